"""Expressions of one clause: sqlglot expressions -> IR expressions over a scope (leaves and operators).

A node is handled by the method named ``_<sqlglot class name>`` if there is one (here or in ``calls``), else by the
tables of ``constants`` (comparisons, arithmetic, functions, EXTRACT-like functions, aggregates); anything else is
unsupported. See docs/ARCHITECTURE.md, "How to add a SQL construct".
"""

from __future__ import annotations

import datetime as dt
import decimal
import re
from collections.abc import Callable

from sqlglot import exp

from imp_core.errors import PlanError, UnsupportedError
from imp_core.plan.expr import (
    FUNCTIONS,
    Between,
    Binary,
    Case,
    Expr,
    Extract,
    Func,
    InList,
    Interval,
    IsNull,
    Like,
    Lit,
    Unary,
    is_numeric,
)
from imp_core.plan.sql.calls import CallRules
from imp_core.plan.sql.constants import AGGS, ARITH, CMP, EXTRACT_FUNCS, FUNCS, INTERVAL_UNITS, NODE_NAMES
from imp_core.plan.sql.dates import shift
from imp_core.plan.sql.positions import Locator, has_position
from imp_core.plan.sql.scope import Scope


class ExprTranslator(CallRules):
    """Translates the sqlglot expressions of one clause into IR expressions over a scope.

    Args:
        loc: Builds the errors, with positions in the query text.
        scope: The FROM items the clause sees.
        clause: The clause's name, for messages ("WHERE", "SELECT", ...).
        aliases: SELECT aliases (lower-cased) the clause may use, with their expressions.
        allow_aggs: Whether aggregate functions are allowed (SELECT, HAVING, ORDER BY).
    """

    def __init__(self, loc: Locator, scope: Scope, clause: str, aliases: dict[str, Expr], allow_aggs: bool) -> None:
        self.loc = loc
        self.scope = scope
        self.clause = clause
        self.aliases = aliases
        self.allow_aggs = allow_aggs

    def __call__(self, node: exp.Expression) -> Expr:
        try:
            return self._translate(node)
        except PlanError as e:
            if has_position(e):
                raise
            # an IR constructor rejected what this node builds (type error, unsupported field, ...)
            raise self.loc.at(e, node) from e

    def _translate(self, node: exp.Expression) -> Expr:
        handler: Callable[[exp.Expression], Expr] | None = getattr(self, f"_{type(node).__name__}", None)
        if handler is not None:
            return handler(node)
        kind = type(node)
        if kind in CMP:
            left, right = self._coerce(self(node.this), self(node.expression), node)
            return Binary(CMP[kind], left, right)
        if kind in ARITH:
            return self._arith(node)
        if kind in FUNCS:
            return self._func(node)
        if kind in EXTRACT_FUNCS:
            return Extract(EXTRACT_FUNCS[kind], self._temporal_arg(node.this))
        if kind in AGGS:
            return self._agg(node)
        raise self._unsupported(node)

    def _unsupported(self, node: exp.Expression) -> UnsupportedError:
        if isinstance(node, exp.AggFunc):
            return self.loc.unsupported(f"aggregate function {node.sql_name()}", node,
                                        "supported: SUM, COUNT, COUNT(*), AVG, MIN, MAX")
        if isinstance(node, (exp.Query, exp.Exists)):
            if self.clause in ("WHERE", "HAVING"):
                return self.loc.unsupported(f"{'EXISTS' if isinstance(node, exp.Exists) else 'a subquery'} under OR "
                                            "or NOT", node, "a subquery can be a conjunct: WHERE ... AND EXISTS (...)")
            return self.loc.unsupported(f"a subquery in {self.clause}", node,
                                        "subqueries are supported in FROM and as conjuncts of WHERE and HAVING")
        if isinstance(node, (exp.Placeholder, exp.Parameter)):
            return self.loc.unsupported("a query parameter", node, "write the constant into the query")
        if type(node) in NODE_NAMES:
            return self.loc.unsupported(NODE_NAMES[type(node)], node)
        if isinstance(node, exp.Func):
            return self.loc.unsupported(f"function {node.sql_name()}", node,
                                        f"supported functions: {', '.join(sorted(FUNCTIONS))}")
        return self.loc.unsupported(f"the expression {node.key.upper()}", node)

    # leaves

    def _Column(self, node: exp.Column) -> Expr:
        if isinstance(node.this, exp.Star):
            raise self.loc.error(f"* is only allowed in the select list and COUNT(*), not in {self.clause}", node)
        name = node.name
        if node.table:
            item = self.scope.item(node.table)
            if item is None:
                raise self.loc.error(f"table or alias {node.table} is not in the FROM clause", node,
                                     f"FROM has {self.scope.describe()}")
            col = item.find(name)
            if col is None:
                raise self.loc.error(f"column {node.table}.{name} does not exist in {item.label}", node,
                                     f"available: {', '.join(c.name for c in item.columns)}")
            return col.col
        hits = [c for c in (item.find(name) for item in self.scope.visible) if c is not None]
        if len(hits) > 1:
            raise self.loc.error(f"column {name} is ambiguous: {', '.join(c.col.name for c in hits)}", node,
                                 "qualify it with a table name or alias")
        if hits:
            return hits[0].col
        if name.lower() in self.aliases:
            return self.aliases[name.lower()]
        available = ", ".join(c.col.name for item in self.scope.visible for c in item.columns)
        raise self.loc.error(f"column {name} does not exist in {self.scope.describe()}", node,
                             f"available: {available}")

    def _Star(self, node: exp.Star) -> Expr:
        raise self.loc.error(f"* is only allowed in the select list and COUNT(*), not in {self.clause}", node)

    def _Paren(self, node: exp.Paren) -> Expr:
        return self(node.this)

    def _Literal(self, node: exp.Literal) -> Expr:
        text = node.this
        if node.is_string:
            return Lit.of(text)
        if re.fullmatch(r"\d+", text):
            return Lit.of(int(text))
        if re.fullmatch(r"\d*\.\d*", text):
            return Lit.of(decimal.Decimal(text))  # Spark reads 0.05 as an exact DECIMAL
        try:
            return Lit.of(float(text))
        except ValueError:
            raise self.loc.unsupported(f"the literal {text}", node) from None

    def _Boolean(self, node: exp.Boolean) -> Expr:
        return Lit.of(bool(node.this))

    def _Null(self, node: exp.Null) -> Expr:
        return Lit.of(None)

    def _Interval(self, node: exp.Interval) -> Expr:
        raise self.loc.error("an INTERVAL can only be added to or subtracted from a date or timestamp", node)

    def _interval(self, node: exp.Interval) -> Interval:
        unit = node.args.get("unit")
        unit_name = INTERVAL_UNITS.get(unit.name.lower()) if unit is not None else None
        value = node.this
        if unit_name is None:
            raise self.loc.unsupported(f"the interval {node.sql(dialect=self.loc.dialect)}", node,
                                       "use INTERVAL 'n' DAY/WEEK/MONTH/YEAR/HOUR/MINUTE/SECOND")
        text = value.name if isinstance(value, exp.Literal) else None
        if isinstance(value, exp.Neg) and isinstance(value.this, exp.Literal):
            text = "-" + value.this.name
        if text is None or not re.fullmatch(r"\s*[-+]?\d+\s*", text):
            raise self.loc.unsupported("an INTERVAL whose amount is not an integer constant", node)
        return Interval(int(text), unit_name)

    # operators

    def _arith(self, node: exp.Expression) -> Expr:
        op = ARITH[type(node)]
        left = self._interval(node.this) if isinstance(node.this, exp.Interval) else self(node.this)
        right = self._interval(node.expression) if isinstance(node.expression, exp.Interval) else \
            self(node.expression)
        if op in ("+", "-"):
            # fold `DATE '1994-01-01' + INTERVAL '1' YEAR` so later steps (sketch use, pruning) see a constant
            if isinstance(right, Interval) and isinstance(left, Lit) and isinstance(left.value, dt.date):
                shifted = shift(left.value, op, right)
                if shifted is not None:
                    return Lit(shifted, left.dtype)
            if op == "+" and isinstance(left, Interval) and isinstance(right, Lit) and \
                    isinstance(right.value, dt.date):
                shifted = shift(right.value, op, left)
                if shifted is not None:
                    return Lit(shifted, right.dtype)
        return Binary(op, left, right)

    def _Neg(self, node: exp.Neg) -> Expr:
        arg = self(node.this)
        if isinstance(arg, Lit) and is_numeric(arg.dtype) and not isinstance(arg.value, bool):
            if isinstance(arg.value, int):
                return Lit.of(-arg.value)  # Spark types -2147483648 as an INT
            return Lit(-arg.value, arg.dtype)
        return Unary("neg", arg)

    def _Not(self, node: exp.Not) -> Expr:
        inner = node.this
        while isinstance(inner, exp.Paren):
            inner = inner.this
        if isinstance(inner, exp.In):
            return self._In(inner, negated=True)
        if isinstance(inner, exp.Between):
            return self._Between(inner, negated=True)
        if isinstance(inner, (exp.Like, exp.ILike)):
            return self._like(inner, negated=True)
        if isinstance(inner, exp.Is):
            return self._Is(inner, negated=True)
        return Unary("not", self(node.this))

    def _And(self, node: exp.And) -> Expr:
        return Binary("and", self(node.this), self(node.expression))

    def _Or(self, node: exp.Or) -> Expr:
        return Binary("or", self(node.this), self(node.expression))

    def _Is(self, node: exp.Is, negated: bool = False) -> Expr:
        if not isinstance(node.expression, exp.Null):
            raise self.loc.unsupported(f"IS {node.expression.sql(dialect=self.loc.dialect)}", node,
                                       "write the comparison with = and COALESCE")
        return IsNull(self(node.this), negated != bool(node.args.get("negate")))

    def _In(self, node: exp.In, negated: bool = False) -> Expr:
        if node.args.get("query") is not None:
            raise self.loc.unsupported("IN (subquery) under OR or NOT" if self.clause in ("WHERE", "HAVING") else
                                       f"IN (subquery) in {self.clause}", node,
                                       "a subquery can be a conjunct: WHERE ... AND x IN (SELECT ...)")
        if node.args.get("unnest") is not None or node.args.get("field") is not None:
            raise self.loc.unsupported("IN over an array", node)
        arg = self(node.this)
        values = [self._coerce(arg, self(v), v)[1] for v in node.expressions]
        return InList(arg, tuple(values), negated)

    def _Between(self, node: exp.Between, negated: bool = False) -> Expr:
        if node.args.get("symmetric"):
            raise self.loc.unsupported("BETWEEN SYMMETRIC", node)
        arg = self(node.this)
        low = self._coerce(arg, self(node.args["low"]), node)[1]
        high = self._coerce(arg, self(node.args["high"]), node)[1]
        return Between(arg, low, high, negated)

    def _Like(self, node: exp.Like) -> Expr:
        return self._like(node)

    def _ILike(self, node: exp.ILike) -> Expr:
        return self._like(node)

    def _like(self, node: exp.Expression, negated: bool = False) -> Expr:
        pattern = node.expression
        if not (isinstance(pattern, exp.Literal) and pattern.is_string):
            raise self.loc.unsupported("LIKE with a pattern that is not a string constant", node)
        return Like(self(node.this), pattern.this, negated != bool(node.args.get("negate")),
                    isinstance(node, exp.ILike))

    def _Escape(self, node: exp.Escape) -> Expr:
        raise self.loc.unsupported("LIKE ... ESCAPE", node)

    def _DPipe(self, node: exp.DPipe) -> Expr:
        parts: list[exp.Expression] = []

        def flatten(n: exp.Expression) -> None:  # a || b || c -> concat(a, b, c)
            if isinstance(n, exp.DPipe):
                flatten(n.this)
                flatten(n.expression)
            else:
                parts.append(n)

        flatten(node)
        return Func("concat", tuple(self(p) for p in parts))

    def _Concat(self, node: exp.Concat) -> Expr:
        args = [self(a) for a in node.expressions]
        if node.args.get("coalesce"):
            # this dialect's CONCAT treats NULL as '' (Postgres); spell that out for Spark's NULL-propagating one
            args = [Func("coalesce", (a, Lit.of(""))) for a in args]
        return Func("concat", tuple(args))

    def _Case(self, node: exp.Case) -> Expr:
        operand = self(node.this) if node.this is not None else None
        whens = []
        for branch in node.args.get("ifs") or []:
            cond = self(branch.this)
            if operand is not None:  # simple CASE x WHEN v -> searched CASE WHEN x = v
                cond = Binary("=", *self._coerce(operand, cond, branch))
            whens.append((cond, self(branch.args["true"])))
        default = node.args.get("default")
        return Case(tuple(whens), self(default) if default is not None else None)

    def _If(self, node: exp.If) -> Expr:
        otherwise = node.args.get("false")
        return Case(((self(node.this), self(node.args["true"])),), self(otherwise) if otherwise is not None else None)


    def _Alias(self, node: exp.Alias) -> Expr:
        raise self.loc.error(f"an alias (AS {node.alias}) is only allowed on a select item", node)

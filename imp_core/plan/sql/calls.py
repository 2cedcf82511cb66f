"""Calls and typed constants in expressions: CAST, date functions, scalar functions and aggregates.

A mixin of ``exprs.ExprTranslator``, which dispatches to its ``_<sqlglot class name>`` methods. See
docs/ARCHITECTURE.md, "How to add a SQL construct".
"""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
from sqlglot import exp

from imp_core.plan.expr import (
    BOOL,
    DATE,
    FLOAT,
    FUNCTIONS,
    STRING,
    TIMESTAMP,
    AggCall,
    Cast,
    Col,
    Expr,
    Extract,
    Func,
    Lit,
    is_numeric,
    is_temporal,
)
from imp_core.plan.sql.constants import (
    AGGS,
    EXTRACT_FIELDS,
    FUNC_ALIASES,
    FUNCS,
    IGNORED_FUNC_ARGS,
    NUMBER_TYPES,
    SPARK_LIKE,
    STRING_TYPES,
    TIMESTAMP_TYPES,
)
from imp_core.plan.sql.dates import iso_date_formats
from imp_core.plan.sql.positions import Locator
from imp_core.plan.sql.scope import Scope
from imp_core.plan.sql.windows import HINT
from imp_core.plan.values import string_to_date, string_to_timestamp


class CallRules:
    """The handlers of calls and typed constants; ``ExprTranslator`` provides the attributes declared here."""

    loc: Locator
    scope: Scope
    clause: str
    allow_aggs: bool

    def __call__(self, node: exp.Expression) -> Expr:
        raise NotImplementedError  # ExprTranslator.__call__

    def _Cast(self, node: exp.Cast) -> Expr:
        for key in ("format", "action", "default"):
            if node.args.get(key) is not None:
                raise self.loc.unsupported(f"CAST with {key.upper()}", node)
        to = self._type(node.args["to"], node)
        arg = self(node.this)
        if isinstance(arg, Lit) and arg.value is not None:
            if arg.dtype == STRING and to in (DATE, TIMESTAMP):
                return self._temporal_lit(arg.value, to, node, safe=isinstance(node, exp.TryCast) and
                                          bool(node.args.get("safe")))
            if pa.types.is_integer(to) and pa.types.is_integer(arg.dtype) and \
                    -2**(to.bit_width - 1) <= arg.value < 2**(to.bit_width - 1):
                return Lit(arg.value, to)
            if to == FLOAT and is_numeric(arg.dtype):
                return Lit(float(arg.value), FLOAT)  # exact rounding, as Spark's cast of a constant
        return Cast(arg, to)

    def _TryCast(self, node: exp.TryCast) -> Expr:
        return self._Cast(node)

    def _Collate(self, node: exp.Collate) -> Expr:
        self._check_collation(node.expression, node)
        return self(node.this)

    def _check_collation(self, collation: exp.Expression | None, at: exp.Expression) -> None:
        """Refuse a collation other than Spark's default (``UTF8_BINARY``): Spark compares, groups and orders such
        strings by it (``UTF8_LCASE``: case-insensitively), the engine byte-wise, so a sketch would hold other
        groups than Spark's answer."""
        if collation is None:
            return
        name = (collation.name if isinstance(collation, exp.Literal) else collation.sql("spark")).strip("`'\"")
        if name.upper() != "UTF8_BINARY":
            raise self.loc.unsupported(f"collation {name} (COLLATE)", at,
                                       "strings are compared byte-wise (UTF8_BINARY, Spark's default) by sketches; "
                                       "remove the COLLATE")

    def _type(self, node: exp.DataType, at: exp.Expression) -> pa.DataType:
        self._check_collation(node.args.get("collate"), at)
        t = node.this
        if t in NUMBER_TYPES:
            return NUMBER_TYPES[t]
        if t in STRING_TYPES:
            return STRING
        if t == exp.DataType.Type.DATE:
            return DATE
        if t in TIMESTAMP_TYPES:
            return TIMESTAMP
        if t == exp.DataType.Type.BOOLEAN:
            return BOOL
        if t == exp.DataType.Type.DECIMAL:
            params = [p.this for p in node.expressions]
            if not params:
                return pa.decimal128(10, 0) if self.loc.dialect in SPARK_LIKE else pa.decimal128(38, 18)
            try:
                precision = int(params[0].this)
                scale = int(params[1].this) if len(params) > 1 else 0
                return pa.decimal128(precision, scale)
            except (ValueError, AttributeError, IndexError) as e:
                raise self.loc.error(f"invalid DECIMAL type {node.sql(dialect=self.loc.dialect)}", at) from e
        raise self.loc.unsupported(f"CAST to {node.sql(dialect=self.loc.dialect)}", at,
                                   "supported: TINYINT/SMALLINT/INT/BIGINT, FLOAT/DOUBLE, DECIMAL(p,s), "
                                   "STRING/VARCHAR, DATE, TIMESTAMP, BOOLEAN")

    def _temporal_lit(self, text: str, to: pa.DataType, node: exp.Expression, safe: bool = False) -> Lit:
        # Spark's reading of the text (imp_core.plan.values), not Python's: '2024-1-5' is a date, '20240105' not
        value: dt.date | None = string_to_date(text) if to == DATE else string_to_timestamp(text)
        if value is None:
            if safe:
                return Lit(None, to)
            kind = "date ('yyyy-mm-dd')" if to == DATE else "timestamp ('yyyy-mm-dd hh:mm:ss[.ffffff]')"
            raise self.loc.error(f"'{text}' is not a valid {kind}", node)
        return Lit(value, DATE if to == DATE else TIMESTAMP)

    def _coerce(self, a: Expr, b: Expr, node: exp.Expression) -> tuple[Expr, Expr]:
        """Turn a string constant compared with a date/timestamp into a date/timestamp constant."""
        if is_temporal(a.dtype) and isinstance(b, Lit) and b.dtype == STRING:
            b = self._temporal_lit(b.value, DATE if pa.types.is_date(a.dtype) else TIMESTAMP, node)
        elif is_temporal(b.dtype) and isinstance(a, Lit) and a.dtype == STRING:
            a = self._temporal_lit(a.value, DATE if pa.types.is_date(b.dtype) else TIMESTAMP, node)
        return a, b

    # dates

    def _to_date(self, arg: Expr, node: exp.Expression) -> Expr:
        if isinstance(arg, Lit) and arg.dtype == STRING:
            return self._temporal_lit(arg.value, DATE, node)
        if pa.types.is_date(arg.dtype):
            return arg
        if pa.types.is_timestamp(arg.dtype) or pa.types.is_string(arg.dtype) or arg.dtype == pa.null():
            return Cast(arg, DATE)
        raise self.loc.error(f"TO_DATE needs a string, date or timestamp, got {arg.dtype}", node)

    def _check_date_format(self, node: exp.Expression) -> None:
        fmt = node.args.get("format")
        if fmt is None:
            return
        if not (isinstance(fmt, exp.Literal) and fmt.is_string and fmt.this in iso_date_formats(self.loc.dialect)):
            raise self.loc.unsupported("a TO_DATE format other than 'YYYY-MM-DD' / 'yyyy-MM-dd'", node)

    def _TsOrDsToDate(self, node: exp.TsOrDsToDate) -> Expr:
        self._check_date_format(node)
        return self._to_date(self(node.this), node)

    def _StrToDate(self, node: exp.StrToDate) -> Expr:
        self._check_date_format(node)
        return self._to_date(self(node.this), node)

    def _Date(self, node: exp.Date) -> Expr:
        if node.expressions or node.args.get("zone") is not None:
            raise self.loc.unsupported("DATE() with more than one argument", node)
        return self._to_date(self(node.this), node)

    def _temporal_arg(self, node: exp.Expression) -> Expr:
        # Spark's YEAR(d) etc. parse as YEAR(TO_DATE(d)); drop that wrapper when d is already a date/timestamp.
        if isinstance(node, exp.TsOrDsToDate) and node.args.get("format") is None:
            inner = self(node.this)
            return inner if is_temporal(inner.dtype) else self._to_date(inner, node)
        arg = self(node)
        if isinstance(arg, Lit) and arg.dtype == STRING:
            return self._temporal_lit(arg.value, TIMESTAMP if ":" in arg.value else DATE, node)
        return arg

    def _date_arg(self, node: exp.Expression) -> Expr:
        # date_add / date_sub / datediff work on dates; Spark casts a timestamp or string argument to a date
        if isinstance(node, exp.TsOrDsToDate) and node.args.get("format") is None:
            node = node.this
        return self._to_date(self(node), node)

    def _Extract(self, node: exp.Extract) -> Expr:
        name = node.this.name.lower()
        return Extract(EXTRACT_FIELDS.get(name, name), self._temporal_arg(node.expression))

    def _day_unit(self, node: exp.Expression) -> None:
        unit = node.args.get("unit")
        if unit is not None and unit.name.upper() not in ("DAY", "DAYS"):
            raise self.loc.unsupported(f"{_sql_name(node)} with unit {unit.name}", node,
                                       "use date + INTERVAL 'n' MONTH/YEAR")

    def _TsOrDsAdd(self, node: exp.TsOrDsAdd) -> Expr:
        self._day_unit(node)
        amount = node.expression
        # Spark's date_sub(d, n) arrives as TsOrDsAdd(d, n * -1)
        if isinstance(amount, exp.Mul) and isinstance(amount.expression, exp.Neg) and \
                isinstance(amount.expression.this, exp.Literal) and amount.expression.this.this == "1":
            return Func("date_sub", (self._date_arg(node.this), self(amount.this)))
        return Func("date_add", (self._date_arg(node.this), self(amount)))

    def _DateAdd(self, node: exp.DateAdd) -> Expr:
        self._day_unit(node)
        return Func("date_add", (self._date_arg(node.this), self(node.expression)))

    def _DateSub(self, node: exp.DateSub) -> Expr:
        self._day_unit(node)
        return Func("date_sub", (self._date_arg(node.this), self(node.expression)))

    def _DateDiff(self, node: exp.DateDiff) -> Expr:
        self._day_unit(node)
        for key in ("zone", "date_part_boundary"):
            if node.args.get(key):
                raise self.loc.unsupported(f"DATEDIFF with {key.upper()}", node)
        # Spark's argument order: datediff(end, start) = end - start in days
        return Func("datediff", (self._date_arg(node.this), self._date_arg(node.expression)))

    # functions and aggregates

    def _func(self, node: exp.Expression) -> Expr:
        name, keys = FUNCS[type(node)]
        for key, value in node.args.items():
            if value and key not in keys and not (key == "expressions" and "*" in keys) and \
                    key not in IGNORED_FUNC_ARGS:
                raise self.loc.unsupported(f"{_sql_name(node)} with {key.upper()}", node)
        args: list[Expr] = []
        for key in keys:
            if key == "*":
                args += [self(a) for a in node.expressions]
            elif node.args.get(key) is not None:
                args.append(self(node.args[key]))
        return Func(name, tuple(args))

    def _Trim(self, node: exp.Trim) -> Expr:
        if node.args.get("expression") is not None or node.args.get("collation") is not None:
            raise self.loc.unsupported("TRIM of characters other than spaces", node)
        position = (node.text("position") or "BOTH").upper()
        name = {"LEADING": "ltrim", "TRAILING": "rtrim"}.get(position, "trim")
        return Func(name, (self(node.this),))

    def _Grouping(self, node: exp.Grouping) -> Expr:
        return self._grouping_call("grouping", node)

    def _GroupingId(self, node: exp.GroupingId) -> Expr:
        return self._grouping_call("grouping_id", node)

    def _grouping_call(self, function: str, node: exp.Expression) -> Expr:
        """A placeholder column for ``GROUPING(k)`` / ``GROUPING_ID(k, ...)``, a constant in each grouping set."""
        if self.clause not in ("SELECT", "HAVING", "ORDER BY"):
            raise self.loc.error(f"{function.upper()}() is not allowed in {self.clause}", node)
        args = tuple(self(a) for a in node.expressions)
        if function == "grouping" and len(args) != 1:
            raise self.loc.error(f"GROUPING() takes one GROUP BY expression, got {len(args)}", node)
        name = f"__grouping{len(self.scope.groupings)}"
        self.scope.groupings[name] = (function, args)
        return Col(name, pa.int8() if function == "grouping" else pa.int64())

    def _Anonymous(self, node: exp.Anonymous) -> Expr:
        name = node.name.lower()
        name = FUNC_ALIASES.get(name, name)
        if name in FUNCTIONS:
            return Func(name, tuple(self(a) for a in node.expressions))
        raise self.loc.unsupported(f"function {node.name.upper()}", node,
                                   f"supported functions: {', '.join(sorted(FUNCTIONS))}")

    def _agg(self, node: exp.Expression) -> Expr:
        func = AGGS[type(node)]
        if not self.allow_aggs:
            hint = " (use HAVING)" if self.clause == "WHERE" else ""
            raise self.loc.error(f"aggregate functions are not allowed in {self.clause}{hint}", node)
        arg = node.this
        distinct = isinstance(arg, exp.Distinct)
        if distinct:
            arg = self._distinct_arg(func, arg, node)
            distinct = func not in ("min", "max")
        if node.expressions:
            raise self.loc.unsupported(f"{func.upper()} with several arguments", node)
        if isinstance(arg, exp.Star):
            if func != "count" or distinct:
                raise self.loc.error(f"{func.upper()}({'DISTINCT ' if distinct else ''}*) is not valid; only "
                                     f"COUNT(*)", node)
            return AggCall("count", None)
        if arg is None:
            raise self.loc.error(f"{func.upper()} needs an argument", node)
        # a nested aggregate in `arg`, or a DISTINCT the engine cannot maintain, is rejected by AggCall
        return AggCall(func, self(arg), distinct=distinct)

    def _distinct_arg(self, func: str, arg: exp.Distinct, node: exp.Expression) -> exp.Expression:
        """The one argument of ``func(DISTINCT arg)``; MIN and MAX ignore DISTINCT (same value), AVG refuses it."""
        if len(arg.expressions) != 1 or arg.args.get("on") is not None:
            raise self.loc.unsupported(f"{func.upper()}(DISTINCT ...) with several arguments", node,
                                       "write one column or expression after DISTINCT")
        if func == "avg":
            raise self.loc.unsupported("AVG(DISTINCT ...)", node,
                                       "write SUM(DISTINCT x) / COUNT(DISTINCT x), or aggregate over a SELECT "
                                       "DISTINCT subquery")
        only: exp.Expression = arg.expressions[0]
        return only

    def _Filter(self, node: exp.Filter) -> Expr:
        raise self.loc.unsupported("an aggregate with FILTER (WHERE ...)", node, "use SUM(CASE WHEN ... END)")

    def _Window(self, node: exp.Window) -> Expr:
        rank = self.scope.windows.get(id(node))  # a SELECT list's ranking window (``windows.py``) is its rank column
        if rank is None:
            raise self.loc.unsupported(f"a window function (OVER ...) in {self.clause}", node, HINT)
        return rank


def _sql_name(node: exp.Expression) -> str:
    """The SQL name of a function node (``DATE_ADD``), else of its node type."""
    return node.sql_name() if isinstance(node, exp.Func) else node.key.upper()

"""SQL front-end: SQL text -> the platform's relational-algebra plan (the operators of the IMP paper's Fig. 4).

sqlglot parses the text. Names are resolved here, against the registered tables, rather than with sqlglot's
``qualify``: qualify reports an ambiguous column as "could not be resolved" and loses which FROM item was meant,
while a user registering a sketch needs "column brand is ambiguous: s.brand, t2.brand" and where it is. The
resolver is small because the supported subset has no correlation: every query block sees only its own FROM items.

What the translation guarantees (other modules rely on it):

* every FROM item exposes ``alias.column``; a subquery (or inlined CTE) gets a renaming Project on top;
* only inner joins exist, so all ON and WHERE conjuncts are pooled and each is pushed as low as it can go: a
  Select right above its FROM item, or the condition of the lowest Join that covers its columns. Join order follows
  FROM order, except that an item connected to the already-joined items by a condition is joined before one that
  would make a cross product (the incremental engine joins deltas per Join node);
* GROUP BY / aggregates -> Aggregate, HAVING -> Select over it, SELECT list -> Project, DISTINCT -> Distinct,
  ORDER BY + LIMIT -> TopK. ORDER BY without LIMIT does not change the result set and is dropped.

Everything outside that subset raises ``UnsupportedError`` naming the construct and where it is, so a sketch is
never registered for a query the engine would maintain wrongly.
"""

from __future__ import annotations

import calendar
import datetime as dt
import decimal
import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import pyarrow as pa
import sqlglot
from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import ParseError, SqlglotError, TokenError

from imp_core.errors import PlanError, UnsupportedError
from imp_core.plan.expr import (
    BOOL,
    DATE,
    FLOAT,
    FLOAT32,
    FUNCTIONS,
    INT,
    INT8,
    INT16,
    INT32,
    STRING,
    TIMESTAMP,
    AggCall,
    Between,
    Binary,
    Case,
    Cast,
    Col,
    Expr,
    Extract,
    Func,
    InList,
    Interval,
    IsNull,
    Like,
    Lit,
    Unary,
    conjoin,
    conjuncts,
    is_numeric,
    is_temporal,
    substitute,
)
from imp_core.plan.nodes import Aggregate, Distinct, Field, Join, Plan, Project, Scan, Select, SortKey, TopK
from imp_core.plan.values import string_to_date, string_to_timestamp


@dataclass(frozen=True, slots=True)
class Query:
    """A parsed query: its plan and the names of the result columns.

    Attributes:
        plan: The relational-algebra plan; its root's ``names`` equal ``output_names``.
        output_names: The result column names, in order, unique (case-insensitively): SELECT aliases, the bare
            column name for a plain column, ``_c{i}`` for an unaliased expression at position ``i``; a repeated
            name gets ``_2``, ``_3`` ... appended.
        sql: The SQL text the plan was made from.
    """

    plan: Plan
    output_names: tuple[str, ...]
    sql: str


def parse_query(sql: str, tables: Mapping[str, pa.Schema], dialect: str = "spark", *,
                statement: exp.Expression | None = None) -> Query:
    """Translate one SELECT query into a plan over the registered tables.

    Identifiers are resolved case-insensitively (as Spark does); the plan keeps the spelling stored in ``tables``.

    Args:
        sql: The query text (one statement).
        tables: Registered table name -> Arrow schema of the table.
        dialect: The sqlglot dialect the text is written in.
        statement: ``sql`` already parsed by :func:`parse_statement` (it is not parsed again; not modified).

    Returns:
        The plan and the result column names.

    Raises:
        PlanError: The SQL does not parse, or names an unknown table or column, an ambiguous column, or has a
            type error.
        UnsupportedError: The query uses a construct the platform cannot maintain (outer joins, set operations,
            window functions, subqueries in expressions, LIMIT without ORDER BY, ...).
    """
    if statement is None:
        statement = parse_statement(sql, dialect)
    plan, names = _Builder(tables, sql, dialect).query(statement, {})
    return Query(plan, names, sql)


def parse_statement(sql: str, dialect: str = "spark") -> exp.Expression:
    """Parse SQL text that must hold exactly one query.

    Raises:
        PlanError: The text does not parse, is empty, or the dialect is unknown.
        UnsupportedError: The text holds several statements, or a statement that is not a query.
    """
    try:
        Dialect.get_or_raise(dialect)
    except ValueError as e:
        raise PlanError(f"unknown SQL dialect {dialect!r}: {_one_line(str(e))}") from e
    try:
        statements = [s for s in sqlglot.parse(sql, read=dialect) if s is not None]
    except ParseError as e:
        raise PlanError(f"cannot parse the query: {_parse_error_text(e)}") from e
    except (TokenError, SqlglotError) as e:
        raise PlanError(f"cannot parse the query: {_one_line(str(e))}") from e
    if not statements:
        raise PlanError("the query text is empty")
    if len(statements) > 1:
        raise UnsupportedError(f"multiple statements ({len(statements)}) are not supported; a sketch is made for "
                               "exactly one SELECT query")
    statement = statements[0]
    if not isinstance(statement, exp.Query):
        kind = statement.name.upper() if isinstance(statement, exp.Command) else statement.key.upper()
        raise UnsupportedError(f"only SELECT queries can have sketches; got {kind}")
    return statement


# --- errors and positions -------------------------------------------------------------------------------------

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


_TOKEN = re.compile(r"<Token token_type: TokenType\.(\w+), text: (.*?), line: \d+, col: \d+, start: \d+, "
                    r"end: \d+, comments: \[.*?\]>")


def _one_line(text: str) -> str:
    text = _TOKEN.sub(lambda m: "the end of the query" if m[1] == "SENTINEL" else f"'{m[2]}'", _ANSI.sub("", text))
    return " ".join(text.split())


def _parse_error_text(e: ParseError) -> str:
    if not e.errors:
        return _one_line(str(e))
    err = e.errors[0]
    near = _one_line(f"{err.get('start_context', '')}{err.get('highlight', '')}")
    where = f" at line {err.get('line')}, column {err.get('col')}" if err.get("line") else ""
    return _one_line(f"{err.get('description', 'syntax error')}{where}" + (f" near '{near}'" if near else ""))


_E = TypeVar("_E", bound=PlanError)


def _located(error: _E) -> _E:
    # Marks an error whose message already says where it is, so outer levels do not add a second position.
    error.located = True  # type: ignore[attr-defined]
    return error


# --- names in scope -------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Column:
    """One column a FROM item exposes: the name SQL uses for it and the plan column it is."""

    name: str
    col: Col


@dataclass(frozen=True, slots=True)
class _Item:
    """A FROM item (table, subquery or CTE reference) with its alias, plan and columns."""

    alias: str
    label: str  # how messages name it: "sales", "sales AS s", "subquery tt"
    plan: Plan
    columns: tuple[_Column, ...]
    node: exp.Expression  # where it is written, for messages

    def find(self, name: str) -> _Column | None:
        exact = [c for c in self.columns if c.name == name]
        if exact:
            return exact[0]
        folded = [c for c in self.columns if c.name.lower() == name.lower()]
        return folded[0] if len(folded) == 1 else None


class _Scope:
    """The FROM items visible to one query block (no outer scopes: correlation is not supported)."""

    def __init__(self, items: Sequence[_Item]) -> None:
        self.items = tuple(items)
        self.owner = {c.col.name: i for i, item in enumerate(self.items) for c in item.columns}
        self.bare = {c.col.name: c.name for item in self.items for c in item.columns}

    def item(self, alias: str) -> _Item | None:
        exact = [i for i in self.items if i.alias == alias]
        if exact:
            return exact[0]
        folded = [i for i in self.items if i.alias.lower() == alias.lower()]
        return folded[0] if len(folded) == 1 else None

    def describe(self) -> str:
        return ", ".join(i.label for i in self.items)


@dataclass(frozen=True, slots=True)
class _Cte:
    name: str
    body: exp.Expression
    columns: tuple[str, ...]
    env: Mapping[str, _Cte]  # the CTEs visible where this one was defined (not itself: no recursion)


@dataclass(slots=True)
class _SelectItem:
    name: str  # before de-duplication
    expr: Expr
    alias: bool  # the user wrote AS name


@dataclass(slots=True)
class _OrderItem:
    item: int | None  # index of the SELECT item it refers to, or None
    expr: Expr | None  # otherwise the expression (over FROM columns, before aggregation)
    descending: bool
    nulls_first: bool | None


# --- constants and types ----------------------------------------------------------------------------------------

# SQL type names -> IR types, with Spark's widths (INT is 32-bit, FLOAT/REAL 32-bit, DOUBLE 64-bit)
_NUMBER_TYPES = {exp.DataType.Type.TINYINT: INT8, exp.DataType.Type.SMALLINT: INT16, exp.DataType.Type.INT: INT32,
                 exp.DataType.Type.MEDIUMINT: INT32, exp.DataType.Type.BIGINT: INT,
                 exp.DataType.Type.FLOAT: FLOAT32, exp.DataType.Type.DOUBLE: FLOAT}
_STRING_TYPES = {exp.DataType.Type.TEXT, exp.DataType.Type.VARCHAR, exp.DataType.Type.CHAR,
                 exp.DataType.Type.NVARCHAR, exp.DataType.Type.NCHAR}
_TIMESTAMP_TYPES = {exp.DataType.Type.TIMESTAMP, exp.DataType.Type.TIMESTAMPTZ, exp.DataType.Type.TIMESTAMPLTZ,
                    exp.DataType.Type.TIMESTAMPNTZ, exp.DataType.Type.DATETIME}
# Dialects whose DECIMAL without precision means DECIMAL(10, 0) (Spark's default); elsewhere it is unconstrained.
_SPARK_LIKE = {"spark", "spark2", "databricks", "hive"}

_INTERVAL_UNITS = {"day": "day", "days": "day", "week": "week", "weeks": "week", "month": "month",
                   "months": "month", "year": "year", "years": "year", "hour": "hour", "hours": "hour",
                   "minute": "minute", "minutes": "minute", "second": "second", "seconds": "second"}

# EXTRACT(SECOND FROM ts) keeps the microseconds (a DECIMAL(8, 6) in Spark); the SECOND(ts) function does not
_EXTRACT_FIELDS = {"year": "year", "years": "year", "yr": "year", "quarter": "quarter", "qtr": "quarter",
                   "month": "month", "months": "month", "mon": "month", "week": "week", "weeks": "week",
                   "weekofyear": "week", "day": "day", "days": "day", "dayofmonth": "day", "dayofweek": "dayofweek",
                   "dow": "dayofweek", "dayofyear": "dayofyear", "doy": "dayofyear", "hour": "hour",
                   "hours": "hour", "minute": "minute", "minutes": "minute", "second": "second_with_fraction",
                   "seconds": "second_with_fraction"}
_EXTRACT_FUNCS: dict[type[exp.Expression], str] = {
    exp.Year: "year", exp.Quarter: "quarter", exp.Month: "month", exp.Day: "day", exp.DayOfMonth: "day",
    exp.WeekOfYear: "week", exp.DayOfWeek: "dayofweek", exp.DayOfYear: "dayofyear", exp.Hour: "hour",
    exp.Minute: "minute", exp.Second: "second",
}

# sqlglot function node -> (our function name, its argument keys in order; "*" is the `expressions` list)
_FUNCS: dict[type[exp.Expression], tuple[str, tuple[str, ...]]] = {
    exp.Upper: ("upper", ("this",)),
    exp.Lower: ("lower", ("this",)),
    exp.Length: ("length", ("this",)),
    exp.Substring: ("substring", ("this", "start", "length")),
    exp.Coalesce: ("coalesce", ("this", "*")),
    exp.Abs: ("abs", ("this",)),
    exp.Round: ("round", ("this", "decimals")),
    exp.Floor: ("floor", ("this",)),
    exp.Ceil: ("ceil", ("this",)),
    exp.Greatest: ("greatest", ("this", "*")),
    exp.Least: ("least", ("this", "*")),
    exp.Nullif: ("nullif", ("this", "expression")),
    exp.Replace: ("replace", ("this", "expression", "replacement")),
    exp.Sqrt: ("sqrt", ("this",)),
    exp.Ln: ("ln", ("this",)),
    exp.Exp: ("exp", ("this",)),
    exp.Pow: ("power", ("this", "expression")),
    exp.Sign: ("sign", ("this",)),
}
# Flags sqlglot records while parsing that do not change the meaning of these functions for us.
_IGNORED_FUNC_ARGS = {"safe", "ignore_nulls", "is_nvl", "is_null", "big_int"}
# Spellings that reach us as anonymous functions.
_FUNC_ALIASES = {"ceiling": "ceil", "substr": "substring", "pow": "power", "signum": "sign",
                 "char_length": "length", "character_length": "length"}

_AGGS: dict[type[exp.Expression], str] = {exp.Sum: "sum", exp.Count: "count", exp.Avg: "avg", exp.Min: "min",
                                           exp.Max: "max"}

_CMP: dict[type[exp.Expression], str] = {exp.EQ: "=", exp.NEQ: "<>", exp.LT: "<", exp.LTE: "<=", exp.GT: ">",
                                          exp.GTE: ">="}
_ARITH: dict[type[exp.Expression], str] = {exp.Add: "+", exp.Sub: "-", exp.Mul: "*", exp.Div: "/", exp.Mod: "%"}

_SELECT_CLAUSES = {"with_", "expressions", "hint", "distinct", "from_", "joins", "where", "group", "having",
                   "order", "limit", "offset"}
_CLAUSE_NAMES = {"qualify": "QUALIFY", "laterals": "LATERAL VIEW", "windows": "a WINDOW clause",
                 "distribute": "DISTRIBUTE BY", "sort": "SORT BY", "cluster": "CLUSTER BY", "sample": "TABLESAMPLE",
                 "pivots": "PIVOT", "locks": "FOR UPDATE / FOR SHARE", "into": "SELECT INTO",
                 "connect": "CONNECT BY", "prewhere": "PREWHERE", "match": "MATCH_RECOGNIZE"}
_TABLE_ARG_NAMES = {"version": "time travel (VERSION AS OF / TIMESTAMP AS OF)",
                    "system_time": "time travel (FOR SYSTEM_TIME)", "sample": "TABLESAMPLE", "pivots": "PIVOT",
                    "laterals": "LATERAL VIEW", "partition": "a PARTITION clause on a table",
                    "changes": "a CHANGES clause on a table"}
# The keywords that start a clause node before its first positioned token (see _Builder.where).
_KEYWORDS: dict[type[exp.Expression], str] = {
    exp.Join: "NATURAL|LEFT|RIGHT|FULL|OUTER|INNER|CROSS|SEMI|ANTI|JOIN", exp.Limit: "LIMIT",
    exp.Offset: "OFFSET", exp.Fetch: "FETCH|FIRST|NEXT", exp.Qualify: "QUALIFY", exp.Group: "GROUP|BY",
    exp.Sort: "SORT|BY", exp.Cluster: "CLUSTER|BY", exp.Distribute: "DISTRIBUTE|BY", exp.Lateral: "LATERAL|VIEW",
    exp.With: "WITH|RECURSIVE", exp.Distinct: "DISTINCT|ON",
}
# Names for expression nodes that have no function name, for "... is not supported" messages.
_NODE_NAMES: dict[type[exp.Expression], str] = {
    exp.NullSafeEQ: "null-safe equality (<=> / IS NOT DISTINCT FROM)",
    exp.NullSafeNEQ: "null-safe inequality (IS DISTINCT FROM)", exp.IntDiv: "integer division (DIV)",
    exp.Bracket: "an array or map subscript", exp.Dot: "struct field access", exp.Xor: "XOR",
    exp.BitwiseAnd: "bitwise AND (&)", exp.BitwiseOr: "bitwise OR (|)", exp.BitwiseXor: "bitwise XOR (^)",
    exp.BitwiseNot: "bitwise NOT (~)", exp.Any: "ANY (...)", exp.All: "ALL (...)", exp.Tuple: "a row value (tuple)",
    exp.Lambda: "a lambda function", exp.Array: "an array constructor", exp.Struct: "a struct constructor",
}


@functools.cache
def _iso_date_formats(dialect: str) -> frozenset[str]:
    """The format strings sqlglot produces in ``dialect`` for 'YYYY-MM-DD' and 'yyyy-MM-dd'.

    sqlglot rewrites TO_DATE's format into its own notation (and Spark reads 'DD' as day-of-year), so the accepted
    spellings are recognized by parsing them in the same dialect rather than by string comparison.
    """
    out = {"YYYY-MM-DD", "yyyy-MM-dd", "%Y-%m-%d"}
    for fmt in ("YYYY-MM-DD", "yyyy-MM-dd"):
        try:
            node = sqlglot.parse_one(f"SELECT TO_DATE('2000-01-01', '{fmt}')", read=dialect)
        except SqlglotError:  # pragma: no cover - every dialect we know parses this
            continue
        for call in node.find_all(exp.TsOrDsToDate, exp.StrToDate):
            f = call.args.get("format")
            if isinstance(f, exp.Literal):
                out.add(f.this)
    return frozenset(out)


def _add_months(value: dt.date, months: int) -> dt.date:
    # Spark's add_months and Postgres both clamp to the last day of the target month.
    years, month0 = divmod(value.month - 1 + months, 12)
    year, month = value.year + years, month0 + 1
    day = min(value.day, calendar.monthrange(year, month)[1])
    return value.replace(year=year, month=month, day=day)


def _shift(value: dt.date, op: str, iv: Interval) -> dt.date | None:
    """``value op interval`` for a constant date/timestamp, or None when it does not fold to the same type."""
    n = iv.value if op == "+" else -iv.value
    if iv.unit in ("day", "week"):
        return value + dt.timedelta(days=n * (7 if iv.unit == "week" else 1))
    if iv.unit in ("month", "year"):
        return _add_months(value, n * (12 if iv.unit == "year" else 1))
    if isinstance(value, dt.datetime):
        return value + dt.timedelta(**{f"{iv.unit}s": n})
    return None  # date + hours is a timestamp in Spark; leave it to the engine


def _unique_names(names: Sequence[str], taken: set[str] | None = None) -> list[str]:
    """Make names unique case-insensitively (Spark treats ``a`` and ``A`` as the same column)."""
    used = set() if taken is None else taken
    out = []
    for n in names:
        name = n
        k = 2
        while name.lower() in used:
            name = f"{n}_{k}"
            k += 1
        used.add(name.lower())
        out.append(name)
    return out


def _free_name(candidates: Sequence[str], used: set[str]) -> str:
    for c in candidates:
        if c.lower() not in used:
            used.add(c.lower())
            return c
    return _unique_names([candidates[-1]], used)[0]


def _ungrouped(e: Expr, grouped: set[Expr]) -> Col | None:
    """The first column of ``e`` outside a grouped expression or aggregate (top-down, like ``substitute``)."""
    if e in grouped or isinstance(e, AggCall):
        return None
    if isinstance(e, Col):
        return e
    for child in e.children():
        found = _ungrouped(child, grouped)
        if found is not None:
            return found
    return None


# --- the translator -----------------------------------------------------------------------------------------------


class _Builder:
    """Translates one parsed statement; holds the catalog, the SQL text (for positions) and the dialect."""

    def __init__(self, tables: Mapping[str, pa.Schema], sql: str, dialect: str) -> None:
        self.tables = dict(tables)
        self.sql = sql
        self.dialect = dialect
        self._subqueries = 0

    # errors

    def where(self, node: exp.Expression) -> str:
        """Where ``node`` is: line and column of its leftmost token that has a position, and a SQL snippet."""
        snippet = _one_line(node.sql(dialect=self.dialect))
        if len(snippet) > 60:
            snippet = snippet[:57] + "..."
        starts = [n.meta["start"] for n in node.walk() if "start" in n.meta]
        if starts:
            s = min(starts)
            # a clause's first position is that of its first operand; step back over its keywords
            keywords = _KEYWORDS.get(type(node))
            if keywords:
                m = re.search(rf"(?:\b(?:{keywords})\s+)+$", self.sql[:s], re.IGNORECASE)
                if m:
                    s = m.start()
            line = self.sql.count("\n", 0, s) + 1
            col = s - self.sql.rfind("\n", 0, s)
            return f"at line {line}, column {col} (`{snippet}`)"
        return f"in `{snippet}`"

    def unsupported(self, construct: str, node: exp.Expression, hint: str = "") -> UnsupportedError:
        msg = f"{construct} is not supported; found {self.where(node)}"
        return _located(UnsupportedError(msg + (f"; {hint}" if hint else "")))

    def error(self, message: str, node: exp.Expression, hint: str = "") -> PlanError:
        return _located(PlanError(f"{message} {self.where(node)}" + (f"; {hint}" if hint else "")))

    # query blocks

    def query(self, node: exp.Expression, ctes: Mapping[str, _Cte]) -> tuple[Plan, tuple[str, ...]]:
        """Plan a query expression; returns the plan and its output names."""
        if isinstance(node, exp.Subquery):
            extra = [k for k, v in node.args.items() if v and k != "this"]
            if extra:
                raise self.unsupported(f"{extra[0].upper()} on a parenthesized query", node)
            return self.query(node.this, ctes)
        if isinstance(node, exp.SetOperation):
            op = node.key.upper() + ("" if node.args.get("distinct") else " ALL")
            raise self.unsupported(f"set operation {op}", node,
                                   "register a sketch for each branch instead")
        if isinstance(node, exp.Select):
            return self._select(node, ctes)
        raise self.unsupported(f"{node.key.upper()} as a query", node)

    def _select(self, node: exp.Select, ctes: Mapping[str, _Cte]) -> tuple[Plan, tuple[str, ...]]:
        self._check_clauses(node)
        ctes = self._with(node, ctes)
        if node.args.get("from_") is None:
            raise self.unsupported("a SELECT without FROM", node, "a sketch needs at least one table")
        scope, source = self._from(node, ctes)

        items = self._select_items(node, scope)
        aliases = {}
        for i, it in enumerate(items):
            if it.alias:
                aliases.setdefault(it.name.lower(), i)
        alias_exprs = {a: items[i].expr for a, i in aliases.items()}

        group = node.args.get("group")
        keys = self._group_by(group, scope, items, alias_exprs) if group is not None else None
        having_node = node.args.get("having")
        having = (self._condition(having_node.this, scope, "HAVING", alias_exprs, allow_aggs=True)
                  if having_node is not None else None)

        limit = self._limit(node)
        order_node = node.args.get("order")
        written_order = self._order_by(order_node, scope, items, alias_exprs) if order_node is not None else []
        if limit is not None and not written_order:
            raise _located(UnsupportedError(
                f"LIMIT without ORDER BY is nondeterministic and not supported; found "
                f"{self.where(node.args['limit'])}; add an ORDER BY that makes the first rows well defined"))
        # ORDER BY alone does not change the result set: it is checked above, then dropped
        order = written_order if limit is not None else []

        exprs = [it.expr for it in items] + ([having] if having is not None else []) + \
            [o.expr for o in written_order if o.expr is not None]
        if keys is not None or having is not None or any(e.has_aggregate() for e in exprs):
            plan, item_exprs, having, order_exprs = self._aggregate(source, scope, items, keys or [], having,
                                                                    order, node)
            if having is not None:
                plan = Select(plan, having)
        else:
            plan, item_exprs = source, [it.expr for it in items]
            order_exprs = [o.expr for o in order]
        return self._output(plan, node, [it.name for it in items], item_exprs, order, order_exprs, limit)

    def _output(self, plan: Plan, node: exp.Select, item_names: list[str], item_exprs: list[Expr],
                order: list[_OrderItem], order_exprs: list[Expr | None], limit: int | None
                ) -> tuple[Plan, tuple[str, ...]]:
        """SELECT list -> Project, DISTINCT -> Distinct, ORDER BY + LIMIT -> TopK over the Project's columns.

        An ORDER BY expression that is not an output column becomes a hidden ``__order{i}`` column of the Project,
        dropped again by a final Project after the TopK.
        """
        names = _unique_names(item_names)
        project = list(zip(names, item_exprs))
        used = {n.lower() for n in names}
        sort_keys = []
        distinct = node.args.get("distinct") is not None
        for i, (o, e) in enumerate(zip(order, order_exprs)):
            if o.item is None:
                assert e is not None
                matches = [j for j, ie in enumerate(item_exprs) if ie == e]
                if matches:
                    o.item = matches[0]
                elif distinct:
                    raise self.error("with SELECT DISTINCT, ORDER BY expressions must appear in the select list",
                                     node.args["order"].expressions[i])
                else:
                    hidden = _free_name([f"__order{i}"], used)
                    project.append((hidden, e))
                    sort_keys.append(SortKey(Col(hidden, e.dtype), o.descending, o.nulls_first))
                    continue
            name, e = project[o.item]
            sort_keys.append(SortKey(Col(name, e.dtype), o.descending, o.nulls_first))

        plan = Project(plan, tuple(project))
        if distinct:
            plan = Distinct(plan)
        if limit is not None:
            plan = TopK(plan, tuple(sort_keys), limit)
            if len(project) > len(names):
                plan = Project(plan, tuple((n, Col(n, e.dtype)) for n, e in project[:len(names)]))
        return plan, tuple(names)

    def _check_clauses(self, node: exp.Select) -> None:
        for key, value in node.args.items():
            if key in _SELECT_CLAUSES or not value:
                continue
            at = value[0] if isinstance(value, list) else value
            if not isinstance(at, exp.Expression):
                at = node
            raise self.unsupported(_CLAUSE_NAMES.get(key, f"the {key.upper()} clause"), at)
        distinct = node.args.get("distinct")
        if distinct is not None and distinct.args.get("on") is not None:
            raise self.unsupported("SELECT DISTINCT ON", distinct)
        if node.args.get("offset") is not None:
            raise self.unsupported("OFFSET", node.args["offset"],
                                   "a sketch of rows past an offset cannot be maintained; use ORDER BY ... LIMIT")

    def _with(self, node: exp.Expression, ctes: Mapping[str, _Cte]) -> Mapping[str, _Cte]:
        with_ = node.args.get("with_")
        if with_ is None:
            return ctes
        if with_.args.get("recursive"):
            raise self.unsupported("WITH RECURSIVE", with_)
        env = dict(ctes)
        for cte in with_.expressions:
            alias = cte.args.get("alias")
            name = cte.alias
            columns = tuple(c.name for c in alias.columns) if alias is not None else ()
            # A CTE is inlined at every reference, seeing only the CTEs defined before it.
            env[name.lower()] = _Cte(name, cte.this, columns, dict(env))
        return env

    # FROM, joins and predicate placement

    def _from(self, node: exp.Select, ctes: Mapping[str, _Cte]) -> tuple[_Scope, Plan]:
        items: list[_Item] = []
        ons: list[tuple[exp.Expression, int]] = []  # ON condition, number of FROM items visible to it
        self._add_item(node.args["from_"].this, ctes, items, ons)
        self._add_joins(node.args.get("joins") or [], ctes, items, ons)
        seen: dict[str, _Item] = {}
        for item in items:
            other = seen.get(item.alias.lower())
            if other is not None:
                raise self.error(f"the name {item.alias} is used for two FROM items ({other.label} and "
                                 f"{item.label})", item.node, "give them distinct aliases")
            seen[item.alias.lower()] = item

        scope = _Scope(items)
        conds: list[Expr] = []
        for on, n in ons:
            conds += conjuncts(self._condition(on, _Scope(items[:n]), "ON"))
        where = node.args.get("where")
        if where is not None:
            conds += conjuncts(self._condition(where.this, scope, "WHERE"))
        return scope, self._place(scope, conds)

    def _add_joins(self, joins: Sequence[exp.Join], ctes: Mapping[str, _Cte], items: list[_Item],
                   ons: list[tuple[exp.Expression, int]]) -> None:
        for join in joins:
            self._check_join(join)
            self._add_item(join.this, ctes, items, ons)
            on = join.args.get("on")
            if on is not None:
                ons.append((on, len(items)))

    def _check_join(self, join: exp.Join) -> None:
        side, kind, method = join.side, join.kind, join.method
        if method:
            raise self.unsupported(f"{method} JOIN", join, "write the join condition with ON")
        if kind in ("SEMI", "ANTI"):
            raise self.unsupported(f"{(side + ' ') if side else ''}{kind} JOIN (semi/anti join)", join)
        if side:
            raise self.unsupported(f"{side} OUTER JOIN (outer join)", join, "only inner and cross joins can be "
                                   "maintained incrementally")
        if kind not in ("", "INNER", "CROSS"):
            raise self.unsupported(f"{kind} JOIN", join)
        if join.args.get("using"):
            raise self.unsupported("JOIN ... USING", join, "write the join condition with ON")
        for key, value in join.args.items():
            if value and key not in ("this", "on", "side", "kind", "method", "using", "hint"):
                raise self.unsupported(f"{key.upper()} in a join", join)

    def _add_item(self, node: exp.Expression, ctes: Mapping[str, _Cte], items: list[_Item],
                  ons: list[tuple[exp.Expression, int]]) -> None:
        if isinstance(node, exp.Subquery) and isinstance(node.this, exp.Table):
            # a parenthesized join: inner joins are associative, so its items join the enclosing FROM
            if node.args.get("alias") is not None:
                raise self.unsupported("an alias on a parenthesized join", node)
            node = node.this
        if isinstance(node, exp.Table):
            items.append(self._table_item(node, ctes))
            self._add_joins(node.args.get("joins") or [], ctes, items, ons)
        elif isinstance(node, exp.Subquery):
            alias_node = node.args.get("alias")
            alias = node.alias
            if not alias:
                self._subqueries += 1
                alias = f"__subquery{self._subqueries}"
            columns = tuple(c.name for c in alias_node.columns) if alias_node is not None else ()
            plan, names = self.query(node.this, ctes)
            items.append(self._renamed(plan, names, alias, columns, f"subquery {alias}", node))
        elif isinstance(node, exp.Lateral):
            raise self.unsupported("LATERAL", node)
        elif isinstance(node, exp.Values):
            raise self.unsupported("VALUES in FROM", node, "register the rows as a table")
        elif isinstance(node, exp.Unnest):
            raise self.unsupported("UNNEST", node)
        else:
            raise self.unsupported(f"{node.key.upper()} in FROM", node)

    def _table_item(self, node: exp.Table, ctes: Mapping[str, _Cte]) -> _Item:
        if not isinstance(node.this, exp.Identifier):
            raise self.unsupported("a table-valued function", node)
        for key, value in node.args.items():
            if value and key not in ("this", "alias", "db", "catalog", "joins", "hints"):
                hint = "the platform pins table versions itself" if key in ("version", "system_time") else ""
                raise self.unsupported(_TABLE_ARG_NAMES.get(key, f"{key.upper()} on a table"), node, hint)
        parts = [p.name for p in node.parts]
        name = ".".join(parts)
        alias_node = node.args.get("alias")
        alias = node.alias or node.name
        if len(parts) == 1 and name.lower() in ctes:
            cte = ctes[name.lower()]
            columns = tuple(c.name for c in alias_node.columns) if alias_node is not None else ()
            plan, names = self.query(cte.body, cte.env)
            label = cte.name if alias == cte.name else f"{cte.name} AS {alias}"
            return self._renamed(plan, names, alias, columns or cte.columns, label, node)
        if alias_node is not None and alias_node.columns:
            raise self.unsupported("column aliases on a table", node, "rename the columns in the SELECT list")
        stored = self._lookup_table(name, node, ctes)
        schema = self.tables[stored]
        if not node.alias:
            alias = stored.split(".")[-1]
        scan = Scan(stored, alias, tuple(Field(f.name, f.type) for f in schema))
        label = stored if alias == stored else f"{stored} AS {alias}"
        columns = tuple(_Column(c.name, Col(f.name, f.dtype)) for c, f in zip(scan.columns, scan.schema))
        return _Item(alias, label, scan, columns, node)

    def _lookup_table(self, name: str, node: exp.Expression, ctes: Mapping[str, _Cte]) -> str:
        if name in self.tables:
            return name
        folded = [t for t in self.tables if t.lower() == name.lower()]
        if len(folded) == 1:
            return folded[0]
        if len(folded) > 1:
            raise self.error(f"table name {name} is ambiguous: {', '.join(sorted(folded))} differ only in case",
                             node)
        known = ", ".join(sorted(self.tables)) or "(none)"
        also = f"; CTEs in scope: {', '.join(c.name for c in ctes.values())}" if ctes else ""
        raise self.error(f"unknown table {name}", node, f"registered tables: {known}{also}")

    def _renamed(self, plan: Plan, names: Sequence[str], alias: str, columns: Sequence[str], label: str,
                 node: exp.Expression) -> _Item:
        """A subquery as a FROM item: a Project renaming its output ``x`` to ``alias.x``."""
        if columns:
            if len(columns) != len(names):
                raise self.error(f"{label} has {len(names)} columns but {len(columns)} column aliases", node)
            names_out = _unique_names(columns)
        else:
            names_out = list(names)
        proj = Project(plan, tuple((f"{alias}.{out}", Col(n, f.dtype))
                                   for out, n, f in zip(names_out, names, plan.schema)))
        cols = tuple(_Column(out, Col(f.name, f.dtype)) for out, f in zip(names_out, proj.schema))
        return _Item(alias, label, proj, cols, node)

    def _place(self, scope: _Scope, conds: list[Expr]) -> Plan:
        """Build the join tree of the FROM items with every conjunct pushed as low as it can go."""
        n = len(scope.items)
        local: list[list[Expr]] = [[] for _ in range(n)]
        constant: list[Expr] = []
        multi: list[tuple[Expr, frozenset[int]]] = []
        seen: list[Expr] = []
        for c in conds:
            if c in seen or c == Lit(True, BOOL):
                continue  # `a JOIN b ON x WHERE x` and `JOIN ... ON TRUE`
            seen.append(c)
            refs = frozenset(scope.owner[name] for name in c.columns())
            if not refs:
                constant.append(c)
            elif len(refs) == 1:
                local[next(iter(refs))].append(c)
            else:
                multi.append((c, refs))

        plans = []
        for item, preds in zip(scope.items, local):
            pred = conjoin(preds)
            plans.append(item.plan if pred is None else Select(item.plan, pred))

        # Connected components of the join graph; within one, join items in FROM order, preferring an item that
        # a condition connects to those already joined, so no cross product is built where a join condition exists.
        component = list(range(n))

        def root(i: int) -> int:
            while component[i] != i:
                i = component[i]
            return i

        for _, refs in multi:
            first, *rest = sorted(refs)
            for r in rest:
                component[root(r)] = root(first)
        groups: dict[int, list[int]] = {}
        for i in range(n):
            groups.setdefault(root(i), []).append(i)

        result: Plan | None = None
        for members in sorted(groups.values()):
            joined = {members[0]}
            plan = plans[members[0]]
            remaining = members[1:]
            pending = [m for m in multi if m[1] <= set(members)]
            while remaining:
                pick = next((i for i in remaining if any(i in refs and refs <= joined | {i} for _, refs in pending)),
                            None)
                if pick is None:  # only conditions over three or more items link the rest
                    pick = next((i for i in remaining if any(i in refs and refs & joined for _, refs in pending)),
                                remaining[0])
                joined.add(pick)
                remaining.remove(pick)
                here = [m for m in pending if m[1] <= joined]
                pending = [m for m in pending if not m[1] <= joined]
                plan = Join(plan, plans[pick], conjoin([c for c, _ in here]))
            result = plan if result is None else Join(result, plan)
        assert result is not None
        if constant:
            result = Select(result, conjoin(constant))  # type: ignore[arg-type]
        return result

    # SELECT list, GROUP BY, ORDER BY, LIMIT

    def _select_items(self, node: exp.Select, scope: _Scope) -> list[_SelectItem]:
        items: list[_SelectItem] = []
        for pos, e in enumerate(node.expressions):
            if isinstance(e, exp.Star) or (isinstance(e, exp.Column) and isinstance(e.this, exp.Star)):
                star = e if isinstance(e, exp.Star) else e.this
                extra = [k for k, v in star.args.items() if v]
                if extra:
                    raise self.unsupported(f"SELECT * {extra[0].rstrip('_').upper()}", e)
                if isinstance(e, exp.Star):
                    sources = scope.items
                else:
                    found = scope.item(e.table)
                    if found is None:
                        raise self.error(f"{e.table}.* does not name a FROM item", e, f"FROM has {scope.describe()}")
                    sources = (found,)
                items += [_SelectItem(c.name, c.col, False) for item in sources for c in item.columns]
                continue
            if isinstance(e, exp.Alias):
                items.append(_SelectItem(e.alias, self._expr(e.this, scope, "SELECT", allow_aggs=True), True))
                continue
            ir = self._expr(e, scope, "SELECT", allow_aggs=True)
            if isinstance(e, exp.Column) and isinstance(ir, Col):
                items.append(_SelectItem(scope.bare[ir.name], ir, False))
            else:
                items.append(_SelectItem(f"_c{pos}", ir, False))
        return items

    def _group_by(self, group: exp.Group, scope: _Scope, items: list[_SelectItem],
                  aliases: dict[str, Expr]) -> list[Expr]:
        for key in ("grouping_sets", "cube", "rollup", "totals"):
            if group.args.get(key):
                raise self.unsupported(f"GROUP BY ... WITH {key.upper().replace('_', ' ')}", group)
        if group.args.get("all"):
            raise self.unsupported("GROUP BY ALL", group, "list the grouping columns")
        keys: list[Expr] = []
        for g in group.expressions:
            if isinstance(g, (exp.Rollup, exp.Cube, exp.GroupingSets)):
                raise self.unsupported(g.key.upper().replace("GROUPINGSETS", "GROUPING SETS"), g)
            if isinstance(g, exp.Literal) and not g.is_string and g.is_int:
                k = self._ordinal(g, items, "GROUP BY")
                e = items[k].expr
                if e.has_aggregate():
                    raise self.error(f"GROUP BY {k + 1} refers to an aggregate", g)
            else:
                e = self._expr(g, scope, "GROUP BY", aliases)
                if e.has_aggregate():
                    raise self.error("aggregate functions are not allowed in GROUP BY", g)
            if e not in keys:
                keys.append(e)
        return keys

    def _ordinal(self, node: exp.Literal, items: list[_SelectItem], clause: str) -> int:
        k = int(node.this)
        if not 1 <= k <= len(items):
            raise self.error(f"{clause} position {k} is not in the select list (1..{len(items)})", node)
        return k - 1

    def _order_by(self, order: exp.Order, scope: _Scope, items: list[_SelectItem],
                  aliases: dict[str, Expr]) -> list[_OrderItem]:
        out = []
        for o in order.expressions:
            if o.args.get("with_fill"):
                raise self.unsupported("ORDER BY ... WITH FILL", o)
            desc = bool(o.args.get("desc"))
            nulls_first = o.args.get("nulls_first")
            # sqlglot fills in the dialect's default; keep None when it equals Spark's (NULLs smallest) so only
            # an order that differs from the default is spelled out in the plan.
            nulls = None if nulls_first is None or bool(nulls_first) == (not desc) else bool(nulls_first)
            e = o.this
            if isinstance(e, exp.Literal) and not e.is_string and e.is_int:
                out.append(_OrderItem(self._ordinal(e, items, "ORDER BY"), None, desc, nulls))
                continue
            if isinstance(e, exp.Column) and not e.table and isinstance(e.this, exp.Identifier):
                # Spark resolves a bare name in ORDER BY against the select list first.
                hits = [i for i, it in enumerate(items) if it.name == e.name] or \
                       [i for i, it in enumerate(items) if it.name.lower() == e.name.lower()]
                if len({items[i].expr for i in hits}) > 1:
                    raise self.error(f"ORDER BY {e.name} is ambiguous: several select items are named so", e)
                if hits:
                    out.append(_OrderItem(hits[0], None, desc, nulls))
                    continue
            out.append(_OrderItem(None, self._expr(e, scope, "ORDER BY", aliases, allow_aggs=True), desc, nulls))
        return out

    def _limit(self, node: exp.Select) -> int | None:
        limit = node.args.get("limit")
        if limit is None:
            return None
        if isinstance(limit, exp.Fetch):
            options = limit.args.get("limit_options")
            if options is not None and (options.args.get("percent") or options.args.get("with_ties")):
                raise self.unsupported("FETCH ... PERCENT / WITH TIES", limit)
            value = limit.args.get("count")
            if value is None:
                return 1  # FETCH FIRST ROW ONLY
        else:
            if limit.args.get("offset") is not None:
                raise self.unsupported("OFFSET", limit, "a sketch of rows past an offset cannot be maintained")
            if limit.args.get("expressions"):
                raise self.unsupported("LIMIT BY", limit)
            value = limit.expression
        if not (isinstance(value, exp.Literal) and not value.is_string and value.is_int):
            raise self.unsupported("a LIMIT that is not an integer constant", limit)
        return int(value.this)

    def _aggregate(self, source: Plan, scope: _Scope, items: list[_SelectItem], keys: list[Expr],
                   having: Expr | None, order: list[_OrderItem], node: exp.Select
                   ) -> tuple[Plan, list[Expr], Expr | None, list[Expr | None]]:
        """The Aggregate node, and the SELECT / HAVING / ORDER BY expressions rewritten over its outputs."""
        used: set[str] = set()
        key_names = []
        for i, k in enumerate(keys):
            cands = [it.name for it in items if it.alias and it.expr == k][:1]
            if isinstance(k, Col):
                bare = scope.bare.get(k.name, k.name)
                same = [o for o in keys if isinstance(o, Col) and
                        scope.bare.get(o.name, o.name).lower() == bare.lower()]
                if len(same) == 1:
                    cands.append(bare)
                cands.append(k.name)
            cands.append(f"__key{i}")
            key_names.append(_free_name(cands, used))

        aggs: list[AggCall] = []
        for e in [it.expr for it in items] + [having] + [o.expr for o in order]:
            for sub in (e.walk() if e is not None else ()):
                if isinstance(sub, AggCall) and sub not in aggs:
                    aggs.append(sub)
        agg_names = [_free_name([it.name for it in items if it.alias and it.expr == a][:1] + [f"__agg{i}"], used)
                     for i, a in enumerate(aggs)]

        agg = Aggregate(source, tuple(zip(key_names, keys)), tuple(zip(agg_names, aggs)))
        mapping: dict[Expr, Expr] = {k: Col(n, k.dtype) for n, k in zip(key_names, keys)}
        mapping.update({a: Col(n, a.dtype) for n, a in zip(agg_names, aggs)})
        grouped = set(keys)

        def over_groups(e: Expr, what: str, at: exp.Expression) -> Expr:
            col = _ungrouped(e, grouped)
            if col is not None:
                bare = scope.bare[col.name]
                at = next((c for c in at.find_all(exp.Column) if c.name.lower() == bare.lower()), at)
                raise self.error(f"{what}: column {col.name} is neither in GROUP BY nor inside an aggregate "
                                 "function", at,
                                 f"add it to GROUP BY or aggregate it, e.g. MAX({bare})")
            return substitute(e, mapping)

        select_nodes = node.expressions
        item_exprs = []
        for it in items:
            at = next((s for s in select_nodes if s.alias_or_name == it.name), node)
            item_exprs.append(over_groups(it.expr, f"SELECT item {it.name}", at))
        new_having = over_groups(having, "HAVING", node.args["having"]) if having is not None else None
        order_exprs: list[Expr | None] = [
            over_groups(o.expr, "ORDER BY", node.args["order"]) if o.expr is not None else None for o in order]
        return agg, item_exprs, new_having, order_exprs

    # expressions

    def _expr(self, node: exp.Expression, scope: _Scope, clause: str, aliases: dict[str, Expr] | None = None,
              allow_aggs: bool = False) -> Expr:
        return _Exprs(self, scope, clause, aliases or {}, allow_aggs)(node)

    def _condition(self, node: exp.Expression, scope: _Scope, clause: str, aliases: dict[str, Expr] | None = None,
                   allow_aggs: bool = False) -> Expr:
        e = self._expr(node, scope, clause, aliases, allow_aggs)
        if e.dtype not in (BOOL, pa.null()):
            raise self.error(f"the {clause} condition must be boolean, got an expression of type {e.dtype}", node)
        return e


class _Exprs:
    """Translates sqlglot expressions of one clause into IR expressions over a scope.

    A node is handled by the method named ``_<sqlglot class name>`` if there is one, else by the tables above
    (comparisons, arithmetic, functions, EXTRACT-like functions, aggregates); anything else is unsupported.
    """

    def __init__(self, builder: _Builder, scope: _Scope, clause: str, aliases: dict[str, Expr],
                 allow_aggs: bool) -> None:
        self.b = builder
        self.scope = scope
        self.clause = clause
        self.aliases = aliases
        self.allow_aggs = allow_aggs

    def __call__(self, node: exp.Expression) -> Expr:
        try:
            return self._translate(node)
        except PlanError as e:
            if getattr(e, "located", False):
                raise
            # an IR constructor rejected what this node builds (type error, unsupported field, ...)
            raise _located(type(e)(f"{e} {self.b.where(node)}")) from e

    def _translate(self, node: exp.Expression) -> Expr:
        handler = getattr(self, f"_{type(node).__name__}", None)
        if handler is not None:
            return handler(node)
        if type(node) in _CMP:
            left, right = self._coerce(self(node.this), self(node.expression), node)
            return Binary(_CMP[type(node)], left, right)
        if type(node) in _ARITH:
            return self._arith(node)
        if type(node) in _FUNCS:
            return self._func(node)
        if type(node) in _EXTRACT_FUNCS:
            return Extract(_EXTRACT_FUNCS[type(node)], self._temporal_arg(node.this))
        if type(node) in _AGGS:
            return self._agg(node)
        if isinstance(node, exp.AggFunc):
            raise self.b.unsupported(f"aggregate function {node.sql_name()}", node,
                                     "supported: SUM, COUNT, COUNT(*), AVG, MIN, MAX")
        if isinstance(node, (exp.Query, exp.Exists)):
            raise self.b.unsupported(f"a subquery in {self.clause}", node,
                                     "only subqueries in FROM are supported; rewrite it as a join")
        if isinstance(node, (exp.Placeholder, exp.Parameter)):
            raise self.b.unsupported("a query parameter", node, "write the constant into the query")
        if type(node) in _NODE_NAMES:
            raise self.b.unsupported(_NODE_NAMES[type(node)], node)
        if isinstance(node, exp.Func):
            raise self.b.unsupported(f"function {node.sql_name()}", node,
                                     f"supported functions: {', '.join(sorted(FUNCTIONS))}")
        raise self.b.unsupported(f"the expression {node.key.upper()}", node)

    # leaves

    def _Column(self, node: exp.Column) -> Expr:
        if isinstance(node.this, exp.Star):
            raise self.b.error(f"* is only allowed in the select list and COUNT(*), not in {self.clause}", node)
        name = node.name
        if node.table:
            item = self.scope.item(node.table)
            if item is None:
                raise self.b.error(f"table or alias {node.table} is not in the FROM clause", node,
                                   f"FROM has {self.scope.describe()}")
            col = item.find(name)
            if col is None:
                raise self.b.error(f"column {node.table}.{name} does not exist in {item.label}", node,
                                   f"available: {', '.join(c.name for c in item.columns)}")
            return col.col
        hits = [c for c in (item.find(name) for item in self.scope.items) if c is not None]
        if len(hits) > 1:
            raise self.b.error(f"column {name} is ambiguous: {', '.join(c.col.name for c in hits)}", node,
                               "qualify it with a table name or alias")
        if hits:
            return hits[0].col
        if name.lower() in self.aliases:
            return self.aliases[name.lower()]
        available = ", ".join(c.col.name for item in self.scope.items for c in item.columns)
        raise self.b.error(f"column {name} does not exist in {self.scope.describe()}", node,
                           f"available: {available}")

    def _Star(self, node: exp.Star) -> Expr:
        raise self.b.error(f"* is only allowed in the select list and COUNT(*), not in {self.clause}", node)

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
            raise self.b.unsupported(f"the literal {text}", node) from None

    def _Boolean(self, node: exp.Boolean) -> Expr:
        return Lit.of(bool(node.this))

    def _Null(self, node: exp.Null) -> Expr:
        return Lit.of(None)

    def _Interval(self, node: exp.Interval) -> Expr:
        raise self.b.error("an INTERVAL can only be added to or subtracted from a date or timestamp", node)

    def _interval(self, node: exp.Interval) -> Interval:
        unit = node.args.get("unit")
        unit_name = _INTERVAL_UNITS.get(unit.name.lower()) if unit is not None else None
        value = node.this
        if unit_name is None:
            raise self.b.unsupported(f"the interval {node.sql(dialect=self.b.dialect)}", node,
                                     "use INTERVAL 'n' DAY/WEEK/MONTH/YEAR/HOUR/MINUTE/SECOND")
        text = value.name if isinstance(value, exp.Literal) else None
        if isinstance(value, exp.Neg) and isinstance(value.this, exp.Literal):
            text = "-" + value.this.name
        if text is None or not re.fullmatch(r"\s*[-+]?\d+\s*", text):
            raise self.b.unsupported("an INTERVAL whose amount is not an integer constant", node)
        return Interval(int(text), unit_name)

    # operators

    def _arith(self, node: exp.Expression) -> Expr:
        op = _ARITH[type(node)]
        left = self._interval(node.this) if isinstance(node.this, exp.Interval) else self(node.this)
        right = self._interval(node.expression) if isinstance(node.expression, exp.Interval) else \
            self(node.expression)
        if op in ("+", "-"):
            # fold `DATE '1994-01-01' + INTERVAL '1' YEAR` so later steps (sketch use, pruning) see a constant
            if isinstance(right, Interval) and isinstance(left, Lit) and isinstance(left.value, dt.date):
                shifted = _shift(left.value, op, right)
                if shifted is not None:
                    return Lit(shifted, left.dtype)
            if op == "+" and isinstance(left, Interval) and isinstance(right, Lit) and \
                    isinstance(right.value, dt.date):
                shifted = _shift(right.value, op, left)
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
            raise self.b.unsupported(f"IS {node.expression.sql(dialect=self.b.dialect)}", node,
                                     "write the comparison with = and COALESCE")
        return IsNull(self(node.this), negated != bool(node.args.get("negate")))

    def _In(self, node: exp.In, negated: bool = False) -> Expr:
        if node.args.get("query") is not None:
            raise self.b.unsupported(f"IN (subquery) in {self.clause}", node, "rewrite it as a join")
        if node.args.get("unnest") is not None or node.args.get("field") is not None:
            raise self.b.unsupported("IN over an array", node)
        arg = self(node.this)
        values = [self._coerce(arg, self(v), v)[1] for v in node.expressions]
        return InList(arg, tuple(values), negated)

    def _Between(self, node: exp.Between, negated: bool = False) -> Expr:
        if node.args.get("symmetric"):
            raise self.b.unsupported("BETWEEN SYMMETRIC", node)
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
            raise self.b.unsupported("LIKE with a pattern that is not a string constant", node)
        return Like(self(node.this), pattern.this, negated != bool(node.args.get("negate")),
                    isinstance(node, exp.ILike))

    def _Escape(self, node: exp.Escape) -> Expr:
        raise self.b.unsupported("LIKE ... ESCAPE", node)

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

    def _Cast(self, node: exp.Cast) -> Expr:
        for key in ("format", "action", "default"):
            if node.args.get(key) is not None:
                raise self.b.unsupported(f"CAST with {key.upper()}", node)
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

    def _type(self, node: exp.DataType, at: exp.Expression) -> pa.DataType:
        t = node.this
        if t in _NUMBER_TYPES:
            return _NUMBER_TYPES[t]
        if t in _STRING_TYPES:
            return STRING
        if t == exp.DataType.Type.DATE:
            return DATE
        if t in _TIMESTAMP_TYPES:
            return TIMESTAMP
        if t == exp.DataType.Type.BOOLEAN:
            return BOOL
        if t == exp.DataType.Type.DECIMAL:
            params = [p.this for p in node.expressions]
            if not params:
                return pa.decimal128(10, 0) if self.b.dialect in _SPARK_LIKE else pa.decimal128(38, 18)
            try:
                precision = int(params[0].this)
                scale = int(params[1].this) if len(params) > 1 else 0
                return pa.decimal128(precision, scale)
            except (ValueError, AttributeError, IndexError) as e:
                raise self.b.error(f"invalid DECIMAL type {node.sql(dialect=self.b.dialect)}", at) from e
        raise self.b.unsupported(f"CAST to {node.sql(dialect=self.b.dialect)}", at,
                                 "supported: TINYINT/SMALLINT/INT/BIGINT, FLOAT/DOUBLE, DECIMAL(p,s), STRING/VARCHAR, "
                                 "DATE, TIMESTAMP, BOOLEAN")

    def _temporal_lit(self, text: str, to: pa.DataType, node: exp.Expression, safe: bool = False) -> Lit:
        # Spark's reading of the text (imp_core.plan.values), not Python's: '2024-1-5' is a date, '20240105' not
        value: dt.date | None = string_to_date(text) if to == DATE else string_to_timestamp(text)
        if value is None:
            if safe:
                return Lit(None, to)
            kind = "date ('yyyy-mm-dd')" if to == DATE else "timestamp ('yyyy-mm-dd hh:mm:ss[.ffffff]')"
            raise self.b.error(f"'{text}' is not a valid {kind}", node)
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
        raise self.b.error(f"TO_DATE needs a string, date or timestamp, got {arg.dtype}", node)

    def _check_date_format(self, node: exp.Expression) -> None:
        fmt = node.args.get("format")
        if fmt is None:
            return
        if not (isinstance(fmt, exp.Literal) and fmt.is_string and fmt.this in _iso_date_formats(self.b.dialect)):
            raise self.b.unsupported("a TO_DATE format other than 'YYYY-MM-DD' / 'yyyy-MM-dd'", node)

    def _TsOrDsToDate(self, node: exp.TsOrDsToDate) -> Expr:
        self._check_date_format(node)
        return self._to_date(self(node.this), node)

    def _StrToDate(self, node: exp.StrToDate) -> Expr:
        self._check_date_format(node)
        return self._to_date(self(node.this), node)

    def _Date(self, node: exp.Date) -> Expr:
        if node.expressions or node.args.get("zone") is not None:
            raise self.b.unsupported("DATE() with more than one argument", node)
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
        return Extract(_EXTRACT_FIELDS.get(name, name), self._temporal_arg(node.expression))

    def _day_unit(self, node: exp.Expression) -> None:
        unit = node.args.get("unit")
        if unit is not None and unit.name.upper() not in ("DAY", "DAYS"):
            raise self.b.unsupported(f"{node.sql_name()} with unit {unit.name}", node,
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
                raise self.b.unsupported(f"DATEDIFF with {key.upper()}", node)
        # Spark's argument order: datediff(end, start) = end - start in days
        return Func("datediff", (self._date_arg(node.this), self._date_arg(node.expression)))

    # functions and aggregates

    def _func(self, node: exp.Expression) -> Expr:
        name, keys = _FUNCS[type(node)]
        for key, value in node.args.items():
            if value and key not in keys and not (key == "expressions" and "*" in keys) and \
                    key not in _IGNORED_FUNC_ARGS:
                raise self.b.unsupported(f"{node.sql_name()} with {key.upper()}", node)
        args: list[Expr] = []
        for key in keys:
            if key == "*":
                args += [self(a) for a in node.expressions]
            elif node.args.get(key) is not None:
                args.append(self(node.args[key]))
        return Func(name, tuple(args))

    def _Trim(self, node: exp.Trim) -> Expr:
        if node.args.get("expression") is not None or node.args.get("collation") is not None:
            raise self.b.unsupported("TRIM of characters other than spaces", node)
        position = (node.text("position") or "BOTH").upper()
        name = {"LEADING": "ltrim", "TRAILING": "rtrim"}.get(position, "trim")
        return Func(name, (self(node.this),))

    def _Anonymous(self, node: exp.Anonymous) -> Expr:
        name = node.name.lower()
        name = _FUNC_ALIASES.get(name, name)
        if name in FUNCTIONS:
            return Func(name, tuple(self(a) for a in node.expressions))
        raise self.b.unsupported(f"function {node.name.upper()}", node,
                                 f"supported functions: {', '.join(sorted(FUNCTIONS))}")

    def _agg(self, node: exp.Expression) -> Expr:
        func = _AGGS[type(node)]
        if not self.allow_aggs:
            hint = " (use HAVING)" if self.clause == "WHERE" else ""
            raise self.b.error(f"aggregate functions are not allowed in {self.clause}{hint}", node)
        arg = node.this
        if isinstance(arg, exp.Distinct):
            raise self.b.unsupported(f"{func.upper()}(DISTINCT ...) (a DISTINCT aggregate)", node,
                                     "aggregate over a SELECT DISTINCT subquery instead")
        if node.expressions:
            raise self.b.unsupported(f"{func.upper()} with several arguments", node)
        if isinstance(arg, exp.Star):
            if func != "count":
                raise self.b.error(f"{func.upper()}(*) is not valid; only COUNT(*)", node)
            return AggCall("count", None)
        if arg is None:
            raise self.b.error(f"{func.upper()} needs an argument", node)
        return AggCall(func, self(arg))  # a nested aggregate in `arg` is rejected by AggCall

    def _Filter(self, node: exp.Filter) -> Expr:
        raise self.b.unsupported("an aggregate with FILTER (WHERE ...)", node, "use SUM(CASE WHEN ... END)")

    def _Window(self, node: exp.Window) -> Expr:
        raise self.b.unsupported("window function (OVER ...)", node)

    def _Alias(self, node: exp.Alias) -> Expr:
        raise self.b.error(f"an alias (AS {node.alias}) is only allowed on a select item", node)

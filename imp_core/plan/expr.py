"""Scalar and aggregate expressions of the relational-algebra IR.

Expressions are frozen values. Each knows its result type (an Arrow type), derived once at construction with
Spark's typing rules (``int / int`` is a double, decimals keep exact scale for ``+ - *``, a decimal meeting a double
becomes a double), so the Spark compiler and the in-memory evaluator can both be told exactly what to produce.
Column references use the plan's internal column names (``alias.column`` for scanned columns).
"""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from imp_core.errors import PlanError, UnsupportedError

INT = pa.int64()
FLOAT = pa.float64()
BOOL = pa.bool_()
STRING = pa.string()
DATE = pa.date32()
TIMESTAMP = pa.timestamp("us")
NULL = pa.null()

ARITH_OPS = ("+", "-", "*", "/", "%")
CMP_OPS = ("=", "<>", "<", "<=", ">", ">=")
BOOL_OPS = ("and", "or")
AGG_FUNCS = ("sum", "count", "avg", "min", "max")


def is_numeric(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)


def is_temporal(t: pa.DataType) -> bool:
    return pa.types.is_date(t) or pa.types.is_timestamp(t)


def kind_of_type(t: pa.DataType) -> str:
    """The partition kind of a column type (see ``imp_core.sketch.partition``)."""
    if pa.types.is_integer(t):
        return "int"
    if pa.types.is_floating(t):
        return "float"
    if pa.types.is_decimal(t):
        return "decimal"
    if pa.types.is_date(t):
        return "date"
    if pa.types.is_timestamp(t):
        return "timestamp"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    return str(t)


def numeric_result(op: str, a: pa.DataType, b: pa.DataType) -> pa.DataType:
    """Result type of ``a op b`` for numeric operands (Spark's rules, simplified)."""
    if a == NULL:
        a = b
    if b == NULL:
        b = a
    if op == "/":
        return FLOAT
    if pa.types.is_floating(a) or pa.types.is_floating(b):
        return FLOAT
    if pa.types.is_decimal(a) or pa.types.is_decimal(b):
        pa_, sa = _dec(a)
        pb, sb = _dec(b)
        if op == "*":
            scale = min(sa + sb, 18)
            return pa.decimal128(38, scale)
        if op == "%":
            return pa.decimal128(38, max(sa, sb))
        return pa.decimal128(38, max(sa, sb))
    return INT


def _dec(t: pa.DataType) -> tuple[int, int]:
    if pa.types.is_decimal(t):
        return t.precision, t.scale
    return 19, 0  # integers behave like decimal(19, 0)


def common_type(a: pa.DataType, b: pa.DataType) -> pa.DataType:
    """Type both sides of a comparison / CASE branch / IN list are brought to."""
    if a == b or b == NULL:
        return a
    if a == NULL:
        return b
    if is_numeric(a) and is_numeric(b):
        return numeric_result("+", a, b)
    if is_temporal(a) and is_temporal(b):
        return TIMESTAMP
    if is_temporal(a) and pa.types.is_string(b):
        return a
    if is_temporal(b) and pa.types.is_string(a):
        return b
    raise PlanError(f"cannot compare or combine values of types {a} and {b}; add a CAST")


class Expr:
    """Base class of scalar expressions; subclasses are frozen dataclasses with a derived ``dtype``."""

    __slots__ = ()
    dtype: pa.DataType

    def children(self) -> tuple[Expr, ...]:
        return ()

    def walk(self) -> Iterator[Expr]:
        yield self
        for c in self.children():
            yield from c.walk()

    def columns(self) -> set[str]:
        return {e.name for e in self.walk() if isinstance(e, Col)}

    def has_aggregate(self) -> bool:
        return any(isinstance(e, AggCall) for e in self.walk())

    def _set_type(self, t: pa.DataType) -> None:
        object.__setattr__(self, "dtype", t)


@dataclass(frozen=True, slots=True)
class Col(Expr):
    name: str
    dtype: pa.DataType = field(compare=False)

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True, slots=True)
class Lit(Expr):
    value: Any
    dtype: pa.DataType = field(default=NULL)

    @staticmethod
    def of(value: Any) -> Lit:
        if value is None:
            return Lit(None, NULL)
        if isinstance(value, bool):
            return Lit(value, BOOL)
        if isinstance(value, int):
            return Lit(value, INT)
        if isinstance(value, float):
            return Lit(value, FLOAT)
        if isinstance(value, decimal.Decimal):
            exp = value.as_tuple().exponent
            scale = max(0, -exp) if isinstance(exp, int) else 0
            return Lit(value, pa.decimal128(38, min(scale, 18)))
        if isinstance(value, dt.datetime):
            return Lit(value, TIMESTAMP)
        if isinstance(value, dt.date):
            return Lit(value, DATE)
        if isinstance(value, str):
            return Lit(value, STRING)
        raise UnsupportedError(f"unsupported literal {value!r}")

    def __str__(self) -> str:
        v = self.value
        if v is None:
            return "NULL"
        if isinstance(v, bool):
            return str(v).upper()
        if isinstance(v, dt.datetime):
            return f"TIMESTAMP '{v.isoformat(sep=' ')}'"
        if isinstance(v, dt.date):
            return f"DATE '{v.isoformat()}'"
        return repr(v) if isinstance(v, str) else str(v)


@dataclass(frozen=True, slots=True)
class Interval(Expr):
    """An interval literal; only valid on the right of ``date/timestamp +/- interval``."""

    value: int
    unit: str  # day | month | year | hour | minute | second | week
    dtype: pa.DataType = field(default=pa.month_day_nano_interval(), compare=False)

    def __str__(self) -> str:
        return f"INTERVAL '{self.value}' {self.unit.upper()}"


@dataclass(frozen=True, slots=True)
class Unary(Expr):
    op: str  # neg | not
    arg: Expr
    dtype: pa.DataType = field(default=NULL, compare=False)

    def __post_init__(self) -> None:
        if self.op == "not":
            _require_bool(self.arg, "NOT")
            self._set_type(BOOL)
        elif self.op == "neg":
            if not is_numeric(self.arg.dtype) and self.arg.dtype != NULL:
                raise PlanError(f"cannot negate a value of type {self.arg.dtype}")
            self._set_type(self.arg.dtype)
        else:
            raise PlanError(f"unknown unary operator {self.op}")

    def children(self) -> tuple[Expr, ...]:
        return (self.arg,)

    def __str__(self) -> str:
        return f"(-{self.arg})" if self.op == "neg" else f"(NOT {self.arg})"


@dataclass(frozen=True, slots=True)
class Binary(Expr):
    op: str
    left: Expr
    right: Expr
    dtype: pa.DataType = field(default=NULL, compare=False)

    def __post_init__(self) -> None:
        lt, rt = self.left.dtype, self.right.dtype
        if self.op in BOOL_OPS:
            _require_bool(self.left, self.op.upper())
            _require_bool(self.right, self.op.upper())
            self._set_type(BOOL)
        elif self.op in CMP_OPS:
            common_type(lt, rt)
            self._set_type(BOOL)
        elif self.op in ARITH_OPS:
            if isinstance(self.right, Interval) or isinstance(self.left, Interval):
                base = self.left if isinstance(self.right, Interval) else self.right
                if self.op not in ("+", "-") or not is_temporal(base.dtype):
                    raise PlanError("an INTERVAL can only be added to or subtracted from a date or timestamp")
                if isinstance(self.left, Interval) and self.op == "-":
                    raise PlanError("cannot subtract a date from an INTERVAL")
                self._set_type(base.dtype)
            elif is_temporal(lt) and self.op == "-" and is_temporal(rt):
                self._set_type(INT)  # days between two dates
            elif is_temporal(lt) and pa.types.is_integer(rt) and self.op in ("+", "-"):
                self._set_type(lt)  # date + n days
            elif (is_numeric(lt) or lt == NULL) and (is_numeric(rt) or rt == NULL):
                self._set_type(numeric_result(self.op, lt, rt))
            else:
                raise PlanError(f"operator {self.op} is not defined for types {lt} and {rt}")
        else:
            raise PlanError(f"unknown operator {self.op}")

    def children(self) -> tuple[Expr, ...]:
        return (self.left, self.right)

    def __str__(self) -> str:
        return f"({self.left} {self.op} {self.right})"


@dataclass(frozen=True, slots=True)
class IsNull(Expr):
    arg: Expr
    negated: bool = False
    dtype: pa.DataType = field(default=BOOL, compare=False)

    def children(self) -> tuple[Expr, ...]:
        return (self.arg,)

    def __str__(self) -> str:
        return f"({self.arg} IS {'NOT ' if self.negated else ''}NULL)"


@dataclass(frozen=True, slots=True)
class InList(Expr):
    arg: Expr
    items: tuple[Expr, ...]
    negated: bool = False
    dtype: pa.DataType = field(default=BOOL, compare=False)

    def __post_init__(self) -> None:
        for item in self.items:
            common_type(self.arg.dtype, item.dtype)

    def children(self) -> tuple[Expr, ...]:
        return (self.arg, *self.items)

    def __str__(self) -> str:
        return f"({self.arg} {'NOT ' if self.negated else ''}IN ({', '.join(map(str, self.items))}))"


@dataclass(frozen=True, slots=True)
class Between(Expr):
    arg: Expr
    low: Expr
    high: Expr
    negated: bool = False
    dtype: pa.DataType = field(default=BOOL, compare=False)

    def __post_init__(self) -> None:
        common_type(self.arg.dtype, self.low.dtype)
        common_type(self.arg.dtype, self.high.dtype)

    def children(self) -> tuple[Expr, ...]:
        return (self.arg, self.low, self.high)

    def __str__(self) -> str:
        return f"({self.arg} {'NOT ' if self.negated else ''}BETWEEN {self.low} AND {self.high})"


@dataclass(frozen=True, slots=True)
class Like(Expr):
    arg: Expr
    pattern: str
    negated: bool = False
    case_insensitive: bool = False
    dtype: pa.DataType = field(default=BOOL, compare=False)

    def __post_init__(self) -> None:
        if not (pa.types.is_string(self.arg.dtype) or self.arg.dtype == NULL):
            raise PlanError(f"LIKE needs a string, got {self.arg.dtype}")

    def children(self) -> tuple[Expr, ...]:
        return (self.arg,)

    def __str__(self) -> str:
        op = "ILIKE" if self.case_insensitive else "LIKE"
        return f"({self.arg} {'NOT ' if self.negated else ''}{op} {self.pattern!r})"


@dataclass(frozen=True, slots=True)
class Case(Expr):
    whens: tuple[tuple[Expr, Expr], ...]
    default: Expr | None = None
    dtype: pa.DataType = field(default=NULL, compare=False)

    def __post_init__(self) -> None:
        t = NULL
        for cond, value in self.whens:
            _require_bool(cond, "CASE WHEN")
            t = common_type(t, value.dtype)
        if self.default is not None:
            t = common_type(t, self.default.dtype)
        self._set_type(t)

    def children(self) -> tuple[Expr, ...]:
        out: list[Expr] = []
        for c, v in self.whens:
            out += [c, v]
        if self.default is not None:
            out.append(self.default)
        return tuple(out)

    def __str__(self) -> str:
        whens = " ".join(f"WHEN {c} THEN {v}" for c, v in self.whens)
        return f"CASE {whens}{'' if self.default is None else f' ELSE {self.default}'} END"


@dataclass(frozen=True, slots=True)
class Cast(Expr):
    arg: Expr
    to: pa.DataType

    @property
    def dtype(self) -> pa.DataType:  # type: ignore[override]
        return self.to

    def children(self) -> tuple[Expr, ...]:
        return (self.arg,)

    def __str__(self) -> str:
        return f"CAST({self.arg} AS {self.to})"


# name -> (min args, max args); result types are derived in Func.__post_init__
FUNCTIONS: dict[str, tuple[int, int]] = {
    "upper": (1, 1), "lower": (1, 1), "length": (1, 1), "trim": (1, 1), "ltrim": (1, 1), "rtrim": (1, 1),
    "substring": (2, 3), "concat": (1, 64), "coalesce": (1, 64), "abs": (1, 1), "round": (1, 2),
    "floor": (1, 1), "ceil": (1, 1), "date_add": (2, 2), "date_sub": (2, 2), "datediff": (2, 2),
    "greatest": (2, 64), "least": (2, 64), "nullif": (2, 2), "replace": (3, 3), "sqrt": (1, 1),
    "ln": (1, 1), "exp": (1, 1), "power": (2, 2), "sign": (1, 1),
}
EXTRACT_FIELDS = ("year", "quarter", "month", "week", "day", "dayofweek", "dayofyear", "hour", "minute", "second")


@dataclass(frozen=True, slots=True)
class Func(Expr):
    name: str
    args: tuple[Expr, ...]
    dtype: pa.DataType = field(default=NULL, compare=False)

    def __post_init__(self) -> None:
        if self.name not in FUNCTIONS:
            raise UnsupportedError(f"function {self.name.upper()} is not supported")
        lo, hi = FUNCTIONS[self.name]
        if not lo <= len(self.args) <= hi:
            raise PlanError(f"{self.name.upper()} takes {lo}..{hi} arguments, got {len(self.args)}")
        a = self.args
        n = self.name
        if n in ("upper", "lower", "trim", "ltrim", "rtrim", "substring", "concat", "replace"):
            t = STRING
        elif n in ("length", "datediff"):
            t = INT
        elif n in ("coalesce", "greatest", "least"):
            t = NULL
            for x in a:
                t = common_type(t, x.dtype)
        elif n == "nullif":
            t = a[0].dtype
        elif n in ("abs", "sign"):
            t = a[0].dtype
        elif n in ("floor", "ceil"):
            t = INT if not pa.types.is_decimal(a[0].dtype) else pa.decimal128(38, 0)
        elif n == "round":
            t = a[0].dtype
        elif n in ("date_add", "date_sub"):
            t = DATE
        else:
            t = FLOAT
        self._set_type(t)

    def children(self) -> tuple[Expr, ...]:
        return self.args

    def __str__(self) -> str:
        return f"{self.name}({', '.join(map(str, self.args))})"


@dataclass(frozen=True, slots=True)
class Extract(Expr):
    field_: str
    arg: Expr
    dtype: pa.DataType = field(default=INT, compare=False)

    def __post_init__(self) -> None:
        if self.field_ not in EXTRACT_FIELDS:
            raise UnsupportedError(f"EXTRACT({self.field_.upper()} ...) is not supported; supported fields: "
                                   f"{', '.join(f.upper() for f in EXTRACT_FIELDS)}")
        if not is_temporal(self.arg.dtype):
            raise PlanError(f"EXTRACT needs a date or timestamp, got {self.arg.dtype}")

    def children(self) -> tuple[Expr, ...]:
        return (self.arg,)

    def __str__(self) -> str:
        return f"EXTRACT({self.field_.upper()} FROM {self.arg})"


@dataclass(frozen=True, slots=True)
class AggCall(Expr):
    """``func(arg)``; ``arg`` is None for ``COUNT(*)``. Only valid inside an Aggregate node."""

    func: str
    arg: Expr | None
    dtype: pa.DataType = field(default=NULL, compare=False)

    def __post_init__(self) -> None:
        if self.func not in AGG_FUNCS:
            raise UnsupportedError(f"aggregate {self.func.upper()} is not supported; supported: "
                                   f"{', '.join(f.upper() for f in AGG_FUNCS)}")
        if self.arg is None:
            if self.func != "count":
                raise PlanError(f"{self.func.upper()}(*) is not valid; only COUNT(*)")
            self._set_type(INT)
            return
        if self.arg.has_aggregate():
            raise UnsupportedError("nested aggregate functions are not supported")
        t = self.arg.dtype
        if self.func == "count":
            self._set_type(INT)
        elif self.func == "avg":
            if not is_numeric(t):
                raise PlanError(f"AVG needs a numeric argument, got {t}")
            # Spark: AVG(DECIMAL(p, s)) is DECIMAL(p + 4, s + 4), both capped at 38; any other AVG is a double
            self._set_type(pa.decimal128(min(38, t.precision + 4), min(38, t.scale + 4)) if pa.types.is_decimal(t)
                           else FLOAT)
        elif self.func == "sum":
            if not is_numeric(t):
                raise PlanError(f"SUM needs a numeric argument, got {t}")
            # Spark: SUM of an integer is a BIGINT, of DECIMAL(p, s) a DECIMAL(p + 10, s) (capped at 38)
            self._set_type(INT if pa.types.is_integer(t) else (
                pa.decimal128(min(38, t.precision + 10), t.scale) if pa.types.is_decimal(t) else FLOAT))
        else:
            self._set_type(t)

    def children(self) -> tuple[Expr, ...]:
        return () if self.arg is None else (self.arg,)

    def __str__(self) -> str:
        return f"{self.func}({'*' if self.arg is None else self.arg})"


def _require_bool(e: Expr, where: str) -> None:
    if e.dtype not in (BOOL, NULL):
        raise PlanError(f"{where} needs a boolean condition, got an expression of type {e.dtype}")


def conjuncts(e: Expr | None) -> list[Expr]:
    """Split a predicate at its top-level ANDs."""
    if e is None:
        return []
    if isinstance(e, Binary) and e.op == "and":
        return conjuncts(e.left) + conjuncts(e.right)
    return [e]


def conjoin(parts: list[Expr]) -> Expr | None:
    out: Expr | None = None
    for p in parts:
        out = p if out is None else Binary("and", out, p)
    return out


def substitute(e: Expr, mapping: dict[Expr, Expr]) -> Expr:
    """Replace sub-expressions (by structural equality) bottom-up; used to rewrite over aggregate outputs."""
    if e in mapping:
        return mapping[e]
    if isinstance(e, Col) and e in mapping:
        return mapping[e]
    kids = e.children()
    if not kids:
        return e
    new = [substitute(k, mapping) for k in kids]
    if all(a is b for a, b in zip(new, kids)):
        return e
    return rebuild(e, new)


def rebuild(e: Expr, kids: list[Expr]) -> Expr:
    """A copy of ``e`` with new children (in ``children()`` order)."""
    if isinstance(e, Unary):
        return Unary(e.op, kids[0])
    if isinstance(e, Binary):
        return Binary(e.op, kids[0], kids[1])
    if isinstance(e, IsNull):
        return IsNull(kids[0], e.negated)
    if isinstance(e, InList):
        return InList(kids[0], tuple(kids[1:]), e.negated)
    if isinstance(e, Between):
        return Between(kids[0], kids[1], kids[2], e.negated)
    if isinstance(e, Like):
        return Like(kids[0], e.pattern, e.negated, e.case_insensitive)
    if isinstance(e, Case):
        whens = tuple((kids[2 * i], kids[2 * i + 1]) for i in range(len(e.whens)))
        default = kids[-1] if e.default is not None else None
        return Case(whens, default)
    if isinstance(e, Cast):
        return Cast(kids[0], e.to)
    if isinstance(e, Func):
        return Func(e.name, tuple(kids))
    if isinstance(e, Extract):
        return Extract(e.field_, kids[0])
    if isinstance(e, AggCall):
        return AggCall(e.func, kids[0] if kids else None)
    raise PlanError(f"cannot rebuild expression {type(e).__name__}")


def rename_columns(e: Expr, names: dict[str, str]) -> Expr:
    """Rename column references (``old -> new``)."""
    mapping: dict[Expr, Expr] = {c: Col(names[c.name], c.dtype) for c in e.walk()
                                 if isinstance(c, Col) and c.name in names}
    return substitute(e, mapping) if mapping else e

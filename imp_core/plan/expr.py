"""Scalar and aggregate expressions of the relational-algebra IR, typed with Spark's rules.

Expressions are frozen values. Each knows its result type (an Arrow type), derived once at construction with
Spark's (non-ANSI) typing rules, so the Spark compiler and the in-memory evaluator are both told exactly what to
produce: integers keep their width (``INT + INT`` is an ``INT`` that wraps, an integer constant is an ``INT`` when it
fits), ``FLOAT op FLOAT`` stays 32-bit, ``/`` of numbers is a ``DOUBLE`` unless a ``DECIMAL`` is involved, decimal
results follow Spark's DecimalPrecision rules (with ``spark.sql.decimalOperations.allowPrecisionLoss``), a decimal
meeting a float becomes a ``DOUBLE``. docs/SEMANTICS.md lists every rule. Column references use the plan's internal
column names (``alias.column`` for scanned columns).
"""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from imp_core.errors import PlanError, UnsupportedError

INT8 = pa.int8()  # TINYINT
INT16 = pa.int16()  # SMALLINT
INT32 = pa.int32()  # INT
INT = pa.int64()  # BIGINT
FLOAT32 = pa.float32()  # FLOAT / REAL
FLOAT = pa.float64()  # DOUBLE
BOOL = pa.bool_()
STRING = pa.string()
DATE = pa.date32()
TIMESTAMP = pa.timestamp("us")
NULL = pa.null()
SECOND_WITH_FRACTION = pa.decimal128(8, 6)  # EXTRACT(SECOND FROM ts): seconds with microseconds

MAX_PRECISION = 38  # Spark's DecimalType.MAX_PRECISION
MIN_ADJUSTED_SCALE = 6  # Spark's DecimalType.MINIMUM_ADJUSTED_SCALE

ARITH_OPS = ("+", "-", "*", "/", "%")
CMP_OPS = ("=", "<>", "<", "<=", ">", ">=")
BOOL_OPS = ("and", "or")
AGG_FUNCS = ("sum", "count", "avg", "min", "max")
INTERVAL_UNITS = ("day", "week", "month", "year", "hour", "minute", "second")

# an integral type as the decimal Spark converts it to before decimal arithmetic (IntegralType -> DecimalType)
_INTEGRAL_DECIMAL = {8: pa.decimal128(3, 0), 16: pa.decimal128(5, 0), 32: pa.decimal128(10, 0),
                     64: pa.decimal128(20, 0)}


def is_integral(t: pa.DataType) -> bool:
    return pa.types.is_integer(t)


def is_numeric(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)


def is_temporal(t: pa.DataType) -> bool:
    return pa.types.is_date(t) or pa.types.is_timestamp(t)


def is_string(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or t == pa.string_view()


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


# -- Spark's numeric typing rules ----------------------------------------------------------------------------------


def decimal_type(precision: int, scale: int) -> pa.DataType:
    """``DECIMAL(precision, scale)`` with Spark's bounds (precision 1..38, 0 <= scale <= precision)."""
    precision = max(1, min(precision, MAX_PRECISION))
    return pa.decimal128(precision, max(0, min(scale, precision)))


def _adjusted(precision: int, scale: int) -> pa.DataType:
    """Spark's ``DecimalType.adjustPrecisionScale`` (precision loss allowed): keep the integer digits, cut the scale
    but not below 6."""
    if precision <= MAX_PRECISION:
        return decimal_type(precision, scale)
    int_digits = precision - scale
    min_scale = min(scale, MIN_ADJUSTED_SCALE)
    return decimal_type(MAX_PRECISION, max(MAX_PRECISION - int_digits, min_scale))


def as_decimal(t: pa.DataType) -> pa.DataType:
    """The decimal type Spark converts an integral or decimal operand to (``INT`` -> ``DECIMAL(10, 0)``)."""
    if pa.types.is_decimal(t):
        return t
    if pa.types.is_integer(t):
        return _INTEGRAL_DECIMAL[t.bit_width]
    raise PlanError(f"a value of type {t} has no decimal form")


def literal_decimal(e: Expr) -> pa.DataType:
    """The decimal form of an operand of decimal arithmetic or comparison: an integer constant counts with its
    own digits (Spark's ``DecimalType.fromLiteral``: ``1`` is ``DECIMAL(1, 0)``), anything else by its type."""
    if isinstance(e, Lit) and pa.types.is_integer(e.dtype) and e.value is not None:
        return decimal_type(len(str(abs(int(e.value)))), 0)
    return as_decimal(e.dtype)


def wider_integral(a: pa.DataType, b: pa.DataType) -> pa.DataType:
    return a if a.bit_width >= b.bit_width else b


def wider_decimal(a: pa.DataType, b: pa.DataType) -> pa.DataType:
    """Spark's ``widerDecimalType``: the larger scale and the larger integer range; over 38 digits the integer
    digits win."""
    scale = max(a.scale, b.scale)
    rng = max(a.precision - a.scale, b.precision - b.scale)
    if rng + scale > MAX_PRECISION:
        return decimal_type(MAX_PRECISION, MAX_PRECISION - rng)
    return decimal_type(rng + scale, scale)


def decimal_result(op: str, a: pa.DataType, b: pa.DataType) -> pa.DataType:
    """Result type of ``a op b`` for two decimals (Spark's DecimalPrecision rules, precision loss allowed)."""
    p1, s1, p2, s2 = a.precision, a.scale, b.precision, b.scale
    if op in ("+", "-"):
        scale = max(s1, s2)
        return _adjusted(max(p1 - s1, p2 - s2) + scale + 1, scale)
    if op == "*":
        return _adjusted(p1 + p2 + 1, s1 + s2)
    if op == "/":
        scale = max(MIN_ADJUSTED_SCALE, s1 + p2 + 1)
        return _adjusted(p1 - s1 + s2 + scale, scale)
    if op == "%":
        scale = max(s1, s2)
        return _adjusted(min(p1 - s1, p2 - s2) + scale, scale)
    raise PlanError(f"unknown decimal operator {op}")


def arithmetic_types(op: str, left: Expr, right: Expr) -> tuple[pa.DataType, pa.DataType, pa.DataType]:
    """``(left operand type, right operand type, result type)`` of numeric ``left op right``.

    Both compilers convert the operands to these types and then apply the operator, so a rule lives here once:
    integers widen to the wider width (and wrap there), a float meets an integer as a float (``BIGINT + FLOAT`` is a
    32-bit ``FLOAT``), a decimal meets a float as a ``DOUBLE``, ``/`` of integers or floats is a ``DOUBLE``, decimal
    operands keep their own types (an integer as its decimal form) and the result follows ``decimal_result``.
    """
    a, b = left.dtype, right.dtype
    if a == NULL and b == NULL:
        return FLOAT, FLOAT, FLOAT  # Spark types NULL op NULL as DOUBLE
    if a == NULL:
        a = b
    if b == NULL:
        b = a
    if pa.types.is_floating(a) or pa.types.is_floating(b):
        if op == "/" or pa.types.is_decimal(a) or pa.types.is_decimal(b) or FLOAT in (a, b):
            return FLOAT, FLOAT, FLOAT
        return FLOAT32, FLOAT32, FLOAT32
    if pa.types.is_decimal(a) or pa.types.is_decimal(b):
        da = literal_decimal(left) if left.dtype != NULL else as_decimal(a)
        db = literal_decimal(right) if right.dtype != NULL else as_decimal(b)
        return da, db, decimal_result(op, da, db)
    if op == "/":
        return FLOAT, FLOAT, FLOAT
    t = wider_integral(a, b)
    return t, t, t


def numeric_result(op: str, a: pa.DataType, b: pa.DataType) -> pa.DataType:
    """Result type of ``a op b`` for numeric operand types (no constants; see ``arithmetic_types``)."""
    return arithmetic_types(op, Col("a", a), Col("b", b))[2]


def common_type(a: pa.DataType, b: pa.DataType) -> pa.DataType:
    """The type Spark brings two values to for CASE branches, COALESCE, GREATEST/LEAST and IN lists
    (``findWiderTypeForTwo``)."""
    if a == b or b == NULL:
        return a
    if a == NULL:
        return b
    if is_numeric(a) and is_numeric(b):
        if pa.types.is_floating(a) or pa.types.is_floating(b):
            if pa.types.is_decimal(a) or pa.types.is_decimal(b) or FLOAT in (a, b):
                return FLOAT
            return FLOAT32
        if pa.types.is_decimal(a) or pa.types.is_decimal(b):
            return wider_decimal(as_decimal(a), as_decimal(b))
        return wider_integral(a, b)
    if is_temporal(a) and is_temporal(b):
        if pa.types.is_timestamp(a) and pa.types.is_timestamp(b):
            return a if a.tz is not None else b  # TIMESTAMP (with time zone) is wider than TIMESTAMP_NTZ
        return a if pa.types.is_timestamp(a) else b
    if is_string(a) and is_string(b):
        return STRING
    if is_temporal(a) and is_string(b):
        return a
    if is_temporal(b) and is_string(a):
        return b
    raise PlanError(f"cannot compare or combine values of types {a} and {b}; add a CAST")


def comparison_type(left: Expr, right: Expr) -> pa.DataType:
    """The type both sides of a comparison are brought to: ``common_type``, except that an integer constant meets
    a decimal with its own digits (``d = 1`` compares in ``wider(d, DECIMAL(1, 0))``), as Spark does."""
    a, b = left.dtype, right.dtype
    if pa.types.is_decimal(a) and pa.types.is_integer(b) or pa.types.is_integer(a) and pa.types.is_decimal(b):
        return wider_decimal(literal_decimal(left), literal_decimal(right))
    return common_type(a, b)


def int_literal_type(value: int) -> pa.DataType:
    """Spark's type of an integer constant: ``INT`` when it fits, else ``BIGINT``, else ``DECIMAL(digits, 0)``."""
    if -2**31 <= value < 2**31:
        return INT32
    if -2**63 <= value < 2**63:
        return INT
    digits = len(str(abs(value)))
    if digits > MAX_PRECISION:
        raise PlanError(f"the integer constant {value} has more than {MAX_PRECISION} digits")
    return decimal_type(digits, 0)


def decimal_literal_type(value: decimal.Decimal) -> pa.DataType:
    """Spark's type of an exact numeric constant: ``0.05`` is ``DECIMAL(2, 2)``, ``123.45`` is ``DECIMAL(5, 2)``."""
    _, digits, exp = value.as_tuple()
    if not isinstance(exp, int):
        raise PlanError(f"the constant {value} is not a finite number")
    scale = max(0, -exp)
    significant = len(digits) + max(0, exp)
    precision = max(significant, scale, 1)
    if precision > MAX_PRECISION:
        raise PlanError(f"the decimal constant {value} has more than {MAX_PRECISION} digits")
    return pa.decimal128(precision, scale)


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
        """A constant typed as Spark types the same constant written in SQL (``7`` is an ``INT``, ``0.05`` a
        ``DECIMAL(2, 2)``, ``1.5e3`` a ``DOUBLE``)."""
        if value is None:
            return Lit(None, NULL)
        if isinstance(value, bool):
            return Lit(value, BOOL)
        if isinstance(value, int):
            return Lit(value, int_literal_type(value))
        if isinstance(value, float):
            return Lit(value, FLOAT)
        if isinstance(value, decimal.Decimal):
            return Lit(value, decimal_literal_type(value))
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
    """An interval literal; only valid on either side of ``date/timestamp +/- interval``."""

    value: int
    unit: str  # day | week | month | year | hour | minute | second
    dtype: pa.DataType = field(default=pa.month_day_nano_interval(), compare=False)

    def __post_init__(self) -> None:
        if self.unit not in INTERVAL_UNITS:
            raise UnsupportedError(f"INTERVAL unit {self.unit.upper()} is not supported; use one of "
                                   f"{', '.join(u.upper() for u in INTERVAL_UNITS)}")

    @property
    def is_calendar(self) -> bool:
        """Whole days, weeks, months or years: added to a DATE it gives a DATE (hours give a TIMESTAMP)."""
        return self.unit in ("day", "week", "month", "year")

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
            self._set_type(FLOAT if self.arg.dtype == NULL else self.arg.dtype)  # -x keeps the type and wraps
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
            comparison_type(self.left, self.right)
            self._set_type(BOOL)
        elif self.op in ARITH_OPS:
            self._set_type(self._arithmetic_type(lt, rt))
        else:
            raise PlanError(f"unknown operator {self.op}")

    def _arithmetic_type(self, lt: pa.DataType, rt: pa.DataType) -> pa.DataType:
        if isinstance(self.right, Interval) or isinstance(self.left, Interval):
            base, iv = (self.left, self.right) if isinstance(self.right, Interval) else (self.right, self.left)
            assert isinstance(iv, Interval)
            if self.op not in ("+", "-") or not (is_temporal(base.dtype) or base.dtype == NULL):
                raise PlanError("an INTERVAL can only be added to or subtracted from a date or timestamp")
            if isinstance(self.left, Interval) and self.op == "-":
                raise PlanError("cannot subtract a date from an INTERVAL")
            if pa.types.is_date(base.dtype) and not iv.is_calendar:
                return TIMESTAMP  # Spark: date + INTERVAL '1' HOUR is a timestamp
            return DATE if base.dtype == NULL else base.dtype
        if is_temporal(lt) or is_temporal(rt):
            if self.op == "-" and pa.types.is_date(lt) and pa.types.is_date(rt):
                return INT32  # the number of days between two dates, as DATEDIFF
            if self.op == "-" and is_temporal(lt) and is_temporal(rt):
                raise UnsupportedError("subtracting timestamps (an INTERVAL in Spark) is not supported; use "
                                       "DATEDIFF(end, start) for the days between their dates")
            days = rt if is_temporal(lt) else lt
            date = lt if is_temporal(lt) else rt
            if self.op == "-" and is_temporal(rt):
                raise PlanError("cannot subtract a date from a number")
            if self.op not in ("+", "-") or not pa.types.is_date(date):
                raise PlanError(f"operator {self.op} is not defined for types {lt} and {rt}; add days to a DATE "
                                f"or an INTERVAL to a TIMESTAMP")
            if not (days == NULL or pa.types.is_integer(days) and days.bit_width <= 32):
                raise PlanError(f"a DATE {self.op} days needs an INT number of days, got {days}; CAST it AS INT")
            return DATE
        if (is_numeric(lt) or lt == NULL) and (is_numeric(rt) or rt == NULL):
            return arithmetic_types(self.op, self.left, self.right)[2]
        raise PlanError(f"operator {self.op} is not defined for types {lt} and {rt}")

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
    """``arg [NOT] IN (items)``: Spark brings the argument and every item to one common type first."""

    arg: Expr
    items: tuple[Expr, ...]
    negated: bool = False
    dtype: pa.DataType = field(default=BOOL, compare=False)

    def __post_init__(self) -> None:
        if not self.items:
            raise PlanError("IN needs at least one value")
        self.compare_type  # noqa: B018 - raises on incomparable types

    @property
    def compare_type(self) -> pa.DataType:
        t = self.arg.dtype
        for item in self.items:
            t = common_type(t, item.dtype)
        return t

    def children(self) -> tuple[Expr, ...]:
        return (self.arg, *self.items)

    def __str__(self) -> str:
        return f"({self.arg} {'NOT ' if self.negated else ''}IN ({', '.join(map(str, self.items))}))"


@dataclass(frozen=True, slots=True)
class Between(Expr):
    """``arg [NOT] BETWEEN low AND high``, as Spark evaluates it: ``arg >= low AND arg <= high``."""

    arg: Expr
    low: Expr
    high: Expr
    negated: bool = False
    dtype: pa.DataType = field(default=BOOL, compare=False)

    def __post_init__(self) -> None:
        comparison_type(self.arg, self.low)
        comparison_type(self.arg, self.high)

    def children(self) -> tuple[Expr, ...]:
        return (self.arg, self.low, self.high)

    def __str__(self) -> str:
        return f"({self.arg} {'NOT ' if self.negated else ''}BETWEEN {self.low} AND {self.high})"


@dataclass(frozen=True, slots=True)
class Like(Expr):
    """``arg [NOT] LIKE/ILIKE pattern`` with ``%``, ``_`` and ``\\`` escaping one of ``%``, ``_``, ``\\``.

    ILIKE is Spark's ``lower(arg) LIKE lower(pattern)`` (full Unicode lower-casing, not case folding).
    """

    arg: Expr
    pattern: str
    negated: bool = False
    case_insensitive: bool = False
    dtype: pa.DataType = field(default=BOOL, compare=False)

    def __post_init__(self) -> None:
        if not (is_string(self.arg.dtype) or self.arg.dtype == NULL):
            raise PlanError(f"LIKE needs a string, got {self.arg.dtype}")
        i = 0
        while i < len(self.pattern):
            if self.pattern[i] == "\\":
                if i + 1 == len(self.pattern):
                    raise PlanError(f"the LIKE pattern {self.pattern!r} ends with the escape character \\")
                if self.pattern[i + 1] not in "%_\\":
                    raise PlanError(f"the LIKE pattern {self.pattern!r} escapes {self.pattern[i + 1]!r}; "
                                    f"\\ may only precede %, _ or \\")
                i += 1
            i += 1

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


def cast_error(src: pa.DataType, to: pa.DataType) -> str | None:
    """Why Spark refuses (or only returns NULL for) ``CAST(src AS to)``; None when the cast is defined."""
    if src == to or src == NULL or is_string(src) or is_string(to):
        return None
    if (is_numeric(src) or pa.types.is_boolean(src)) and (is_numeric(to) or pa.types.is_boolean(to)):
        return None
    if is_temporal(src) and is_temporal(to):
        return None
    if pa.types.is_date(src) and (is_numeric(to) or pa.types.is_boolean(to)):
        return f"Spark returns NULL for CAST of a DATE to {to}; use EXTRACT or DATEDIFF"
    if pa.types.is_timestamp(src) and is_numeric(to) or is_numeric(src) and pa.types.is_timestamp(to):
        return (f"CAST between TIMESTAMP and numbers ({src} to {to}) is not supported; use EXTRACT, or compare "
                f"with TIMESTAMP constants")
    return f"cannot CAST {src} to {to}"


@dataclass(frozen=True, slots=True)
class Cast(Expr):
    arg: Expr
    to: pa.DataType

    def __post_init__(self) -> None:
        reason = cast_error(self.arg.dtype, self.to)
        if reason is not None:
            raise (UnsupportedError if "not supported" in reason else PlanError)(reason)

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
# EXTRACT(SECOND FROM ts) is "second_with_fraction" (a DECIMAL(8, 6)); the SECOND(ts) function is "second" (an INT)
EXTRACT_FIELDS = ("year", "quarter", "month", "week", "day", "dayofweek", "dayofyear", "hour", "minute", "second",
                  "second_with_fraction")
_STRING_FUNCS = ("upper", "lower", "trim", "ltrim", "rtrim", "length")
_DOUBLE_FUNCS = ("sqrt", "ln", "exp", "power", "sign")


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
        self._set_type(self._result_type())

    def _result_type(self) -> pa.DataType:
        a, n = self.args, self.name
        if n in _STRING_FUNCS:
            self._require(a[0], is_string, "a string")
            return INT32 if n == "length" else STRING
        if n == "substring":
            self._require(a[0], is_string, "a string")
            for x in a[1:]:
                self._require(x, pa.types.is_integer, "an integer position/length")
            return STRING
        if n == "replace":
            for x in a:
                self._require(x, is_string, "strings")
            if not all(isinstance(x, Lit) for x in a[1:]):
                raise UnsupportedError("REPLACE needs constant search and replacement strings")
            return STRING
        if n == "concat":
            return STRING
        if n in ("coalesce", "greatest", "least"):
            t = NULL
            for x in a:
                t = common_type(t, x.dtype)
            if n != "coalesce" and not (is_numeric(t) or is_temporal(t) or is_string(t) or t in (BOOL, NULL)):
                raise PlanError(f"{n.upper()} needs comparable arguments, got {t}")
            return t
        if n == "nullif":
            comparison_type(a[0], a[1])
            return a[0].dtype
        if n in ("date_add", "date_sub"):
            self._require(a[0], pa.types.is_date, "a DATE")
            if not (a[1].dtype == NULL or pa.types.is_integer(a[1].dtype) and a[1].dtype.bit_width <= 32):
                raise PlanError(f"{n.upper()} needs an INT number of days, got {a[1].dtype}; CAST it AS INT")
            return DATE
        if n == "datediff":
            for x in a:
                self._require(x, pa.types.is_date, "DATEs")
            return INT32
        for x in a:
            self._require(x, is_numeric, "a number")
        t = a[0].dtype
        if n in _DOUBLE_FUNCS:
            return FLOAT
        if t == NULL:
            return INT if n in ("floor", "ceil") else FLOAT  # Spark: floor(NULL) is a BIGINT, abs(NULL) a DOUBLE
        if n == "abs":
            return t
        if n in ("floor", "ceil"):
            if pa.types.is_decimal(t):
                return t if t.scale == 0 else decimal_type(t.precision - t.scale + 1, 0)
            return INT
        if n == "round":
            digits = self.round_digits
            if pa.types.is_decimal(t):
                scale = max(0, min(t.scale, digits))
                return decimal_type(t.precision - t.scale + scale + 1, scale)
            return t
        raise PlanError(f"no typing rule for {n.upper()}")  # pragma: no cover - every name is handled above

    @property
    def round_digits(self) -> int:
        """ROUND's number of digits: an integer constant (Spark requires a constant), 0 when omitted."""
        if len(self.args) < 2:
            return 0
        d = self.args[1]
        if not (isinstance(d, Lit) and isinstance(d.value, int) and not isinstance(d.value, bool)):
            raise PlanError("ROUND's number of digits must be an integer constant")
        return int(d.value)

    def _require(self, e: Expr, check: Any, what: str) -> None:
        if e.dtype != NULL and not check(e.dtype):
            raise PlanError(f"{self.name.upper()} needs {what}, got a value of type {e.dtype}; add a CAST")

    def children(self) -> tuple[Expr, ...]:
        return self.args

    def __str__(self) -> str:
        return f"{self.name}({', '.join(map(str, self.args))})"


@dataclass(frozen=True, slots=True)
class Extract(Expr):
    field_: str
    arg: Expr
    dtype: pa.DataType = field(default=INT32, compare=False)

    def __post_init__(self) -> None:
        if self.field_ not in EXTRACT_FIELDS:
            raise UnsupportedError(f"EXTRACT({self.field_.upper()} ...) is not supported; supported fields: "
                                   f"{', '.join(f.upper() for f in EXTRACT_FIELDS[:-1])}")
        if not (is_temporal(self.arg.dtype) or self.arg.dtype == NULL):
            raise PlanError(f"EXTRACT needs a date or timestamp, got {self.arg.dtype}")
        self._set_type(SECOND_WITH_FRACTION if self.field_ == "second_with_fraction" else INT32)

    def children(self) -> tuple[Expr, ...]:
        return (self.arg,)

    def __str__(self) -> str:
        if self.field_ == "second_with_fraction":
            return f"EXTRACT(SECOND FROM {self.arg})"
        if self.field_ == "second":
            return f"SECOND({self.arg})"
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


# Every expression node class. Each compiler (engine/evaluate.py, spark/compile.py) has one ``visit_<Node>`` per
# class, checked when the compiler module is imported (``require_visitors``).
EXPR_NODES: tuple[type[Expr], ...] = (Col, Lit, Interval, Unary, Binary, IsNull, InList, Between, Like, Case, Cast,
                                      Func, Extract, AggCall)


def _subclasses(cls: type) -> set[str]:
    out: set[str] = set()
    subclasses: list[type] = cls.__subclasses__()
    for sub in subclasses:
        out.add(sub.__name__)
        out |= _subclasses(sub)
    return out


def require_visitors(compiler: type, backend: str) -> None:
    """Raise at import time unless ``compiler`` has a ``visit_<Node>`` for every expression node class, and a
    handler (``func_<name>`` / ``extract_<field>``) or an ``UNSUPPORTED_FUNCTIONS`` entry for every function and
    EXTRACT field, so a new node or function cannot reach a compiler that silently mishandles it."""
    names = {c.__name__ for c in EXPR_NODES} | _subclasses(Expr)
    unsupported = getattr(compiler, "UNSUPPORTED_FUNCTIONS", {})
    def has(name: str) -> bool:
        return callable(getattr(compiler, name, None))

    missing = [f"visit_{n}" for n in sorted(names) if not has(f"visit_{n}")]
    missing += [f"func_{n}" for n in FUNCTIONS if not has(f"func_{n}") and n not in unsupported]
    missing += [f"extract_{f}" for f in EXTRACT_FIELDS if not has(f"extract_{f}")]
    if missing:
        raise ImportError(f"the {backend} expression compiler {compiler.__name__} has no {', '.join(missing)}; "
                          f"add them (or an UNSUPPORTED_FUNCTIONS entry saying why not)")


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

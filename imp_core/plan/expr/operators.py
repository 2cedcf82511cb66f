"""Scalar expressions of the IR: the base class, columns, constants and operators, each typed when built.

Expressions are frozen values whose result type (an Arrow type) is derived once, at construction, with Spark's rules
(``types``); column references use the plan's internal names (``alias.column`` for scanned columns). See
docs/ARCHITECTURE.md, "The plan IR".
"""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pyarrow as pa

from imp_core.errors import PlanError, UnsupportedError
from imp_core.plan.expr.types import (
    ARITH_OPS,
    BOOL,
    BOOL_OPS,
    CMP_OPS,
    DATE,
    FLOAT,
    FLOAT32,
    INT32,
    INTERVAL_UNITS,
    NULL,
    STRING,
    TIMESTAMP,
    as_decimal,
    cast_error,
    common_type,
    decimal_literal_type,
    decimal_result,
    decimal_type,
    int_literal_type,
    is_numeric,
    is_string,
    is_temporal,
    wider_decimal,
    wider_integral,
)


def literal_decimal(e: Expr) -> pa.DataType:
    """The decimal form of an operand of decimal arithmetic or comparison: an integer constant counts with its
    own digits (Spark's ``DecimalType.fromLiteral``: ``1`` is ``DECIMAL(1, 0)``), anything else by its type."""
    if isinstance(e, Lit) and pa.types.is_integer(e.dtype) and e.value is not None:
        return decimal_type(len(str(abs(int(e.value)))), 0)
    return as_decimal(e.dtype)


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


def comparison_type(left: Expr, right: Expr) -> pa.DataType:
    """The type both sides of a comparison are brought to: ``common_type``, except that an integer constant meets
    a decimal with its own digits (``d = 1`` compares in ``wider(d, DECIMAL(1, 0))``), as Spark does."""
    a, b = left.dtype, right.dtype
    if pa.types.is_decimal(a) and pa.types.is_integer(b) or pa.types.is_integer(a) and pa.types.is_decimal(b):
        return wider_decimal(literal_decimal(left), literal_decimal(right))
    return common_type(a, b)


class Expr:
    """Base class of scalar expressions; subclasses are frozen dataclasses with a derived ``dtype``."""

    __slots__ = ()
    dtype: pa.DataType
    is_aggregate: ClassVar[bool] = False  # an aggregate call (only valid inside an Aggregate node)

    def children(self) -> tuple[Expr, ...]:
        return ()

    def with_children(self, kids: Sequence[Expr]) -> Expr:
        """A copy with new children (in ``children()`` order), typed anew."""
        if kids:
            raise PlanError(f"{type(self).__name__} has no children")
        return self

    def walk(self) -> Iterator[Expr]:
        yield self
        for c in self.children():
            yield from c.walk()

    def columns(self) -> set[str]:
        return {e.name for e in self.walk() if isinstance(e, Col)}

    def has_aggregate(self) -> bool:
        return any(e.is_aggregate for e in self.walk())

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

    def with_children(self, kids: Sequence[Expr]) -> Expr:
        return Unary(self.op, kids[0])

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
            return self._interval_type()
        if is_temporal(lt) or is_temporal(rt):
            return self._date_days_type(lt, rt)
        if (is_numeric(lt) or lt == NULL) and (is_numeric(rt) or rt == NULL):
            return arithmetic_types(self.op, self.left, self.right)[2]
        raise PlanError(f"operator {self.op} is not defined for types {lt} and {rt}")

    def _interval_type(self) -> pa.DataType:
        """``date/timestamp +/- interval`` (or ``interval + date``)."""
        base, iv = (self.left, self.right) if isinstance(self.right, Interval) else (self.right, self.left)
        assert isinstance(iv, Interval)
        if self.op not in ("+", "-") or not (is_temporal(base.dtype) or base.dtype == NULL):
            raise PlanError("an INTERVAL can only be added to or subtracted from a date or timestamp")
        if isinstance(self.left, Interval) and self.op == "-":
            raise PlanError("cannot subtract a date from an INTERVAL")
        if pa.types.is_date(base.dtype) and not iv.is_calendar:
            return TIMESTAMP  # Spark: date + INTERVAL '1' HOUR is a timestamp
        return DATE if base.dtype == NULL else base.dtype

    def _date_days_type(self, lt: pa.DataType, rt: pa.DataType) -> pa.DataType:
        """``date +/- days``, ``days + date`` and ``date - date`` (days between)."""
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

    def children(self) -> tuple[Expr, ...]:
        return (self.left, self.right)

    def with_children(self, kids: Sequence[Expr]) -> Expr:
        return Binary(self.op, kids[0], kids[1])

    def __str__(self) -> str:
        return f"({self.left} {self.op} {self.right})"


@dataclass(frozen=True, slots=True)
class IsNull(Expr):
    arg: Expr
    negated: bool = False
    dtype: pa.DataType = field(default=BOOL, compare=False)

    def children(self) -> tuple[Expr, ...]:
        return (self.arg,)

    def with_children(self, kids: Sequence[Expr]) -> Expr:
        return IsNull(kids[0], self.negated)

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

    def with_children(self, kids: Sequence[Expr]) -> Expr:
        return InList(kids[0], tuple(kids[1:]), self.negated)

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

    def with_children(self, kids: Sequence[Expr]) -> Expr:
        return Between(kids[0], kids[1], kids[2], self.negated)

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

    def with_children(self, kids: Sequence[Expr]) -> Expr:
        return Like(kids[0], self.pattern, self.negated, self.case_insensitive)

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

    def with_children(self, kids: Sequence[Expr]) -> Expr:
        whens = tuple((kids[2 * i], kids[2 * i + 1]) for i in range(len(self.whens)))
        return Case(whens, kids[-1] if self.default is not None else None)

    def __str__(self) -> str:
        whens = " ".join(f"WHEN {c} THEN {v}" for c, v in self.whens)
        return f"CASE {whens}{'' if self.default is None else f' ELSE {self.default}'} END"


@dataclass(frozen=True, slots=True)
class Cast(Expr):
    arg: Expr
    to: pa.DataType

    def __post_init__(self) -> None:
        reason = cast_error(self.arg.dtype, self.to)
        if reason is not None:
            raise (UnsupportedError if "not supported" in reason else PlanError)(reason)

    @property
    def dtype(self) -> pa.DataType:
        return self.to

    def children(self) -> tuple[Expr, ...]:
        return (self.arg,)

    def with_children(self, kids: Sequence[Expr]) -> Expr:
        return Cast(kids[0], self.to)

    def __str__(self) -> str:
        return f"CAST({self.arg} AS {self.to})"


def _require_bool(e: Expr, where: str) -> None:
    if e.dtype not in (BOOL, NULL):
        raise PlanError(f"{where} needs a boolean condition, got an expression of type {e.dtype}")


__all__ = [
    "Between", "Binary", "Case", "Cast", "Col", "Expr", "InList", "Interval", "IsNull", "Like", "Lit", "Unary",
    "arithmetic_types", "comparison_type", "literal_decimal", "numeric_result",
]

"""Calls in expressions: scalar functions, EXTRACT and aggregate calls, with Spark's result types.

See docs/ARCHITECTURE.md, "The plan IR" (and "How to add a SQL construct" for a new function).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import pyarrow as pa

from imp_core.errors import PlanError, UnsupportedError
from imp_core.plan.expr.operators import Expr, Lit, comparison_type
from imp_core.plan.expr.types import (
    AGG_FUNCS,
    BOOL,
    DATE,
    DISTINCT_AGG_FUNCS,
    FLOAT,
    INT,
    INT32,
    NULL,
    SECOND_WITH_FRACTION,
    STRING,
    common_type,
    decimal_type,
    is_numeric,
    is_string,
    is_temporal,
)

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
        self._set_type(_TYPING[self.name](self))

    @property
    def round_digits(self) -> int:
        """ROUND's number of digits: an integer constant (Spark requires a constant), 0 when omitted."""
        if len(self.args) < 2:
            return 0
        d = self.args[1]
        if not (isinstance(d, Lit) and isinstance(d.value, int) and not isinstance(d.value, bool)):
            raise PlanError("ROUND's number of digits must be an integer constant")
        return int(d.value)

    def children(self) -> tuple[Expr, ...]:
        return self.args

    def with_children(self, kids: Sequence[Expr]) -> Expr:
        return Func(self.name, tuple(kids))

    def __str__(self) -> str:
        return f"{self.name}({', '.join(map(str, self.args))})"


def _require(f: Func, e: Expr, check: Callable[[pa.DataType], bool], what: str) -> None:
    if e.dtype != NULL and not check(e.dtype):
        raise PlanError(f"{f.name.upper()} needs {what}, got a value of type {e.dtype}; add a CAST")


def _string_function(f: Func) -> pa.DataType:
    _require(f, f.args[0], is_string, "a string")
    return INT32 if f.name == "length" else STRING


def _substring(f: Func) -> pa.DataType:
    _require(f, f.args[0], is_string, "a string")
    for x in f.args[1:]:
        _require(f, x, pa.types.is_integer, "an integer position/length")
    return STRING


def _replace(f: Func) -> pa.DataType:
    for x in f.args:
        _require(f, x, is_string, "strings")
    if not all(isinstance(x, Lit) for x in f.args[1:]):
        raise UnsupportedError("REPLACE needs constant search and replacement strings")
    return STRING


def _common(f: Func) -> pa.DataType:
    """COALESCE, GREATEST, LEAST: the arguments' common type (comparable for GREATEST and LEAST)."""
    t = NULL
    for x in f.args:
        t = common_type(t, x.dtype)
    if f.name != "coalesce" and not (is_numeric(t) or is_temporal(t) or is_string(t) or t in (BOOL, NULL)):
        raise PlanError(f"{f.name.upper()} needs comparable arguments, got {t}")
    return t


def _nullif(f: Func) -> pa.DataType:
    comparison_type(f.args[0], f.args[1])
    return f.args[0].dtype


def _date_shift(f: Func) -> pa.DataType:
    """DATE_ADD, DATE_SUB: a DATE and an INT number of days."""
    _require(f, f.args[0], pa.types.is_date, "a DATE")
    days = f.args[1].dtype
    if not (days == NULL or pa.types.is_integer(days) and days.bit_width <= 32):
        raise PlanError(f"{f.name.upper()} needs an INT number of days, got {days}; CAST it AS INT")
    return DATE


def _datediff(f: Func) -> pa.DataType:
    for x in f.args:
        _require(f, x, pa.types.is_date, "DATEs")
    return INT32


def _numeric_arg(f: Func) -> pa.DataType:
    for x in f.args:
        _require(f, x, is_numeric, "a number")
    return f.args[0].dtype


def _double_function(f: Func) -> pa.DataType:
    _numeric_arg(f)
    return FLOAT


def _abs(f: Func) -> pa.DataType:
    t = _numeric_arg(f)
    return FLOAT if t == NULL else t  # Spark: abs(NULL) is a DOUBLE


def _floor_ceil(f: Func) -> pa.DataType:
    t = _numeric_arg(f)
    if pa.types.is_decimal(t):
        return t if t.scale == 0 else decimal_type(t.precision - t.scale + 1, 0)
    return INT  # Spark: floor(NULL) is a BIGINT too


def _round(f: Func) -> pa.DataType:
    t = _numeric_arg(f)
    if t == NULL:
        return FLOAT
    digits = f.round_digits
    if pa.types.is_decimal(t):
        scale = max(0, min(t.scale, digits))
        return decimal_type(t.precision - t.scale + scale + 1, scale)
    return t


# function name -> its typing rule: checks the arguments, returns the result type
_TYPING: dict[str, Callable[[Func], pa.DataType]] = {
    **dict.fromkeys(("upper", "lower", "trim", "ltrim", "rtrim", "length"), _string_function),
    "substring": _substring, "replace": _replace, "concat": lambda f: STRING,
    **dict.fromkeys(("coalesce", "greatest", "least"), _common), "nullif": _nullif,
    **dict.fromkeys(("date_add", "date_sub"), _date_shift), "datediff": _datediff,
    **dict.fromkeys(("sqrt", "ln", "exp", "power", "sign"), _double_function),
    "abs": _abs, **dict.fromkeys(("floor", "ceil"), _floor_ceil), "round": _round,
}
assert set(_TYPING) == set(FUNCTIONS), "every function needs a typing rule"


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

    def with_children(self, kids: Sequence[Expr]) -> Expr:
        return Extract(self.field_, kids[0])

    def __str__(self) -> str:
        if self.field_ == "second_with_fraction":
            return f"EXTRACT(SECOND FROM {self.arg})"
        if self.field_ == "second":
            return f"SECOND({self.arg})"
        return f"EXTRACT({self.field_.upper()} FROM {self.arg})"


@dataclass(frozen=True, slots=True)
class AggCall(Expr):
    """``func(arg)``; ``arg`` is None for ``COUNT(*)``. Only valid inside an Aggregate node. ``distinct``:
    ``COUNT(DISTINCT arg)`` / ``SUM(DISTINCT arg)``, over the group's distinct non-NULL values."""

    func: str
    arg: Expr | None
    dtype: pa.DataType = field(default=NULL, compare=False)
    # stored plans leave it out when False, so plans without a DISTINCT aggregate keep their documents
    distinct: bool = field(default=False, metadata={"omit_default": True})
    is_aggregate: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if self.func not in AGG_FUNCS:
            raise UnsupportedError(f"aggregate {self.func.upper()} is not supported; supported: "
                                   f"{', '.join(f.upper() for f in AGG_FUNCS)}")
        if self.arg is None:
            if self.func != "count" or self.distinct:
                raise PlanError(f"{self.func.upper()}({'DISTINCT ' if self.distinct else ''}*) is not valid; "
                                f"only COUNT(*)")
            self._set_type(INT)
            return
        if self.distinct:
            self._check_distinct(self.arg.dtype)
        if self.arg.has_aggregate():
            raise UnsupportedError("nested aggregate functions are not supported")
        self._set_type(self._result_type(self.arg.dtype))

    def _result_type(self, t: pa.DataType) -> pa.DataType:
        if self.func == "count":
            return INT
        if self.func == "avg":
            if not is_numeric(t):
                raise PlanError(f"AVG needs a numeric argument, got {t}")
            # Spark: AVG(DECIMAL(p, s)) is DECIMAL(p + 4, s + 4), both capped at 38; any other AVG is a double
            return pa.decimal128(min(38, t.precision + 4), min(38, t.scale + 4)) if pa.types.is_decimal(t) else FLOAT
        if self.func == "sum":
            if not is_numeric(t):
                raise PlanError(f"SUM needs a numeric argument, got {t}")
            # Spark: SUM of an integer is a BIGINT, of DECIMAL(p, s) a DECIMAL(p + 10, s) (capped at 38)
            return INT if pa.types.is_integer(t) else (
                pa.decimal128(min(38, t.precision + 10), t.scale) if pa.types.is_decimal(t) else FLOAT)
        return t

    def _check_distinct(self, t: pa.DataType) -> None:
        if self.func not in DISTINCT_AGG_FUNCS:
            raise UnsupportedError(f"{self.func.upper()}(DISTINCT ...) is not supported; only COUNT(DISTINCT ...) "
                                   f"and SUM(DISTINCT ...), or aggregate over a SELECT DISTINCT subquery")
        if self.func == "sum" and pa.types.is_floating(t):
            raise UnsupportedError(f"SUM(DISTINCT ...) of a {t} is not supported (Spark adds floating-point "
                                   f"numbers in an order that depends on partitioning); cast the argument to DECIMAL")

    def children(self) -> tuple[Expr, ...]:
        return () if self.arg is None else (self.arg,)

    def with_children(self, kids: Sequence[Expr]) -> Expr:
        return AggCall(self.func, kids[0] if kids else None, distinct=self.distinct)

    def __str__(self) -> str:
        return f"{self.func}({'DISTINCT ' if self.distinct else ''}{'*' if self.arg is None else self.arg})"


WIDE_SUM_PRECISION = 28  # above it, Spark's DECIMAL(p + 10, s) sum type is capped at 38 digits


def sum_leaves_38_digits(t: pa.DataType) -> bool:
    """Whether a SUM/AVG over values of type ``t`` can need more than 38 digits with a few rows (a DECIMAL with
    precision above 28: Spark's sum type DECIMAL(p + 10, s) is capped at 38, and its sum is then NULL)."""
    return bool(pa.types.is_decimal(t) and t.precision > WIDE_SUM_PRECISION)


__all__ = ["EXTRACT_FIELDS", "FUNCTIONS", "WIDE_SUM_PRECISION", "AggCall", "Extract", "Func", "sum_leaves_38_digits"]

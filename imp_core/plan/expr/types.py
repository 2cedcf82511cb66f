"""Spark's typing rules on Arrow types: the IR's types, integer widths, DecimalPrecision, wider and common types.

The rules are Spark's (non-ANSI); docs/SEMANTICS.md lists every one. See docs/ARCHITECTURE.md, "The plan IR".
"""

from __future__ import annotations

import decimal

import pyarrow as pa

from imp_core.errors import PlanError
from imp_core.sketch.bounds import partition_kind

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
DISTINCT_AGG_FUNCS = ("count", "sum")  # the aggregates that can take DISTINCT
INTERVAL_UNITS = ("day", "week", "month", "year", "hour", "minute", "second")

# an integral type as the decimal Spark converts it to before decimal arithmetic (IntegralType -> DecimalType)
_INTEGRAL_DECIMAL = {8: pa.decimal128(3, 0), 16: pa.decimal128(5, 0), 32: pa.decimal128(10, 0),
                     64: pa.decimal128(20, 0)}


def is_integral(t: pa.DataType) -> bool:
    return bool(pa.types.is_integer(t))


def is_numeric(t: pa.DataType) -> bool:
    return bool(pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t))


def is_temporal(t: pa.DataType) -> bool:
    return bool(pa.types.is_date(t) or pa.types.is_timestamp(t))


def is_string(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t) or t == pa.string_view())


def kind_of_type(t: pa.DataType) -> str:
    """The partition kind of a column type (``imp_core.sketch.bounds.partition_kind``), else the type's name."""
    return partition_kind(t) or str(t)


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



def common_type(a: pa.DataType, b: pa.DataType) -> pa.DataType:
    """The type Spark brings two values to for CASE branches, COALESCE, GREATEST/LEAST and IN lists
    (``findWiderTypeForTwo``)."""
    if a == b or b == NULL:
        return a
    if a == NULL:
        return b
    if is_numeric(a) and is_numeric(b):
        return _common_numeric(a, b)
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


def _common_numeric(a: pa.DataType, b: pa.DataType) -> pa.DataType:
    if pa.types.is_floating(a) or pa.types.is_floating(b):
        if pa.types.is_decimal(a) or pa.types.is_decimal(b) or FLOAT in (a, b):
            return FLOAT
        return FLOAT32
    if pa.types.is_decimal(a) or pa.types.is_decimal(b):
        return wider_decimal(as_decimal(a), as_decimal(b))
    return wider_integral(a, b)


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


def cast_error(src: pa.DataType, to: pa.DataType) -> str | None:
    """Why Spark refuses (or only returns NULL for) ``CAST(src AS to)``; None when the cast is defined."""
    if src in (to, NULL) or is_string(src) or is_string(to):
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


__all__ = [
    "AGG_FUNCS", "ARITH_OPS", "BOOL", "BOOL_OPS", "CMP_OPS", "DATE", "DISTINCT_AGG_FUNCS", "FLOAT", "FLOAT32", "INT",
    "INT8", "INT16",
    "INT32", "INTERVAL_UNITS", "MAX_PRECISION", "MIN_ADJUSTED_SCALE", "NULL", "SECOND_WITH_FRACTION", "STRING",
    "TIMESTAMP", "as_decimal", "cast_error", "common_type", "decimal_literal_type", "decimal_result", "decimal_type",
    "int_literal_type", "is_integral", "is_numeric", "is_string", "is_temporal", "kind_of_type", "wider_decimal",
    "wider_integral",
]

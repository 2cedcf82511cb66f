"""Partition bounds as values of the partition column's own type: parsing ``--bounds`` text, and checking every bound
(given or computed) against the column's Arrow type, rounded up where the type cannot hold it exactly.

The rules (what is rounded, what is refused) are in docs/SEMANTICS.md, "Partitions, bounds and file statistics";
see docs/ARCHITECTURE.md, "Fragments on Spark".
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from imp_core.errors import UsageError

Bound = Any  # int | float | decimal.Decimal | date | datetime | str

KINDS = ("int", "float", "decimal", "date", "timestamp", "string")

_CTX = decimal.Context(prec=200, rounding=decimal.ROUND_CEILING, Emin=-999999, Emax=999999)
_UTC = dt.timezone.utc
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=_UTC)
_FRACTION = re.compile(r"^(?P<head>.*?\d{2}:\d{2}:\d{2})[.,](?P<frac>\d+)(?P<tail>.*)$")


# -- column types ------------------------------------------------------------------------------------------------


def partition_kind(dtype: pa.DataType) -> str | None:
    """The partition kind of an Arrow type (one of ``KINDS``), None for a type that cannot be partitioned."""
    if pa.types.is_integer(dtype):
        return "int"
    if pa.types.is_floating(dtype):
        return "float"
    if pa.types.is_decimal(dtype):
        return "decimal"
    if pa.types.is_date(dtype):
        return "date"
    if pa.types.is_timestamp(dtype):
        return "timestamp"
    if pa.types.is_string(dtype) or pa.types.is_large_string(dtype) or dtype == pa.string_view():
        return "string"
    return None


def kind_of(dtype: pa.DataType) -> str:
    """The partition kind of an Arrow type; raises ``UsageError`` for types that cannot be partitioned."""
    kind = partition_kind(dtype)
    if kind is None:
        raise UsageError(f"cannot partition a column of type {dtype}; use a numeric, date, timestamp or string column")
    return kind


def default_type(kind: str, bounds: Sequence[Bound] = ()) -> pa.DataType:
    """The column type assumed for a partition recorded without one (bounds decide scale and time zone)."""
    if kind == "int":
        return pa.int64()
    if kind == "float":
        return pa.float64()
    if kind == "decimal":
        scale = max([-_as_decimal(b).as_tuple().exponent for b in bounds if _is_number(b)] + [0])  # type: ignore[operator]
        return pa.decimal128(38, max(0, min(scale, 38)))
    if kind == "date":
        return pa.date32()
    if kind == "timestamp":
        aware = any(isinstance(b, dt.datetime) and b.tzinfo is not None for b in bounds)
        return pa.timestamp("us", tz="UTC" if aware else None)
    if kind == "string":
        return pa.string()
    raise UsageError(f"unsupported partition kind {kind!r}")


def sql_type_name(dtype: pa.DataType) -> str:
    """Spark SQL's name of the type (for messages)."""
    return _type_names(dtype)[0]


def type_to_json(dtype: pa.DataType) -> str:
    """A stable text form of a partitionable Arrow type (stored with the partition)."""
    return _type_names(dtype)[1]


def _type_names(dtype: pa.DataType) -> tuple[str, str]:
    """Spark SQL's name of a partitionable type and its stable text form; ``UsageError`` for any other type."""
    if pa.types.is_integer(dtype):
        return ({8: "TINYINT", 16: "SMALLINT", 32: "INT"}.get(dtype.bit_width, "BIGINT"),
                f"{'int' if pa.types.is_signed_integer(dtype) else 'uint'}{dtype.bit_width}")
    if pa.types.is_float32(dtype) or pa.types.is_float16(dtype):
        return "FLOAT", "float32"
    if pa.types.is_floating(dtype):
        return "DOUBLE", "float64"
    if pa.types.is_decimal(dtype):
        return f"DECIMAL({dtype.precision},{dtype.scale})", f"decimal({dtype.precision},{dtype.scale})"
    if pa.types.is_date(dtype):
        return "DATE", "date"
    if pa.types.is_timestamp(dtype):
        return ("TIMESTAMP", f"timestamp[{dtype.tz}]") if dtype.tz else ("TIMESTAMP_NTZ", "timestamp")
    kind = kind_of(dtype)  # raises for a type that cannot be partitioned
    return ("STRING" if kind == "string" else str(dtype)), "string"


def type_from_json(text: str) -> pa.DataType:
    m = re.fullmatch(r"(u?)int(8|16|32|64)", text)
    if m:
        bits = int(m.group(2))
        return {8: pa.uint8, 16: pa.uint16, 32: pa.uint32, 64: pa.uint64}[bits]() if m.group(1) else \
            {8: pa.int8, 16: pa.int16, 32: pa.int32, 64: pa.int64}[bits]()
    m = re.fullmatch(r"decimal\((\d+),(\d+)\)", text)
    if m:
        p, s = int(m.group(1)), int(m.group(2))
        return pa.decimal128(p, s) if p <= 38 else pa.decimal256(p, s)
    m = re.fullmatch(r"timestamp(?:\[(.+)\])?", text)
    if m:
        return pa.timestamp("us", tz=m.group(1))
    simple = {"float32": pa.float32(), "float64": pa.float64(), "date": pa.date32(), "string": pa.string()}
    if text in simple:
        return simple[text]
    raise UsageError(f"unknown partition column type {text!r} in a stored partition")


# -- parsing and normalizing -------------------------------------------------------------------------------------


def parse_bounds(items: Sequence[Any], dtype: pa.DataType, where: str) -> tuple[tuple[Bound, ...], list[str]]:
    """Bounds for a column of type ``dtype``: parsed (text items), checked and normalized.

    Args:
        items: ``--bounds`` text items, or values (equi-depth bounds).
        dtype: the partition column's Arrow type.
        where: ``table.column``, for messages.

    Returns:
        The normalized, strictly increasing bounds and one note per bound that was rounded.

    Raises:
        UsageError: a bound cannot be read or held by the type, or the bounds are not strictly increasing.
    """
    values = [parse_bound(x, dtype, where) if isinstance(x, str) and kind_of(dtype) != "string" else x for x in items]
    if kind_of(dtype) == "timestamp":
        aware = {getattr(v, "tzinfo", None) is not None for v in values if isinstance(v, (dt.date, AboveMicros))}
        if len(aware) > 1:
            raise UsageError(f"bounds of {where} mix timestamps with and without a time zone; give all of them "
                             f"with an offset (e.g. +00:00) or none")
    out: list[Bound] = []
    notes: list[str] = []
    for raw, value in zip(items, values):
        normal, note = normalize_bound(value, dtype, where, shown=raw)
        if note:
            notes.append(note)
        out.append(normal)
    if len(out) < 2:
        raise UsageError(f"partition on {where} needs at least two bounds (one fragment), got {len(out)}")
    for (a, ra), (b, rb) in zip(zip(out, items), zip(out[1:], items[1:])):
        if not a < b:
            if a == b and ra != rb:
                raise UsageError(f"bounds {_show(ra)} and {_show(rb)} of {where} both become {_show(a)} as "
                                 f"{sql_type_name(dtype)} values; drop one of them")
            raise UsageError(f"partition bounds on {where} must be strictly increasing; {_show(ra)} is followed "
                             f"by {_show(rb)}")
    return tuple(out), notes


def parse_bound(text: str, dtype: pa.DataType, where: str = "the partition column") -> Any:
    """One ``--bounds`` item as a Python value, exact (rounding to the type is ``normalize_bound``'s job)."""
    kind = kind_of(dtype)
    text = text.strip()
    try:
        if kind in ("int", "decimal"):
            value = decimal.Decimal(text)
            if not value.is_finite():
                raise ValueError(text)
            return value
        if kind == "float":
            return float(text)  # what Spark makes of the literal ``text``D
        if kind == "date":
            try:
                return dt.date.fromisoformat(text)
            except ValueError:
                return _parse_timestamp(text)
        if kind == "timestamp":
            return _parse_timestamp(text)
        return text
    except (ValueError, ArithmeticError) as e:
        raise UsageError(f"bound {text!r} of {where} is not a valid {sql_type_name(dtype)} value") from e


class AboveMicros:
    """A timestamp strictly between ``floor`` and ``floor`` + 1 microsecond (text with sub-microsecond digits)."""

    __slots__ = ("floor",)

    def __init__(self, floor: dt.datetime) -> None:
        self.floor = floor

    @property
    def tzinfo(self) -> dt.tzinfo | None:
        return self.floor.tzinfo

    def __repr__(self) -> str:
        return f"{self.floor.isoformat(sep=' ')}+"


def _parse_timestamp(text: str) -> dt.datetime | AboveMicros:
    m = _FRACTION.match(text)
    if m and len(m.group("frac")) > 6:
        frac = m.group("frac")
        value = dt.datetime.fromisoformat(f"{m.group('head')}.{frac[:6]}{m.group('tail')}")
        return AboveMicros(value) if frac[6:].strip("0") else value
    return dt.datetime.fromisoformat(text)


def normalize_bound(value: Any, dtype: pa.DataType, where: str = "the partition column",
                    shown: Any = None) -> tuple[Bound, str | None]:
    """The bound as an exact value of ``dtype``, and a note when it had to be rounded up.

    Raises:
        UsageError: the type holds no value at or above the bound, or the bound is NaN, a boolean or of a kind
            the column cannot be compared with.
    """
    shown = value if shown is None else shown
    kind = kind_of(dtype)
    if isinstance(value, bool) or value is None:
        raise UsageError(f"bound {_show(shown)} of {where} is not a {sql_type_name(dtype)} value")
    try:
        normal, rounded = _NORMALIZERS[kind](value, dtype)
    except _Refused as e:
        raise UsageError(f"bound {_show(shown)} of {where} {e.args[0]}") from None
    note = None
    if rounded:
        name = sql_type_name(dtype)
        note = (f"bound {_show(shown)} of {where} cannot be held exactly by {name}; rounded up to "
                f"{_show(normal)}, the next {name} value, so each fragment keeps exactly the values the given "
                f"bound meant")
    return normal, note


class _Refused(Exception):
    pass


def _norm_int(value: Any, dtype: pa.DataType) -> tuple[int, bool]:
    if isinstance(value, (float, np.floating)):
        if not math.isfinite(value):
            raise _Refused(f"is not an integer; {sql_type_name(dtype)} columns take finite integer bounds")
        value = decimal.Decimal(float(value))
    rounded = False
    if isinstance(value, decimal.Decimal):
        whole = int(value.to_integral_value(rounding=decimal.ROUND_CEILING))
        rounded, value = whole != value, whole
    if isinstance(value, np.integer):
        value = int(value)
    if not isinstance(value, int):
        raise _Refused(f"is not a {sql_type_name(dtype)} value")
    bits = dtype.bit_width
    lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if pa.types.is_signed_integer(dtype) else (0, 2**bits - 1)
    if not lo <= value <= hi:
        raise _Refused(f"is outside the range of {sql_type_name(dtype)} ({lo}..{hi}); give bounds within it")
    return value, rounded


def _norm_float(value: Any, dtype: pa.DataType) -> tuple[float, bool]:
    if not isinstance(value, (int, float, decimal.Decimal, np.floating, np.integer)):
        raise _Refused(f"is not a {sql_type_name(dtype)} value")
    x = float(value)
    if math.isnan(x):
        raise _Refused("is NaN; NaN cannot be a bound (Spark orders NaN above every value: it is in the last "
                       "fragment)")
    if not isinstance(value, (float, np.floating)) and math.isfinite(x) and decimal.Decimal(x) < value:
        x = math.nextafter(x, math.inf)  # an integer or decimal between two doubles: the double above it
    if pa.types.is_float32(dtype) or pa.types.is_float16(dtype):
        with np.errstate(over="ignore"):
            f = np.float32(x)
        if math.isinf(f) and math.isfinite(x):
            raise _Refused(f"is outside the range of {sql_type_name(dtype)}; give bounds within "
                           f"±{float(np.finfo(np.float32).max):.8g}")
        if float(f) < x:
            f = np.nextafter(f, np.float32(np.inf))
        x = float(f)
    if x == 0.0:
        x = 0.0  # -0.0 = 0.0 in Spark
    exact = x == value if isinstance(value, (float, np.floating)) else decimal.Decimal(x) == value
    return x, not exact and math.isfinite(x)


def _norm_decimal(value: Any, dtype: pa.DataType) -> tuple[decimal.Decimal, bool]:
    if isinstance(value, (float, np.floating)):
        if not math.isfinite(value):
            raise _Refused(f"is not a {sql_type_name(dtype)} value")
        value = decimal.Decimal(repr(float(value)))  # the decimal the float was written as
    if isinstance(value, (int, np.integer)):
        value = decimal.Decimal(int(value))
    if not isinstance(value, decimal.Decimal) or not value.is_finite():
        raise _Refused(f"is not a {sql_type_name(dtype)} value")
    q = value.quantize(decimal.Decimal(1).scaleb(-dtype.scale), context=_CTX)
    if q == 0:
        q = abs(q)
    if abs(q) >= decimal.Decimal(10) ** (dtype.precision - dtype.scale):
        raise _Refused(f"does not fit {sql_type_name(dtype)}; give bounds with at most "
                       f"{dtype.precision - dtype.scale} digits before the decimal point")
    return q, q != value


def _norm_date(value: Any, dtype: pa.DataType) -> tuple[dt.date, bool]:
    if isinstance(value, AboveMicros):
        value = value.floor + dt.timedelta(microseconds=1)
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            raise _Refused("has a time zone; DATE bounds are plain dates")
        day = value.date()
        if value.time() == dt.time(0):
            return day, False
        if day == dt.date.max:
            raise _Refused("is after the last DATE")
        return day + dt.timedelta(days=1), True
    if isinstance(value, dt.date):
        return value, False
    raise _Refused(f"is not a {sql_type_name(dtype)} value")


def _norm_timestamp(value: Any, dtype: pa.DataType) -> tuple[dt.datetime, bool]:
    up = isinstance(value, AboveMicros)
    if up:
        value = value.floor
    if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        value = dt.datetime(value.year, value.month, value.day)
    if not isinstance(value, dt.datetime):
        raise _Refused(f"is not a {sql_type_name(dtype)} value")
    if dtype.tz:
        value = value.replace(tzinfo=_UTC) if value.tzinfo is None else value.astimezone(_UTC)
    elif value.tzinfo is not None:
        raise _Refused("has a time zone but the column is TIMESTAMP_NTZ (no time zone); give the bound without "
                       "an offset")
    if up:
        try:
            value = value + dt.timedelta(microseconds=1)
        except OverflowError:
            raise _Refused("is after the last timestamp") from None
    return value, up


def _norm_string(value: Any, dtype: pa.DataType) -> tuple[str, bool]:
    if not isinstance(value, str):
        raise _Refused("is not a STRING value")
    return value, False


_NORMALIZERS = {"int": _norm_int, "float": _norm_float, "decimal": _norm_decimal, "date": _norm_date,
                "timestamp": _norm_timestamp, "string": _norm_string}


# -- helpers -----------------------------------------------------------------------------------------------------


def micros(value: dt.datetime) -> int:
    """Microseconds since the epoch of a timestamp bound (naive bounds count as UTC wall-clock values)."""
    ts = value if value.tzinfo is not None else value.replace(tzinfo=_UTC)
    delta = ts - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, decimal.Decimal)) and not isinstance(v, bool)


def _as_decimal(v: Any) -> decimal.Decimal:
    return v if isinstance(v, decimal.Decimal) else decimal.Decimal(v)


def _show(v: Any) -> str:
    if isinstance(v, dt.datetime):
        return v.isoformat(sep=" ")
    if isinstance(v, (dt.date, decimal.Decimal)):
        return str(v)
    return repr(v)

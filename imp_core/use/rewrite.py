"""Sketch use: restrict each partitioned table to the sketch's fragments (paper Section 1, PBDS).

Adjacent fragments merge into one range, so a sketch {ρ3, ρ4} becomes ``price >= b3`` (the last fragment is
open-ended). Fragment 0 also holds the NULLs of the partition column, so its range adds ``OR col IS NULL``. Before
Spark reads anything, Delta files whose statistics prove that they hold no row of any range are dropped.

Statistics are read conservatively (docs/SEMANTICS.md, "Partitions, bounds and file statistics"): a file is skipped
only when its statistics *prove* absence. Timestamp statistics are millisecond-truncated, so they are widened by a
millisecond each way; decimal statistics of more than 15 digits travel through a JSON double, so they are widened by
a few units in the last place; a string maximum may be a truncated prefix of the true maximum; float statistics leave
NaN out, and NaN sits in the last fragment, so a range reaching the last fragment keeps every float file; missing
statistics keep the file. Partition values are compared in the column's type, with Spark's order (NaN above every
number, -0.0 = 0.0).
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
from typing import Any

from imp_core.errors import UsageError
from imp_core.sketch.bounds import parse_bound
from imp_core.sketch.partition import Bound, Partition
from imp_core.sources.delta import FileStats

Range = tuple[Bound | None, Bound | None, bool]

_MS = dt.timedelta(milliseconds=1)
_DOUBLE_DIGITS = 15  # decimals with more digits lose exactness in a JSON double
_RELATIVE = decimal.Decimal(2) ** -50  # a few units in the last place of a double
_CTX = decimal.Context(prec=200)


def ranges_sql(column: str, ranges: list[Range]) -> str:
    """The ranges as a Spark SQL predicate (for display and for users' own SQL)."""
    if not ranges:
        return "FALSE"
    parts = []
    for lo, hi, nulls in ranges:
        conds = []
        if lo is not None:
            conds.append(f"{column} >= {_literal(lo)}")
        if hi is not None:
            conds.append(f"{column} < {_literal(hi)}")
        cond = " AND ".join(conds) if conds else "TRUE"
        if nulls:
            cond = f"({cond} OR {column} IS NULL)" if conds else "TRUE"
        parts.append(f"({cond})" if len(conds) > 1 and not nulls else cond)
    return " OR ".join(parts)


def _literal(v: Bound) -> str:
    if isinstance(v, str):
        return "'" + v.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(v, dt.datetime):
        return f"TIMESTAMP '{v.isoformat(sep=' ')}'" if v.tzinfo else f"TIMESTAMP_NTZ '{v.isoformat(sep=' ')}'"
    if isinstance(v, dt.date):
        return f"DATE '{v.isoformat()}'"
    if isinstance(v, decimal.Decimal):
        return format(v, "f")  # plain digits: "1E+3" would be read as a DOUBLE
    if isinstance(v, float) and not math.isfinite(v):
        return f"CAST('{'NaN' if math.isnan(v) else 'Infinity' if v > 0 else '-Infinity'}' AS DOUBLE)"
    return repr(v)


# -- file pruning --------------------------------------------------------------------------------------------------


def file_may_match(f: FileStats, partition: Partition, ranges: list[Range]) -> bool:
    """False only when the file's statistics prove that no row of it lies in any range."""
    column = partition.column
    if f.num_records == 0:
        return False
    if column in f.partition_values:
        return _partition_may_match(_partition_value(f.partition_values[column], partition), ranges)
    nulls = f.null_counts.get(column)
    if any(n for _, _, n in ranges) and (nulls is None or nulls > 0):
        return True
    if nulls is not None and f.num_records is not None and nulls >= f.num_records:
        return False  # only NULLs, and no range holds NULL
    if partition.kind == "float" and any(hi is None for _, hi, _ in ranges):
        return True  # NaN is in the last fragment and never in float statistics: no file can be proved NaN-free
    return _min_max_may_match(f.min_values.get(column), f.max_values.get(column), partition, ranges)


def _partition_may_match(value: Any, ranges: list[Range]) -> bool:
    """Whether a file whose rows all hold the partition value ``value`` may have a row in a range."""
    if value is None:
        return any(nulls for _, _, nulls in ranges)
    if value is _UNKNOWN:
        return True
    return any(_in_range(value, lo, hi) for lo, hi, _ in ranges)


def _min_max_may_match(lo_raw: Any, hi_raw: Any, partition: Partition, ranges: list[Range]) -> bool:
    """Whether a file with the column statistics ``[lo_raw, hi_raw]`` may have a non-NULL row in a range."""
    try:
        lo_stat, hi_stat = _widened(lo_raw, hi_raw, partition)
        if lo_stat is None or hi_stat is None:
            return True
        for lo, hi, _ in ranges:
            if (lo is None or _max_reaches(hi_stat, lo, partition)) and (hi is None or lo_stat < hi):
                return True
    except TypeError:
        return True  # statistics of an unexpected type prove nothing
    return False


def prune_files(files: list[FileStats], partition: Partition, fragments: list[int]) -> list[FileStats]:
    ranges = partition.ranges(fragments)
    return [f for f in files if file_may_match(f, partition, ranges)]


_UNKNOWN: Any = object()


def _partition_value(raw: Any, partition: Partition) -> Any:
    """A partition value in the column's type (the log stores text; delta-rs usually parses it already)."""
    if raw is None:
        return None
    value = raw
    if isinstance(raw, str) and partition.kind != "string":
        try:
            value = parse_bound(raw, partition.column_type)
        except UsageError:
            return _UNKNOWN
        if partition.kind == "decimal" or partition.kind == "int":
            return value
    if partition.kind == "timestamp":
        if not isinstance(value, dt.datetime):
            return _UNKNOWN
        return _in_zone(value, partition)
    return value


def _in_zone(value: dt.datetime, partition: Partition) -> dt.datetime:
    """A timestamp statistic as the bounds hold it: UTC for a zoned column, naive for TIMESTAMP_NTZ."""
    if partition.column_type.tz:
        return value.replace(tzinfo=dt.timezone.utc) if value.tzinfo is None else value
    return value.replace(tzinfo=None) if value.tzinfo is not None else value


def _is_nan(v: Any) -> bool:
    return isinstance(v, float) and math.isnan(v)


def _in_range(value: Any, lo: Bound | None, hi: Bound | None) -> bool:
    """``lo <= value < hi`` in Spark's order (NaN above every number)."""
    try:
        if _is_nan(value):
            return hi is None
        return (lo is None or value >= lo) and (hi is None or value < hi)
    except TypeError:
        return True


def _widened(lo: Any, hi: Any, partition: Partition) -> tuple[Any, Any]:
    """File min/max widened to bounds that surely hold every value of the file (None: unbounded)."""
    if lo is None or hi is None or _is_nan(lo) or _is_nan(hi):
        return None, None
    kind = partition.kind
    if kind == "timestamp":
        lo, hi = _in_zone(lo, partition), _in_zone(hi, partition)
        try:
            lo = lo - _MS
        except OverflowError:
            lo = None
        try:
            hi = hi + _MS
        except OverflowError:
            hi = None
        return lo, hi
    if kind == "float":
        return math.nextafter(float(lo), -math.inf), math.nextafter(float(hi), math.inf)
    if kind == "decimal" and partition.column_type.precision > _DOUBLE_DIGITS:
        step = decimal.Decimal(1).scaleb(-partition.column_type.scale)
        lo, hi = decimal.Decimal(lo), decimal.Decimal(hi)
        return (_CTX.subtract(lo, _CTX.add(_CTX.multiply(abs(lo), _RELATIVE), step)),
                _CTX.add(hi, _CTX.add(_CTX.multiply(abs(hi), _RELATIVE), step)))
    return lo, hi


def _max_reaches(hi_stat: Any, lo: Bound, partition: Partition) -> bool:
    """Whether a file whose maximum statistic is ``hi_stat`` may hold a value ``>= lo``.

    A string maximum may be a prefix of the true maximum (writers truncate long strings), so any ``lo`` that starts
    with it may still be reached.
    """
    if hi_stat >= lo:
        return True
    return partition.kind == "string" and isinstance(lo, str) and lo.startswith(hi_stat)

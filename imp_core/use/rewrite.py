"""Sketch use: restrict each partitioned table to the sketch's fragments (paper Section 1, PBDS).

Adjacent fragments merge into one range, so a sketch {ρ3, ρ4} becomes ``price >= b3`` (the last fragment is
open-ended). Fragment 0 also holds the NULLs of the partition column, so its range adds ``OR col IS NULL``. Before
Spark reads anything, Delta files whose min/max statistics cannot meet any range are dropped.
"""

from __future__ import annotations

from typing import Any

from imp_core.sketch.partition import Bound, Partition
from imp_core.sources.delta import FileStats

Range = tuple[Bound | None, Bound | None, bool]


def ranges_sql(column: str, ranges: list[Range]) -> str:
    """The ranges as a SQL predicate (for display and for users' own SQL)."""
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
    import datetime as dt
    import decimal

    if isinstance(v, str):
        return "'" + v.replace("'", "''") + "'"
    if isinstance(v, dt.datetime):
        return f"TIMESTAMP '{v.isoformat(sep=' ')}'"
    if isinstance(v, dt.date):
        return f"DATE '{v.isoformat()}'"
    if isinstance(v, decimal.Decimal):
        return str(v)
    return repr(v)


def file_may_match(f: FileStats, column: str, ranges: list[Range]) -> bool:
    """False only when the file's statistics prove that no row of it lies in any range."""
    if column in f.partition_values:
        value = f.partition_values[column]
        if value is None:
            return any(nulls for _, _, nulls in ranges)
        return any(_in_range(value, lo, hi) for lo, hi, _ in ranges)
    lo_stat, hi_stat = f.min_values.get(column), f.max_values.get(column)
    nulls = f.null_counts.get(column)
    if any(n for _, _, n in ranges) and (nulls is None or nulls > 0):
        return True
    if lo_stat is None or hi_stat is None:
        # no statistics: keep, unless the file is known to hold only NULLs (handled above)
        all_null = nulls is not None and f.num_records is not None and nulls == f.num_records
        return not all_null
    for lo, hi, _ in ranges:
        try:
            if (lo is None or hi_stat >= lo) and (hi is None or lo_stat < hi):
                return True
        except TypeError:
            return True
    return False


def _in_range(value: Any, lo: Bound | None, hi: Bound | None) -> bool:
    try:
        return (lo is None or value >= lo) and (hi is None or value < hi)
    except TypeError:
        return True


def prune_files(files: list[FileStats], partition: Partition, fragments: list[int]) -> list[FileStats]:
    ranges = partition.ranges(fragments)
    return [f for f in files if file_may_match(f, partition.column, ranges)]

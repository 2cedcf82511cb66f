"""What the service reads about the tables' data: column signs from Delta file statistics, sign assumptions
checked against the data, equi-depth bounds, and change rows per table version.

See docs/ARCHITECTURE.md, "Safety".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import polars as pl

from imp_core.engine.schema import MULT
from imp_core.maintenance.feeds import ChangeFeeds
from imp_core.plan.safety import SignAssumption
from imp_core.sources.delta import VERSION, DeltaSource

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SignOracle = Callable[[str, str], str | None]


def sign_oracle(sources: Mapping[str, DeltaSource], versions: Mapping[str, int]) -> SignOracle:
    """Column signs from Delta file statistics (exact min/max per file) at the pinned versions: ``+`` when no value
    is negative, ``-`` when none is positive, None when the statistics do not say (a file without them)."""
    cache: dict[str, dict[str, str]] = {}

    def oracle(table: str, column: str) -> str | None:
        if table not in sources:
            return None
        if table not in cache:
            cache[table] = _signs(sources[table], versions[table])
        return cache[table].get(column)

    return oracle


def _signs(source: DeltaSource, version: int) -> dict[str, str]:
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    complete: dict[str, bool] = {}
    for f in source.files(version):
        for col in set(f.min_values) | set(f.max_values):
            lo, hi = f.min_values.get(col), f.max_values.get(col)
            nulls = f.null_counts.get(col)
            all_null = nulls is not None and f.num_records is not None and nulls == f.num_records
            if (lo is None or hi is None) and not all_null:
                complete[col] = False
                continue
            complete.setdefault(col, True)
            if lo is not None:
                mins[col] = lo if col not in mins else min(mins[col], lo)
                maxs[col] = hi if col not in maxs else max(maxs[col], hi)
    signs: dict[str, str] = {}
    for col, ok in complete.items():
        if not ok or col not in mins:
            continue
        try:
            if mins[col] >= 0:
                signs[col] = "+"
            elif maxs[col] <= 0:
                signs[col] = "-"
        except TypeError:
            continue
    return signs


def violated_assumption(spark: SparkSession, sources: Mapping[str, DeltaSource], versions: Mapping[str, int],
                        assumptions: Sequence[SignAssumption]) -> str | None:
    """The first sign assumption the data at ``versions`` breaks, described; None when all hold.

    One Spark job per table with assumptions; comparisons follow Spark (NaN above every number, so NaN breaks
    ``<= 0``), NULLs break nothing.
    """
    from pyspark.sql import functions as F  # lazy start of Spark

    by_table: dict[str, list[SignAssumption]] = {}
    for a in assumptions:
        by_table.setdefault(a.table, []).append(a)
    for table, items in sorted(by_table.items()):
        df = sources[table].scan(spark, versions[table])
        aggs = []
        for i, a in enumerate(items):
            c = F.col(f"`{a.column}`")
            aggs.append(F.min(F.when(c < 0, c)).alias(f"b{i}") if a.sign == "+" else
                        F.max(F.when(c > 0, c)).alias(f"b{i}"))
        row = df.agg(*aggs).first()
        for i, a in enumerate(items):
            if row is not None and row[f"b{i}"] is not None:
                return (f"a row of {table} at version {versions[table]} with {a.column} = {row[f'b{i}']}, which "
                        f"breaks the assumption {a} its safety relies on")
    return None


def broken_by_changes(assumptions: Sequence[SignAssumption], table: str, changes: pl.DataFrame) -> str | None:
    """The first assumption on ``table`` an inserted change row breaks, described; None when all hold.

    polars orders NaN above every number, as Spark does: NaN breaks ``<= 0`` and not ``>= 0``.
    """
    for a in assumptions:
        if a.table != table or a.column not in changes.columns:
            continue
        inserted = changes.filter(pl.col(MULT) > 0).get_column(a.column)
        bad = inserted.filter(inserted < 0) if a.sign == "+" else inserted.filter(inserted > 0)
        if bad.len():
            return f"it is safe only while {a}, but new rows of {table} have {a.column} = {bad[0]}"
    return None


def equi_depth(spark: SparkSession, source: DeltaSource, version: int, column: str, fragments: int,
               kind: str) -> Sequence[Any]:
    """``fragments`` equi-depth bounds of ``column`` at ``version`` (one Spark job)."""
    from imp_core.spark.bounds import equi_depth_bounds  # lazy start of Spark

    df = source.scan(spark, version)
    return equi_depth_bounds(df, column, fragments, kind, source.column_stats(version, column))


def rows_per_version(source: DeltaSource, after: int, upto: int, feeds: ChangeFeeds | None = None) -> dict[int, int]:
    """Change rows of each table version in ``(after, upto]`` (versions without change rows are left out), through
    ``feeds`` when a grouped job shares its tables' change feeds."""
    table = feeds.changes(source, after, upto, []) if feeds is not None else source.changes(after, upto, columns=[])
    if table.num_rows == 0:
        return {}
    counts = pl.from_arrow(table.select([VERSION])).group_by(VERSION).len()  # type: ignore[union-attr]
    return dict(zip(counts.get_column(VERSION).to_list(), counts.get_column("len").to_list()))


__all__ = ["SignOracle", "broken_by_changes", "equi_depth", "rows_per_version", "sign_oracle",
           "violated_assumption"]

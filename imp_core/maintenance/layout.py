"""Sketch-aware layout: what a sketched scan costs against what it would cost on a table clustered by the sketched
column, per table, and the compaction that clusters the table when the excess grows too large.

A sketched scan reads every data file whose min/max statistics overlap the sketch's ranges. After a stream of small
appends, each new file spans most of the domain, so it is read although it holds few rows of the ranges: the sketch
still holds (maintenance is exact), but the query opens and reads more than it needs. Costs are counted as Spark's
planner counts them: a file read costs its bytes plus ``OPEN_COST_BYTES`` (``spark.sql.files.openCostInBytes``), so
many small files cost what their opening costs although they hold few rows. Per usable sketch on a table, from the
Delta file statistics at the table's current version:

* ``files_read`` / ``rows_read`` / ``cost``: the files a scan restricted to the sketch's latest ranges reads, their
  rows, and their cost;
* ``rows_needed``: the rows of those files estimated to lie inside the ranges (each file's values spread evenly over
  its ``[min, max]``; a file without usable statistics counts as needed whole);
* ``clustered_cost``: the expected cost of the same scan on the table sorted by the sketch's column and cut into
  ``m`` files of equal size, for the ``m`` that makes it cheapest (the fragments hold equal shares of the table, as
  the equi-depth ranges of registration do; a run of selected fragments overlaps one file more than it fills, since
  file ends fall anywhere): few large files when the sketch is scattered, more and smaller ones when it is narrow;
* the *excess share* ``1 - clustered_cost / cost``: what the sketched scan spends beyond that.

The table's share is the largest of its sketches'. Above the threshold (``IMP_LAYOUT_THRESHOLD``, default 0.5), and
when it has at least ``MIN_FILES`` data files (fewer have little to prune), the table is compacted and Z-ordered by
its sketched columns (delta-rs OPTIMIZE ZORDER BY) into the file count that is cheapest for its sketches together
(``target_files``): one Delta version without data change, which maintenance passes through as it passes any rewrite
(its change feed is empty), after which the same ranges select few files and the share is small again, so the next
night leaves the table alone unless new appends undid the clustering. With several sketched columns the cost of the
clustered table is an estimate (Z-order clusters each column less than a sort by it alone would). See
docs/ARCHITECTURE.md, "Sketch use and reuse".
"""

from __future__ import annotations

import datetime as dt
import decimal
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from imp_core.errors import ImpError, UsageError, first_line
from imp_core.maintenance.context import ServiceContext
from imp_core.maintenance.loading import version_partitions
from imp_core.sketch.partition import Partition
from imp_core.sources.delta import FileStats
from imp_core.use.rewrite import prune_files

DEFAULT_THRESHOLD = 0.5
CLUSTERED = "liquid-clustered (Delta keeps its layout by its CLUSTER BY columns with OPTIMIZE)"
MIN_FILES = 8  # a table of fewer files has little to prune: re-clustering it would only add a version
OPEN_COST_BYTES = 4 << 20  # spark.sql.files.openCostInBytes: what Spark's planner charges for opening a file
MIN_FILE_BYTES = 1 << 20  # the smallest file the rewrite aims at: smaller ones cost more to open than to read
MAX_FILE_BYTES = 256 << 20  # Delta's usual target: a large table keeps the usual file size


def threshold_setting() -> float:
    """``IMP_LAYOUT_THRESHOLD``: the excess share above which a table is re-clustered."""
    raw = os.environ.get("IMP_LAYOUT_THRESHOLD", "")
    try:
        value = float(raw) if raw else DEFAULT_THRESHOLD
    except ValueError:
        raise UsageError(f"IMP_LAYOUT_THRESHOLD={raw!r}: give a share between 0 and 1, e.g. 0.5") from None
    if not 0 <= value <= 1:
        raise UsageError(f"IMP_LAYOUT_THRESHOLD={raw!r}: give a share between 0 and 1, e.g. 0.5")
    return value


@dataclass(frozen=True)
class SketchCoverage:
    """What a scan restricted to one sketch's latest ranges reads of the table, and what it costs (bytes read plus
    the open cost per file) against the same scan on the table clustered by the sketch's column."""

    sketch: str
    column: str
    files_read: int
    rows_read: int
    rows_needed: float
    cost: int
    clustered_cost: int

    @property
    def excess_share(self) -> float:
        return max(0.0, 1.0 - self.clustered_cost / self.cost) if self.cost else 0.0


@dataclass(frozen=True)
class TableLayout:
    """One table's files against its sketches."""

    table: str
    version: int
    files: int
    rows: int
    sketches: list[SketchCoverage] = field(default_factory=list)
    bytes: int = 0
    target_files: int = 1  # the file count of the clustered layout cheapest for the sketches together

    @property
    def excess_share(self) -> float:
        return max((s.excess_share for s in self.sketches), default=0.0)

    @property
    def columns(self) -> list[str]:
        """The sketched columns, most wasteful sketch's first (Z-order weighs earlier columns no more than later)."""
        out: list[str] = []
        for s in sorted(self.sketches, key=lambda s: -s.excess_share):
            if s.column not in out:
                out.append(s.column)
        return out

    def to_json(self) -> dict[str, Any]:
        return {"table": self.table, "version": self.version, "files": self.files, "rows": self.rows,
                "bytes": self.bytes, "excess_share": round(self.excess_share, 4), "columns": self.columns,
                "target_files": self.target_files,
                "sketches": [{**asdict(s), "rows_needed": round(s.rows_needed, 1),
                              "excess_share": round(s.excess_share, 4)} for s in self.sketches]}


def measure(parts: ServiceContext, table: str | None = None) -> list[TableLayout]:
    """The layout of ``table`` (every table some usable sketch partitions, by default) at its current version."""
    catalog = parts.catalog
    registered = {t.name for t in catalog.list_tables()}
    if table is not None and table not in registered:
        raise UsageError(f"table {table} is not registered; registered: {', '.join(sorted(registered)) or 'none'}")
    per_table: dict[str, list[tuple[str, Partition, list[int]]]] = {}
    for record in catalog.list_sketches():
        if not record.usable:
            continue
        latest = catalog.latest_version(record.id)
        fragments = latest.fragments
        for part in version_partitions(record, latest).partitions:  # a repartition changes them
            if table is None or part.table == table:
                per_table.setdefault(part.table, []).append((record.name, part, list(fragments.get(part.table, []))))
    if table is not None:
        per_table.setdefault(table, [])
    out = []
    for name in sorted(per_table):
        source = parts.sources([name])[name]
        version = source.current_version()
        files = source.files(version)
        size = sum(f.size_bytes for f in files)
        sketched = [(part, frags) for _, part, frags in per_table[name]]
        coverage = [_coverage(sketch, part, frags, files, size) for sketch, part, frags in per_table[name]]
        out.append(TableLayout(name, version, len(files), sum(f.num_records or 0 for f in files), coverage, size,
                               _cheapest_file_count(size, sketched)))
    return out


def skipped_tables() -> frozenset[str]:
    """Tables the layout pass leaves alone: those listed in ``IMP_LAYOUT_SKIP`` (comma-separated)."""
    return frozenset(t.strip() for t in os.environ.get("IMP_LAYOUT_SKIP", "").split(",") if t.strip())


def switched_on() -> bool:
    """``IMP_LAYOUT`` (default ``on``): whether the nightly DAG re-clusters tables at all."""
    raw = os.environ.get("IMP_LAYOUT", "on").strip().lower()
    if raw not in ("on", "off"):
        raise UsageError(f"IMP_LAYOUT={raw!r}: give on or off")
    return raw == "on"


@dataclass(frozen=True)
class Relayout:
    """What the layout pass did with one table: ``after`` is its layout after re-clustering (None when left as it
    was), ``outcome`` says why, ``error`` is the one-line reason of a failed rewrite."""

    before: TableLayout
    after: TableLayout | None
    outcome: str
    error: str | None = None

    @property
    def failed(self) -> bool:
        return self.error is not None

    def to_json(self) -> dict[str, Any]:
        return {**self.before.to_json(), "after": self.after.to_json() if self.after is not None else None,
                "outcome": self.outcome, "error": self.error}


def apply(parts: ServiceContext, table: str | None = None, threshold: float | None = None,
          skip: frozenset[str] = frozenset()) -> list[Relayout]:
    """Re-cluster every measured table whose excess share exceeds ``threshold``, but those switched off in the
    catalog (``imp table layout TABLE --off``) or listed in ``skip``. A table whose rewrite fails is reported with
    its error and the others go on."""
    limit = threshold_setting() if threshold is None else threshold
    if not 0 <= limit <= 1:
        raise UsageError(f"--threshold {limit}: give a share between 0 and 1, e.g. 0.5")
    off = {t.name for t in parts.catalog.list_tables() if not t.layout_maintenance}
    out: list[Relayout] = []
    for before in measure(parts, table):
        source = parts.sources([before.table])[before.table]
        why = _left_alone(before, limit, off, skip) or (CLUSTERED if source.clustered() else None)
        if why is not None:
            out.append(Relayout(before, None, why))
            continue
        parts.progress(f"table {before.table}: sketched scans cost {before.excess_share:.0%} more than on the table "
                       f"clustered; OPTIMIZE ZORDER BY ({', '.join(before.columns)}) into about "
                       f"{before.target_files} file(s)")
        try:
            source.z_order(before.columns, target_size=max(MIN_FILE_BYTES, before.bytes // before.target_files))
            out.append(Relayout(before, measure(parts, before.table)[0], "re-clustered"))
        except ImpError as e:
            out.append(Relayout(before, None, "failed", first_line(e)))
    return out


def _left_alone(before: TableLayout, limit: float, off: set[str], skip: frozenset[str]) -> str | None:
    """Why the pass leaves a table as it is (None: re-cluster it)."""
    if before.table in off:
        return "switched off (imp table layout TABLE --on)"
    if before.table in skip:
        return "skipped (IMP_LAYOUT_SKIP)"
    if not before.sketches:
        return "no usable sketch"
    if before.excess_share <= limit:
        return f"below the threshold ({limit:.0%})"
    if before.files < MIN_FILES:
        return f"fewer than {MIN_FILES} files"
    return None


def _coverage(sketch: str, part: Partition, fragments: list[int], files: list[FileStats],
              size: int) -> SketchCoverage:
    read = prune_files(files, part, fragments) if fragments else []
    ranges = part.ranges(fragments) if fragments else []
    rows = sum(f.num_records or 0 for f in read)
    needed = sum(_rows_inside(f, part.column, ranges) for f in read)
    cost = sum(f.size_bytes + OPEN_COST_BYTES for f in read)
    clustered = min((_clustered_cost(size, m, part.fragments, fragments) for m in _file_counts(size)), default=0)
    return SketchCoverage(sketch, part.column, len(read), rows, min(needed, float(rows)), cost, clustered)


def _file_counts(size: int) -> list[int]:
    """The file counts the rewrite may aim at: powers of two whose files are between ``MIN_FILE_BYTES`` and
    ``MAX_FILE_BYTES`` (one file at least)."""
    counts, m = [], 1
    while m == 1 or size // m >= MIN_FILE_BYTES:
        if size // m <= MAX_FILE_BYTES or m * MIN_FILE_BYTES > size:
            counts.append(m)
        m *= 2
    return counts


def _clustered_cost(size: int, files: int, fragments: int, selected: list[int]) -> int:
    """The expected cost of reading ``selected`` of ``fragments`` equal fragments from ``size`` bytes sorted by the
    column and cut into ``files`` files of equal size, every file that overlaps a selected fragment read whole.

    The rewrite cuts files by size, not at fragment bounds, so a run of consecutive selected fragments covering
    ``w`` files' worth of rows overlaps ``w + 1`` files on average (its ends fall anywhere inside a file)."""
    if not selected:
        return 0
    ordered = sorted(set(selected))
    runs, width = [], 1
    for prev, cur in zip(ordered, ordered[1:]):
        if cur == prev + 1:
            width += 1
        else:
            runs.append(width)
            width = 1
    runs.append(width)
    touched = min(float(files), sum(w * files / fragments + 1 for w in runs))
    return round(touched * (size / files + OPEN_COST_BYTES))


def _cheapest_file_count(size: int, sketched: list[tuple[Partition, list[int]]]) -> int:
    """The file count whose clustered layout costs the sketches' scans least together (one file when none)."""
    counts = _file_counts(size)
    return min(counts, key=lambda m: (sum(_clustered_cost(size, m, p.fragments, frags) for p, frags in sketched), m))


def _rows_inside(f: FileStats, column: str, ranges: list[tuple[Any, Any, bool]]) -> float:
    """The file's rows estimated to lie in ``ranges`` (values spread evenly over the file's [min, max]).

    Integers and dates are counted as values (a file of 15..24 holds 5 of its 10 values in [10, 20)); a timestamp
    maximum is widened by the millisecond Delta truncates statistics to."""
    total = f.num_records or 0
    nulls = f.null_counts.get(column) or 0
    raw_lo, raw_hi = f.min_values.get(column), f.max_values.get(column)
    lo, hi = _number(raw_lo), _number(raw_hi)
    if lo is None or hi is None or total == 0:
        return float(total)
    step = _step(raw_lo)
    hi += step if step else 0.001 if isinstance(raw_hi, dt.datetime) else 0.0
    covered = 0.0
    with_nulls = False
    for r_lo, r_hi, r_nulls in ranges:
        with_nulls |= r_nulls
        start, end = _number(r_lo), _number(r_hi)  # None: open-ended
        a = lo if start is None else max(lo, start)
        b = hi if end is None else min(hi, end)
        if hi == lo:  # one value: inside the range [r_lo, r_hi) or not
            above = start is None or lo >= start
            below = end is None or lo < end
            covered = 1.0 if above and below else covered
        elif b > a:
            covered += (b - a) / (hi - lo)
    return min(covered, 1.0) * (total - nulls) + (nulls if with_nulls else 0)


def _step(v: Any) -> float:
    """The distance between neighbouring values of a discrete kind (integers, dates), 0 for continuous ones: a file
    of integers ``lo..hi`` covers ``[lo, hi + 1)``."""
    if isinstance(v, bool):
        return 0.0
    if isinstance(v, int) or (isinstance(v, dt.date) and not isinstance(v, dt.datetime)):
        return 1.0
    return 0.0


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, float, decimal.Decimal)):
        return float(v)
    if isinstance(v, dt.datetime):
        return (v if v.tzinfo else v.replace(tzinfo=dt.timezone.utc)).timestamp()
    if isinstance(v, dt.date):
        return float(v.toordinal())
    return None


__all__ = ["DEFAULT_THRESHOLD", "MIN_FILES", "OPEN_COST_BYTES", "Relayout", "SketchCoverage", "TableLayout", "apply",
           "measure", "skipped_tables", "switched_on", "threshold_setting"]

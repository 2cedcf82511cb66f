"""Range split and merge of a sketch's partitions (paper 7.4), committed as a version with method ``repartition``.

Rows per fragment are tracked with each version (``fragment_rows``: counted once from the table, then carried
forward by every maintenance pass from its change rows). A fragment above ``factor`` times the mean is split at its
values' quantiles, runs of neighbours far below it are merged (:mod:`imp_core.sketch.repartition`). Operator state
follows without a recapture: ids are renamed (``Pipeline.repartitioned``) and only the rows that change fragment are
read back from the table at the version's snapshot and pushed through the operators as deletions under the old id
and insertions under the new one (``__refrag``). The committed sketch is therefore exactly the one a capture with the
new bounds would give; it is checked to lie within the paper's rule (a sketch holding ρ holds ρ's pieces; one
holding a merged fragment's part holds the merged fragment) before it is committed. See docs/ARCHITECTURE.md,
"Range split and merge".
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from imp_core.catalog import VersionRecord
from imp_core.engine.evaluate import compile_expr, polars_type
from imp_core.engine.pipeline import Pipeline
from imp_core.engine.schema import MULT, REFRAG
from imp_core.errors import ImpError, StateError, UnsupportedError, UsageError, first_line
from imp_core.maintenance import guards
from imp_core.maintenance.changes import used_columns
from imp_core.maintenance.context import ServiceContext
from imp_core.maintenance.loading import LoadedSketch, load_sketch, load_state
from imp_core.maintenance.runs import Run, commit, maintenance_run, new_version
from imp_core.plan.nodes import Plan
from imp_core.plan.pushdown import change_filter
from imp_core.sketch import repartition as rp
from imp_core.sketch.partition import Partition, PartitionSet
from imp_core.sketch.sketch import Sketch
from imp_core.sources import reader
from imp_core.sources.delta import DeltaSource
from imp_core.use.rewrite import ranges_sql


@dataclass
class TablePlan:
    """What a repartition does (or would do) to one table's partition."""

    table: str
    column: str
    fragments_before: int
    fragments_after: int
    skew_before: float  # the largest fragment's rows over the mean
    skew_after: float
    splits: list[dict[str, Any]] = field(default_factory=list)  # {"fragment", "rows", "pieces"}
    merges: list[dict[str, Any]] = field(default_factory=list)  # {"fragments": [first, last], "rows"}
    rows_moved: int = 0
    rows: list[int] = field(default_factory=list)  # rows per fragment before

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class RepartitionResult:
    """``imp sketch repartition``: per table what changed, and the version committed (None for a dry run or when
    every partition is fine)."""

    sketch: str
    factor: float
    tables: list[TablePlan]
    version: VersionRecord | None = None
    counted: bool = False  # rows per fragment were counted from the table (not tracked by the latest version)

    @property
    def changed(self) -> bool:
        return any(t.splits or t.merges for t in self.tables)

    def to_json(self) -> dict[str, Any]:
        return {"sketch": self.sketch, "factor": self.factor, "changed": self.changed, "counted": self.counted,
                "version": self.version.version if self.version else None,
                "tables": [t.to_json() for t in self.tables]}


def repartition(parts: ServiceContext, name: str, factor: float = rp.DEFAULT_FACTOR, apply: bool = False,
                trigger: str = "cli", wait: float | None = None) -> RepartitionResult:
    """Split over- and merge underflowing fragments of sketch ``name``'s partitions (``apply``), or say what would
    be done. Works at the latest version's table versions; maintain first to repartition the current data.

    Raises:
        SketchUnusableError: The sketch is unusable.
        UnsupportedError: The sketch's query reads a partitioned table twice (a self-join).
        StateError: The latest version has no usable operator state (maintain or recapture first).
    """
    rp.check(Partition("t", "c", (0, 1), "int"), [0], factor)
    loaded = load_sketch(parts, name)
    guards.refuse_unusable(loaded.record)
    for table in loaded.partitions.tables:
        if sum(1 for s in loaded.plan.scans() if s.table == table) > 1:
            raise UnsupportedError(f"sketch {name} reads table {table} more than once; its ranges cannot be split or "
                                   f"merged in place: drop it and create it again with other bounds")
    catalog = parts.catalog
    with catalog.sketch_lock(loaded.record.id, timeout=wait):
        guards.refuse_unusable(catalog.get_sketch_by_id(loaded.record.id))
        latest = catalog.latest_version(loaded.record.id)
        loaded = loaded.at(latest)
        rows = dict(latest.fragment_rows or {})
        counted = any(t not in rows for t in loaded.partitions.tables)
        for table in loaded.partitions.tables:
            if table not in rows:
                rows[table] = count_rows(parts, loaded.plan, loaded.partitions, loaded.sources, table,
                                         latest.table_versions[table])
        plans, reads = _plans(parts, loaded, latest, rows, factor)
        result = RepartitionResult(name, factor, [_describe(loaded, p, rows[p.old.table], reads.get(p.old.table))
                                                  for p in plans.values()], counted=counted)
        if not apply or not result.changed:
            return result
        with maintenance_run(catalog, trigger, "repartition", sketch_id=loaded.record.id, start=latest) as run:
            result.version = _apply(parts, loaded, latest, plans, reads, rows, run, result)
    return result


def switched_on() -> bool:
    """``IMP_REPARTITION`` (default ``on``): whether the nightly DAG splits and merges ranges."""
    raw = os.environ.get("IMP_REPARTITION", "on").strip().lower()
    if raw not in ("on", "off"):
        raise UsageError(f"IMP_REPARTITION={raw!r}: give on or off")
    return raw == "on"


def factor_setting() -> float:
    """``IMP_REPARTITION_FACTOR`` (default :data:`~imp_core.sketch.repartition.DEFAULT_FACTOR`)."""
    raw = os.environ.get("IMP_REPARTITION_FACTOR", "")
    try:
        factor = float(raw) if raw else rp.DEFAULT_FACTOR
    except ValueError:
        factor = 0.0
    if not factor > 1:
        raise UsageError(f"IMP_REPARTITION_FACTOR={raw!r}: give a number above 1, e.g. 4")
    return factor


def skewed(parts: ServiceContext, factor: float) -> list[str]:
    """The usable sketches whose ranges over- or underflow by their latest version's rows per range, and those whose
    rows are not tracked (a repartition counts them): no Spark, only the catalog."""
    catalog = parts.catalog
    out = []
    for record in catalog.list_sketches():
        if not record.usable:
            continue
        version = catalog.latest_version(record.id)
        rows = version.fragment_rows
        if rows is None or any(rp.needs_change(counts, factor) for counts in rows.values() if counts):
            out.append(record.name)
    return out


def repartition_all(parts: ServiceContext, factor: float = rp.DEFAULT_FACTOR,
                    trigger: str = "cli") -> list[dict[str, Any]]:
    """:func:`repartition` with ``apply`` of every usable sketch (what the nightly DAG runs); one sketch's failure is
    reported in its entry (``error``) and does not stop the others."""
    out: list[dict[str, Any]] = []
    for record in parts.catalog.list_sketches():
        if not record.usable:
            continue
        try:
            out.append(repartition(parts, record.name, factor, apply=True, trigger=trigger).to_json())
        except ImpError as e:
            out.append({"sketch": record.name, "factor": factor, "changed": False, "error": first_line(e)})
    return out


def count_rows(parts: ServiceContext, plan: Plan, partitions: PartitionSet, sources: Mapping[str, DeltaSource],
               table: str, version: int) -> list[int]:
    """Rows of ``table`` at ``version`` in each fragment of its partition, counting the rows the sketch's pipeline
    sees (those passing the query's selections right above the table's scans): the partition column (and the
    selections' columns) read batch by batch in this process when the table's reader allows it (the driver holds one
    batch, not the table), else counted by one Spark job (reader.py decides)."""
    part = partitions.get(table)
    assert part is not None
    pred = change_filter(plan, table)
    source = sources[table]
    if not reader.choice(source, version).in_process:
        from imp_core.spark.compile import compile_expr as spark_expr  # lazy start of Spark
        from imp_core.spark.fragment import fragment_counts

        return fragment_counts(source.scan(parts.spark, version), part,
                               spark_expr(pred) if pred is not None else None)
    columns = used_columns(plan, table) if pred is not None else [part.column]
    counts = np.zeros(part.fragments, dtype=np.int64)
    for batch in reader.batches(source, version, columns):
        rows = pl.from_arrow(batch)
        assert isinstance(rows, pl.DataFrame)
        counts += np.asarray(_counts(plan, part, rows, pred), dtype=np.int64)
    return [int(n) for n in counts]


def tracked_rows(parts: ServiceContext, plan: Plan, partitions: PartitionSet, sources: Mapping[str, DeltaSource],
                 versions: Mapping[str, int]) -> dict[str, list[int]]:
    """``count_rows`` of every partitioned table (what a capture records with its version)."""
    return {t: count_rows(parts, plan, partitions, sources, t, versions[t]) for t in partitions.tables}


def advance_rows(rows: Mapping[str, list[int]] | None, loaded: LoadedSketch, table: str,
                 changes: pl.DataFrame) -> dict[str, list[int]] | None:
    """``rows`` (per table, per fragment) after ``table``'s change rows (plain columns, ``__mult``); None stays
    None (not tracked)."""
    if rows is None:
        return None
    part = loaded.partitions.get(table)
    if part is None or table not in rows or changes.height == 0:
        return dict(rows)
    delta = np.asarray(_counts(loaded.plan, part, changes, change_filter(loaded.plan, table)), dtype=np.int64)
    before = np.asarray(rows[table], dtype=np.int64)
    if before.size != delta.size:
        return None  # counts of other bounds: stop tracking (a recount follows when a repartition needs them)
    return {**rows, table: (before + delta).tolist()}


def _counts(plan: Plan, part: Partition, rows: pl.DataFrame, pred: Any) -> list[int]:
    if pred is not None and rows.height:
        rows = rows.filter(compile_expr(pred).fill_null(False))
    values = _values(plan, part, rows)
    weights = rows.get_column(MULT).to_numpy() if MULT in rows.columns else None
    counts = np.bincount(part.fragment_of(values), weights=weights, minlength=part.fragments)
    return [int(n) for n in np.rint(counts)]


def _values(plan: Plan, part: Partition, rows: pl.DataFrame) -> pl.Series:
    """The partition column of ``rows`` in the engine's storage type (as the scans annotate it)."""
    dtype = next(c.dtype for s in plan.scans() if s.table == part.table for c in s.columns if c.name == part.column)
    return rows.get_column(part.column).cast(polars_type(dtype), strict=False)


def _read(parts: ServiceContext, source: DeltaSource, part: Partition, version: int, columns: list[str],
          fragments: list[int] | None) -> pl.DataFrame:
    """``columns`` of the table at ``version`` through Spark (only the rows of ``fragments`` of ``part`` when
    given: files are skipped by their statistics)."""
    df = source.scan(parts.spark, version)
    if fragments is not None:
        df = df.where(ranges_sql(f"`{part.column}`", part.ranges(fragments)))
    out = pl.from_arrow(df.select(*[f"`{c}`" for c in columns]).toArrow())
    assert isinstance(out, pl.DataFrame)
    return out


def _plans(parts: ServiceContext, loaded: LoadedSketch, latest: VersionRecord, rows: Mapping[str, list[int]],
           factor: float) -> tuple[dict[str, rp.Repartition], dict[str, pl.DataFrame]]:
    """Per table the split-and-merge, and the rows read of its overflowing fragments (used again to move them)."""
    plans, reads = {}, {}
    for part in loaded.partitions.partitions:
        counts = rows[part.table]
        rp.check(part, counts, factor)
        over = rp.overflowing(counts, factor)
        values: dict[int, pl.Series] = {}
        if over:
            read = _read(parts, loaded.sources[part.table], part, latest.table_versions[part.table],
                         loaded.used_columns(part.table), over)
            frag = part.fragment_of(_values(loaded.plan, part, read))
            reads[part.table] = read
            values = {f: _values(loaded.plan, part, read.filter(pl.Series(frag == f))) for f in over}
        plans[part.table] = rp.plan(part, counts, factor, values)
    return plans, reads


def _describe(loaded: LoadedSketch, plan: rp.Repartition, rows: list[int], overflow: pl.DataFrame | None) -> TablePlan:
    after = plan.new_rows(rows, _split_rows(plan, *_pieces(loaded, plan, overflow)))
    out = TablePlan(plan.old.table, plan.old.column, plan.old.fragments, plan.new.fragments, _skew(rows), _skew(after),
                    rows=list(rows))
    to_mid = plan.old_to_mid()
    for m, cuts in plan.splits.items():
        old = int(np.flatnonzero(to_mid == m)[0])
        out.splits.append({"fragment": old, "rows": rows[old], "pieces": len(cuts) + 1})
    for first, last in plan.merges:
        out.merges.append({"fragments": [first, last], "rows": int(sum(rows[first:last + 1]))})
    return out


def _pieces(loaded: LoadedSketch, plan: rp.Repartition, overflow: pl.DataFrame | None) -> tuple[np.ndarray, np.ndarray]:
    """For each row read of the overflowing fragments: the new id it holds after renaming (a split fragment's first
    piece) and the new id it belongs to."""
    if overflow is None or not plan.splits:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    values = _values(loaded.plan, plan.old, overflow)
    first = plan.mid_to_new()[plan.old_to_mid()[plan.old.fragment_of(values)]]
    return first, plan.new.fragment_of(values).astype(np.int64)


def _split_rows(plan: rp.Repartition, first: np.ndarray, now: np.ndarray) -> dict[int, list[int]]:
    """Rows per piece of each split (mid id -> counts)."""
    to_new = plan.mid_to_new()
    out = {}
    for m, cuts in plan.splits.items():
        start = int(to_new[m])
        out[m] = [int(n) for n in np.bincount(now[first == start] - start, minlength=len(cuts) + 1)]
    return out


def _skew(rows: list[int]) -> float:
    mean = sum(rows) / len(rows) if rows else 0
    return round(max(rows) / mean, 3) if mean else 0.0


def _apply(parts: ServiceContext, loaded: LoadedSketch, latest: VersionRecord, plans: Mapping[str, rp.Repartition],
           reads: Mapping[str, pl.DataFrame], rows: dict[str, list[int]], run: Run,
           result: RepartitionResult) -> VersionRecord:
    t0 = time.perf_counter()
    operators = load_state(parts, loaded, latest)
    backend = parts.backend(loaded.sources)
    versions = dict(latest.table_versions)
    partitions = loaded.partitions
    before = Sketch({t: tuple(f) for t, f in latest.fragments.items()})
    moved_total = 0
    for described in result.tables:
        plan = plans[described.table]
        if not plan.changed:
            continue
        operators, partitions, moved = _table(parts, loaded, operators, partitions, plan, reads.get(plan.old.table),
                                              backend, versions)
        counts = plan.new_rows(rows[plan.old.table], _split_rows(plan, *_pieces(loaded, plan,
                                                                                reads.get(plan.old.table))))
        rows[plan.old.table] = counts
        described.rows_moved = moved
        described.skew_after = _skew(counts)
        moved_total += moved
    after = Sketch.from_global(partitions, operators.sketch())
    for table, plan in plans.items():
        allowed = set(plan.rule(before.fragments.get(table, ())))
        if not set(after.fragments.get(table, ())) <= allowed:
            raise StateError(f"sketch {loaded.name}: the repartitioned sketch of {table} holds fragments the paper's "
                             f"rule does not allow; nothing was committed, recapture the sketch")
    version = new_version(operators, partitions, run, method="repartition", table_versions=versions,
                          identities=latest.table_identities or {}, options=latest.state_options or {}, started=t0,
                          delta_rows=moved_total, fragment_rows=rows,
                          reason=_reason(result))
    return commit(parts.catalog, loaded.record.id, latest, version, run, parts.settings.state_retention)


def _table(parts: ServiceContext, loaded: LoadedSketch, operators: Pipeline, partitions: PartitionSet,
           plan: rp.Repartition, overflow: pl.DataFrame | None, backend: Any,
           versions: dict[str, int]) -> tuple[Pipeline, PartitionSet, int]:
    """One table's merges, then its splits: the operators and partitions after, and the rows moved."""
    table = plan.old.table
    moved = 0
    offset = partitions.offset(table)
    merged_away = plan.moved_by_merge()
    if merged_away:
        rows = _read(parts, loaded.sources[table], plan.old, versions[table], loaded.used_columns(table),
                     [f for f, _ in merged_away])
        old_ids = plan.old.fragment_of(_values(loaded.plan, plan.old, rows)).astype(np.int64)
        target = np.arange(plan.old.fragments, dtype=np.int64)
        for f, to in merged_away:
            target[f] = to
        operators.maintain_pass(table, _moves(rows, old_ids + offset, target[old_ids] + offset), backend, versions)
        moved += rows.height
    mid = rp.replaced(partitions, plan.mid)
    operators = operators.repartitioned(mid, rp.global_map(partitions, table, plan.old_to_mid(), plan.mid.fragments))
    new = rp.replaced(mid, plan.new)
    operators = operators.repartitioned(new, rp.global_map(mid, table, plan.mid_to_new(), plan.new.fragments))
    first, now = _pieces(loaded, plan, overflow)
    moving = now != first
    if overflow is not None and moving.any():
        operators.maintain_pass(table, _moves(overflow.filter(pl.Series(moving)), first[moving] + offset,
                                              now[moving] + offset), backend, versions)
        moved += int(moving.sum())
    return operators, new, moved


def _moves(rows: pl.DataFrame, old: np.ndarray, new: np.ndarray) -> pl.DataFrame:
    """Change rows moving ``rows`` from fragment ``old`` to ``new`` (global ids): a deletion and an insertion."""
    n = rows.height
    out = pl.concat([rows, rows]).with_columns(
        pl.Series(MULT, np.concatenate([np.full(n, -1), np.full(n, 1)]), dtype=pl.Int64),
        pl.Series(REFRAG, np.concatenate([old, new]).astype(np.uint32)))
    return out


def _reason(result: RepartitionResult) -> str:
    parts = []
    for t in result.tables:
        if t.splits or t.merges:
            parts.append(f"{t.table}.{t.column}: {len(t.splits)} split, {len(t.merges)} merged, "
                         f"{t.fragments_before} -> {t.fragments_after} fragments")
    return "; ".join(parts)


__all__ = ["RepartitionResult", "TablePlan", "advance_rows", "count_rows", "factor_setting", "repartition",
           "repartition_all", "skewed", "switched_on", "tracked_rows"]

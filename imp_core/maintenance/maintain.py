"""Maintenance: bring a sketch to the current table versions, lazily (one step), eagerly (one version per batch of
change rows) or by recapture, and fall back to a recapture, recorded with its reason, when incremental maintenance
cannot proceed (change feed gone, state missing or corrupt, a buffer exhausted).

Work on one sketch is serialized by its maintenance lock; a process killed at any point leaves the last committed
version intact. See docs/ARCHITECTURE.md, "Data flow".
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from imp_core import faults, inputs
from imp_core.catalog import VersionRecord
from imp_core.engine import frames
from imp_core.engine.pipeline import Pipeline
from imp_core.errors import ChangeFeedUnavailableError, StateError, UsageError, first_line
from imp_core.maintenance import cost, guards, placement
from imp_core.maintenance.batches import PendingVersion, plan_batches
from imp_core.maintenance.changes import read_changes
from imp_core.maintenance.context import ServiceContext
from imp_core.maintenance.feeds import ChangeFeeds
from imp_core.maintenance.loading import LoadedSketch, load_sketch, load_state, pipeline
from imp_core.maintenance.options import state_options
from imp_core.maintenance.repartition import advance_rows, tracked_rows
from imp_core.maintenance.runs import Run, commit, maintenance_run, new_version, table_identities
from imp_core.maintenance.statistics import rows_per_version
from imp_core.maintenance.strategy import Strategy
from imp_core.sources import names, storage
from imp_core.sources.delta import VERSION

DEFAULT_BATCH = 1000
"""Change rows per committed version of eager maintenance when no batch size is given."""


@dataclass
class MaintenanceResult:
    """What a maintenance call did."""

    sketch: str
    versions: list[VersionRecord] = field(default_factory=list)
    delta_rows: int = 0
    recaptured: str | None = None  # the reason, when a recapture happened
    up_to_date: bool = False


def maintain(parts: ServiceContext, name: str, strategy: str | None = None, batch_size: int | None = None,
             trigger: str = "cli", allow_recapture: bool = True, wait: float | None = None) -> MaintenanceResult:
    """Bring sketch ``name`` to the current table versions with ``strategy`` (default: the sketch's own).

    ``wait``: give up after this many seconds if another process is maintaining the sketch
    (``MaintainerBusyError``); None waits for it.
    """
    loaded = load_sketch(parts, name)
    chosen = Strategy.parse(strategy or loaded.record.strategy or Strategy.LAZY)
    if batch_size is not None:
        inputs.check_batch_size(batch_size, "--batch-size")
    result = MaintenanceResult(name)
    guards.refuse_unusable(loaded.record)
    catalog = parts.catalog
    names.check_identity(catalog, loaded.sources, lambda: parts.spark)  # catalog names still mean these tables
    with catalog.sketch_lock(loaded.record.id, timeout=wait):
        # another process may have marked it while this one waited for the lock
        guards.refuse_unusable(catalog.get_sketch_by_id(loaded.record.id))
        # holding the lock, any run still marked running for this sketch belongs to a dead process
        catalog.abandon_running(loaded.record.id)
        latest = catalog.latest_version(loaded.record.id)
        loaded = loaded.at(latest)
        target = parts.observe(loaded.sources)
        guards.check_identity(catalog, loaded.record, loaded.sources, latest, target)
        if all(target[t] <= latest.table_versions.get(t, -1) for t in target) and chosen is not Strategy.RECAPTURE:
            result.up_to_date = True
            return result
        reason = "requested" if chosen is Strategy.RECAPTURE else _cheaper_recapture(parts, loaded, latest, target,
                                                                                    allow_recapture)
        if reason is not None:
            with maintenance_run(catalog, trigger, Strategy.RECAPTURE.value, sketch_id=loaded.record.id,
                                 start=latest) as run:
                result.versions.append(recapture(parts, loaded, latest, target, reason, run))
            result.recaptured = reason
        else:
            guards.check_schemas(catalog, loaded, target)
            with maintenance_run(catalog, trigger, chosen.value, sketch_id=loaded.record.id, start=latest) as run:
                _incremental_batches(parts, loaded, latest, target, chosen, batch_size, allow_recapture, run, result)
        if any(placement.external_of(v.state_placement) for v in (latest, *result.versions)):
            _clean_up_state(parts, loaded)  # only after a run that read or wrote external state
    return result


def _clean_up_state(parts: ServiceContext, loaded: LoadedSketch) -> None:
    """Remove the external state folders no kept version reads (:func:`placement.clean_up`); a failure is reported,
    not raised: the versions are committed, and the next run tries again."""
    try:
        removed = placement.clean_up(parts, loaded.name, loaded.sources)
    except Exception as e:  # noqa: BLE001 - housekeeping after the commit must not fail the run
        parts.progress(f"sketch {loaded.name}: could not remove external state no version reads: "
                       f"{storage.redact(first_line(e))}; the next run tries again")
        return
    if removed:
        parts.progress(f"sketch {loaded.name}: removed external state no kept version reads ({', '.join(removed)})")


def _cheaper_recapture(parts: ServiceContext, loaded: LoadedSketch, latest: VersionRecord, target: Mapping[str, int],
                       allow_recapture: bool) -> str | None:
    """Why a recapture should replace this step (cheaper by the cost estimate), or None."""
    if not (allow_recapture and parts.settings.cost_choice):
        return None
    found = cost.estimate(parts, loaded, latest, target)
    if found is not None and found.revisit:
        parts.progress(f"sketch {loaded.name}: {cost.REVISIT} recaptures in a row were chosen by cost; maintaining "
                       f"incrementally once to measure it again")
    if found is None or not found.recapture_is_cheaper:
        return None
    parts.progress(f"sketch {loaded.name}: recapturing, {found.reason()}")
    return found.reason()


def _incremental_batches(parts: ServiceContext, loaded: LoadedSketch, latest: VersionRecord, target: dict[str, int],
                         strategy: Strategy, batch_size: int | None, allow_recapture: bool, run: Run,
                         result: MaintenanceResult) -> None:
    """One committed version per batch (lazy: one batch); a recapture instead when incremental maintenance cannot
    proceed (and ``allow_recapture``)."""
    if strategy is Strategy.LAZY:
        batches = [target]
    else:
        batches = eager_batches(loaded, latest.table_versions, target, batch_size or DEFAULT_BATCH, parts.feeds)
    operators: Pipeline | None = None
    for i, batch_target in enumerate(batches):
        parts.progress(f"sketch {loaded.name}: maintaining batch {i + 1}/{len(batches)} -> {batch_target}")
        try:
            if operators is None:
                operators = placement.rebalance(parts, load_state(parts, loaded, latest), loaded.sources,
                                                loaded.name, run.id)
            latest = incremental(parts, loaded, operators, latest, batch_target, run)
        except (ChangeFeedUnavailableError, StateError) as e:
            if not allow_recapture:
                raise
            reason = first_line(e)
            parts.progress(f"sketch {loaded.name}: incremental maintenance cannot proceed ({reason}); recapturing")
            result.versions.append(recapture(parts, loaded, latest, target, reason, run))
            result.recaptured = reason
            return
        result.versions.append(latest)
        result.delta_rows += latest.delta_rows


def incremental(parts: ServiceContext, loaded: LoadedSketch, operators: Pipeline, latest: VersionRecord,
                target: Mapping[str, int], run: Run) -> VersionRecord:
    """One batch: one pass per changed table (in name order), each against the others at the versions already
    reached, then the new version committed."""
    t0 = time.perf_counter()
    backend = parts.backend(loaded.sources)
    reached = dict(latest.table_versions)
    rows = 0
    fragment_rows = latest.fragment_rows
    for table in sorted(target):
        start, end = reached.get(table, -1), target[table]
        if end <= start:
            continue
        changes = read_changes(loaded.sources[table], loaded.plan, start, end, parts.settings.optimizations,
                               feeds=parts.feeds)
        faults.point("after_cdf_read")
        guards.check_changes(parts.catalog, loaded, table, changes)
        reached[table] = end
        operators.maintain_pass(table, frames.drop(changes, VERSION), backend, dict(reached),
                                netting=parts.settings.optimizations.netting)
        faults.point("after_pass")
        fragment_rows = advance_rows(fragment_rows, loaded, table, changes)
        rows += changes.height
    version = new_version(operators, loaded.partitions, run, method="incremental", table_versions=reached,
                          identities=table_identities(loaded.sources), options=latest.state_options or {},
                          started=t0, delta_rows=rows, fragment_rows=fragment_rows)
    return commit(parts.catalog, loaded.record.id, latest, version, run, parts.settings.state_retention)


def recapture(parts: ServiceContext, loaded: LoadedSketch, latest: VersionRecord, target: Mapping[str, int],
              reason: str, run: Run) -> VersionRecord:
    """Full maintenance at ``target``, after the lifecycle guards (schemas, safety and sign assumptions re-checked),
    committed with ``reason``."""
    guards.check_schemas(parts.catalog, loaded, target)
    report = guards.recheck_safety(parts, loaded, target)
    t0 = time.perf_counter()
    # the options the sketch's state has been built with; a version from before they were recorded takes this
    # process's, recorded from now on
    options = latest.state_options if latest.state_options is not None else \
        state_options(parts.settings.optimizations)
    operators = placement.for_capture(parts, lambda external: pipeline(parts, loaded, options, external),
                                      loaded.sources, target, loaded.name, run.id)
    parts.progress(f"recapturing sketch {loaded.name} on Spark at versions {dict(target)}")
    operators.capture(parts.backend(loaded.sources), dict(target))
    rows = tracked_rows(parts, loaded.plan, loaded.partitions, loaded.sources, target)
    version = new_version(operators, loaded.partitions, run, method="recapture", table_versions=target,
                          identities=table_identities(loaded.sources, target), options=options, started=t0,
                          reason=reason, fragment_rows=rows)
    return commit(parts.catalog, loaded.record.id, latest, version, run, parts.settings.state_retention,
                  safety=report.to_json())


def eager_batches(loaded: LoadedSketch, start: Mapping[str, int], target: Mapping[str, int],
                  batch_size: int, feeds: ChangeFeeds | None = None) -> list[dict[str, int]]:
    """Pending table versions in commit order, cut into batches of at least ``batch_size`` change rows."""
    pending: list[PendingVersion] = []
    for table, source in loaded.sources.items():
        lo, hi = start.get(table, -1), target[table]
        if hi <= lo:
            continue
        source.check_cdf_range(lo, hi)
        counts = rows_per_version(source, lo, hi, feeds)
        stamps = {c.version: c.timestamp for c in source.commits(lo, hi)}
        for v in range(lo + 1, hi + 1):
            ts = stamps.get(v)
            pending.append(PendingVersion(table, v, ts.timestamp() if ts else float(v), counts.get(v, 0)))
    return plan_batches(dict(start), pending, batch_size)


def is_stale(parts: ServiceContext, name: str) -> bool:
    """Whether a table of the sketch has a version its latest version does not reflect (observed on the way)."""
    catalog = parts.catalog
    latest = catalog.latest_version(catalog.get_sketch(name).id)
    current = parts.observe(parts.sources(latest.table_versions))
    return any(v > latest.table_versions.get(t, -1) for t, v in current.items())


def check_request(parts: ServiceContext, name: Any, strategy: Any = None, batch_size: Any = None) -> dict[str, Any]:
    """Validate a maintenance request before any Spark job starts (the on-demand DAG's first task).

    Raises:
        UsageError: Unknown strategy, or a batch size that is not an integer of at least 1.
        NotFoundError: No live sketch is named ``name`` (the message lists the existing ones).
        SketchUnusableError: The sketch is marked unusable (it must be dropped and created again).
    """
    if not name or not str(name).strip():
        raise UsageError("give the name of the sketch to maintain (parameter `sketch`)")
    inputs.check_sketch_name(name)
    chosen = Strategy.parse(strategy) if strategy is not None else None
    if batch_size is not None:
        inputs.check_batch_size(batch_size)
    record = parts.catalog.get_sketch(name)
    guards.refuse_unusable(record)
    return {"sketch": record.name, "strategy": (chosen or record.strategy).__str__(), "batch_size": batch_size,
            "stale": is_stale(parts, name)}


__all__ = ["DEFAULT_BATCH", "MaintenanceResult", "check_request", "eager_batches", "incremental", "is_stale",
           "maintain", "recapture"]

"""Grouped maintenance: which sketches one job (one Spark application) maintains, and maintaining them.

A job's fixed cost (JVM, SparkSession, imports, catalog connection: seconds) dwarfs an incremental batch
(milliseconds), and sketches over the same table share its change feed (:mod:`imp_core.maintenance.feeds`). So the
sketches to maintain are grouped by the tables they read: sketches connected through shared tables stay together
(cut into pieces of at most ``size`` when a component is larger, sketches with the same tables next to each other),
and the remaining room in each job is filled with smaller unrelated components, so that the number of jobs is small.

:func:`maintain_group` runs one group in one process: one catalog connection, each table's source and change feed
shared by its sketches, Spark started only if a sketch's pass needs it, and one sketch's failure recorded for that
sketch without stopping the others. See docs/ARCHITECTURE.md "Grouped maintenance".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from imp_core import inputs
from imp_core.catalog import Catalog
from imp_core.errors import (
    GroupFailedError,
    ImpError,
    NotFoundError,
    SketchUnusableError,
    UsageError,
    first_line,
)
from imp_core.maintenance import maintain, reports
from imp_core.maintenance.context import ServiceContext
from imp_core.maintenance.feeds import ChangeFeeds
from imp_core.maintenance.loading import load_sketch
from imp_core.maintenance.maintain import MaintenanceResult
from imp_core.maintenance.strategy import Strategy
from imp_core.spark.failures import as_known_error

log = logging.getLogger(__name__)


def plan_groups(tables: Mapping[str, Iterable[str]], size: int) -> list[tuple[str, ...]]:
    """Cut sketches into groups of at most ``size``, keeping sketches that read the same tables together.

    Args:
        tables: Sketch name -> the tables its query reads.
        size: The largest group.

    Returns:
        The groups, each a tuple of sketch names; deterministic for the same input (names sorted within ties).

    Raises:
        UsageError: ``size`` is below 1.
    """
    if size < 1:
        raise UsageError(f"the maintenance group size must be at least 1, got {size}")
    read = {name: tuple(sorted(set(ts))) for name, ts in tables.items()}
    pieces: list[list[str]] = []
    for component in _components(read):
        ordered = sorted(component, key=lambda n: (read[n], n))
        pieces += [ordered[i:i + size] for i in range(0, len(ordered), size)]
    # first fit decreasing: the fewest jobs for the pieces (a piece is never split again)
    groups: list[list[str]] = []
    for piece in sorted(pieces, key=lambda p: (-len(p), p)):
        for group in groups:
            if len(group) + len(piece) <= size:
                group += piece
                break
        else:
            groups.append(list(piece))
    return [tuple(g) for g in groups]


def _components(read: Mapping[str, tuple[str, ...]]) -> list[list[str]]:
    """Sketches connected through the tables they read (union-find over tables)."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for name, ts in read.items():
        root = find(f"s:{name}")
        for t in ts:
            parent[find(f"t:{t}")] = root
            root = find(root)
    members: dict[str, list[str]] = {}
    for name in sorted(read):
        members.setdefault(find(f"s:{name}"), []).append(name)
    return list(members.values())


@dataclass
class GroupResult:
    """What a grouped job did: each sketch's result or error, and how often each table's change feed was read."""

    results: dict[str, MaintenanceResult] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)  # sketch -> its error's first line
    unusable: dict[str, str] = field(default_factory=dict)  # found unusable on the way: marked so in the catalog
    feed_reads: dict[str, int] = field(default_factory=dict)
    spark_started: bool = False
    seconds: dict[str, float] = field(default_factory=dict)  # per sketch, and "planning" for the shared reads' plan

    def error(self) -> GroupFailedError | None:
        """The job's error when any sketch failed (listing them), else None."""
        if not self.failed:
            return None
        listed = "; ".join(f"{name}: {error}" for name, error in sorted(self.failed.items()))
        return GroupFailedError(f"{len(self.failed)} of {len(self.failed) + len(self.results)} sketches failed "
                                f"(the others were maintained; see `imp runs`): {listed}")


def maintain_group(parts: ServiceContext, sketches: Sequence[str], strategy: str | None = None,
                   batch_size: int | None = None, trigger: str = "cli",
                   allow_recapture: bool = True) -> GroupResult:
    """Maintain ``sketches`` one after the other in this process, sharing what they read.

    Every sketch's pending change ranges are planned first, so each table's feed is read once for all of them
    (:class:`~imp_core.maintenance.feeds.ChangeFeeds`). A sketch that fails is recorded (its failed run, with the
    error, in the catalog: one is written if the failure came before its run started) and the next one goes on.

    Args:
        parts: The service's parts.
        sketches: The sketches, maintained in this order.
        strategy: ``lazy``, ``eager`` or ``recapture``; None: each sketch's own.
        batch_size: Change rows per committed version (eager).
        trigger: What started the job, recorded with every run.
        allow_recapture: Recapture a sketch whose incremental maintenance cannot proceed.
    """
    if batch_size is not None:
        inputs.check_batch_size(batch_size, "--batch-size")
    chosen = Strategy.parse(strategy) if strategy is not None else None
    out = GroupResult()
    catalog = parts.catalog
    newest = catalog.runs(limit=1)
    watermark = newest[0].id if newest else 0
    with parts.shared_reads(ChangeFeeds()) as feeds:
        started = time.perf_counter()
        if chosen is not Strategy.RECAPTURE:
            for name in sketches:
                _plan_reads(parts, feeds, name)
        out.seconds["planning"] = round(time.perf_counter() - started, 3)
        for name in sketches:
            started = time.perf_counter()
            try:
                out.results[name] = maintain.maintain(parts, name, chosen, batch_size, trigger, allow_recapture)
            except SketchUnusableError as e:  # marked unusable (queries run without it): not this job's failure
                out.unusable[name] = first_line(e)
                parts.progress(out.unusable[name])
            except Exception as e:  # noqa: BLE001 - one sketch's failure, whatever it is, must not stop the others
                out.failed[name] = first_line(as_known_error(e) or e)
                log.error("sketch %s failed: %s", name, out.failed[name])
                try:
                    _record_failure(catalog, name, chosen, trigger, out.failed[name], watermark)
                except Exception as unrecorded:  # noqa: BLE001 - e.g. the catalog is down: the others still run
                    out.failed[name] += f" (not recorded in the catalog: {first_line(unrecorded)})"
                    log.error("sketch %s: its failure could not be recorded in the catalog: %s", name,
                              first_line(unrecorded))
            out.seconds[name] = round(time.perf_counter() - started, 3)
        out.feed_reads = dict(feeds.reads)
    out.spark_started = parts.spark_started
    return out


def maintain_all(parts: ServiceContext, strategy: str = Strategy.EAGER, batch_size: int | None = None,
                 trigger: str = "cli") -> list[MaintenanceResult]:
    """Maintain every live, usable, stale sketch as one group; one found unusable on the way is marked and skipped.

    Raises:
        GroupFailedError: Some sketches failed (after every other one was maintained).
    """
    names = []
    for record in parts.catalog.list_sketches():
        if not record.usable:
            parts.progress(f"skipping sketch {record.name}: unusable ({record.unusable_reason})")
        elif maintain.is_stale(parts, record.name):
            names.append(record.name)
    group = maintain_group(parts, names, strategy, batch_size, trigger)
    error = group.error()
    if error is not None:
        raise error
    return [group.results[n] for n in names if n in group.results]


def stale_groups(parts: ServiceContext, size: int, table: str | Collection[str] | None = None) -> list[tuple[str, ...]]:
    """The stale, usable sketches (those reading ``table``, or one of several tables, when given) cut into groups of
    at most ``size``."""
    wanted = None if table is None else {table} if isinstance(table, str) else set(table)
    catalog = parts.catalog
    read: dict[str, list[str]] = {}
    for name in reports.stale_sketches(catalog):
        record = catalog.get_sketch(name)
        if not record.usable:
            continue
        tables = list(catalog.latest_version(record.id).table_versions)
        if wanted is None or wanted.intersection(tables):
            read[name] = tables
    return plan_groups(read, size)


def _plan_reads(parts: ServiceContext, feeds: ChangeFeeds, name: str) -> None:
    """Tell ``feeds`` which ranges and columns sketch ``name`` will read (nothing when it cannot be loaded: its
    maintenance then fails on its own)."""
    try:
        loaded = load_sketch(parts, name)
        latest = parts.catalog.latest_version(loaded.record.id)
        for table, source in loaded.sources.items():
            feeds.plan(source, latest.table_versions.get(table, -1), source.current_version(),
                       loaded.used_columns(table), sketch=name)
    except ImpError:
        return


def _record_failure(catalog: Catalog, name: str, strategy: Strategy | None, trigger: str, error: str,
                    watermark: int) -> None:
    """A failed run for ``name`` unless its maintenance already recorded one after ``watermark``."""
    try:
        record = catalog.get_sketch(name)
    except NotFoundError:
        return  # no such sketch: nothing to record it on (the job's error lists it)
    recent = catalog.runs(record.id, limit=1)
    if recent and recent[0].id > watermark and recent[0].trigger == trigger and recent[0].status == "failed":
        return
    latest = catalog.latest_version(record.id)
    run_id = catalog.start_run(record.id, (strategy or record.strategy or Strategy.LAZY).__str__(), trigger,
                               from_version=latest.version, table_versions_from=latest.table_versions)
    catalog.finish_run(run_id, "failed", error=error)

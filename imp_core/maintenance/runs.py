"""A maintenance run from start to end, and the one way a new sketch version is made and committed.

Only this module commits: the engine's operators hand back state, and each new version is written together with its
operator state in one catalog transaction. See docs/ARCHITECTURE.md, "State and versions".
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from imp_core import faults
from imp_core.catalog import Catalog, NewVersion, PartSink, StateBlob, StateWriter, VersionRecord
from imp_core.engine.pipeline import Pipeline
from imp_core.engine.state import FORMAT, format_version, state_parts
from imp_core.errors import StateError, first_line
from imp_core.maintenance import placement
from imp_core.publish import publisher
from imp_core.sketch.partition import PartitionSet
from imp_core.sketch.sketch import Sketch
from imp_core.sources.delta import DeltaSource
from imp_core.spark.failures import as_known_error


@dataclass
class Run:
    """A run in progress: its id and the latest version it committed (or started from)."""

    id: int
    reached: VersionRecord | None = None
    delta_rows: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    started: float = field(default_factory=time.perf_counter)


@contextmanager
def maintenance_run(catalog: Catalog, trigger: str, strategy: str, *, sketch_id: int | None = None,
                    start: VersionRecord | None = None,
                    table_versions: Mapping[str, int] | None = None) -> Iterator[Run]:
    """Record a run for the ``with`` block: ``succeeded`` with what it committed, or ``failed`` with the error.

    Without ``sketch_id`` it is the capture of a new sketch: it holds the capture lock while it runs, and a capture
    that fails leaves no run behind (the sketch was never created). Otherwise it is maintenance of a sketch from
    version ``start``.
    """
    if sketch_id is None:
        with catalog.capture_run(trigger, table_versions) as run_id:
            run = Run(run_id)
            try:
                yield run
            except BaseException:
                catalog.discard_capture_run(run_id)
                raise
            _succeeded(catalog, run)
        return
    assert start is not None
    run = Run(catalog.start_run(sketch_id, strategy, trigger, from_version=start.version,
                                table_versions_from=start.table_versions), reached=start)
    try:
        yield run
    except BaseException as e:
        catalog.finish_run(run.id, "failed", error=first_line(as_known_error(e) or e))
        raise
    _succeeded(catalog, run)


def _succeeded(catalog: Catalog, run: Run) -> None:
    reached = run.reached
    catalog.finish_run(run.id, "succeeded", to_version=reached.version if reached else None,
                       table_versions_to=reached.table_versions if reached else None, delta_rows=run.delta_rows,
                       timings=run.timings or None)


def table_identities(sources: Mapping[str, DeltaSource],
                     versions: Mapping[str, int] | None = None) -> dict[str, dict[str, str]]:
    """Per table, the Delta metadata id (at ``versions``, else the latest) and the registered path: what a version
    records so that a table re-created or re-registered later is noticed (:mod:`imp_core.maintenance.guards`)."""
    return {t: {"id": s.table_id(None if versions is None else versions[t]), "path": s.path}
            for t, s in sources.items()}


def new_version(pipeline: Pipeline, partitions: PartitionSet, run: Run, *, method: str,
                table_versions: Mapping[str, int], identities: Mapping[str, Mapping[str, str]],
                options: Mapping[str, Any], started: float, reason: str | None = None, delta_rows: int = 0,
                fragment_rows: Mapping[str, list[int]] | None = None) -> tuple[NewVersion, StateWriter]:
    """The sketch version ``pipeline`` holds now and the writer of its operator state, ready to commit (the state
    is encoded inside the committing transaction, large frames streamed as parts, so ``pipeline`` must not change
    before the commit).

    Args:
        pipeline: The sketch's operators after a capture or a maintenance pass.
        partitions: The partitions the pipeline's fragment ids refer to (recorded with the version).
        run: The run making it.
        method: ``capture``, ``incremental``, ``recapture`` or ``repartition``.
        table_versions: The table versions it reflects.
        identities: The tables' identities (:func:`table_identities`).
        options: The engine options that shaped the state (:mod:`imp_core.maintenance.options`).
        started: ``time.perf_counter()`` when the work began (its duration is recorded).
        reason: Why a recapture happened.
        delta_rows: Change rows processed.
        fragment_rows: Per partitioned table, its rows per fragment at ``table_versions`` (None: not tracked).
    """
    sketch = Sketch.from_global(partitions, pipeline.sketch())
    new = NewVersion(table_versions=dict(table_versions), bits=sketch.bits(partitions), fragments=sketch.to_json(),
                     method=method, reason=reason, delta_rows=delta_rows,
                     duration_ms=(time.perf_counter() - started) * 1000, run_id=run.id,
                     table_identities={t: dict(i) for t, i in identities.items()},
                     state_options=dict(options), partitions=partitions.to_json(),
                     fragment_rows=None if fragment_rows is None else {t: list(c) for t, c in fragment_rows.items()},
                     state_placement=placement.recorded(pipeline))

    def write(sink: PartSink) -> list[StateBlob]:
        sizes: dict[str, int] = {}

        def store(digest: str, data: bytes) -> None:
            sink(digest, data)
            sizes[digest] = len(data)

        out = []
        for op_id, (blob, chunks) in pipeline.saved_states(store).items():
            named = state_parts(blob)  # recorded with the blob's row, so retention keeps them while it is kept
            out.append(StateBlob(op_id, FORMAT, format_version(blob), blob,
                                 chunks={**{d: c.data for d, c in chunks.items()}, **dict.fromkeys(named, _stored)},
                                 parts_bytes=sum(sizes[d] for d in set(named))))
        return out

    return new, write


def _stored() -> bytes:
    raise StateError("a state part was asked for again after it was stored; this is a bug in imp")


def commit(catalog: Catalog, sketch_id: int, previous: VersionRecord, version: tuple[NewVersion, StateWriter],
           run: Run, retention: int, safety: Any = None) -> VersionRecord:
    """Commit ``version`` (from :func:`new_version`) on top of ``previous``, in one catalog transaction with its
    state; the run then counts it.

    Raises:
        ConcurrentMaintenanceError: Another maintainer committed after ``previous``.
        SketchUnusableError: The sketch was marked unusable meanwhile.
    """
    new, blobs = version
    faults.point("before_commit")
    record = catalog.commit_version(sketch_id, previous.version, new, blobs, retention, safety=safety)
    run.reached = record
    run.delta_rows += new.delta_rows
    publisher.after_commit(catalog, sketch_id, record)  # for imp's Spark extension; never fails the commit
    return record


__all__ = ["Run", "commit", "maintenance_run", "new_version", "table_identities"]

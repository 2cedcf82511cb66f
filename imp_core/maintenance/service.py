"""The maintenance service: register tables and sketches, capture, and keep sketches fresh.

Only this module commits: the engine's operators hand back state, and each new sketch version is written together
with its operator state in one catalog transaction (``Catalog.commit_version``). Work on one sketch is serialized by
a Postgres advisory lock; a process killed at any point leaves the last committed version intact, and the next run
starts from it.

Strategies (IMP paper Section 2, 8.5):

* ``lazy``: bring the sketch to the current table versions in one step, when it is needed;
* ``eager``: consume pending table versions in commit order, in batches of at least ``batch_size`` change rows
  (a version is never split), committing one sketch version per batch (the iOLAP mini-batch model), so a long
  backlog becomes small resumable steps;
* ``recapture``: full maintenance; also chosen automatically when incremental maintenance cannot proceed (change
  feed vacuumed or disabled, state missing or corrupt, a top-k buffer exhausted), recorded with the reason.

Lifecycle guards (docs/SEMANTICS.md, "Lifecycle"): every recapture re-runs the safety check against the current
statistics and the sign assumptions against the data; each version records the identity (Delta metadata id and
registered path) of every table it reflects and the engine options its state was built with. A sketch whose
assumptions stop holding, or whose table changed identity or went back to an older version, is marked unusable:
maintenance refuses it and queries run without it until it is dropped and created again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import polars as pl
import pyarrow as pa

from imp_core import faults, inputs
from imp_core.config import Settings
from imp_core.engine.pipeline import Pipeline
from imp_core.engine.state import FORMAT, FORMAT_VERSION
from imp_core.engine.support import require_engine_support
from imp_core.maintenance.changes import read_changes, used_columns
from imp_core.errors import (
    ChangeFeedUnavailableError,
    ImpError,
    PlanError,
    SketchUnusableError,
    StateError,
    UnsafeSketchError,
    UsageError,
)
from imp_core.maintenance.options import state_options, with_state_options
from imp_core.plan.expr import kind_of_type
from imp_core.plan.nodes import Plan, explain
from imp_core.plan.safety import SafetyReport, check, require_safe
from imp_core.plan.sql import Query, parse_query
from imp_core.plan.template import template_key
from imp_core.sketch.partition import Partition, PartitionSet, parse_bounds
from imp_core.sketch.sketch import Sketch
from imp_core.sources.delta import MULT, VERSION, DeltaSource
from imp_core.sources.schema import check_compatible, schema_from_json, schema_to_json

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from imp_core.catalog.store import Catalog, SketchRecord, VersionRecord

log = logging.getLogger(__name__)

STRATEGIES = ("lazy", "eager", "recapture")
Progress = Callable[[str], None]


@dataclass
class Loaded:
    """A sketch ready to maintain: its record, plan, partitions and sources."""

    record: SketchRecord
    query: Query
    partitions: PartitionSet
    sources: dict[str, DeltaSource]
    schemas: dict[str, pa.Schema]
    assumptions: tuple[str, ...]

    @property
    def plan(self) -> Plan:
        return self.query.plan

    def used_columns(self, table: str) -> list[str]:
        return used_columns(self.plan, table)


@dataclass
class _Registration:
    query: Query
    sources: dict[str, DeltaSource]
    versions: dict[str, int]
    schemas: dict[str, pa.Schema]
    targets: dict[str, str]
    report: Any


@dataclass
class MaintenanceResult:
    """What a maintenance call did."""

    sketch: str
    versions: list[VersionRecord] = field(default_factory=list)
    delta_rows: int = 0
    recaptured: str | None = None  # the reason, when a recapture happened
    up_to_date: bool = False
    timings: dict[str, float] = field(default_factory=dict)


class SketchService:
    """Facade over catalog, sources, engine and Spark for one process."""

    def __init__(self, settings: Settings, catalog: Catalog | None = None, spark: SparkSession | None = None,
                 progress: Progress | None = None) -> None:
        self.settings = settings
        self._catalog = catalog
        self._spark = spark
        self.progress = progress or (lambda msg: log.info(msg))

    # -- lazily started parts ------------------------------------------------------------------------------------

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            from imp_core.catalog.store import Catalog

            self._catalog = Catalog.connect(self.settings)
        return self._catalog

    @property
    def spark(self) -> SparkSession:
        if self._spark is None:
            from imp_core.spark.session import get_spark

            self.progress("starting Spark")
            self._spark = get_spark(self.settings)
        return self._spark

    def backend(self, sources: dict[str, DeltaSource]):  # noqa: ANN201
        from imp_core.spark.backend import SparkBackend

        return SparkBackend(lambda: self.spark, sources, self.settings.optimizations)

    # -- tables --------------------------------------------------------------------------------------------------

    def register_table(self, name: str, path: str | None = None, replace: bool = False,
                       table: str | None = None):  # noqa: ANN201
        """Register a Delta table under a name usable in SQL; it must have Change Data Feed enabled.

        Give its ``path`` (local or ``s3://``; stored as an absolute URI, :func:`imp_core.inputs.table_uri`) or its
        Spark catalog name ``table`` (``CATALOG.DB.TABLE``), which is resolved to its location now and re-checked on
        every maintenance (``imp_core.sources.names``).
        """
        from imp_core.sources import names, storage

        inputs.check_table_name(name)
        if (path is None) == (table is None):
            raise UsageError("give the table's PATH or --table CATALOG.DB.TABLE (one of them)")
        resolved_id = None
        if table is not None:
            path, resolved_id = names.resolve(self.spark, table)
        path = storage.normalize(inputs.table_uri(str(path)))
        source = DeltaSource(name, path)
        version = source.current_version()
        source.require_cdf()
        source.require_readable_by_spark()
        table_id = source.table_id()
        if resolved_id is not None and resolved_id != table_id:
            raise UsageError(f"--table {table}: the catalog's table id {resolved_id} differs from the Delta log's "
                             f"{table_id} at {path}; is the metastore out of date?")
        schema = source.schema()
        record = self.catalog.register_table(name, path, schema_to_json(schema), replace=replace)
        if table is not None:
            self.catalog.set_table_identity(name, table_id, table)
        self.catalog.observe_table_version(name, version, table_id)
        return record

    def source(self, name: str) -> DeltaSource:
        return DeltaSource(name, self.catalog.get_table(name).path, spark=lambda: self.spark)

    def table_schemas(self) -> dict[str, pa.Schema]:
        out = {}
        for t in self.catalog.list_tables():
            if t.schema_json:
                out[t.name] = schema_from_json(t.schema_json)
        return out

    def current_schemas(self, tables: list[str]) -> dict[str, pa.Schema]:
        return {t: self.source(t).schema() for t in tables}

    # -- registration --------------------------------------------------------------------------------------------

    def analyze(self, sql: str, dialect: str = "spark") -> Query:
        """Parse ``sql`` against the registered tables (their current schemas)."""
        from sqlglot import exp

        from imp_core.plan.sql import parse_statement

        registered = {t.name: t for t in self.catalog.list_tables()}
        if not registered:
            raise UsageError("no tables are registered; register one with `imp table register NAME PATH`")
        referenced = {t.name.lower() for t in parse_statement(sql, dialect).find_all(exp.Table)}
        schemas: dict[str, pa.Schema] = {}
        for name, rec in registered.items():
            if name.lower() in referenced:
                schemas[name] = DeltaSource(name, rec.path).schema()  # the table as it is now
            elif rec.schema_json:
                schemas[name] = schema_from_json(rec.schema_json)  # only for error messages
        return parse_query(sql, schemas, dialect)

    def sign_oracle(self, sources: dict[str, DeltaSource], versions: dict[str, int]) -> Callable[[str, str], str | None]:
        """Column signs from Delta file statistics (exact min/max per file) at the pinned versions."""
        cache: dict[str, dict[str, str]] = {}

        def oracle(table: str, column: str) -> str | None:
            if table not in sources:
                return None
            if table not in cache:
                signs: dict[str, str] = {}
                files = sources[table].files(versions[table])
                mins: dict[str, Any] = {}
                maxs: dict[str, Any] = {}
                complete: dict[str, bool] = {}
                for f in files:
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
                cache[table] = signs
            return cache[table].get(column)

        return oracle

    def create_sketch(self, name: str, sql: str, on: list[str], fragments: int | None = None,
                      bounds: list[str] | None = None, dialect: str = "spark", strategy: str = "lazy",
                      trigger: str = "cli") -> tuple[SketchRecord, VersionRecord]:
        """Parse, check safety, pick bounds, capture at pinned versions and commit version 1."""
        if strategy not in ("lazy", "eager"):
            raise UsageError(f"--strategy must be lazy or eager, got {strategy!r}")
        started = time.perf_counter()
        reg = self._registration(name, sql, on, fragments, bounds, dialect)
        sources, versions, schemas, targets = reg.sources, reg.versions, reg.schemas, reg.targets

        parts = []
        for i, (table, column) in enumerate(targets.items()):
            dtype = schemas[table].field(column).type
            kind = kind_of_type(dtype)
            if kind not in ("int", "float", "decimal", "date", "timestamp", "string"):
                raise UsageError(f"cannot partition on {table}.{column} of type {dtype}")
            if bounds is not None:
                values = tuple(b.strip() for b in bounds[i].split(","))
            else:
                from imp_core.spark.bounds import equi_depth_bounds

                self.progress(f"computing {fragments} equi-depth bounds on {table}.{column}")
                df = sources[table].scan(self.spark, versions[table])
                known = sources[table].column_stats(versions[table], column)
                values = equi_depth_bounds(df, column, fragments or 1, kind, known)
            values, notes = parse_bounds(values, dtype, f"{table}.{column}")  # exact values of the column's type
            for note in notes:
                self.progress(note)
            parts.append(Partition(table, column, values, kind, dtype))
        partitions = PartitionSet(tuple(parts))

        violation = self._violated_assumption(sources, versions, reg.report.assumptions)
        if violation:
            raise UnsafeSketchError(f"a sketch on {', '.join(f'{t}.{c}' for t, c in targets.items())} is not safe "
                                    f"for this query: {violation}")
        key, constants = template_key(sql, dialect)
        options = state_options(self.settings.optimizations)
        self.catalog.clear_abandoned_captures()
        with self.catalog.capture_run(trigger, versions) as run_id:
            record, capture_ms = self._capture_new(name, sql, dialect, strategy, key, constants, reg, partitions,
                                                   options, run_id)
        version = self.catalog.latest_version(record.id)
        self.catalog.finish_run(run_id, "succeeded", to_version=1, table_versions_to=versions, delta_rows=0,
                                timings={"capture_ms": capture_ms, "total_ms": (time.perf_counter() - started) * 1000})
        for t, v in versions.items():
            self.catalog.observe_table_version(t, v, sources[t].table_id(v))
        return record, version

    def _capture_new(self, name: str, sql: str, dialect: str, strategy: str, key: str, constants: Any,
                     reg: _Registration, partitions: PartitionSet, options: dict[str, Any],
                     run_id: int) -> tuple[SketchRecord, float]:
        """Capture a new sketch and create it with version 1; on any failure the capture run is discarded."""
        query, plan, sources, versions, schemas = reg.query, reg.query.plan, reg.sources, reg.versions, reg.schemas
        try:
            pipeline = Pipeline.configured(plan, partitions, self.settings.optimizations)
            self.progress(f"capturing sketch {name} on Spark at versions {versions}")
            t0 = time.perf_counter()
            pipeline.capture(self.backend(sources), dict(versions))
            capture_ms = (time.perf_counter() - t0) * 1000
            sketch = Sketch.from_global(partitions, pipeline.sketch())
            from imp_core.catalog.store import NewVersion

            first = NewVersion(table_versions=versions, bits=sketch.bits(partitions), fragments=sketch.to_json(),
                               method="capture", delta_rows=0, duration_ms=capture_ms, run_id=run_id,
                               table_identities=_identities(sources, versions), state_options=options)
            plan_json = {"explain": explain(plan), "fingerprint": pipeline.fingerprint,
                         "schemas": {t: schema_to_json(s) for t, s in schemas.items()},
                         "output_names": list(query.output_names), "constants": [str(c) for c in constants]}
            record = self.catalog.create_sketch(name, sql, dialect, key, plan_json, partitions.to_json(),
                                                reg.report.to_json(), strategy, first, self._blobs(pipeline), run_id)
        except BaseException:
            # a failed create leaves nothing: no sketch, and no run pointing at none
            self.catalog.discard_capture_run(run_id)
            raise
        return record, capture_ms

    # -- loading ---------------------------------------------------------------------------------------------------

    def load(self, name: str) -> Loaded:
        record = self.catalog.get_sketch(name)
        plan_json = record.plan_json or {}
        schemas = {t: schema_from_json(s) for t, s in plan_json.get("schemas", {}).items()}
        query = parse_query(record.sql, schemas, record.dialect or "spark")
        partitions = PartitionSet.from_json(record.partitions)
        sources = {t: self.source(t) for t in query.plan.tables()}
        safety = record.safety or {}
        return Loaded(record, query, partitions, sources, schemas, tuple(safety.get("assumptions", ())))

    def _pipeline(self, loaded: Loaded, options: dict[str, Any]) -> Pipeline:
        """The sketch's operators, configured with the state-shaping ``options`` recorded with its state."""
        opts = with_state_options(self.settings.optimizations, options, loaded.record.name)
        pipeline = Pipeline.configured(loaded.plan, loaded.partitions, opts)
        expected = (loaded.record.plan_json or {}).get("fingerprint")
        if expected and expected != pipeline.fingerprint:
            raise StateError(f"sketch {loaded.record.name}: the plan built from its SQL no longer matches the one "
                             f"captured (imp was upgraded?); recapture the sketch")
        return pipeline

    def _blobs(self, pipeline: Pipeline):  # noqa: ANN202
        from imp_core.catalog.store import StateBlob

        return [StateBlob(op_id, FORMAT, FORMAT_VERSION, blob) for op_id, blob in pipeline.state_blobs().items()]

    # -- maintenance -----------------------------------------------------------------------------------------------

    def current_versions(self, loaded: Loaded) -> dict[str, int]:
        out = {}
        for t, s in loaded.sources.items():
            out[t] = s.current_version()
            self.catalog.observe_table_version(t, out[t], s.table_id())
        return out

    def is_stale(self, name: str) -> bool:
        loaded = self.load(name)
        latest = self.catalog.latest_version(loaded.record.id)
        return any(v > latest.table_versions.get(t, -1) for t, v in self.current_versions(loaded).items())

    def maintain(self, name: str, strategy: str | None = None, batch_size: int | None = None,
                 trigger: str = "cli", allow_recapture: bool = True, wait: float | None = None) -> MaintenanceResult:
        """Bring sketch ``name`` to the current table versions with the given strategy.

        ``wait``: give up after this many seconds if another process is maintaining the sketch
        (``MaintainerBusyError``); None waits for it.
        """
        loaded = self.load(name)
        strategy = strategy or loaded.record.strategy or "lazy"
        if strategy not in STRATEGIES:
            raise UsageError(f"--strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
        if batch_size is not None and batch_size < 1:
            raise UsageError(f"--batch-size must be at least 1, got {batch_size}")
        result = MaintenanceResult(name)
        _refuse_unusable(loaded.record)
        from imp_core.sources.names import check_identity

        check_identity(self.catalog, loaded.sources, lambda: self.spark)  # catalog names still mean these tables
        with self.catalog.sketch_lock(loaded.record.id, timeout=wait):
            # another process may have marked it while this one waited for the lock
            _refuse_unusable(self.catalog.get_sketch_by_id(loaded.record.id))
            # holding the lock, any run still marked running for this sketch belongs to a dead process
            self.catalog.abandon_running(loaded.record.id)
            latest = self.catalog.latest_version(loaded.record.id)
            target = self.current_versions(loaded)
            self._check_identity(loaded, latest, target)
            if strategy == "recapture":
                result.versions.append(self._recapture(loaded, latest, target, "requested", trigger))
                result.recaptured = "requested"
                return result
            if all(target[t] <= latest.table_versions.get(t, -1) for t in target):
                result.up_to_date = True
                return result
            self._check_schemas(loaded, target)
            run_id = self.catalog.start_run(loaded.record.id, strategy, trigger, from_version=latest.version,
                                            table_versions_from=latest.table_versions)
            try:
                if strategy == "lazy":
                    batches = [target]
                else:
                    batches = self._eager_batches(loaded, latest.table_versions, target,
                                                  batch_size or max(1, _DEFAULT_BATCH))
                pipeline: Pipeline | None = None
                for i, batch_target in enumerate(batches):
                    self.progress(f"sketch {name}: maintaining batch {i + 1}/{len(batches)} -> {batch_target}")
                    try:
                        if pipeline is None:
                            pipeline = self._load_state(loaded, latest)
                        version, rows = self._incremental(loaded, pipeline, latest, batch_target, run_id)
                    except (ChangeFeedUnavailableError, StateError) as e:
                        if not allow_recapture:
                            raise
                        reason = _one_line(e)
                        self.progress(f"sketch {name}: incremental maintenance cannot proceed ({reason}); "
                                      f"recapturing")
                        version = self._recapture(loaded, latest, target, reason, trigger, run_id=run_id)
                        result.recaptured = reason
                        result.versions.append(version)
                        break
                    result.versions.append(version)
                    result.delta_rows += rows
                    latest = version
                last = result.versions[-1] if result.versions else latest
                self.catalog.finish_run(run_id, "succeeded", to_version=last.version,
                                        table_versions_to=last.table_versions, delta_rows=result.delta_rows)
            except BaseException as e:
                self.catalog.finish_run(run_id, "failed", error=_one_line(e))
                raise
        return result

    def _check_schemas(self, loaded: Loaded, target: dict[str, int]) -> None:
        for table, source in loaded.sources.items():
            registered = loaded.schemas.get(table)
            if registered is None:
                continue
            current = source.schema(target[table])
            check_compatible(table, registered, current, set(loaded.used_columns(table)), loaded.record.name)

    def _load_state(self, loaded: Loaded, latest: VersionRecord) -> Pipeline:
        if latest.state_options is None:
            raise StateError(f"sketch {loaded.record.name} version {latest.version} was written by an older imp that "
                             f"did not record the engine options of its state")
        pipeline = self._pipeline(loaded, latest.state_options)
        if not self.catalog.has_states(loaded.record.id, latest.version):
            raise StateError(f"sketch {loaded.record.name} version {latest.version} has no operator state "
                             f"(removed by retention?)")
        blobs = self.catalog.load_states(loaded.record.id, latest.version)
        pipeline.load_state_blobs({k: b.payload for k, b in blobs.items()})
        if pipeline.sketch() != Sketch(latest.fragments).to_global(loaded.partitions):
            raise StateError(f"sketch {loaded.record.name} version {latest.version}: the saved merge state does not "
                             f"match the saved sketch")
        return pipeline

    def _incremental(self, loaded: Loaded, pipeline: Pipeline, latest: VersionRecord, target: dict[str, int],
                     run_id: int) -> tuple[VersionRecord, int]:
        """One batch: one pass per changed table (in name order), then commit the new version."""
        from imp_core.catalog.store import NewVersion

        t0 = time.perf_counter()
        backend = self.backend(loaded.sources)
        reached = dict(latest.table_versions)
        rows = 0
        for table in sorted(target):
            start, end = reached.get(table, -1), target[table]
            if end <= start:
                continue
            changes = read_changes(loaded.sources[table], loaded.plan, start, end, self.settings.optimizations)
            faults.point("after_cdf_read")
            self._check_assumptions(loaded, table, changes)
            reached[table] = end
            pipeline.maintain_pass(table, changes.drop(VERSION), backend, dict(reached),
                                   netting=self.settings.optimizations.netting)
            faults.point("after_pass")
            rows += changes.height
        sketch = Sketch.from_global(loaded.partitions, pipeline.sketch())
        duration = (time.perf_counter() - t0) * 1000
        new = NewVersion(table_versions=reached, bits=sketch.bits(loaded.partitions), fragments=sketch.to_json(),
                         method="incremental", delta_rows=rows, duration_ms=duration, run_id=run_id,
                         table_identities=_identities(loaded.sources), state_options=latest.state_options)
        faults.point("before_commit")
        version = self.catalog.commit_version(loaded.record.id, latest.version, new, self._blobs(pipeline),
                                              self.settings.state_retention)
        return version, rows

    def _check_assumptions(self, loaded: Loaded, table: str, changes: pl.DataFrame) -> None:
        """The safety verdict relied on column signs; an inserted row that breaks one makes the column unsafe."""
        for a in loaded.assumptions:
            col_ref, op, _ = a.split(" ")
            t, _, column = col_ref.partition(".")
            if t != table or column not in changes.columns:
                continue
            inserted = changes.filter(pl.col(MULT) > 0).get_column(column)
            # polars orders NaN above every number, as Spark does: NaN breaks "<= 0" and not ">= 0"
            bad = inserted.filter(inserted < 0) if op == ">=" else inserted.filter(inserted > 0)
            if bad.len():
                self._invalidate(loaded, f"it is safe only while {a}, but new rows of {table} have {column} = "
                                         f"{bad[0]}")

    # -- lifecycle guards ------------------------------------------------------------------------------------------

    def check_usable(self, name: str) -> None:
        """Raise if sketch ``name`` must not be applied: marked unusable, or a table it reflects changed identity or
        went back in version (marked now). For use without maintenance (``maintain`` runs the same guards).

        Raises:
            SketchUnusableError: With the reason and what to do.
        """
        loaded = self.load(name)
        _refuse_unusable(loaded.record)
        self._check_identity(loaded, self.catalog.latest_version(loaded.record.id), self.current_versions(loaded))

    def _invalidate(self, loaded: Loaded, reason: str) -> None:
        """Mark the sketch unusable with ``reason`` (the first reason stays) and stop with the one-line error."""
        from imp_core.catalog.store import unusable_message

        if self.catalog.mark_unusable(loaded.record.id, reason):
            log.warning("sketch %s marked unusable: %s", loaded.record.name, reason)
        current = self.catalog.get_sketch_by_id(loaded.record.id).unusable_reason or reason
        raise SketchUnusableError(unusable_message(loaded.record.name, current))

    def _check_identity(self, loaded: Loaded, latest: VersionRecord, current: dict[str, int]) -> None:
        """Invalidate the sketch if a table it reflects is not the table its versions refer to any more.

        Compares, per table, the registered path and the Delta metadata id now with those recorded with ``latest``,
        and the current Delta version with the one ``latest`` reflects (a version going backwards means another
        table, or a rolled-back log). Versions recorded before identities were kept are checked by version only.
        """
        problem = _identity_problem(loaded.sources, latest, current)
        if problem:
            self._invalidate(loaded, problem)

    def _recheck_safety(self, loaded: Loaded, target: dict[str, int]) -> SafetyReport:
        """The safety verdict at ``target``: the check against the statistics there, then its sign assumptions
        against the data there (a recapture must not commit a sketch that is no longer safe)."""
        targets = {p.table: p.column for p in loaded.partitions.partitions}
        report = check(loaded.plan, targets, self.sign_oracle(loaded.sources, target))
        if not report.safe:
            self._invalidate(loaded, f"a recapture at table versions {target} found it no longer safe on "
                                     f"{', '.join(f'{t}.{c}' for t, c in targets.items())} ({report.reason})")
        violation = self._violated_assumption(loaded.sources, target, report.assumptions)
        if violation:
            self._invalidate(loaded, f"a recapture at table versions {target} found {violation}")
        return report

    def _violated_assumption(self, sources: dict[str, DeltaSource], versions: dict[str, int],
                             assumptions: tuple[str, ...]) -> str | None:
        """The first sign assumption (``t.c >= 0`` / ``t.c <= 0``) the data at ``versions`` breaks, described; None
        when all hold. One Spark job per table with assumptions; comparisons follow Spark (NaN above every number,
        so NaN breaks ``<= 0``), NULLs break nothing."""
        from pyspark.sql import functions as F

        by_table: dict[str, list[tuple[str, str, str]]] = {}
        for a in assumptions:
            col_ref, op, _ = a.split(" ")
            table, _, column = col_ref.partition(".")
            by_table.setdefault(table, []).append((a, column, op))
        for table, items in sorted(by_table.items()):
            df = sources[table].scan(self.spark, versions[table])
            aggs = []
            for i, (_, column, op) in enumerate(items):
                c = F.col(f"`{column}`")
                aggs.append(F.min(F.when(c < 0, c)).alias(f"b{i}") if op == ">=" else
                            F.max(F.when(c > 0, c)).alias(f"b{i}"))
            row = df.agg(*aggs).first()
            for i, (a, column, _) in enumerate(items):
                if row is not None and row[f"b{i}"] is not None:
                    return (f"a row of {table} at version {versions[table]} with {column} = {row[f'b{i}']}, which "
                            f"breaks the assumption {a} its safety relies on")
        return None

    def _eager_batches(self, loaded: Loaded, start: dict[str, int], target: dict[str, int],
                       batch_size: int) -> list[dict[str, int]]:
        """Pending table versions in commit order, cut into batches of >= ``batch_size`` change rows."""
        from imp_core.maintenance.batches import Commit, plan_batches

        commits: list[Commit] = []
        for table, source in loaded.sources.items():
            lo, hi = start.get(table, -1), target[table]
            if hi <= lo:
                continue
            source.check_cdf_range(lo, hi)
            counts = _rows_per_version(source, lo, hi)
            stamps = {c.version: c.timestamp for c in source.commits(lo, hi)}
            for v in range(lo + 1, hi + 1):
                ts = stamps.get(v)
                commits.append(Commit(table, v, ts.timestamp() if ts else float(v), counts.get(v, 0)))
        return plan_batches(start, commits, batch_size)

    def _recapture(self, loaded: Loaded, latest: VersionRecord, target: dict[str, int], reason: str,
                   trigger: str, run_id: int | None = None) -> VersionRecord:
        from imp_core.catalog.store import NewVersion

        own_run = run_id is None
        if own_run:
            run_id = self.catalog.start_run(loaded.record.id, "recapture", trigger, from_version=latest.version,
                                            table_versions_from=latest.table_versions)
        try:
            self._check_schemas(loaded, target)
            report = self._recheck_safety(loaded, target)
            t0 = time.perf_counter()
            # the options the sketch's state has been built with; a version from before they were recorded takes
            # this process's, recorded from now on
            options = latest.state_options if latest.state_options is not None else \
                state_options(self.settings.optimizations)
            pipeline = self._pipeline(loaded, options)
            self.progress(f"recapturing sketch {loaded.record.name} on Spark at versions {target}")
            pipeline.capture(self.backend(loaded.sources), dict(target))
            sketch = Sketch.from_global(loaded.partitions, pipeline.sketch())
            new = NewVersion(table_versions=target, bits=sketch.bits(loaded.partitions), fragments=sketch.to_json(),
                             method="recapture", reason=reason, delta_rows=0,
                             duration_ms=(time.perf_counter() - t0) * 1000, run_id=run_id,
                             table_identities=_identities(loaded.sources, target), state_options=options)
            version = self.catalog.commit_version(loaded.record.id, latest.version, new, self._blobs(pipeline),
                                                  self.settings.state_retention, safety=report.to_json())
        except BaseException as e:
            if own_run:
                self.catalog.finish_run(run_id, "failed", error=_one_line(e))  # type: ignore[arg-type]
            raise
        if own_run:
            self.catalog.finish_run(run_id, "succeeded", to_version=version.version,  # type: ignore[arg-type]
                                    table_versions_to=target, delta_rows=0)
        return version

    def recapture(self, name: str, reason: str = "requested", trigger: str = "cli") -> VersionRecord:
        return self.maintain(name, strategy="recapture", trigger=trigger).versions[-1]

    def maintain_all(self, strategy: str = "eager", batch_size: int | None = None,
                     trigger: str = "cli") -> list[MaintenanceResult]:
        out = []
        for record in self.catalog.list_sketches():
            if not record.usable:
                self.progress(f"skipping sketch {record.name}: unusable ({record.unusable_reason})")
                continue
            if self.is_stale(record.name):
                try:
                    out.append(self.maintain(record.name, strategy, batch_size, trigger))
                except SketchUnusableError as e:  # found unusable now: marked, the others still run
                    self.progress(_one_line(e))
        return out

    # -- use -------------------------------------------------------------------------------------------------------

    def find_sketch(self, sql: str, dialect: str = "spark", query: Query | None = None) -> str | None:
        """A live sketch that can answer ``sql``: same template, and the same constants or constants that the reuse
        check proves only tighten the query's result (``imp_core.plan.reuse``)."""
        from imp_core.plan.reuse import can_reuse

        key, constants = template_key(sql, dialect)
        wanted = [str(c) for c in constants]
        # usable sketches first; an unusable one is still returned (the query notes that it ran without it)
        candidates = sorted((r for r in self.catalog.list_sketches() if r.template_key == key),
                            key=lambda r: not r.usable)
        for record in candidates:
            if (record.plan_json or {}).get("constants") == wanted:
                return record.name
        for record in candidates:
            query = query or self.analyze(sql, dialect)
            try:
                captured = self.load(record.name).plan
            except ImpError:
                continue
            ok, why = can_reuse(captured, query.plan)
            log.info("sketch %s for %s: %s", record.name, sql, why)
            if ok:
                return record.name
        return None

    def query(self, sql: str, dialect: str = "spark", use_sketch: bool = True, capture: bool = False,
              on: list[str] | None = None, fragments: int = 100, trigger: str = "cli"):  # noqa: ANN201
        """Run ``sql`` on Spark, with a fresh sketch when one can answer it (lazily maintained first)."""
        from imp_core.use.query import QueryResult, collect, execute

        t0 = time.perf_counter()
        query = self.analyze(sql, dialect)
        tables = sorted(query.plan.tables())
        sources = {t: self.source(t) for t in tables}
        notes: list[str] = []
        name = self.find_sketch(sql, dialect, query) if use_sketch else None
        if name is None and use_sketch and capture:
            from imp_core.plan.safety import safe_columns

            targets = on
            if not targets:
                versions0 = {t: sources[t].current_version() for t in tables}
                safe = safe_columns(query.plan, self.sign_oracle(sources, versions0))
                if not safe:
                    raise UnsafeSketchError("no column of the query's tables is safe for a sketch; run the query "
                                            "without --capture")
                targets = [safe[0]]
            name = _auto_name(self.catalog, sql)
            self.create_sketch(name, sql, targets, fragments=fragments, dialect=dialect, trigger=trigger)
            notes.append(f"registered sketch {name} on {', '.join(targets)}")
        sketch_info = None
        partitions = sketch = None
        versions = {t: sources[t].current_version() for t in tables}
        latest = None
        if name is not None:
            try:
                latest = self.usable_version(name, versions, trigger, notes)
            except SketchUnusableError as e:  # marked now or before: the answer must not depend on it
                notes.append(_one_line(e))
        if latest is not None and name is not None:
            record = self.catalog.get_sketch(name)
            partitions = PartitionSet.from_json(record.partitions)
            sketch = Sketch({t: tuple(f) for t, f in latest.fragments.items()})
            versions = {t: latest.table_versions[t] for t in tables}
            sketch_info = {"name": name, "version": latest.version}
        elif use_sketch and name is None:
            notes.append("no sketch can answer this query; ran it without one (add --capture to register one)")
        df, scanned = execute(self.spark, query.plan, sources, versions, partitions, sketch)
        rows = collect(df, list(query.output_names), scanned)
        return QueryResult(list(query.output_names), rows, sketch_info, scanned, time.perf_counter() - t0, notes)

    def usable_version(self, name: str, current: dict[str, int], trigger: str, notes: list[str]) -> VersionRecord | None:
        """The sketch version a query at table versions ``current`` may use, without waiting on a maintainer for long.

        The latest committed version when it is valid for ``current`` (or later table versions: the query then runs
        at the sketch's versions, one consistent snapshot); otherwise the sketch is maintained lazily,
        waiting at most ``IMP_QUERY_WAIT`` seconds for another process that holds its maintenance lock. None (and a
        note) when that wait ran out: the query then runs without the sketch, which is always correct.

        Raises:
            SketchUnusableError: The sketch is (or has just been found) unusable: it must not be applied.
        """
        from imp_core.errors import MaintainerBusyError

        self.check_usable(name)
        record = self.catalog.get_sketch(name)
        latest = self.catalog.latest_version(record.id)
        if _covers(latest, current):
            return latest
        try:
            result = self.maintain(name, strategy="lazy", trigger=trigger, wait=self.settings.query_wait)
        except MaintainerBusyError:
            latest = self.catalog.latest_version(record.id)
            if _covers(latest, current):
                return latest  # the other maintainer finished meanwhile
            notes.append(f"sketch {name} is being maintained by another process (waited "
                         f"{self.settings.query_wait:g} s, IMP_QUERY_WAIT); ran the query without it")
            return None
        if result.versions:
            notes.append(f"maintained sketch {name} to version {result.versions[-1].version}"
                         + (f" (recaptured: {result.recaptured})" if result.recaptured else ""))
        return self.catalog.latest_version(record.id)

    # -- reading ---------------------------------------------------------------------------------------------------

    def describe(self, name: str, version: int | None = None, as_of: tuple[str, int] | None = None) -> dict[str, Any]:
        """``imp sketch show --json``: stable keys other tools parse."""
        record = self.catalog.get_sketch(name)
        if version is not None:
            v = self.catalog.get_version(record.id, version)
        elif as_of is not None:
            v = self.catalog.version_as_of_table_version(record.id, as_of[0], as_of[1])
        else:
            v = self.catalog.latest_version(record.id)
        partitions = PartitionSet.from_json(record.partitions)
        sketch = Sketch({t: tuple(f) for t, f in v.fragments.items()})
        share = sketch.covered_share(partitions)
        return {
            "name": record.name,
            "sql": record.sql,
            "version": v.version,
            "method": v.method,
            "reason": v.reason,
            "table_versions": dict(v.table_versions),
            "partitions": [{"table": p.table, "column": p.column, "bounds": p.to_json()["bounds"],
                            "fragments": list(sketch.fragments.get(p.table, ())),
                            "fragment_count": p.fragments, "covered_share": share[p.table]}
                           for p in partitions.partitions],
            "strategy": record.strategy,
            "template_key": record.template_key,
            "safety": record.safety,
            "usable": record.usable,
            "unusable_reason": record.unusable_reason,
            "unusable_since": _iso(record.unusable_at),
            "table_identities": v.table_identities,
            "state_options": v.state_options,
            "delta_rows": v.delta_rows,
            "duration_ms": v.duration_ms,
            "created_at": v.created_at.isoformat() if v.created_at else None,
        }

    def history(self, name: str) -> list[dict[str, Any]]:
        record = self.catalog.get_sketch(name)
        out = []
        for v in self.catalog.versions(record.id):
            out.append({"version": v.version, "method": v.method, "reason": v.reason,
                        "table_versions": dict(v.table_versions), "fragments": v.fragments,
                        "delta_rows": v.delta_rows, "duration_ms": v.duration_ms, "run_id": v.run_id,
                        "has_state": self.catalog.has_states(record.id, v.version),
                        "created_at": v.created_at.isoformat() if v.created_at else None})
        return out

    # -- orchestration (Airflow DAGs, the plugin page, spark-submit jobs) -----------------------------------------

    def refresh_observations(self, strict: bool = True) -> dict[str, int | str]:
        """Record the current Delta version of every registered table, so the ``sketch_catalog`` view is current.

        Reads only Delta logs (no Spark). With ``strict=False`` a table that cannot be read is reported by its error
        message instead of failing the whole refresh (the plugin page shows what it can). Sketches whose tables
        changed identity or went back in version are marked unusable on the way.

        Returns:
            Table name -> observed version (or, with ``strict=False``, the error message for unreadable tables).
        """
        out: dict[str, int | str] = {}
        opened: dict[str, DeltaSource] = {}
        for table in self.catalog.list_tables():
            try:
                source = DeltaSource(table.name, table.path)
                version = source.current_version()
                self.catalog.observe_table_version(table.name, version, source.table_id())
                out[table.name] = version
                opened[table.name] = source
            except ImpError as e:
                if strict:
                    raise
                log.warning("could not observe table %s: %s", table.name, _one_line(e))
                out[table.name] = _one_line(e)
        self._check_identities(opened, out)
        return out

    def _check_identities(self, opened: dict[str, DeltaSource], current: dict[str, int | str]) -> None:
        """Mark every live sketch unusable whose latest version refers to a table that changed identity or went
        back in version (so `imp sketch list` and the catalog page say so before anyone maintains it)."""
        for record in self.catalog.list_sketches():
            if not record.usable:
                continue
            latest = self.catalog.latest_version(record.id)
            sources = {t: opened[t] for t in latest.table_versions if t in opened}
            versions = {t: v for t, v in current.items() if t in sources and isinstance(v, int)}
            if set(versions) != set(latest.table_versions):
                continue  # a table could not be read: say nothing about the sketch
            problem = _identity_problem(sources, latest, versions)
            if problem and self.catalog.mark_unusable(record.id, problem):
                log.warning("sketch %s marked unusable: %s", record.name, problem)

    def stale_sketches(self) -> list[str]:
        """Names of live sketches behind the current version of one of their tables (observations refreshed).

        Also clears capture runs left by dead processes (the nightly DAG calls this).
        """
        self.catalog.clear_abandoned_captures()
        self.refresh_observations()
        return self.catalog.stale_sketches()

    def check_maintenance_request(self, name: str, strategy: str | None = None,
                                  batch_size: int | None = None) -> dict[str, Any]:
        """Validate a maintenance request before any Spark job starts (the on-demand DAG's first task).

        Raises:
            UsageError: Unknown strategy, or a batch size below 1.
            NotFoundError: No live sketch is named ``name`` (the message lists the existing ones).
            SketchUnusableError: The sketch is marked unusable (it must be dropped and created again).
        """
        if not name or not str(name).strip():
            raise UsageError("give the name of the sketch to maintain (parameter `sketch`)")
        inputs.check_sketch_name(name)
        if strategy is not None and strategy not in STRATEGIES:
            raise UsageError(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
        if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int)
                                       or batch_size < 1):
            raise UsageError(f"batch size must be an integer of at least 1 (change rows per committed version), "
                             f"got {batch_size!r}")
        record = self.catalog.get_sketch(name)
        _refuse_unusable(record)
        stale = self.is_stale(name)
        return {"sketch": record.name, "strategy": strategy or record.strategy, "batch_size": batch_size,
                "stale": stale}

    def check_registration(self, name: str, sql: str, on: list[str], fragments: int | None = None,
                           bounds: list[str] | None = None, dialect: str = "spark") -> dict[str, Any]:
        """The safety check of :meth:`create_sketch` without the capture: no Spark, nothing written.

        Returns:
            ``{"name", "tables", "on", "safety"}`` where ``safety`` is the safety report.

        Raises:
            UsageError: Bad arguments, or a live sketch named ``name`` exists.
            PlanError: The SQL does not parse against the registered tables, or the column is not safe.
        """
        reg = self._registration(name, sql, on, fragments, bounds, dialect)
        return {"name": name, "tables": reg.versions, "on": list(on), "safety": reg.report.to_json()}

    def _registration(self, name: str, sql: str, on: list[str], fragments: int | None, bounds: list[str] | None,
                      dialect: str) -> _Registration:
        """Everything a registration checks before Spark starts: arguments, SQL, tables, columns, safety."""
        if (fragments is None) == (bounds is None):
            raise UsageError("give exactly one of --fragments N or --bounds b0,b1,...,bn")
        if bounds is not None and len(bounds) != len(on):
            raise UsageError(f"give one --bounds per --on ({len(on)} partitioned columns, {len(bounds)} --bounds)")
        if fragments is not None:
            inputs.check_fragments(fragments, self.settings.max_fragments)
        for text in bounds or ():
            inputs.check_bounds_count(text, self.settings.max_fragments)
        inputs.check_sketch_name(name)
        if any(r.name == name for r in self.catalog.list_sketches()):  # before any Spark work (the insert checks too)
            raise UsageError(f"sketch {name!r} already exists; pick another name or drop it (`imp sketch drop {name}`)")
        query = self.analyze(sql, dialect)
        require_engine_support(query.plan)  # refuse what the engine cannot compute as Spark does, before Spark runs
        tables = sorted(query.plan.tables())
        sources = {t: self.source(t) for t in tables}
        for s in sources.values():
            s.require_cdf()
            s.require_readable_by_spark()
        versions = {t: sources[t].current_version() for t in tables}
        schemas = {t: sources[t].schema(versions[t]) for t in tables}
        targets: dict[str, str] = {}
        for item in on:
            table, _, column = item.partition(".")
            if not column:
                raise UsageError(f"--on {item!r}: write TABLE.COLUMN")
            if table not in schemas:
                raise UsageError(f"--on {item}: table {table} is not used by the query (it reads "
                                 f"{', '.join(tables)})")
            if column not in schemas[table].names:
                raise PlanError(f"--on {item}: column {column} does not exist in table {table}; columns: "
                                f"{', '.join(schemas[table].names)}")
            if table in targets:
                raise UsageError(f"--on {item}: table {table} is partitioned twice; one partition per table")
            targets[table] = column
            if bounds is not None:  # bad bounds are a usage error before any Spark work (create parses them again)
                dtype = schemas[table].field(column).type
                if kind_of_type(dtype) in ("int", "float", "decimal", "date", "timestamp", "string"):
                    parse_bounds([b.strip() for b in bounds[len(targets) - 1].split(",")], dtype, item)
        report = require_safe(query.plan, targets, self.sign_oracle(sources, versions))
        return _Registration(query, sources, versions, schemas, targets, report)

    def run_report(self, trigger: str, expected: list[str] | None = None) -> dict[str, Any]:
        """What the runs recorded under ``trigger`` (e.g. ``airflow:DAG/RUN``) did, from the catalog.

        Args:
            trigger: The trigger string the jobs were given.
            expected: Sketches that should have been maintained; one without a succeeded run counts as failed.

        Returns:
            ``{"trigger", "runs": [...], "versions_made", "delta_rows", "succeeded": [names], "failed": [names]}``;
            a sketch retried after a failure counts by its latest run.
        """
        names = {r.id: r.name for r in self.catalog.list_sketches()}
        runs = [r for r in self.catalog.runs(limit=100_000) if r.trigger == trigger]
        runs.sort(key=lambda r: r.id)
        rows, latest = [], {}
        made = consumed = 0
        for r in runs:
            name = names.get(r.sketch_id) if r.sketch_id is not None else None
            if name is None and r.sketch_id is not None:
                name = self.catalog.get_sketch_by_id(r.sketch_id).name
            made_here = 0
            if r.status == "succeeded" and r.to_version is not None:
                made_here = r.to_version - (r.from_version or 0)
            made += made_here
            consumed += r.delta_rows or 0
            rows.append({"run_id": r.id, "sketch": name, "strategy": r.strategy, "status": r.status,
                         "from_version": r.from_version, "to_version": r.to_version, "versions_made": made_here,
                         "delta_rows": r.delta_rows or 0, "error": r.error})
            if name is not None:
                latest[name] = r.status
        for name in expected or ():
            latest.setdefault(name, "missing")
        return {"trigger": trigger, "runs": rows, "versions_made": made, "delta_rows": consumed,
                "succeeded": sorted(n for n, s in latest.items() if s == "succeeded"),
                "failed": sorted(n for n, s in latest.items() if s != "succeeded")}

    def overview(self, refresh: bool = True) -> list[dict[str, Any]]:
        """One row per live sketch for the catalog page: ``sketch_catalog`` plus sketch size and covered share.

        Args:
            refresh: Observe the tables' current Delta versions first (cheap: log reads only); tables that cannot
                be read are skipped with a warning.
        """
        if refresh:
            self.refresh_observations(strict=False)
        records = {r.name: r for r in self.catalog.list_sketches()}
        out = []
        for row in self.catalog.sketch_catalog():
            record = records.get(row["name"])
            parts = []
            if record is not None:
                partitions = PartitionSet.from_json(record.partitions)
                sketch = Sketch({t: tuple(f) for t, f in (row.get("fragments") or {}).items()})
                share = sketch.covered_share(partitions)
                parts = [{"table": p.table, "column": p.column, "fragments": len(sketch.fragments.get(p.table, ())),
                          "fragment_count": p.fragments, "covered_share": share[p.table]}
                         for p in partitions.partitions]
            out.append({
                "name": row["name"],
                "sql": row["sql"],
                "strategy": row["strategy"],
                "latest_version": row["latest_version"],
                "latest_method": row["latest_method"],
                "table_versions": dict(row["table_versions"] or {}),
                "current_table_versions": dict(row["current_table_versions"] or {}),
                "stale": bool(row["is_stale"]),
                "usable": bool(row["usable"]),
                "unusable_reason": row["unusable_reason"],
                "version_created_at": _iso(row.get("version_created_at")),
                "last_run": {"id": row["last_run_id"], "status": row["last_run_status"],
                             "finished_at": _iso(row.get("last_run_finished_at")), "error": row["last_run_error"]},
                "partitions": parts,
                "sketch_fragments": sum(p["fragments"] for p in parts),
                "total_fragments": sum(p["fragment_count"] for p in parts),
            })
        return out


_DEFAULT_BATCH = 1000


def _refuse_unusable(record: SketchRecord) -> None:
    """The one-line error for maintaining (or using) a sketch marked unusable."""
    if record.unusable_reason is not None:
        from imp_core.catalog.store import unusable_message

        raise SketchUnusableError(unusable_message(record.name, record.unusable_reason))


def _identities(sources: dict[str, DeltaSource], versions: dict[str, int] | None = None) -> dict[str, dict[str, str]]:
    """Per table, the Delta metadata id (at ``versions``, else the latest) and the registered path."""
    return {t: {"id": s.table_id(None if versions is None else versions[t]), "path": s.path}
            for t, s in sources.items()}


def _identity_problem(sources: dict[str, DeltaSource], latest: VersionRecord, current: dict[str, int]) -> str | None:
    """Why ``latest`` no longer describes the tables ``sources`` point at now (None if it does)."""
    recorded = latest.table_identities or {}
    for table in sorted(sources):
        source = sources[table]
        had = latest.table_versions.get(table)
        ident = recorded.get(table)
        if ident is not None and ident.get("path") != source.path:
            return (f"table {table} is now registered at {source.path}, but sketch version {latest.version} refers "
                    f"to the table at {ident.get('path')}")
        if ident is not None and ident.get("id") != source.table_id():
            return (f"table {table} at {source.path} was re-created (its Delta table id is {source.table_id()}, "
                    f"sketch version {latest.version} refers to table id {ident.get('id')})")
        if had is not None and current[table] < had:
            return (f"table {table} is at version {current[table]}, older than version {had} that sketch version "
                    f"{latest.version} reflects (the table was re-created or its log rolled back)")
    return None


def _auto_name(catalog: Catalog, sql: str) -> str:
    import hashlib

    base = "q_" + hashlib.sha256(sql.encode()).hexdigest()[:8]
    existing = {r.name for r in catalog.list_sketches()}
    name, i = base, 2
    while name in existing:
        name, i = f"{base}_{i}", i + 1
    return name


def _rows_per_version(source: DeltaSource, after: int, upto: int) -> dict[int, int]:
    table = source.changes(after, upto, columns=[])
    if table.num_rows == 0:
        return {}
    counts = pl.from_arrow(table.select([VERSION])).group_by(VERSION).len()  # type: ignore[union-attr]
    return dict(zip(counts.get_column(VERSION).to_list(), counts.get_column("len").to_list()))


def _covers(version: VersionRecord, current: dict[str, int]) -> bool:
    """Whether a sketch version is valid for (or past) every table version of ``current``."""
    return all(version.table_versions.get(t, -1) >= v for t, v in current.items())


def _iso(value: Any) -> str | None:
    return value.isoformat() if hasattr(value, "isoformat") else value


def _one_line(e: BaseException) -> str:
    if isinstance(e, ImpError):
        text = str(e)
    else:
        text = f"{type(e).__name__}: {e}"
    lines = text.strip().splitlines()
    return lines[0] if lines else type(e).__name__


__all__ = ["SketchService", "MaintenanceResult", "Loaded", "STRATEGIES"]

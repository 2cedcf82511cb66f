"""The sketch service: the one entry point the CLI, the jobs, the Airflow tasks, the catalog page and the PySpark
API go through. Each method is one call into a module that does one job.

See docs/ARCHITECTURE.md, "Where each part lives".
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any

from imp_core.catalog import Catalog, SketchRecord, TableRecord, VersionRecord
from imp_core.config import Settings
from imp_core.errors import UsageError
from imp_core.maintenance import advice, groups, layout, maintain, registration, repartition, reports, sketch_use
from imp_core.maintenance.advice import ColumnAdvice
from imp_core.maintenance.context import Progress, ServiceContext
from imp_core.maintenance.groups import GroupResult
from imp_core.maintenance.guards import check_usable
from imp_core.maintenance.layout import Relayout, TableLayout
from imp_core.maintenance.loading import LoadedSketch, load_sketch
from imp_core.maintenance.maintain import MaintenanceResult
from imp_core.maintenance.registration import ParsedSql
from imp_core.maintenance.repartition import RepartitionResult
from imp_core.maintenance.sketch_use import PreparedQuery, SketchInUse, SketchPredicate
from imp_core.maintenance.strategy import Strategy
from imp_core.plan.sql import Query
from imp_core.publish import publisher
from imp_core.publish.publisher import Published
from imp_core.sketch.partition import Partition
from imp_core.sketch.repartition import DEFAULT_FACTOR
from imp_core.sources.delta import DeltaSource
from imp_core.use import extension, sketched
from imp_core.use.extension import Explanation

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from imp_core.use.query import QueryResult

log = logging.getLogger(__name__)


class SketchService:
    """Registration, maintenance, use and reports of sketches for one process (catalog and Spark started when a
    step first needs them)."""

    def __init__(self, settings: Settings, catalog: Catalog | None = None, spark: SparkSession | None = None,
                 progress: Progress | None = None) -> None:
        self.parts = ServiceContext(settings, catalog, spark, progress or log.info)

    # -- the process's parts

    @property
    def settings(self) -> Settings:
        return self.parts.settings

    @property
    def catalog(self) -> Catalog:
        """The catalog (for tests and tools that inspect it; callers go through the methods below)."""
        return self.parts.catalog

    @property
    def catalog_url(self) -> str:
        """The catalog's URL with the password redacted."""
        return self.parts.catalog.url

    @property
    def spark(self) -> SparkSession:
        return self.parts.spark

    def stop_spark(self) -> None:
        self.parts.stop_spark()

    def close(self) -> None:
        """Close the catalog's pooled connections."""
        self.parts.catalog.close()

    def source(self, table: str) -> DeltaSource:
        return self.parts.source(table)

    # -- registration

    def register_table(self, name: str, path: str | None = None, replace: bool = False,
                       table: str | None = None) -> TableRecord:
        """Register a Delta table, its current version observed (:func:`registration.register_table`)."""
        return registration.register_table(self.parts, name, path, replace, table)

    def unregister_table(self, name: str) -> None:
        """Forget a registered table no live sketch reads (:meth:`Catalog.unregister_table`)."""
        self.catalog.unregister_table(name)

    def analyze(self, sql: str, dialect: str = "spark") -> Query:
        """``sql``'s plan against the registered tables."""
        return registration.analyze(self.parts, ParsedSql.parse(sql, dialect))

    def check_registration(self, name: str, sql: str, on: list[str], fragments: int | None = None,
                           bounds: list[str] | None = None, dialect: str = "spark") -> dict[str, Any]:
        """The safety check of :meth:`create_sketch` without the capture: no Spark, nothing written. With
        ``on == ["auto"]`` every safe column is listed (advice chooses among them at the capture).

        Returns:
            ``{"name", "tables", "on", "safety"}`` where ``safety`` is the safety report (of the first safe column
            for ``auto``, with ``candidates`` listing them all).
        """
        candidates = self._auto(on, bounds, sql, dialect)
        reg = registration.check(self.parts, name, sql, candidates[:1] if candidates else on, fragments, bounds,
                                 dialect)
        out = {"name": name, "tables": reg.versions, "on": list(on), "safety": reg.report.to_json()}
        return {**out, "candidates": candidates} if candidates else out

    def _auto(self, on: list[str], bounds: list[str] | None, sql: str, dialect: str) -> list[str]:
        """The safe columns ``on == ["auto"]`` chooses among (none for explicit columns)."""
        if [o.strip().lower() for o in on] != [advice.AUTO]:
            return []
        if bounds is not None:
            raise UsageError("--bounds needs the column they are for: give --on TABLE.COLUMN, or --fragments N with "
                             "--on auto")
        return advice.safe_candidates(self.parts, sql, dialect)

    def create_sketch(self, name: str, sql: str, on: list[str], fragments: int | None = None,
                      bounds: list[str] | None = None, dialect: str = "spark", strategy: str = Strategy.LAZY,
                      trigger: str = "cli", replace: bool = False) -> tuple[SketchRecord, VersionRecord]:
        """Parse, check safety, pick bounds, capture at pinned versions and commit version 1 (``replace``: in the
        commit that drops the live sketch of that name). ``on == ["auto"]``: on the column sketch advice ranks first
        (paper 7.4; estimating a few safe columns costs a capture each)."""
        candidates = self._auto(on, bounds, sql, dialect)
        if candidates:  # a bad name or argument fails before any capture
            registration.check(self.parts, name, sql, candidates[:1], fragments, bounds, dialect, replace)
            on = [advice.first_choice(self.parts, sql, fragments or 100, dialect)]
        return registration.create_sketch(self.parts, name, sql, on, fragments, bounds, dialect, strategy, trigger,
                                          replace)

    def drop_sketch(self, name: str) -> None:
        """Drop a sketch: its name becomes free, its versions stay for the record, its manifests are withdrawn."""
        record = self.parts.catalog.get_sketch(name)
        latest = self.parts.catalog.latest_version(record.id)
        self.parts.catalog.drop_sketch(name)
        publisher.withdraw_quietly(self.parts.settings, record, latest)

    def publish(self, name: str | None = None) -> list[Published]:
        """Publish sketch ``name``'s latest version for the Spark extension, or every sketch whose latest version
        is not published yet (:func:`imp_core.use.extension.publish`)."""
        names = [name] if name is not None else publisher.pending(self.parts.catalog)
        return [extension.publish(self.parts, n) for n in names]

    def explain(self, sql: str, dialect: str = "spark") -> Explanation:
        """Which published sketches the Spark extension applies to ``sql``, and why not (``imp sketch explain``)."""
        return extension.explain(self.parts, sql, dialect)

    def load(self, name: str) -> LoadedSketch:
        """Sketch ``name`` with its plan, partitions and tables (:func:`loading.load_sketch`)."""
        return load_sketch(self.parts, name)

    # -- maintenance

    def maintain(self, name: str, strategy: str | None = None, batch_size: int | None = None,
                 trigger: str = "cli", allow_recapture: bool = True, wait: float | None = None) -> MaintenanceResult:
        """Bring sketch ``name`` to the current table versions (:func:`maintain.maintain`)."""
        return maintain.maintain(self.parts, name, strategy, batch_size, trigger, allow_recapture, wait)

    def recapture(self, name: str, trigger: str = "cli") -> VersionRecord:
        """Full maintenance of sketch ``name``; returns the new version."""
        return maintain.maintain(self.parts, name, Strategy.RECAPTURE, trigger=trigger).versions[-1]

    def maintain_all(self, strategy: str = Strategy.EAGER, batch_size: int | None = None,
                     trigger: str = "cli") -> list[MaintenanceResult]:
        """Maintain every stale, usable sketch, as one group (:func:`groups.maintain_all`)."""
        return groups.maintain_all(self.parts, strategy, batch_size, trigger)

    def maintain_group(self, sketches: Sequence[str], strategy: str | None = None, batch_size: int | None = None,
                       trigger: str = "cli", allow_recapture: bool = True) -> GroupResult:
        """Maintain ``sketches`` in this process, sharing their tables' change feeds (:func:`groups.maintain_group`)."""
        return groups.maintain_group(self.parts, sketches, strategy, batch_size, trigger, allow_recapture)

    def stale_groups(self, size: int, table: str | Collection[str] | None = None) -> list[tuple[str, ...]]:
        """The stale sketches (of ``table``, or of several tables) in groups of at most ``size``
        (:func:`groups.stale_groups`)."""
        return groups.stale_groups(self.parts, size, table)

    def is_stale(self, name: str) -> bool:
        return maintain.is_stale(self.parts, name)

    def check_maintenance_request(self, name: Any, strategy: Any = None, batch_size: Any = None) -> dict[str, Any]:
        """Validate a maintenance request before any Spark job starts (:func:`maintain.check_request`)."""
        return maintain.check_request(self.parts, name, strategy, batch_size)

    def check_usable(self, name: str) -> None:
        """Raise ``SketchUnusableError`` if sketch ``name`` must not be applied (:func:`guards.check_usable`)."""
        check_usable(self.parts, name)

    # -- use

    def find_sketch(self, sql: str, dialect: str = "spark") -> str | None:
        """A live sketch that can answer ``sql`` (:func:`sketch_use.find_sketch`)."""
        parsed = ParsedSql.parse(sql, dialect)
        return sketch_use.find_sketch(self.parts, parsed, registration.analyze(self.parts, parsed))

    def usable_version(self, name: str, current: dict[str, int], trigger: str,
                       notes: list[str]) -> VersionRecord | None:
        """The version of sketch ``name`` a query at ``current`` may use (:func:`sketch_use.usable_version`)."""
        return sketch_use.usable_version(self.parts, name, current, trigger, notes)

    def query(self, sql: str, dialect: str = "spark", use_sketch: bool = True, capture: bool = False,
              on: list[str] | None = None, fragments: int = 100, trigger: str = "cli") -> QueryResult:
        """Run ``sql`` on Spark, with a fresh sketch when one can answer it (:func:`sketched.run_query`)."""
        return sketched.run_query(self.parts, sql, dialect, use_sketch=use_sketch, capture=capture, on=on,
                                    fragments=fragments, trigger=trigger)

    def prepare_query(self, sql: str, dialect: str = "spark", maintain_first: bool = True,
                      trigger: str = "api") -> PreparedQuery:
        """``sql``'s plan with the sketch to apply, not run (:func:`sketch_use.prepare`)."""
        return sketch_use.prepare(self.parts, sql, dialect, maintain_first=maintain_first, trigger=trigger)

    def sketch_for_table(self, sketch: str, table: str, maintain_first: bool = True, trigger: str = "api",
                         notes: list[str] | None = None) -> tuple[SketchInUse | None, Partition]:
        """Sketch ``sketch`` loaded for use and its partition of ``table`` (:func:`sketch_use.sketch_for_table`)."""
        return sketch_use.sketch_for_table(self.parts, sketch, table, maintain_first=maintain_first,
                                           trigger=trigger, notes=notes)

    def layout(self, table: str | None = None) -> list[TableLayout]:
        """What sketched scans read outside their sketches, per table (:func:`layout.measure`)."""
        return layout.measure(self.parts, table)

    def relayout(self, table: str | None = None, threshold: float | None = None,
                 skip: frozenset[str] = frozenset()) -> list[Relayout]:
        """Re-cluster the tables above ``threshold`` but those switched off or in ``skip`` (:func:`layout.apply`)."""
        return layout.apply(self.parts, table, threshold, skip)

    def set_layout_maintenance(self, table: str, on: bool) -> TableRecord:
        """Let the layout pass re-cluster ``table`` (``on``) or leave it alone."""
        return self.parts.catalog.set_layout_maintenance(table, on)

    def advise(self, sql: str, table: str | None = None, fragments: int = 100, dialect: str = "spark",
               max_columns: int = 10) -> list[ColumnAdvice]:
        """The columns a sketch of ``sql`` is safe on, best first, with estimates (:func:`advice.advise`)."""
        return advice.advise(self.parts, sql, table, fragments, dialect, max_columns)

    def repartition(self, name: str, factor: float = DEFAULT_FACTOR, apply: bool = False,
                    trigger: str = "cli") -> RepartitionResult:
        """Split over- and merge underflowing ranges of a sketch (paper 7.4; :func:`repartition.repartition`)."""
        return repartition.repartition(self.parts, name, factor, apply, trigger)

    def skewed_sketches(self, factor: float = DEFAULT_FACTOR) -> list[str]:
        """Usable sketches whose ranges call for a split or merge (:func:`repartition.skewed`; no Spark)."""
        return repartition.skewed(self.parts, factor)

    def repartition_all(self, factor: float = DEFAULT_FACTOR, trigger: str = "cli") -> list[dict[str, Any]]:
        """Repartition every usable sketch whose ranges over- or underflow (:func:`repartition.repartition_all`)."""
        return repartition.repartition_all(self.parts, factor, trigger)

    def sketch_predicate(self, sketch: str, table: str | None = None) -> SketchPredicate:
        """The SQL range predicate of ``sketch``'s latest usable version (:func:`sketch_use.sketch_predicate`)."""
        return sketch_use.sketch_predicate(self.parts, sketch, table)

    # -- reports

    def list_tables(self) -> list[dict[str, Any]]:
        return reports.tables(self.parts.catalog)

    def describe(self, name: str, version: int | None = None, as_of: tuple[str, int] | None = None) -> dict[str, Any]:
        """``imp sketch show --json`` (:func:`reports.describe`)."""
        return reports.describe(self.parts.catalog, name, version, as_of)

    def history(self, name: str) -> list[dict[str, Any]]:
        return reports.history(self.parts.catalog, name)

    def sketch_list(self) -> list[dict[str, Any]]:
        """``imp sketch list --json`` (:func:`reports.sketch_list`)."""
        return reports.sketch_list(self.parts.catalog)

    def overview(self, refresh: bool = True) -> list[dict[str, Any]]:
        """The catalog page's rows (:func:`reports.overview`)."""
        return reports.overview(self.parts, refresh)

    def run_report(self, trigger: str, expected: list[str] | None = None) -> dict[str, Any]:
        """What the runs recorded under ``trigger`` did (:func:`reports.run_report`)."""
        return reports.run_report(self.parts.catalog, trigger, expected)

    def refresh_observations(self, strict: bool = True) -> dict[str, int | str]:
        return reports.refresh_observations(self.parts.catalog, strict)

    def stale_sketches(self) -> list[str]:
        return reports.stale_sketches(self.parts.catalog)


__all__ = ["MaintenanceResult", "SketchService"]

"""What the service's modules share in one process: settings, the catalog and Spark (each started when first
needed), the registered tables as sources, and progress reporting.

See docs/ARCHITECTURE.md, "Where each part lives".
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

from imp_core.catalog import Catalog
from imp_core.config import Settings
from imp_core.maintenance.feeds import ChangeFeeds
from imp_core.sources.delta import DeltaSource

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from imp_core.spark.backend import SparkBackend

log = logging.getLogger(__name__)

Progress = Callable[[str], None]


class ServiceContext:
    """Settings, catalog, Spark and progress of one service: what its modules share in one process."""

    def __init__(self, settings: Settings, catalog: Catalog | None = None, spark: SparkSession | None = None,
                 progress: Progress | None = None) -> None:
        self.settings = settings
        self._catalog = catalog
        self._spark = spark
        self.progress: Progress = progress or log.info
        self.feeds: ChangeFeeds | None = None  # set while a grouped job shares its tables' change feeds
        self._shared: dict[tuple[str, str], DeltaSource] | None = None

    @property
    def catalog(self) -> Catalog:
        """The catalog, connected on first use."""
        if self._catalog is None:
            self._catalog = Catalog.connect(self.settings)
        return self._catalog

    @property
    def spark(self) -> SparkSession:
        """The Spark session, started on first use (steps that read only Delta logs never start it)."""
        if self._spark is None:
            from imp_core.spark.session import get_spark  # lazy start of Spark

            self.progress("starting Spark")
            self._spark = get_spark(self.settings)
        return self._spark

    @property
    def spark_started(self) -> bool:
        """Whether this process has a Spark session (steps that read only Delta logs never start one)."""
        return self._spark is not None

    def stop_spark(self) -> None:
        """Stop the session this service holds, if any (a ``spark-submit`` job then exits promptly)."""
        if self._spark is not None:
            self._spark.stop()
            self._spark = None

    def source(self, table: str) -> DeltaSource:
        """The registered table ``table`` (scans go through this service's Spark session); inside
        :meth:`shared_reads`, one object per table, so its log is read once for all sketches."""
        path = self.catalog.get_table(table).path
        if self._shared is None:
            return DeltaSource(table, path, spark=lambda: self.spark)
        return self._shared.setdefault((table, path), DeltaSource(table, path, spark=lambda: self.spark))

    @contextmanager
    def shared_reads(self, feeds: ChangeFeeds) -> Iterator[ChangeFeeds]:
        """Within the block, sketches share their tables' sources and change feeds (one grouped job).

        Scoped to one job: a source caches the table versions it opened, which is right while one job runs and
        wrong across a table being re-created later at the same path.
        """
        self.feeds, self._shared = feeds, {}
        try:
            yield feeds
        finally:
            self.feeds, self._shared = None, None

    def sources(self, tables: Iterable[str]) -> dict[str, DeltaSource]:
        return {t: self.source(t) for t in sorted(tables)}

    def backend(self, sources: Mapping[str, DeltaSource]) -> SparkBackend:
        """The engine's backend for full-table work on Spark (capture, joins of a delta with a whole side)."""
        from imp_core.spark.backend import SparkBackend  # lazy start of Spark

        return SparkBackend(lambda: self.spark, dict(sources), self.settings.optimizations)

    def observe(self, sources: Mapping[str, DeltaSource]) -> dict[str, int]:
        """The current Delta version of each table (Delta log reads), recorded as observed in the catalog."""
        out = {}
        for table, source in sources.items():
            out[table] = source.current_version()
            self.catalog.observe_table_version(table, out[table], source.table_id())
        return out


__all__ = ["Progress", "ServiceContext"]

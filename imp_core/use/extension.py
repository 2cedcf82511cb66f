"""imp's side of the Spark extension: the registered tables as temporary views of their Delta tables (so a query
naming them is planned as a client's query of those tables is), ``imp sketch explain`` (for each published sketch
of the query's tables: applies, or the first check that fails, decided by the extension's own code) and ``imp
sketch publish`` (the latest version of a sketch, its plan signature computed first when none is recorded).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from imp_core.errors import UsageError
from imp_core.maintenance.context import ServiceContext
from imp_core.maintenance.registration import ParsedSql
from imp_core.publish import publisher, signature
from imp_core.sketch.partition import PartitionSet
from imp_core.sources import storage
from imp_core.sources.delta import DeltaSource

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def register_views(spark: SparkSession, sources: dict[str, DeltaSource],
                   versions: dict[str, int] | None = None) -> None:
    """Each table as a temporary view of its Delta table (at ``versions`` when given: a time-travel read), the view
    a client would define (``CREATE TEMP VIEW t AS SELECT * FROM delta.`path```): the extension sees through it."""
    for name, source in sources.items():
        uri = storage.spark_uri(source.path).replace("`", "``")
        pinned = f" VERSION AS OF {int(versions[name])}" if versions is not None else ""
        view = name.replace("`", "``")
        spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW `{view}` AS SELECT * FROM delta.`{uri}`{pinned}")


@dataclass(frozen=True)
class Explanation:
    """Per published sketch of the query's tables: whether the extension applies it, else why not."""

    sketches: list[dict[str, Any]]
    locations: list[dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        return {"sketches": self.sketches, "locations": self.locations}


def explain(parts: ServiceContext, sql: str, dialect: str = "spark") -> Explanation:
    """What the extension decides for ``sql`` in imp's session (tables at their current versions)."""
    parsed = ParsedSql.parse(sql, dialect)
    registered = {t.name: t for t in parts.catalog.list_tables()}
    names = [n for n in registered if n.lower() in parsed.tables]
    if not names:
        raise UsageError("the query reads no registered table; register one with `imp table register NAME PATH`")
    spark = parts.spark
    register_views(spark, parts.sources(names))
    out = json.loads(signature.api(spark).explain(spark._jsparkSession, signature.spark_text(sql, dialect)))
    return Explanation(out["sketches"], out["locations"])


def publish(parts: ServiceContext, name: str) -> publisher.Published:
    """Publish sketch ``name``'s latest version, computing its plan signature first when none is recorded."""
    record = parts.catalog.get_sketch(name)
    latest = parts.catalog.latest_version(record.id)
    if not (record.signature or {}).get("hash"):
        tables = sorted(latest.table_versions)
        sources = parts.sources(tables)
        partitions = PartitionSet.from_json(latest.partitions if latest.partitions is not None else record.partitions)
        sig = signature.plan_signature(parts.spark, record.sql, record.dialect or "spark",
                                       {t: s.path for t, s in sources.items()},
                                       {t: s.schema() for t, s in sources.items()},
                                       {p.table: {p.column} for p in partitions.partitions})
        parts.catalog.set_signature(record.id, sig)
    return publisher.publish_latest(parts.catalog, parts.settings, name)


__all__ = ["Explanation", "explain", "publish", "register_views"]

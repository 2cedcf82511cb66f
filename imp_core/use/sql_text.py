"""The sketched query as one Spark SQL text: the user's query with each partitioned table replaced by a subquery
that reads it at the version the sketch reflects and keeps only the sketch's ranges.

Building a DataFrame by composing Column objects from Python costs a Py4J round trip per call (~180 for a small
aggregate query, ~0.18 s); handing Spark one SQL text costs a handful. The text is what a user would write by hand:
``SELECT ... FROM (SELECT * FROM delta.`path` VERSION AS OF 7 WHERE `a` >= 10 AND `a` < 20) AS t ...``, so the
sketched query runs at the cost of the same query with the same filter written in plain Spark SQL (Delta's connector
skips the files whose statistics cannot meet the filter). Tables the sketch does not partition are read at their
pinned version without a filter.
"""

from __future__ import annotations

import hashlib
import re
from typing import TYPE_CHECKING

import sqlglot
from sqlglot import exp

from imp_core.errors import UsageError
from imp_core.sketch.partition import Partition, PartitionSet
from imp_core.sketch.sketch import Sketch
from imp_core.sources import reader, storage
from imp_core.sources.delta import DeltaSource
from imp_core.use.rewrite import prune_files, ranges_sql

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from imp_core.use.query import ScanReport


# temporary views of direct Parquet reads registered per session: (session id, view name)
_REGISTERED: set[tuple[int, str]] = set()


def _direct_view(spark: SparkSession, source: DeltaSource, version: int, partition: Partition | None,
                 fragments: list[int] | None) -> str:
    """A temporary view over the version's Parquet files that may hold rows of ``fragments`` (all files when no
    sketch applies), registered once per session: later queries reuse it without a JVM call.

    The direct read skips the connector's snapshot reconstruction (a Spark job per pinned version); the files are
    pruned by their statistics first, and the range filter in the SQL text still applies to every row.
    """
    files = source.files(version)
    chosen = prune_files(files, partition, fragments) if partition is not None and fragments is not None else files
    digest = hashlib.sha1("\n".join(sorted(f.uri for f in chosen)).encode()).hexdigest()[:12]
    view = f"imp_{re.sub(r'[^0-9A-Za-z_]', '_', source.name)}_v{int(version)}_{digest}"
    key = (id(spark), view)
    if key not in _REGISTERED:
        source.scan(spark, version, chosen).createOrReplaceTempView(view)
        _REGISTERED.add(key)
    return view


def sketched_sql_text(sql: str, dialect: str, sources: dict[str, DeltaSource], versions: dict[str, int],
                      partitions: PartitionSet | None = None, sketch: Sketch | None = None,
                      views: dict[str, str] | None = None) -> str:
    """``sql`` as Spark SQL with every registered table read at ``versions`` and restricted to ``sketch``'s ranges.

    Raises:
        UsageError: ``sql`` cannot be parsed in ``dialect``.
    """
    try:
        tree = sqlglot.parse_one(sql, read=dialect)
    except sqlglot.errors.ParseError as e:
        raise UsageError(f"cannot parse the query: {str(e).splitlines()[0]}; check its SQL") from e
    lowered = {name.lower(): name for name in sources}
    ctes = {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}

    def replace(node: exp.Expression) -> exp.Expression:
        if not isinstance(node, exp.Table) or node.args.get("db") or not isinstance(node.this, exp.Identifier):
            return node
        key = node.name.lower()
        if key not in lowered or key in ctes:
            return node
        name = lowered[key]
        predicate = None
        part = partitions.get(name) if partitions is not None else None
        if part is not None and sketch is not None:
            predicate = ranges_sql(f"`{part.column}`", part.ranges(list(sketch.fragments.get(name, ()))))
        view = (views or {}).get(name)
        sub = sqlglot.parse_one(reader.relation_sql(sources[name], versions[name], predicate, view), read="spark")
        return exp.Subquery(this=sub, alias=exp.TableAlias(this=exp.to_identifier(node.alias_or_name)))

    return tree.transform(replace).sql(dialect="spark")


def sketched_dataframe(spark: SparkSession, sql: str, dialect: str, sources: dict[str, DeltaSource],
                       versions: dict[str, int], partitions: PartitionSet | None = None,
                       sketch: Sketch | None = None) -> tuple[DataFrame, ScanReport]:
    """The sketched query as a DataFrame built by one ``spark.sql`` call, and the tables' sizes from the Delta log
    (no JVM call: the log is read by delta-rs)."""
    from imp_core.use.query import ScanReport

    report = ScanReport()
    for name, source in sources.items():
        source.require_readable_by_spark(versions[name])
        if storage.is_s3(source.path):
            storage.configure_spark(spark)
        files = source.files(versions[name])
        report.files_total += len(files)
        report.rows_total += sum(f.num_records or 0 for f in files)
    views = {}
    for name, source in sources.items():
        if source.reads_parquet_directly(versions[name]):
            part = partitions.get(name) if partitions is not None and sketch is not None else None
            frags = list(sketch.fragments.get(name, ())) if part is not None and sketch is not None else None
            views[name] = _direct_view(spark, source, versions[name], part, frags)
    return spark.sql(sketched_sql_text(sql, dialect, sources, versions, partitions, sketch, views)), report


__all__ = ["sketched_dataframe", "sketched_sql_text"]

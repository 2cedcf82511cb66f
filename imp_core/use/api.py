"""Sketch use from inside your own PySpark job.

Two entry points, both working on the SparkSession you already have:

``sketched_sql(spark, sql)``
    The query as a DataFrame, already restricted by a fresh sketch when one can answer it (the sketch is maintained
    lazily first if a table changed since its version). Nothing is collected; compose it further as you like.

``sketch_filter(spark, table, sketch=...)``
    The predicate (a ``Column``) that keeps only the rows of ``table`` in the fragments of a fresh sketch, for your own
    DataFrame code, plus ``sketched_table``: the table at the sketch's version with that predicate applied (Delta's
    connector skips the files that cannot match).

Example::

    from imp_core.use.api import sketched_sql, sketch_filter, sketched_table

    df = sketched_sql(spark, "SELECT brand, SUM(price*numSold) AS rev FROM sales GROUP BY brand "
                             "HAVING SUM(price*numSold) > 5000")
    df.show()

    sales = sketched_table(spark, "sales", sketch="top")          # range filter (Delta skips files)
    big = sales.groupBy("brand").agg(F.sum(F.col("price") * F.col("numSold")).alias("rev"))

    pred = sketch_filter(spark, "sales", sketch="top")            # just the predicate
    my_df.filter(pred)

Settings (catalog URL etc.) come from the ``IMP_*`` environment variables unless given.

None of these waits long for another process that is maintaining the sketch: after ``IMP_QUERY_WAIT`` seconds the
query runs without the sketch (``sketch_filter`` then keeps every row), which is always correct, and a warning is
logged.

A sketch marked unusable (its assumptions stopped holding, or a table changed identity; docs/SEMANTICS.md,
"Lifecycle") is never applied: the functions then return the unrestricted query, table or an always-true predicate,
and warn with ``SketchUnusableWarning`` saying why and what to do.
"""

from __future__ import annotations

import logging
import warnings

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from imp_core.config import Settings
from imp_core.errors import SketchUnusableError
from imp_core.maintenance.service import SketchService
from imp_core.maintenance.sketch_use import SketchInUse
from imp_core.sketch.partition import Partition
from imp_core.spark.session import apply_semantics
from imp_core.use.query import execute, range_filter
from imp_core.use.rewrite import prune_files

log = logging.getLogger(__name__)


class SketchUnusableWarning(UserWarning):
    """A sketch was not applied because it is unusable; the result is computed without it."""


def _unusable(error: SketchUnusableError) -> None:
    message = f"{error}; computed without it"
    log.warning(message)
    warnings.warn(message, SketchUnusableWarning, stacklevel=3)


def _service(spark: SparkSession, settings: Settings | None) -> SketchService:
    apply_semantics(spark)
    return SketchService(settings or Settings.from_env(), spark=spark)


def sketched_sql(spark: SparkSession, sql: str, *, dialect: str = "spark", maintain: bool = True,
                 settings: Settings | None = None) -> DataFrame:
    """``sql`` as a DataFrame over the registered tables, restricted by a fresh sketch when one can answer it."""
    prepared = _service(spark, settings).prepare_query(sql, dialect, maintain_first=maintain)
    for note in prepared.notes:
        log.warning("%s", note)
    if prepared.unusable is not None:
        _unusable(prepared.unusable)
    applied = prepared.applied
    return execute(spark, prepared.query.plan, prepared.sources, prepared.versions,
                   applied.partitions if applied else None, applied.sketch if applied else None)[0]


def _fresh(service: SketchService, sketch: str, table: str, maintain: bool) -> tuple[SketchInUse | None, Partition]:
    """The sketch to apply to ``table`` (None: apply none; the notes on the way are logged) and its partition.

    Raises:
        SketchUnusableError: The sketch is (or has just been found) unusable.
    """
    notes: list[str] = []
    applied, part = service.sketch_for_table(sketch, table, maintain_first=maintain, notes=notes)
    for note in notes:
        log.warning("%s", note)
    return applied, part


def sketch_filter(spark: SparkSession, table: str, *, sketch: str, maintain: bool = True,
                  settings: Settings | None = None) -> Column:
    """The predicate keeping the rows of ``table`` that lie in the fragments of ``sketch`` (maintained first)."""
    try:
        applied, part = _fresh(_service(spark, settings), sketch, table, maintain)
    except SketchUnusableError as e:
        _unusable(e)
        return F.lit(True)
    if applied is None:
        return F.lit(True)
    return range_filter(part, applied.fragments(table))


def sketched_table(spark: SparkSession, table: str, *, sketch: str, maintain: bool = True,
                   settings: Settings | None = None) -> DataFrame:
    """``table`` at the sketch's version with the range filter applied (files that cannot match are skipped)."""
    service = _service(spark, settings)
    source = service.source(table)
    try:
        applied, part = _fresh(service, sketch, table, maintain)
    except SketchUnusableError as e:
        _unusable(e)
        applied = None
    if applied is None:
        return source.scan(spark, source.current_version())
    version = applied.version.table_versions[table]
    frags = applied.fragments(table)
    files = prune_files(source.files(version), part, frags) if source.reads_parquet_directly(version) else None
    return source.scan(spark, version, files).filter(range_filter(part, frags))


__all__ = ["SketchUnusableWarning", "sketch_filter", "sketched_sql", "sketched_table"]

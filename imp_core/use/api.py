"""Sketch use from inside your own PySpark job.

Two entry points, both working on the SparkSession you already have:

``sketched_sql(spark, sql)``
    The query as a DataFrame, already restricted by a fresh sketch when one can answer it (the sketch is maintained
    lazily first if a table changed since its version, then applied by imp's Spark extension, which the session
    must load: ``imp_core.spark.connector.session_conf()``). Nothing is collected; compose it further as you like.

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

``sketched_view(spark, table, sketch=..., view=...)`` and ``sketch_predicate(sketch)``
    For plain Spark code that must not see any change to its session: the table at the version the sketch's latest
    usable version reflects, with the sketch's range filter, optionally registered as a temporary view; or the
    filter as SQL text. Neither maintains the sketch nor changes a setting of the session (the functions above set
    Spark's time zone to UTC, ANSI mode off and case-sensitive names on the session they are given, the semantics
    sketches are computed under; ``sketched_view`` only reads them, and warns with ``SketchSemanticsWarning`` when
    the session's differ, since a query evaluated under other settings may need rows outside the sketch).

    ::

        from imp_core.use.api import sketched_view
        sketched_view(spark, "sales", sketch="top", view="sales_top")
        spark.sql("SELECT brand, SUM(price*numSold) AS rev FROM sales_top GROUP BY brand "
                  "HAVING SUM(price*numSold) > 5000").show()

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
from imp_core.maintenance.sketch_use import SketchInUse, SketchPredicate
from imp_core.sketch.partition import Partition
from imp_core.spark.session import apply_semantics, semantics_differences
from imp_core.use.query import range_filter, sketched_scan
from imp_core.use.sketched import dataframe

log = logging.getLogger(__name__)


class SketchSemanticsWarning(UserWarning):
    """The session evaluates SQL under other settings than the sketch was computed with."""


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
    """``sql`` as a DataFrame over the registered tables, restricted by a fresh sketch when one can answer it: the
    sketch is maintained lazily and published first, then imp's Spark extension (which ``spark`` must load) applies
    it when ``spark.sql`` analyzes the query (:mod:`imp_core.use.sketched`)."""
    service = _service(spark, settings)
    prepared = service.prepare_query(sql, dialect, maintain_first=maintain)
    if prepared.unusable is not None:
        _unusable(prepared.unusable)
    df = dataframe(service.parts, prepared, sql, dialect)[0]
    for note in prepared.notes:
        log.warning("%s", note)
    return df


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
    return sketched_scan(spark, source, applied.version.table_versions[table], part, applied.fragments(table))


def sketch_predicate(sketch: str, *, table: str | None = None, settings: Settings | None = None) -> SketchPredicate:
    """The range predicate of ``sketch``'s latest usable version on ``table`` as Spark SQL text, with the table
    version it is valid for (no Spark needed; the sketch is not maintained)."""
    service = SketchService(settings or Settings.from_env())
    try:
        return service.sketch_predicate(sketch, table)
    finally:
        service.close()


def sketched_view(spark: SparkSession, table: str, *, sketch: str, view: str | None = None,
                  settings: Settings | None = None) -> DataFrame:
    """``table`` at the version ``sketch``'s latest usable version reflects, restricted to the sketch's fragments
    (files that cannot match are skipped), registered as temporary view ``view`` when given. The caller's session
    is only read: no setting changes, no maintenance.

    Raises:
        SketchUnusableError: The sketch is unusable (drop and re-create it).
    """
    differences = semantics_differences(spark.conf.get)
    if differences:
        shown = ", ".join(f"{k}={v!r} (sketches: {e!r})" for k, (v, e) in sorted(differences.items()))
        message = (f"sketch {sketch}: this session evaluates SQL with {shown}; the sketch holds every row the "
                   f"registered query needs under the sketches' settings, and a query whose result depends on these "
                   f"settings may need rows outside it")
        log.warning(message)
        warnings.warn(message, SketchSemanticsWarning, stacklevel=2)
    service = SketchService(settings or Settings.from_env(), spark=spark)
    try:
        applied, part = service.sketch_for_table(sketch, table, maintain_first=False, trigger="api")
        assert applied is not None  # taken as it is: nothing to wait for
        source = service.source(table)
        df = sketched_scan(spark, source, applied.version.table_versions[table], part, applied.fragments(table))
    finally:
        service.close()
    if view:
        df.createOrReplaceTempView(view)
    return df


__all__ = ["SketchSemanticsWarning", "SketchUnusableWarning", "sketch_filter", "sketch_predicate", "sketched_sql",
           "sketched_table", "sketched_view"]

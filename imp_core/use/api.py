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
from typing import TYPE_CHECKING

from imp_core.config import Settings
from imp_core.errors import SketchUnusableError, UsageError
from imp_core.sketch.partition import PartitionSet
from imp_core.sketch.sketch import Sketch

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

    from imp_core.catalog.store import VersionRecord
    from imp_core.maintenance.service import SketchService

log = logging.getLogger(__name__)


class SketchUnusableWarning(UserWarning):
    """A sketch was not applied because it is unusable; the result is computed without it."""


def _unusable(error: SketchUnusableError) -> None:
    message = f"{error}; computed without it"
    log.warning(message)
    warnings.warn(message, SketchUnusableWarning, stacklevel=3)


def _service(spark: SparkSession, settings: Settings | None) -> SketchService:
    from imp_core.maintenance.service import SketchService
    from imp_core.spark.session import apply_semantics

    apply_semantics(spark)
    return SketchService(settings or Settings.from_env(), spark=spark)


def sketched_sql(spark: SparkSession, sql: str, *, dialect: str = "spark", maintain: bool = True,
                 settings: Settings | None = None) -> DataFrame:
    """``sql`` as a DataFrame over the registered tables, restricted by a fresh sketch when one can answer it."""
    from imp_core.use.query import execute

    service = _service(spark, settings)
    query = service.analyze(sql, dialect)
    tables = sorted(query.plan.tables())
    sources = {t: service.source(t) for t in tables}
    name = service.find_sketch(sql, dialect)
    versions = {t: s.current_version() for t, s in sources.items()}
    try:
        latest = _version(service, name, versions, maintain) if name is not None else None
    except SketchUnusableError as e:
        _unusable(e)
        latest = None
    if name is None or latest is None:
        return execute(spark, query.plan, sources, versions)[0]
    record = service.catalog.get_sketch(name)
    partitions = PartitionSet.from_json(record.partitions)
    sketch = Sketch({t: tuple(f) for t, f in latest.fragments.items()})
    versions = {t: latest.table_versions[t] for t in tables}
    return execute(spark, query.plan, sources, versions, partitions, sketch)[0]


def _version(service: SketchService, sketch: str, current: dict[str, int], maintain: bool) -> VersionRecord | None:
    """The version to use: with ``maintain``, one valid for ``current`` without a long wait (None when the wait ran
    out: use no sketch); without, the latest as it is, checked for unusability.

    Raises:
        SketchUnusableError: The sketch is (or has just been found) unusable.
    """
    if not maintain:
        service.check_usable(sketch)
        return service.catalog.latest_version(service.catalog.get_sketch(sketch).id)
    notes: list[str] = []
    latest = service.usable_version(sketch, current, "api", notes)
    for note in notes:
        log.warning("%s", note)
    return latest


def _fresh(service: SketchService, sketch: str, table: str, maintain: bool):  # noqa: ANN202
    """The version of the sketch to use (None: use none) and its partition of ``table``.

    Raises:
        SketchUnusableError: The sketch is (or has just been found) unusable.
    """
    record = service.catalog.get_sketch(sketch)
    partitions = PartitionSet.from_json(record.partitions)
    tables = service.catalog.latest_version(record.id).table_versions  # every table the sketch depends on
    current = {t: service.source(t).current_version() for t in tables}
    latest = _version(service, sketch, current, maintain)
    part = partitions.get(table)
    if part is None:
        raise UsageError(f"sketch {sketch} does not partition table {table} (it partitions "
                         f"{', '.join(partitions.tables)})")
    return latest, part


def sketch_filter(spark: SparkSession, table: str, *, sketch: str, maintain: bool = True,
                  settings: Settings | None = None) -> Column:
    """The predicate keeping the rows of ``table`` that lie in the fragments of ``sketch`` (maintained first)."""
    from pyspark.sql import functions as F

    from imp_core.use.query import range_filter

    try:
        latest, part = _fresh(_service(spark, settings), sketch, table, maintain)
    except SketchUnusableError as e:
        _unusable(e)
        return F.lit(True)
    if latest is None:
        return F.lit(True)
    return range_filter(part, list(latest.fragments.get(table, [])))


def sketched_table(spark: SparkSession, table: str, *, sketch: str, maintain: bool = True,
                   settings: Settings | None = None) -> DataFrame:
    """``table`` at the sketch's version with the range filter applied (files that cannot match are skipped)."""
    from imp_core.use.query import range_filter
    from imp_core.use.rewrite import prune_files

    service = _service(spark, settings)
    source = service.source(table)
    try:
        latest, part = _fresh(service, sketch, table, maintain)
    except SketchUnusableError as e:
        _unusable(e)
        latest = None
    if latest is None:
        return source.scan(spark, source.current_version())
    version = latest.table_versions[table]
    frags = list(latest.fragments.get(table, []))
    files = prune_files(source.files(version), part, frags) if source.reads_parquet_directly(version) else None
    return source.scan(spark, version, files).filter(range_filter(part, frags))

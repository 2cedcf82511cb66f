"""A query run through Spark's SQL with the sketch applied by imp's Spark extension, the one implementation of
matching (IMP paper Fig. 2; docs/ARCHITECTURE.md, "Queries from any client").

``imp query`` and ``sketched_sql`` first do what only imp can: find the sketch that answers the query and maintain
it lazily (:mod:`imp_core.maintenance.sketch_use`), which publishes the version it commits. Then the query runs as
any client's does: ``spark.sql`` on the user's own text, each registered table it reads a temporary view of its
Delta table at the version to read (the sketch's), and the extension's optimizer rule restricts the scans when the
published sketch matches. Around that one analysis the session is told which sketch version was just published
(``spark.imp.sketches.expect``: the rule re-reads a location whose cached manifests lack it), and where imp
publishes when the session looks elsewhere; ``--no-sketch`` analyzes with the rule off
(``spark.imp.sketches.enabled=false``). Settings and views are restored afterwards: the DataFrame's analyzed plan
already holds the decision.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from imp_core.errors import ConfigError, PlanError, first_line
from imp_core.maintenance.context import ServiceContext
from imp_core.maintenance.sketch_use import PreparedQuery, SketchInUse, prepare
from imp_core.publish import publisher, signature
from imp_core.sources import storage
from imp_core.spark import connector, failures
from imp_core.spark.extension import EXTENSION_CLASS
from imp_core.use import extension

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from imp_core.use.query import QueryResult, ScanReport

log = logging.getLogger(__name__)

_CONNECT_SIGNATURE = "registered through Spark Connect"  # signature_of's reason when no JVM was at hand


def run_query(
    parts: ServiceContext,
    sql: str,
    dialect: str = "spark",
    *,
    use_sketch: bool = True,
    capture: bool = False,
    on: list[str] | None = None,
    fragments: int = 100,
    trigger: str = "cli",
) -> QueryResult:
    """Run ``sql`` on Spark, restricted by a fresh sketch when one can answer it (lazily maintained first); with
    ``use_sketch`` False, with the extension's rule off."""
    from imp_core.use.query import QueryResult, collect  # lazy start of Spark

    t0 = time.perf_counter()
    prepared = prepare(
        parts, sql, dialect, use_sketch=use_sketch, capture=capture, on=on, fragments=fragments, trigger=trigger
    )
    df, scanned, applied = dataframe(parts, prepared, sql, dialect, use_sketch=use_sketch)
    names = list(prepared.query.output_names)
    rows = collect(df, names, scanned)
    notes = list(prepared.notes)
    if prepared.unusable is not None:
        notes.append(first_line(prepared.unusable))
    elif use_sketch and prepared.found is None and not applied:
        notes.append("no sketch can answer this query; ran it without one (add --capture to register one)")
    info = {"name": applied[0]["sketch"], "version": applied[0]["version"]} if applied else None
    return QueryResult(names, rows, info, scanned, time.perf_counter() - t0, notes)


def dataframe(
    parts: ServiceContext, prepared: PreparedQuery, sql: str, dialect: str, *, use_sketch: bool = True
) -> tuple[DataFrame, ScanReport, list[dict[str, Any]]]:
    """The prepared query as a DataFrame of ``spark.sql``, the tables' sizes from the Delta log, and the sketch
    versions the extension applied to it (``[{"sketch", "version"}]``; empty on Spark Connect, where the plan is
    on the server). A sketch the extension does not apply leaves a note on ``prepared``."""
    from imp_core.use.query import ScanReport  # lazy start of Spark

    spark = parts.spark
    report = ScanReport()
    for name, source in prepared.sources.items():
        version = prepared.versions[name]
        source.require_readable_by_spark(version)
        if storage.is_s3(source.path):
            storage.configure_spark(spark)
        files = source.files(version)
        report.files_total += len(files)
        report.rows_total += sum(f.num_records or 0 for f in files)
    conf: dict[str, str | None] = {connector.SKETCH_ENABLED_CONF: "true" if use_sketch else "false"}
    wanted = prepared.applied if use_sketch else None
    if wanted is not None:
        conf.update(_sketch_conf(parts, spark, wanted, prepared.notes))
    with session_conf(spark, conf), _table_views(spark, prepared):
        df = _spark_sql(spark, signature.spark_text(sql, dialect))
    applied = applied_sketches(spark, df)
    if (
        wanted is not None
        and conf.get(connector.SKETCH_EXPECT_CONF)
        and hasattr(df, "_jdf")
        and not any(a["sketch"] == wanted.name for a in applied)
    ):
        prepared.notes.append(
            f"the Spark extension did not apply sketch {wanted.name} v{wanted.version.version}; "
            f"ran the query without it (`imp sketch explain --sql ...` says why)"
        )
    return df, report, applied


def applied_sketches(spark: SparkSession, df: DataFrame) -> list[dict[str, Any]]:
    """The sketch versions the extension applied to ``df``'s plan (empty for a Spark Connect DataFrame)."""
    if not hasattr(df, "_jdf"):
        return []
    return list(json.loads(signature.api(spark).applied(df._jdf)))  # noqa: SLF001 - PySpark's Py4J handle of the DataFrame


def require_extension(spark: SparkSession) -> None:
    """Refuse a session that does not load imp's extension: no sketch could restrict its queries.

    Raises:
        ConfigError: The session's ``spark.sql.extensions`` lacks imp's extension.
    """
    if EXTENSION_CLASS not in str(spark.conf.get("spark.sql.extensions", "") or ""):
        raise ConfigError(
            f"this Spark session does not load imp's sketch extension ({EXTENSION_CLASS}), which "
            f"applies sketches to its queries; start it with the settings of "
            f"imp_core.spark.connector.session_conf() (spark-submit: python -m "
            f"imp_core.spark.connector submit-args)"
        )


def _sketch_conf(
    parts: ServiceContext, spark: SparkSession, wanted: SketchInUse, notes: list[str]
) -> dict[str, str | None]:
    """The session settings under which the extension sees ``wanted``'s version: published (now, when the commit's
    own publish failed or no signature was recorded), expected, and looked for where it was published."""
    require_extension(spark)
    record = parts.catalog.get_sketch(wanted.name)
    version = wanted.version.version
    try:
        if not (record.signature or {}).get("hash") and _signature_computable(parts, record.signature):
            extension.publish(parts, wanted.name)  # computes the signature, then publishes the latest version
        elif record.published_version is None or record.published_version < version:
            publisher.publish_version(parts.catalog, parts.settings, record, wanted.version)
    except Exception as e:  # noqa: BLE001 - the query still runs, without the sketch
        notes.append(
            f"could not publish sketch {wanted.name} v{version} for the Spark extension "
            f"({first_line(e)}); ran the query without it"
        )
        return {}
    out: dict[str, str | None] = {connector.SKETCH_EXPECT_CONF: f"{record.id}:{version}"}
    where = storage.spark_uri(publisher.location(parts.settings, wanted.version))
    configured = [
        x.strip() for x in str(spark.conf.get(connector.SKETCH_LOCATION_CONF, "") or "").split(",") if x.strip()
    ]
    if (configured or parts.settings.publish_location) and where not in configured:
        out[connector.SKETCH_LOCATION_CONF] = ",".join([*configured, where])
    return out


def _signature_computable(parts: ServiceContext, recorded: Any) -> bool:
    """Whether a missing signature may be computed now: a JVM is at hand, and registration did not find the plan
    unmatchable (only that it had no JVM, or it recorded nothing)."""
    from imp_core.spark.session import is_remote  # lazy start of Spark

    reason = str((recorded or {}).get("unmatchable") or "")
    return not is_remote(parts.spark) and (not reason or reason.startswith(_CONNECT_SIGNATURE))


_ANALYSIS_ERRORS = ("AnalysisException", "ParseException")


def _spark_sql(spark: Any, text: str) -> Any:
    """``spark.sql(text)``; a query Spark cannot parse or analyze is the user's to fix (a ``PlanError`` with
    Spark's first line), a known data failure is its platform error, anything else stays an internal error."""
    try:
        return spark.sql(text)
    except Exception as e:
        known = failures.as_known_error(e)
        if known is not None:
            raise known from e
        if type(e).__name__ in _ANALYSIS_ERRORS:
            raise PlanError(
                f"Spark cannot run the query: {storage.redact(first_line(e)).rstrip('; ')}; fix the SQL (imp query "
                f"runs it as Spark SQL)"
            ) from e
        raise


@contextmanager
def session_conf(spark: SparkSession, conf: dict[str, str | None]) -> Iterator[None]:
    """``conf`` set on the session (None: unset) while the block runs, the former values restored after."""
    saved = {k: spark.conf.get(k, None) for k in conf}
    try:
        for key, value in conf.items():
            _set(spark, key, value)
        yield
    finally:
        for key, value in saved.items():
            _set(spark, key, value)


def _set(spark: SparkSession, key: str, value: str | None) -> None:
    if value is None:
        spark.conf.unset(key)
    else:
        spark.conf.set(key, value)


@contextmanager
def _table_views(spark: SparkSession, prepared: PreparedQuery) -> Iterator[None]:
    """Each table of the query a temporary view of its Delta table at the version to read, while the block runs
    (a client's ``CREATE TEMP VIEW t AS SELECT * FROM delta.`path` VERSION AS OF v``: the extension sees through
    it); dropped after, so later queries of the session never read a pinned version by that name."""
    extension.register_views(spark, prepared.sources, prepared.versions)
    try:
        yield
    finally:
        for name in prepared.sources:
            spark.catalog.dropTempView(name)


__all__ = ["applied_sketches", "dataframe", "require_extension", "run_query", "session_conf"]

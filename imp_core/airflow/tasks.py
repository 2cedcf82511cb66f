"""What the DAGs' Python tasks call: each function is one call into the service façade plus argument building.

Errors a user can fix (unknown sketch, bad batch size, unsafe column) become ``AirflowFailException``: the task fails
at once with the one-line message, without retries, before any ``spark-submit`` starts. An unreachable catalog stays
an ordinary error, so the task's retries apply. See docs/AIRFLOW.md.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from imp_core.airflow import CATALOG_CONN_ID, assets
from imp_core.airflow.hooks import ImpCatalogHook
from imp_core.errors import CatalogError, ImpError, NotFoundError, UsageError, first_line
from imp_core.jobs import MaintainGroupJob, MaintainJob, RepartitionJob, airflow_trigger, parse_job, sketches_of
from imp_core.maintenance import layout, repartition
from imp_core.maintenance.strategy import Strategy
from imp_core.security.redact import scrub

log = logging.getLogger(__name__)


def trigger_for(context: Mapping[str, Any]) -> str:
    """The trigger recorded with the catalog runs of this DAG run: ``airflow:<dag_id>/<run_id>``."""
    dag_id = context["dag"].dag_id if context.get("dag") is not None else context["dag_run"].dag_id
    return airflow_trigger(dag_id, context["run_id"])


@contextmanager
def _user_errors() -> Iterator[None]:
    try:
        yield
    except NotFoundError as e:
        raise AirflowFailException(scrub(first_line(e))) from e
    except CatalogError:
        raise
    except ImpError as e:
        raise AirflowFailException(scrub(first_line(e))) from e


def stale_group_args(context: Mapping[str, Any], size: int, strategy: str = Strategy.EAGER,
                     batch_size: int | None = None, conn_id: str = CATALOG_CONN_ID) -> list[list[str]]:
    """One ``maintain-group`` job's argv per group of stale sketches (table observations refreshed first; sketches
    grouped by the tables they read, at most ``size`` per job), for dynamic task mapping."""
    with _user_errors():
        groups = ImpCatalogHook(conn_id).get_conn().stale_groups(size)
    stale = [name for group in groups for name in group]
    log.info("stale sketches: %s", ", ".join(stale) if stale else "none")
    log.info("%d job(s) of at most %d sketches: %s", len(groups), size, "; ".join(", ".join(g) for g in groups))
    trigger = trigger_for(context)
    return [MaintainGroupJob(group, Strategy.parse(strategy), batch_size, trigger).argv() for group in groups]


def on_commit_group_args(context: Mapping[str, Any], size: int, batch_size: int,
                         conn_id: str = CATALOG_CONN_ID) -> list[list[str]]:
    """One eager ``maintain-group`` job's argv per group of the stale sketches that read a table this run was
    triggered for (its table assets' events; every watched table when the run was started by hand), grouped as the
    nightly DAG groups them; no job when none is stale (the events arrived while an earlier run caught up)."""
    events = context.get("triggering_asset_events") or {}
    uris = sorted({getattr(asset, "uri", str(asset)) for asset in events})
    for asset in events:
        for event in events[asset]:
            payload = (event.extra or {}).get("payload") or {}
            log.info("asset %s: %s", getattr(asset, "uri", asset),
                     f"version {payload.get('version')} (after {payload.get('previous_version')})" if payload
                     else f"event from {event.source_dag_id or 'outside a DAG'}")
    with _user_errors():
        service = ImpCatalogHook(conn_id).get_conn()
        found = assets.watched(service)
        tables = found.table_names(uris) if uris else {t for names in found.tables.values() for t in names}
        groups = service.stale_groups(size, tables) if tables else []
    log.info("changed tables: %s; stale sketches reading them: %s", ", ".join(sorted(tables)) or "none",
             "; ".join(", ".join(g) for g in groups) or "none (already maintained)")
    trigger = trigger_for(context)
    return [MaintainGroupJob(group, Strategy.EAGER, batch_size, trigger).argv() for group in groups]


def relayout(conn_id: str = CATALOG_CONN_ID) -> list[dict[str, Any]]:
    """The nightly layout pass (before maintenance, so the maintenance after it passes through the rewrite and the
    sketches end the night current): tables whose sketched scans cost more than ``IMP_LAYOUT_THRESHOLD`` above what
    they would cost on the table clustered by those columns are re-clustered, except tables switched off (``imp table
    layout TABLE --off``) or listed in ``IMP_LAYOUT_SKIP``; ``IMP_LAYOUT=off`` skips the pass. Each table's share,
    and what was done, goes to the task log; the result to XCom. A table whose rewrite fails does not stop the
    others; the task fails at the end naming it (maintenance runs anyway: its trigger rule is ``all_done``).

    Raises:
        AirflowFailException: A table could not be re-clustered.
    """
    with _user_errors():
        if not layout.switched_on():
            log.info("layout pass switched off (IMP_LAYOUT=off)")
            return []
        done = ImpCatalogHook(conn_id).get_conn().relayout(skip=layout.skipped_tables())
    log.info("layout: %d table(s) partitioned by a usable sketch", len(done))
    for d in done:
        before, after = d.before, d.after
        if after is not None:
            log.info("layout: table %s: sketched scans cost %.0f%% more than clustered -> %.0f%% after OPTIMIZE "
                     "ZORDER BY (%s) at version %d (%d -> %d files)", before.table, 100 * before.excess_share,
                     100 * after.excess_share, ", ".join(before.columns), after.version, before.files, after.files)
        else:
            log.info("layout: table %s: sketched scans cost %.0f%% more than clustered, %s%s", before.table,
                     100 * before.excess_share, d.outcome, f": {scrub(d.error)}" if d.error else "")
    failed = [d for d in done if d.failed]
    if failed:
        raise AirflowFailException(f"re-clustering failed for table(s) {', '.join(d.before.table for d in failed)}; "
                                   f"see the log (maintenance runs anyway)")
    return [d.to_json() for d in done]


def layout_failed() -> None:
    """The last word of a failed layout pass: a task downstream of it, run only when it failed (trigger rule
    ``one_failed``), so that the DAG run ends failed although maintenance, downstream too, ran and succeeded.

    Raises:
        AirflowFailException: Always.
    """
    raise AirflowFailException("the layout pass failed for some table (see the relayout_tables log); maintenance "
                               "ran anyway; switch the table off with imp table layout TABLE --off or repair it")


def repartition_args(context: Mapping[str, Any], conn_id: str = CATALOG_CONN_ID) -> list[str]:
    """The argv of the job that splits and merges the ranges of the sketches that need it (after maintenance, from
    the rows per range the catalog tracks: no Spark here); skipped when ``IMP_REPARTITION=off`` or none needs it.

    Raises:
        AirflowSkipException: Nothing to do.
    """
    with _user_errors():
        if not repartition.switched_on():
            raise AirflowSkipException("range split and merge switched off (IMP_REPARTITION=off)")
        factor = repartition.factor_setting()
        names = ImpCatalogHook(conn_id).get_conn().skewed_sketches(factor)
    if not names:
        raise AirflowSkipException(f"every sketch's ranges hold within {factor:g}x the mean rows: nothing to split "
                                   f"or merge")
    log.info("%d sketch(es) to repartition (factor %g): %s", len(names), factor, ", ".join(names))
    return RepartitionJob(tuple(names), factor, trigger_for(context)).argv()


def on_demand_args(context: Mapping[str, Any], conn_id: str = CATALOG_CONN_ID) -> list[str]:
    """Check an on-demand request and return its job's argv.

    The request names one sketch or several (``sketch``: names separated by commas or spaces), or a ``table``
    whose stale sketches are all maintained; each sketch is checked (exists, usable), as are the strategy and the
    batch size, before any Spark job.
    """
    params = context["params"]
    names = [n for n in re.split(r"[,\s]+", str(params.get("sketch") or "")) if n]
    table = str(params.get("table") or "").strip()
    strategy, batch_size = params.get("strategy"), params.get("batch_size")
    with _user_errors():
        if bool(names) == bool(table):
            raise UsageError("give the sketch(es) to maintain (parameter `sketch`) or a table whose stale sketches to "
                             "maintain (parameter `table`), not both")
        service = ImpCatalogHook(conn_id).get_conn()
        if table:
            service.catalog.get_table(table)  # NotFoundError naming the registered tables
            names = [n for group in service.stale_groups(10**6, table) for n in group]
        checked = [service.check_maintenance_request(n, strategy, batch_size) for n in dict.fromkeys(names)]
    log.info("maintenance request is valid: %s", checked)
    if not checked:
        raise AirflowSkipException(f"table {table} has no stale sketch: nothing to maintain")
    trigger = trigger_for(context)
    sketches = tuple(c["sketch"] for c in checked)
    if len(sketches) == 1:
        return MaintainJob(sketches[0], strategy, batch_size, trigger).argv()
    return MaintainGroupJob(sketches, strategy, batch_size, trigger).argv()


def validate_maintenance(params: Mapping[str, Any], conn_id: str = CATALOG_CONN_ID) -> dict[str, Any]:
    """Check an on-demand request (sketch exists, strategy known, batch size >= 1) before any Spark job."""
    with _user_errors():
        checked = ImpCatalogHook(conn_id).get_conn().check_maintenance_request(
            params.get("sketch") or "", params.get("strategy"), params.get("batch_size"))
    log.info("maintenance request is valid: %s", checked)
    return checked


def validate_registration(params: Mapping[str, Any], conn_id: str = CATALOG_CONN_ID) -> dict[str, Any]:
    """Safety check of a sketch registration (no Spark, nothing written) before the capture job."""
    with _user_errors():
        report = ImpCatalogHook(conn_id).get_conn().check_registration(
            params.get("name") or "", params.get("sql") or "", [params.get("on") or ""],
            fragments=params.get("fragments"))
    log.info("sketch %s is safe to register: %s", report["name"], report["safety"])
    return report


def report_runs(context: Mapping[str, Any], submitted: Sequence[Sequence[str]] | None,
                conn_id: str = CATALOG_CONN_ID) -> dict[str, Any]:
    """Versions made and change rows consumed by this DAG run's jobs, read back from the catalog.

    Raises:
        AirflowFailException: The stale sketches could not be listed (``submitted`` is None: its task failed), or
            a sketch that was submitted has no succeeded run (the report is logged first).
    """
    if submitted is None:
        raise AirflowFailException("the stale sketches could not be listed, so nothing was maintained; see the "
                                   "list_stale_groups task's log")
    expected = [name for argv in submitted or () for name in sketches_of(argv)]
    with _user_errors():
        report = ImpCatalogHook(conn_id).get_conn().run_report(trigger_for(context), expected)
    log.info("maintained %d sketch(es): %d new version(s) from %d change rows", len(report["succeeded"]),
             report["versions_made"], report["delta_rows"])
    for run in report["runs"]:
        log.info("  run %s sketch %s: %s v%s -> v%s, %s change rows%s", run["run_id"], run["sketch"], run["status"],
                 run["from_version"], run["to_version"], run["delta_rows"],
                 f" ({run['error']})" if run["error"] else "")
    if report["failed"]:
        raise AirflowFailException(f"maintenance failed for sketch(es) {', '.join(report['failed'])}; "
                                   f"see the maintenance job tasks' logs")
    return report


def report_job(application_args: Sequence[str], conn_id: str = CATALOG_CONN_ID) -> dict[str, Any] | None:
    """What a finished maintenance job did to each of its sketches, read back from the catalog's runs and logged
    (the mapped task's XCom); None for jobs that maintain no named sketches."""
    try:
        job = parse_job(application_args)
        sketches = sketches_of(application_args)
    except (ImpError, SystemExit):
        return None
    try:
        report = ImpCatalogHook(conn_id).get_conn(shared=True).run_report(job.trigger, list(sketches))
    except ImpError as e:
        log.warning("cannot read the runs of this job back from the catalog: %s", scrub(first_line(e)))
        return None
    runs = [r for r in report["runs"] if r["sketch"] in sketches]
    outcome = {name: "failed" if name in report["failed"] else "succeeded" for name in sketches}
    log.info("this job's sketches: %d succeeded, %d failed", sum(v == "succeeded" for v in outcome.values()),
             sum(v != "succeeded" for v in outcome.values()))
    for run in runs:
        log.info("  sketch %s: %s v%s -> v%s, %s change rows%s", run["sketch"], run["status"], run["from_version"],
                 run["to_version"], run["delta_rows"], f" ({scrub(run['error'])})" if run["error"] else "")
    return {"trigger": job.trigger, "sketches": outcome, "runs": runs}


__all__ = ["on_commit_group_args", "on_demand_args", "report_job", "report_runs", "stale_group_args", "trigger_for",
           "validate_maintenance", "repartition_args", "validate_registration"]

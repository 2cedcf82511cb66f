"""What the DAGs' Python tasks call: each function is one call into the service façade plus argument building.

Errors a user can fix (unknown sketch, bad batch size, unsafe column) become ``AirflowFailException``: the task fails
at once with the one-line message, without retries, before any ``spark-submit`` starts. An unreachable catalog stays
an ordinary error, so the task's retries apply. See docs/AIRFLOW.md.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from airflow.sdk.exceptions import AirflowFailException

from imp_core.airflow import CATALOG_CONN_ID
from imp_core.airflow.hooks import ImpCatalogHook
from imp_core.errors import CatalogError, ImpError, NotFoundError, first_line
from imp_core.jobs import MaintainJob, airflow_trigger, sketch_of
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


def stale_maintenance_args(context: Mapping[str, Any], strategy: str = Strategy.EAGER,
                           batch_size: int | None = None, conn_id: str = CATALOG_CONN_ID) -> list[list[str]]:
    """One ``maintain`` job's argv per stale sketch (table observations refreshed first), for dynamic task mapping."""
    with _user_errors():
        stale = ImpCatalogHook(conn_id).get_conn().stale_sketches()
    log.info("stale sketches: %s", ", ".join(stale) if stale else "none")
    trigger = trigger_for(context)
    return [MaintainJob(name, Strategy.parse(strategy), batch_size, trigger).argv() for name in stale]


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
        AirflowFailException: A sketch that was submitted has no succeeded run (the report is logged first).
    """
    expected = [sketch_of(argv) for argv in submitted or ()]
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
                                   f"see the maintain_sketch task logs")
    return report


__all__ = ["report_runs", "stale_maintenance_args", "trigger_for", "validate_maintenance", "validate_registration"]

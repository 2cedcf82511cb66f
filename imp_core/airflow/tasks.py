"""What the DAGs' Python tasks call: each function is one call into ``SketchService`` plus argument building.

Errors a user can fix (unknown sketch, bad batch size, unsafe column) become ``AirflowFailException``: the task
fails at once with the one-line message, without retries, before any ``spark-submit`` starts. An unreachable catalog
stays an ordinary error, so the task's retries apply.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from airflow.sdk.exceptions import AirflowFailException

from imp_core.airflow import CATALOG_CONN_ID
from imp_core.errors import CatalogError, ImpError, NotFoundError
from imp_core.jobs import maintain_argv, sketch_of

log = logging.getLogger(__name__)


def trigger_for(context: Mapping[str, Any]) -> str:
    """The trigger recorded with the catalog runs of this DAG run: ``airflow:<dag_id>/<run_id>``."""
    dag_id = context["dag"].dag_id if context.get("dag") is not None else context["dag_run"].dag_id
    return f"airflow:{dag_id}/{context['run_id']}"


def maintain_args(sketch: str, strategy: str | None, batch_size: int | None, trigger: str) -> list[str]:
    """``application_args`` of a ``maintain`` job (:func:`imp_core.jobs.maintain_argv`)."""
    return maintain_argv(sketch, strategy, batch_size, trigger)


@contextmanager
def _user_errors() -> Iterator[None]:
    try:
        yield
    except NotFoundError as e:
        raise AirflowFailException(_line(e)) from e
    except CatalogError:
        raise
    except ImpError as e:
        raise AirflowFailException(_line(e)) from e


def _line(e: BaseException) -> str:
    from imp_core.security.redact import scrub

    lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
    return scrub(lines[0]) if lines else type(e).__name__


def _service(conn_id: str):  # noqa: ANN202
    from imp_core.airflow.hooks import ImpCatalogHook

    return ImpCatalogHook(conn_id).get_conn()


def stale_maintenance_args(context: Mapping[str, Any], strategy: str = "eager", batch_size: int | None = None,
                           conn_id: str = CATALOG_CONN_ID) -> list[list[str]]:
    """One ``maintain`` job per stale sketch (table observations refreshed first), for dynamic task mapping."""
    with _user_errors():
        stale = _service(conn_id).stale_sketches()
    log.info("stale sketches: %s", ", ".join(stale) if stale else "none")
    trigger = trigger_for(context)
    return [maintain_args(name, strategy, batch_size, trigger) for name in stale]


def validate_maintenance(params: Mapping[str, Any], conn_id: str = CATALOG_CONN_ID) -> dict[str, Any]:
    """Check an on-demand request (sketch exists, strategy known, batch size >= 1) before any Spark job."""
    with _user_errors():
        checked = _service(conn_id).check_maintenance_request(params.get("sketch") or "", params.get("strategy"),
                                                              params.get("batch_size"))
    log.info("maintenance request is valid: %s", checked)
    return checked


def validate_registration(params: Mapping[str, Any], conn_id: str = CATALOG_CONN_ID) -> dict[str, Any]:
    """Safety check of a sketch registration (no Spark, nothing written) before the capture job."""
    with _user_errors():
        report = _service(conn_id).check_registration(params.get("name") or "", params.get("sql") or "",
                                                      [params.get("on") or ""], fragments=params.get("fragments"))
    log.info("sketch %s is safe to register: %s", report["name"], report["safety"])
    return report


def report_runs(context: Mapping[str, Any], submitted: Sequence[Sequence[str]] | None,
                conn_id: str = CATALOG_CONN_ID) -> dict[str, Any]:
    """Versions made and change rows consumed by this DAG run's jobs, read back from the catalog.

    Raises:
        AirflowFailException: A sketch that was submitted has no succeeded run (the report is logged first).
    """
    expected = [sketch_of(a) for a in submitted or ()]
    with _user_errors():
        report = _service(conn_id).run_report(trigger_for(context), expected)
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


__all__ = [
    "maintain_args",
    "report_runs",
    "sketch_of",
    "stale_maintenance_args",
    "trigger_for",
    "validate_maintenance",
    "validate_registration",
]

"""Nightly batched eager maintenance of every stale sketch, one spark-submit job per sketch.

Wiring only: ``imp_core.airflow.tasks`` lists the stale sketches and reads the report back from the catalog;
``imp_core/jobs/submit.py maintain`` does the work under spark-submit.

Environment: ``IMP_NIGHTLY_CRON`` (default ``0 2 * * *``), ``IMP_NIGHTLY_BATCH_SIZE`` (default 1000 change rows per
committed version), ``IMP_MAINTENANCE_CONCURRENCY`` (jobs at once, default 2). Connections: ``spark_default``
(the Spark master) and optionally ``imp_catalog`` (else ``IMP_CATALOG_URL`` or the embedded catalog).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import Param, dag, task

from imp_core.airflow import CHECK_TIMEOUT, JOB_TIMEOUT, tasks
from imp_core.airflow.operators import ImpSparkSubmitOperator
from imp_core.jobs import sketch_of
from imp_core.maintenance.strategy import Strategy


@dag(
    dag_id="imp_nightly_maintenance",
    schedule=os.environ.get("IMP_NIGHTLY_CRON", "0 2 * * *"),
    start_date=datetime(2025, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": timedelta(minutes=5)},
    params={
        "batch_size": Param(int(os.environ.get("IMP_NIGHTLY_BATCH_SIZE", "1000")), type="integer", minimum=1,
                            title="Batch size",
                            description="Eager maintenance commits one sketch version per batch of at least this "
                                        "many change rows."),
    },
    tags=["imp"],
    doc_md=__doc__,
    user_defined_macros={"sketch_of": sketch_of},
)
def imp_nightly_maintenance() -> None:
    @task(execution_timeout=CHECK_TIMEOUT)
    def list_stale_sketches(**context: Any) -> list[list[str]]:
        return tasks.stale_maintenance_args(context, Strategy.EAGER, context["params"]["batch_size"])

    submitted = list_stale_sketches()
    maintained = ImpSparkSubmitOperator.partial(
        task_id="maintain_sketch",
        max_active_tis_per_dag=int(os.environ.get("IMP_MAINTENANCE_CONCURRENCY", "2")),
        map_index_template="{{ sketch_of(task.application_args) }}",
        execution_timeout=JOB_TIMEOUT,
    ).expand(application_args=submitted)

    @task(trigger_rule="all_done", retries=0, execution_timeout=CHECK_TIMEOUT)
    def summarize(submitted: list[list[str]] | None, **context: Any) -> dict:
        return tasks.report_runs(context, submitted)

    maintained >> summarize(submitted)


imp_nightly_maintenance()

"""Nightly batched eager maintenance of every stale sketch, one job per group of sketches.

Wiring only: ``imp_core.airflow.tasks`` groups the stale sketches by the tables they read and reads the report back
from the catalog; ``imp_core/jobs/submit.py maintain-group`` maintains a group in one Spark application, each table's
change feed read once for all of its sketches.

Environment: ``IMP_NIGHTLY_CRON`` (default ``0 2 * * *``), ``IMP_NIGHTLY_BATCH_SIZE`` (default 1000 change rows per
committed version), ``IMP_MAINTENANCE_GROUP_SIZE`` (sketches per job, default 25; 1: one job per sketch),
``IMP_MAINTENANCE_CONCURRENCY`` (jobs at once, default 2), ``IMP_MAINTENANCE_RUNNER`` (``spark-submit``, default,
or ``connect``: jobs on a running Spark Connect server), ``IMP_LAYOUT`` (``on``, default, or ``off``),
``IMP_LAYOUT_THRESHOLD`` (default 0.5) and ``IMP_LAYOUT_SKIP`` (tables to leave alone) for the layout task that runs
first: tables whose sketched scans read mostly rows outside their sketches are re-clustered by the sketched columns
(``imp table layout``; a table switched off with ``imp table layout TABLE --off`` is left alone).
After maintenance, ``IMP_REPARTITION`` (``on``, default, or ``off``) and ``IMP_REPARTITION_FACTOR`` (default 4) for
range split and merge: sketches whose ranges hold more than FACTOR x the mean rows (or far fewer) get new ranges in
place (``imp sketch repartition``). Connections: ``spark_default`` (the Spark master) or
``spark_connect_default`` (the Connect server), and optionally ``imp_catalog`` (else ``IMP_CATALOG_URL`` or the
embedded catalog). See docs/AIRFLOW.md.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import Param, dag, task

from imp_core.airflow import CHECK_TIMEOUT, JOB_TIMEOUT, group_size, tasks
from imp_core.airflow.operators import job_operator
from imp_core.jobs import group_label, sketches_of
from imp_core.maintenance.strategy import Strategy


@dag(
    dag_id="imp_nightly_maintenance",
    schedule=os.environ.get("IMP_NIGHTLY_CRON", "0 2 * * *"),
    start_date=datetime(2025, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": timedelta(minutes=5)},
    user_defined_macros={"group_label": group_label, "sketches_of": sketches_of},
    params={
        "batch_size": Param(int(os.environ.get("IMP_NIGHTLY_BATCH_SIZE", "1000")), type="integer", minimum=1,
                            title="Batch size",
                            description="Eager maintenance commits one sketch version per batch of at least this "
                                        "many change rows."),
        "group_size": Param(group_size(), type="integer", minimum=1, title="Group size",
                            description="Most sketches one job (one Spark application) maintains; sketches reading "
                                        "the same tables share a job and their change feeds. 1: a job per sketch."),
    },
    tags=["imp"],
    doc_md=__doc__,
)
def imp_nightly_maintenance() -> None:
    @task(execution_timeout=CHECK_TIMEOUT, trigger_rule="all_done")  # maintenance runs even if the layout failed
    def list_stale_groups(**context: Any) -> list[list[str]]:
        params = context["params"]
        return tasks.stale_group_args(context, params["group_size"], Strategy.EAGER, params["batch_size"])

    @task(retries=0, execution_timeout=JOB_TIMEOUT)
    def relayout_tables() -> list[dict]:
        return tasks.relayout()

    @task(trigger_rule="one_failed", retries=0, execution_timeout=CHECK_TIMEOUT)
    def check_layout() -> None:  # fails the run when the layout pass failed (skipped, and harmless, when it did not)
        tasks.layout_failed()

    submitted = list_stale_groups()
    relayouted = relayout_tables()
    relayouted >> submitted
    relayouted >> check_layout()
    maintained = job_operator().partial(
        task_id="maintain_group",
        max_active_tis_per_dag=int(os.environ.get("IMP_MAINTENANCE_CONCURRENCY", "2")),
        map_index_template="{{ group_label(sketches_of(task.application_args)) }}",
        execution_timeout=JOB_TIMEOUT,
    ).expand(application_args=submitted)

    @task(trigger_rule="all_done", retries=0, execution_timeout=CHECK_TIMEOUT)
    def summarize(submitted: list[list[str]] | None, **context: Any) -> dict:
        return tasks.report_runs(context, submitted)

    maintained >> summarize(submitted)

    @task(trigger_rule="all_done", retries=0, execution_timeout=CHECK_TIMEOUT)
    def list_skewed_sketches(**context: Any) -> list[str]:
        return tasks.repartition_args(context)

    skewed = list_skewed_sketches()
    maintained >> skewed
    job_operator()(task_id="repartition_sketches", application_args=skewed, execution_timeout=JOB_TIMEOUT)


imp_nightly_maintenance()

"""Maintenance on commit: a new Delta version of a registered table starts the maintenance of the sketches that read it.

Every registered table is an asset (its location: ``file:///...`` or ``s3://...``) watched by a
``DeltaCommitTrigger`` in the triggerer, which fires one asset event per new version; this DAG is scheduled on
those assets (any of them). A run maintains the stale sketches that read the changed tables as eager
``maintain-group`` jobs, grouped as the nightly DAG groups them. One run at a time: events that arrive while a run is
active are consumed together by the next run, so a burst of commits makes one or two runs. Each maintenance task
declares the sketch assets (``imp://<catalog>/<sketch>``) as outlets and gives the ones it committed an asset event
(extra: version, table versions, method), so other DAGs can ``schedule=`` on a sketch being refreshed.

Wiring only: the assets come from the catalog each time the DAG processor parses this file (a table registered
or dropped from the catalog joins or leaves the schedule then); ``imp_core.airflow.tasks.on_commit_group_args``
plans the jobs. Settings: ``IMP_ON_COMMIT`` (``on``, default; ``off``: no watchers, nothing polls),
``IMP_WATCH_INTERVAL`` (seconds between two reads of a table's log, default 5), ``IMP_ON_COMMIT_BATCH_SIZE``
(change rows per committed version, default 1000), ``IMP_MAINTENANCE_GROUP_SIZE``, ``IMP_MAINTENANCE_RUNNER``,
``IMP_CATALOG_NAME``. Pausing the DAG stops the watchers too. See docs/AIRFLOW.md, "Maintenance on commit".
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import AssetAny, AssetWatcher, dag, get_parsing_context, task

from imp_core.airflow import CHECK_TIMEOUT, JOB_TIMEOUT, assets, group_size, tasks
from imp_core.airflow.hooks import ImpCatalogHook
from imp_core.airflow.operators import job_operator
from imp_core.airflow.triggers import DeltaCommitTrigger
from imp_core.config import WatchSettings
from imp_core.jobs import group_label, sketches_of

settings = WatchSettings.from_env()
if get_parsing_context().dag_id is None:  # the DAG processor: the catalog's tables and sketches are the assets
    service = ImpCatalogHook().get_conn()
    try:
        found = assets.watched(service)
    finally:
        service.close()
else:  # a worker parsing the file to run one task: the tasks read the catalog themselves
    found = assets.Watched()

tables = [assets.table_asset(uri, names, [AssetWatcher(name="imp-delta-commits", trigger=DeltaCommitTrigger(
    uri, names, settings.poll_seconds))] if settings.enabled else []) for uri, names in sorted(found.tables.items())]
sketches = [assets.sketch_asset(name, settings.catalog_name) for name in sorted(found.sketches)]


@dag(
    dag_id="imp_maintain_on_commit",
    schedule=AssetAny(*tables) if tables else None,
    start_date=datetime(2025, 1, 1),
    catchup=False,
    max_active_runs=1,  # events arriving during a run wait for it and are consumed together by the next run
    # a retry holds up the next commits' run (one run at a time): retry soon; the next commit's run tries again anyway
    default_args={"retries": 1, "retry_delay": timedelta(seconds=30)},
    user_defined_macros={"group_label": group_label, "sketches_of": sketches_of},
    tags=["imp"],
    doc_md=__doc__,
)
def imp_maintain_on_commit() -> None:
    @task(execution_timeout=CHECK_TIMEOUT)
    def list_changed_groups(**context: Any) -> list[list[str]]:
        return tasks.on_commit_group_args(context, group_size(), settings.batch_size)

    job_operator().partial(
        task_id="maintain_group",
        outlets=sketches,
        map_index_template="{{ group_label(sketches_of(task.application_args)) }}",
        execution_timeout=JOB_TIMEOUT,
    ).expand(application_args=list_changed_groups())


imp_maintain_on_commit()

"""On-demand maintenance of one sketch, several, or every stale sketch of a table, from the Airflow UI's trigger form.

Wiring only: ``validate_request`` checks the parameters against the catalog (an unknown sketch or table, or a bad
batch size fails here, before any Spark job) and builds the job's argv (a table without stale sketches skips the
job); ``maintain_sketch`` runs
``imp_core/jobs/submit.py maintain`` (one sketch) or ``maintain-group`` (several, in one Spark application) with the
runner ``IMP_MAINTENANCE_RUNNER`` selects (``spark-submit`` or ``connect``). See docs/AIRFLOW.md.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from airflow.sdk import Param, dag, task

from imp_core.airflow import CHECK_TIMEOUT, JOB_TIMEOUT, tasks
from imp_core.airflow.operators import job_operator
from imp_core.inputs import SKETCH_NAME
from imp_core.maintenance.strategy import Strategy

_NAME = SKETCH_NAME.pattern[:-2]  # one sketch name, without its end anchor


@dag(
    dag_id="imp_maintain_on_demand",
    schedule=None,
    start_date=datetime(2025, 1, 1),
    catchup=False,
    render_template_as_native_obj=True,
    params={
        "sketch": Param("", type=["null", "string"], maxLength=10_000, pattern=f"^({_NAME}([,\\s]+{_NAME})*)?\\s*$",
                        title="Sketch(es)",
                        description="Name of the sketch to maintain, or several separated by commas (one job maintains "
                                    "them together); leave empty to give a table instead. See Browse > Sketch "
                                    "catalog."),
        "table": Param("", type=["null", "string"], maxLength=128, title="Table",
                       description="Instead of sketches: maintain every stale sketch that reads this registered "
                                   "table."),
        "strategy": Param(Strategy.LAZY.value, type="string", enum=Strategy.choices(), title="Strategy",
                          description="lazy: one step to the current table versions; eager: one version per batch "
                                      "of change rows; recapture: full recomputation on Spark."),
        "batch_size": Param(1000, type="integer", minimum=1, title="Batch size",
                            description="Eager only: change rows per committed sketch version (at least 1)."),
    },
    tags=["imp"],
    doc_md=__doc__,
)
def imp_maintain_on_demand() -> None:
    @task(retries=0, execution_timeout=CHECK_TIMEOUT)
    def validate_request(**context: Any) -> list[str]:
        return tasks.on_demand_args(context)

    maintain = job_operator()(
        task_id="maintain_sketch",
        application_args="{{ ti.xcom_pull(task_ids='validate_request') }}",  # the argv, rendered as a native list
        execution_timeout=JOB_TIMEOUT,
    )
    validate_request() >> maintain


imp_maintain_on_demand()

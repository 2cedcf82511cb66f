"""On-demand maintenance of one sketch, triggered from the Airflow UI's trigger form.

Wiring only: ``validate_request`` checks the parameters against the catalog (an unknown sketch or a bad batch size
fails here, before any Spark job); ``maintain_sketch`` runs ``imp_core/jobs/submit.py maintain`` under spark-submit.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from airflow.sdk import Param, dag, task

from imp_core.airflow import CHECK_TIMEOUT, tasks
from imp_core.airflow.operators import ImpSparkSubmitOperator
from imp_core.inputs import SKETCH_NAME
from imp_core.jobs import AIRFLOW_TRIGGER, MaintainJob
from imp_core.maintenance.strategy import Strategy


@dag(
    dag_id="imp_maintain_on_demand",
    schedule=None,
    start_date=datetime(2025, 1, 1),
    catchup=False,
    params={
        "sketch": Param("", type="string", minLength=1, maxLength=128, pattern=f"^{SKETCH_NAME.pattern[:-2]}$",
                        title="Sketch",
                        description="Name of the sketch to maintain (see Browse > Sketch catalog)."),
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
    def validate_request(**context: Any) -> dict:
        return tasks.validate_maintenance(context["params"])

    maintain = ImpSparkSubmitOperator(
        task_id="maintain_sketch",
        application_args=MaintainJob("{{ params.sketch }}", "{{ params.strategy }}", "{{ params.batch_size }}",
                                     AIRFLOW_TRIGGER).argv(),
    )
    validate_request() >> maintain


imp_maintain_on_demand()

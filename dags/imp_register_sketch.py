"""Register a sketch on demand: the safety check in a task, then the capture under spark-submit.

Wiring only: ``check_safety`` parses the SQL against the registered tables and checks the partition column (no
Spark); ``capture_sketch`` runs ``imp_core/jobs/submit.py register``, which checks again and captures version 1.
Tables must be registered first (``imp table register NAME PATH``).
"""

from __future__ import annotations

import os
from datetime import datetime
from typing import Any

from airflow.sdk import Param, dag, task

from imp_core.airflow import CHECK_TIMEOUT, tasks
from imp_core.airflow.operators import ImpSparkSubmitOperator
from imp_core.inputs import SKETCH_NAME
from imp_core.jobs import AIRFLOW_TRIGGER, RegisterJob
from imp_core.maintenance.strategy import Strategy


@dag(
    dag_id="imp_register_sketch",
    schedule=None,
    start_date=datetime(2025, 1, 1),
    catchup=False,
    params={
        "name": Param("", type="string", minLength=1, maxLength=128, pattern=f"^{SKETCH_NAME.pattern[:-2]}$",
                      title="Sketch name",
                      description="ASCII letters, digits, '-' and '_', not starting with '-'."),
        "sql": Param("", type="string", minLength=1, title="SQL", format="multiline",
                     description="The SELECT query the sketch is for, over registered tables."),
        "on": Param("auto", type="string", pattern="^(auto|[A-Za-z_][A-Za-z0-9_]*\\.[A-Za-z_][A-Za-z0-9_]*)$",
                    title="Partition column",
                    description="TABLE.COLUMN whose range partition the sketch records, or auto: the safe column "
                                "sketch advice ranks first (it keeps the fewest rows; a few candidates are captured "
                                "to compare)."),
        "fragments": Param(100, type="integer", minimum=1, maximum=int(os.environ.get("IMP_MAX_FRAGMENTS") or 10_000),
                           title="Fragments",
                           description="Number of equi-depth fragments of the partition column."),
        "strategy": Param(Strategy.LAZY.value, type="string", enum=Strategy.choices(default_only=True),
                          title="Default strategy",
                          description="How the sketch is maintained by default."),
    },
    tags=["imp"],
    doc_md=__doc__,
)
def imp_register_sketch() -> None:
    @task(retries=0, execution_timeout=CHECK_TIMEOUT)
    def check_safety(**context: Any) -> dict:
        return tasks.validate_registration(context["params"])

    capture = ImpSparkSubmitOperator(
        task_id="capture_sketch",
        application_args=RegisterJob("{{ params.name }}", "{{ params.sql }}", ("{{ params.on }}",),
                                     fragments="{{ params.fragments }}", strategy="{{ params.strategy }}",
                                     trigger=AIRFLOW_TRIGGER).argv(),
    )
    check_safety() >> capture


imp_register_sketch()

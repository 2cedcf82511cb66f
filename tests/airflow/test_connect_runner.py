"""The Spark Connect runner: the maintenance job as a plain Python process on a running Connect server."""

from __future__ import annotations

import json
import os
from urllib.parse import urlparse

import pytest

from imp_core.airflow.operators import ImpConnectJobOperator
from imp_core.jobs import MaintainGroupJob
from tests.airflow.conftest import APPLE_ROW, COUNT_SQL, Imp

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.postgres, pytest.mark.slow]


def test_a_group_job_on_spark_connect_commits_and_reports_its_sketches(imp: Imp, spark_connect: str,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    address = urlparse(spark_connect)
    token = spark_connect.rsplit("token=", 1)[1]
    connection = {"conn_type": "spark_connect", "host": address.hostname, "port": address.port, "password": token}
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CONNECT_DEFAULT", json.dumps(connection))
    for key, value in imp.env.items():
        if key.startswith("IMP_"):
            monkeypatch.setenv(key, value)
    imp.table("sc_sales")
    imp.sketch("sc_top", "sc_sales")
    imp.sketch("sc_count", "sc_sales", sql=COUNT_SQL)
    imp.append("sc_sales", APPLE_ROW)
    job = MaintainGroupJob(("sc_top", "sc_count"), "recapture", None, "test:connect-runner")  # Spark's work
    operator = ImpConnectJobOperator(task_id="maintain_group", application_args=job.argv())
    lines: list[str] = []
    monkeypatch.setattr(operator.log, "info", lambda msg, *args: lines.append(msg % args if args else msg))

    report = operator.execute({})

    assert report == {"trigger": "test:connect-runner", "sketches": {"sc_top": "succeeded", "sc_count": "succeeded"},
                      "runs": report["runs"]}
    assert [r["status"] for r in report["runs"]] == ["succeeded", "succeeded"]
    text = "\n".join(lines)
    assert '"spark_started": true' in text and "imp job on Spark Connect sc://localhost:" in text
    assert token not in text and os.environ.get("IMP_SPARK_REMOTE") is None
    for name in ("sc_top", "sc_count"):
        imp.assert_equals_recapture(name)

"""The spark-submit job entry points (imp_core/jobs/submit.py), run by a real ``spark-submit --master local[2]``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from imp_core.errors import NotFoundError
from imp_core.jobs import COMMANDS, SUBMIT_PATH
from imp_core.spark import connector
from tests.airflow.conftest import APPLE_ROW, APPLE_ROW_2, BIN, BOUNDS, TOP_SQL, UNSAFE_SQL, Imp

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.postgres, pytest.mark.slow]


def spark_submit(imp: Imp, *args: str, master: str = "local[2]") -> subprocess.CompletedProcess[str]:
    """Run the job like the DAGs do. Spark's Python runner merges the driver's stderr into stdout, so the job's log
    lines and its error line arrive on stdout next to the JSON summary; Spark's own log goes to stderr."""
    cmd = [str(BIN / "spark-submit"), "--master", master, "--conf", "spark.ui.enabled=false", *connector.submit_args(),
           SUBMIT_PATH, *args]
    return subprocess.run(cmd, env=imp.env, text=True, capture_output=True, timeout=300, check=False)


def run_python(imp: Imp, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, SUBMIT_PATH, *args], env=imp.env, text=True, capture_output=True,
                          timeout=120, check=False)


def output(done: subprocess.CompletedProcess[str]) -> str:
    return done.stdout + done.stderr


def summary(done: subprocess.CompletedProcess[str]) -> dict:
    """The job's JSON summary: the one stdout line that is a JSON object with a ``job`` key."""
    lines = [json.loads(ln) for ln in done.stdout.splitlines() if ln.startswith("{")]
    found = [obj for obj in lines if "job" in obj]
    assert len(found) == 1, f"stdout:\n{done.stdout}\nstderr:\n{output(done)[-3000:]}"
    return found[0]


def test_submit_path_is_the_job_file() -> None:
    assert SUBMIT_PATH.endswith("imp_core/jobs/submit.py")
    assert set(COMMANDS) == {"maintain", "maintain-group", "maintain-all", "recapture", "register", "repartition"}


def test_register_then_maintain_in_eager_batches(imp: Imp) -> None:
    imp.table("jobs_sales")
    sql = TOP_SQL.format(t="jobs_sales")
    # (--fragments N, equi-depth bounds computed on Spark, is what the imp_register_sketch DAG test submits)
    done = spark_submit(imp, "register", "--name", "jobs_top", "--sql", sql, "--on", "jobs_sales.price",
                        "--bounds", BOUNDS, "--trigger", "airflow:test_jobs/register")
    assert done.returncode == 0, output(done)[-3000:]
    out = summary(done)
    assert out["job"] == "register" and out["status"] == "succeeded" and out["latest_version"] == 1
    assert out["safety"]["safe"] is True
    assert "registering sketch jobs_top on jobs_sales.price" in done.stdout  # the job logs what it does
    assert out["fragments"] == {"jobs_sales": [0, 1]}  # HP's rows (500 and 1000)
    [run] = imp.runs("jobs_top")
    assert run.trigger == "airflow:test_jobs/register" and run.status == "succeeded"

    # two new table versions, batch size 1: eager maintenance commits one version per batch
    imp.append("jobs_sales", APPLE_ROW)
    imp.append("jobs_sales", APPLE_ROW_2)
    done = spark_submit(imp, "maintain", "--sketch", "jobs_top", "--strategy", "eager", "--batch-size", "1",
                        "--trigger", "airflow:test_jobs/maintain")
    assert done.returncode == 0, output(done)[-3000:]
    out = summary(done)
    assert out["versions"] == [2, 3] and out["delta_rows"] == 2 and out["table_versions"] == {"jobs_sales": 2}
    latest = imp.latest("jobs_top")
    assert latest.version == 3 and latest.method == "incremental" and latest.fragments == out["fragments"]
    assert latest.fragments == {"jobs_sales": [0, 1, 2, 3]}  # Apple passed 5000
    assert imp.runs("jobs_top")[0].trigger == "airflow:test_jobs/maintain"
    imp.assert_equals_recapture("jobs_top")


def test_maintain_all(imp: Imp) -> None:
    imp.table("jobs_all")
    imp.sketch("jobs_all_top", "jobs_all")
    before = imp.latest("jobs_all_top")
    imp.append("jobs_all", APPLE_ROW)

    done = spark_submit(imp, "maintain-all", "--batch-size", "10", "--trigger", "airflow:test_jobs/all")
    assert done.returncode == 0, output(done)[-3000:]
    out = summary(done)
    maintained = {s["sketch"]: s for s in out["sketches"]}
    assert "jobs_all_top" in maintained and maintained["jobs_all_top"]["versions"] == [before.version + 1]
    assert out["versions_made"] >= 1 and out["delta_rows"] >= 1
    assert imp.latest("jobs_all_top").fragments == {"jobs_all": [0, 1, 2, 3]}  # Apple now qualifies
    assert imp.runs("jobs_all_top")[0].trigger == "airflow:test_jobs/all"

    # the recapture command runs on the standalone cluster in test_cluster.py


def test_failure_is_one_line_and_non_zero(imp: Imp) -> None:
    imp.table("jobs_fail")
    runs_before = len(imp.runs())
    done = spark_submit(imp, "maintain", "--sketch", "no_such_sketch", "--trigger", "airflow:test_jobs/fail")
    assert done.returncode == 7  # NotFoundError
    assert summary_lines(done) == []
    errors = [ln for ln in output(done).splitlines() if ln.startswith("imp-job:")]
    assert len(errors) == 1 and "no sketch named 'no_such_sketch'" in errors[0], output(done)[-2000:]
    assert len(imp.runs()) == runs_before

    # argument and safety errors need no Spark: the same file run by plain Python fails the same way
    done = run_python(imp, "maintain", "--sketch", "x", "--batch-size", "0")
    assert done.returncode == 2 and done.stderr.strip() == "imp-job: error: --batch-size must be at least 1, got 0"
    assert done.stdout == ""

    # a partial group can pass `< 5000`: a sketch on price would be wrong, so the safety check refuses it
    done = run_python(imp, "register", "--name", "jobs_bad", "--sql", UNSAFE_SQL.format(t="jobs_fail"),
                      "--on", "jobs_fail.price", "--bounds", BOUNDS)
    assert done.returncode == 3, output(done)[-2000:]  # UnsafeSketchError is a PlanError
    assert "is not safe for this query" in output(done)
    with pytest.raises(NotFoundError):
        imp.catalog.get_sketch("jobs_bad")


def summary_lines(done: subprocess.CompletedProcess[str]) -> list[str]:
    return [ln for ln in done.stdout.splitlines() if ln.startswith("{")]

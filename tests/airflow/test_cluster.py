"""A real Spark standalone cluster (master + one worker on 127.0.0.1, from the installed PySpark) whose executors
have no Python: ``PYSPARK_PYTHON`` names an interpreter that does not exist, so any Python UDF or Python-side
DataFrame construction would fail the job. The maintenance job submitted to ``spark://127.0.0.1:PORT`` commits the
same sketch as local mode, and every platform step (register, maintain with joins on Spark, recapture, query; empty
tables and empty results) works there."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from imp_core.jobs import SUBMIT_PATH
from imp_core.spark import connector
from tests.airflow.conftest import APPLE_ROW, APPLE_ROW_2, BIN, Imp, free_port, tail

NO_PYTHON = "/nonexistent/python3"  # the executors' Python: nothing of ours may need it
STEPS = str(Path(__file__).with_name("cluster_steps.py"))

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.postgres, pytest.mark.slow]


@dataclass
class Cluster:
    master_url: str
    ui_url: str
    work: Path

    def state(self) -> dict:
        return requests.get(f"{self.ui_url}/json/", timeout=10).json()


@pytest.fixture(scope="module")
def spark_cluster(imp: Imp, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    work = tmp_path_factory.mktemp("spark-cluster")
    port, ui_port, worker_ui_port = free_port(), free_port(), free_port()
    env = {**imp.env, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_LOG_DIR": str(work), "SPARK_WORKER_DIR": str(work),
           "PYSPARK_PYTHON": NO_PYTHON}
    cluster = Cluster(f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{ui_port}", work)
    procs: dict[str, subprocess.Popen] = {}
    logs: dict[str, Path] = {}
    try:
        for name, args in (
            ("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                        "--webui-port", str(ui_port)]),
            ("worker", ["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--webui-port",
                        str(worker_ui_port), "--cores", "2", "--memory", "1g", "--work-dir", str(work / "work"),
                        cluster.master_url]),
        ):
            logs[name] = work / f"{name}.log"
            procs[name] = subprocess.Popen([str(BIN / "spark-class"), *args], env=env, cwd=work,
                                           stdout=open(logs[name], "w"), stderr=subprocess.STDOUT,  # noqa: SIM115
                                           start_new_session=True)
        deadline = time.monotonic() + 120
        while True:
            for name, proc in procs.items():
                assert proc.poll() is None, f"spark {name} exited:\n{tail(logs[name])}"
            try:
                if cluster.state().get("aliveworkers", 0) >= 1:
                    break
            except (requests.ConnectionError, ValueError):
                pass
            assert time.monotonic() < deadline, f"no worker registered:\n{tail(logs['master'])}\n{tail(logs['worker'])}"
            time.sleep(0.5)
        yield cluster
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


def submit(cluster: Cluster, imp: Imp, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """spark-submit in client mode; the driver has Python and imp, the executors get neither."""
    cmd = [str(BIN / "spark-submit"), "--master", cluster.master_url, "--deploy-mode", "client",
           "--conf", "spark.ui.enabled=false", "--conf", "spark.executor.memory=512m", "--conf", "spark.cores.max=2",
           "--conf", f"spark.pyspark.python={NO_PYTHON}", "--conf", f"spark.pyspark.driver.python={sys.executable}",
           *connector.submit_args(), *args]
    job_env = {**imp.env, "PYSPARK_PYTHON": NO_PYTHON, **env}
    done = subprocess.run(cmd, env=job_env, text=True, capture_output=True, timeout=900, check=False)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return done


def test_maintenance_job_on_a_standalone_cluster_commits_the_same_sketch_as_local_mode(
        imp: Imp, spark_cluster: Cluster) -> None:
    # two identical sketches on one table; the same changes; one maintained in local mode, one on the cluster
    imp.table("cl_sales")
    imp.sketch("cl_local", "cl_sales")
    imp.sketch("cl_cluster", "cl_sales")
    imp.append("cl_sales", APPLE_ROW)
    imp.append("cl_sales", APPLE_ROW_2)

    local = imp.service.maintain("cl_local", strategy="eager", batch_size=1, trigger="test-local-mode")
    assert [v.version for v in local.versions] == [2, 3]

    # the cluster job: eager maintenance, then a recapture (full maintenance: the capture runs on the executors)
    jobs = (["maintain", "--sketch", "cl_cluster", "--strategy", "eager", "--batch-size", "1"],
            ["recapture", "--sketch", "cl_cluster"])
    outputs = []
    for args in jobs:
        done = submit(spark_cluster, imp, SUBMIT_PATH, *args, "--trigger", "airflow:test_cluster/run")
        [line] = [ln for ln in done.stdout.splitlines() if ln.startswith('{"job"')]
        outputs.append(json.loads(line))
    assert outputs[0]["versions"] == [2, 3] and outputs[1]["latest_version"] == 4

    state = spark_cluster.state()
    finished = [app for app in state["completedapps"] if app["name"] == "imp"]
    assert finished, f"no imp application ran on the cluster: {state}"
    assert any(app["cores"] >= 1 for app in finished)  # executors were granted on the worker

    # version by version, the cluster committed what local mode committed
    local_versions = {v.version: v for v in imp.catalog.versions(imp.catalog.get_sketch("cl_local").id)}
    cluster_versions = {v.version: v for v in imp.catalog.versions(imp.catalog.get_sketch("cl_cluster").id)}
    for n in (1, 2, 3):
        assert cluster_versions[n].fragments == local_versions[n].fragments
        assert cluster_versions[n].table_versions == local_versions[n].table_versions
    recaptured = cluster_versions[4]
    assert recaptured.method == "recapture"
    assert recaptured.fragments == local_versions[3].fragments == {"cl_sales": [0, 1, 2, 3]}
    assert recaptured.table_versions == local_versions[3].table_versions
    assert [r.trigger for r in imp.runs("cl_cluster")[:2]] == ["airflow:test_cluster/run"] * 2


@pytest.mark.parametrize("outside", [False, True], ids=["state-in-memory", "state-in-delta-tables"])
def test_every_step_runs_on_executors_without_python(imp: Imp, spark_cluster: Cluster,
                                                     tmp_path_factory: pytest.TempPathFactory, outside: bool) -> None:
    """The steps with operator state in the job's memory, and again with every aggregation's state in Delta tables
    maintained by the executors (a memory budget of 0)."""
    data = tmp_path_factory.mktemp("cluster-steps")
    env = {"IMP_OPTIMIZATIONS": "-smallside", **({"IMP_STATE_MEMORY_BUDGET": "0"} if outside else {})}
    done = submit(spark_cluster, imp, STEPS, str(data), *(["ext_"] if outside else []), **env)
    [line] = [ln for ln in done.stdout.splitlines() if ln.startswith("CLUSTER-STEPS ")]
    out = json.loads(line.split(" ", 1)[1])
    assert out["master"] == spark_cluster.master_url
    # capture, eager maintenance (joins on Spark) and recapture agree
    assert out["captured"]["cs_empty"] == {"cs_e": []}  # an empty table: nothing to depend on
    assert out["maintained"]["versions"] == [2, 3] and set(out["maintained"]["methods"]) == {"incremental"}
    assert out["recaptured"]["cs_join"] == out["maintained"]["fragments"]
    assert out["recaptured"]["cs_empty"] == out["maintained"]["empty_table"] == {"cs_e": [1]}  # g = 11 twice
    # queries: the sketch is used and Spark's answer is the same without it, also when it is empty
    queries = out["queries"]
    assert queries["join"]["with"] == queries["join"]["without"] == [[1, 7], [3, 15]]
    assert queries["empty_result"]["with"] == queries["empty_result"]["without"] == []
    assert queries["empty_result"]["sketch"] == "cs_join"
    assert queries["empty_table"]["with"] == queries["empty_table"]["without"] == [[11, 2]]
    where = {s["operator"]: s["where"] for s in out["state"]["cs_join"]}
    assert {w for op, w in where.items() if op.startswith("aggregation@")} == {"external" if outside else "memory"}
    # the executors ran tasks and never tried to start Python
    finished = [app for app in spark_cluster.state()["completedapps"] if app["name"] == "imp"]
    assert finished and all(app["cores"] >= 1 for app in finished)
    logs = "".join(p.read_text(errors="replace") for p in (spark_cluster.work / "work").rglob("stderr"))
    assert NO_PYTHON not in logs


def test_cluster_deploy_mode_is_refused_in_one_line() -> None:
    from airflow.sdk.exceptions import AirflowFailException

    from imp_core.airflow.operators import CLUSTER_MODE_REFUSED, ImpSparkSubmitOperator
    from imp_core.errors import ConfigError
    from imp_core.spark.session import require_client_mode

    op = ImpSparkSubmitOperator(task_id="t", application_args=["maintain", "--sketch", "x"], deploy_mode="cluster")
    with pytest.raises(AirflowFailException, match="client deploy mode") as info:
        op._get_hook()
    assert str(info.value) == CLUSTER_MODE_REFUSED and "\n" not in CLUSTER_MODE_REFUSED
    with pytest.raises(ConfigError, match="--deploy-mode client"):
        require_client_mode(lambda key, default: "cluster")


def test_jobs_get_the_configured_driver_heap(monkeypatch: pytest.MonkeyPatch) -> None:
    """spark-submit's driver JVM takes its heap only from ``--driver-memory`` (Spark's own default is 1g)."""
    from imp_core.airflow.operators import ImpSparkSubmitOperator
    from imp_core.jobs import SUBMIT_PATH
    from imp_core.spark.session import DEFAULT_DRIVER_MEMORY

    def command(**kwargs: str) -> list[str]:
        op = ImpSparkSubmitOperator(task_id="t", application_args=["maintain", "--sketch", "x"], **kwargs)
        op.launch_settings()
        return op._get_hook()._build_spark_submit_command(SUBMIT_PATH)

    def heap(cmd: list[str]) -> str:
        return cmd[cmd.index("--driver-memory") + 1]

    monkeypatch.delenv("IMP_SPARK_DRIVER_MEMORY", raising=False)
    assert heap(command()) == DEFAULT_DRIVER_MEMORY
    monkeypatch.setenv("IMP_SPARK_DRIVER_MEMORY", "3g")
    assert heap(command()) == "3g"
    assert heap(command(driver_memory="2g")) == "2g"

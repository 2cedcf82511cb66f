"""imp's Spark extension on a real Spark standalone cluster (a master and one worker on 127.0.0.1, from pyspark's
own jars) whose executors have no Python: ``PYSPARK_PYTHON`` names an interpreter that does not exist, so anything
needing Python on an executor fails (the client checks that it does). A PySpark driver started with only the
printed settings runs the sketched query and a BI tool's wrapping of it: fewer files read than with the rule off,
Spark's rows; the rule runs in the driver's JVM and the executors only scan the files it kept."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from imp_core.maintenance.service import SketchService
from imp_core.spark import connector
from tests.spark.clients import SQL, free_port, no_pythonpath, sketched_table, start, stop, wait_for

pytestmark = [pytest.mark.spark, pytest.mark.postgres, pytest.mark.slow]

CLIENT = Path(__file__).with_name("extension_client.py")
SPARK_CLASS = Path(sys.executable).with_name("spark-class")
NO_PYTHON = "/nonexistent/python3"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The master's ``spark://127.0.0.1:PORT`` once a worker (2 cores, 1 GB) has registered."""
    work = tmp_path_factory.mktemp("standalone")
    port, ui_port, worker_ui = free_port(), free_port(), free_port()
    env = {
        **no_pythonpath(),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": str(work),
        "SPARK_WORKER_DIR": str(work / "work"),
        "PYSPARK_PYTHON": NO_PYTHON,
    }
    url = f"spark://127.0.0.1:{port}"
    log = work / "cluster.log"
    procs = [
        start(
            [
                str(SPARK_CLASS),
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--webui-port",
                str(ui_port),
            ],
            log,
            env,
            work,
        )
    ]
    try:
        procs.append(
            start(
                [
                    str(SPARK_CLASS),
                    "org.apache.spark.deploy.worker.Worker",
                    "--host",
                    "127.0.0.1",
                    "--webui-port",
                    str(worker_ui),
                    "--cores",
                    "2",
                    "--memory",
                    "1g",
                    "--work-dir",
                    str(work / "work"),
                    url,
                ],
                log,
                env,
                work,
            )
        )

        def worker_alive() -> bool:
            try:
                state = requests.get(f"http://127.0.0.1:{ui_port}/json/", timeout=10).json()
            except (requests.RequestException, ValueError):
                return False
            return int(state.get("aliveworkers", 0)) >= 1

        wait_for(worker_alive, procs, log, "the standalone cluster")
        yield url
    finally:
        for proc in reversed(procs):
            stop(proc)


def run_driver(master: str, queries: list[dict[str, Any]], tmp: Path) -> list[dict[str, Any]]:
    """The queries through ``spark.sql`` of a PySpark driver on the cluster (client mode) with the printed
    settings; the executors' Python is ``NO_PYTHON``."""
    conf = {
        **connector.session_conf(),
        "spark.executor.memory": "512m",
        "spark.cores.max": "2",
        "spark.pyspark.python": NO_PYTHON,
        "spark.pyspark.driver.python": sys.executable,
    }
    spec = tmp / "spec.json"
    spec.write_text(json.dumps({"master": master, "conf": conf, "queries": queries, "probe_python": True}))
    done = subprocess.run(
        [sys.executable, str(CLIENT), str(spec)],
        capture_output=True,
        text=True,
        timeout=900,
        env={**no_pythonpath(), "PYSPARK_PYTHON": NO_PYTHON},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


def test_a_cluster_without_python_on_its_executors_gets_the_sketch(
    service: SketchService, cluster: str, tmp_path: Path
) -> None:
    table = sketched_table(service, tmp_path, "sc_sales", "sc_top")
    query = SQL.format(t=f"delta.`{table}`")
    wrapped = f"SELECT * FROM ({query}) t ORDER BY rev DESC LIMIT 1000"
    *out, probe = run_driver(
        cluster,
        [{"sql": query}, {"sql": query, "off": True}, {"sql": wrapped}, {"sql": wrapped, "off": True}],
        tmp_path,
    )
    assert probe == {"python_on_executors": False}, "the executors must have no Python"
    for on, off in (out[0:2], out[2:4]):
        assert on["rows"] == off["rows"] and on["rows"]
        assert on["applied"] == [{"sketch": "sc_top", "version": 1}] and off["applied"] == []
        assert on["files"] < off["files"] == 10

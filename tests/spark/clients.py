"""Shared pieces of the real-client tests of imp's Spark extension (Thrift server, Spark Connect, a standalone
cluster, manifests on S3): a small clustered table with a published sketch, free ports, long-running JVMs started and
stopped by their process group, and the files a query read as Spark's own UI reports them."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import requests

from imp_core.maintenance.service import SketchService
from tests.conftest import write_in_files

SQL = "SELECT brand, SUM(price * numSold) AS rev FROM {t} GROUP BY brand HAVING SUM(price * numSold) > 300000"
ROWS = 2000
FILES = 10
SUBMIT = Path(sys.executable).with_name("spark-submit")


def pyspark_jars() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def sketched_table(service: SketchService, lake: Path, table: str, sketch: str) -> Path:
    """A ``FILES``-file Delta table clustered on price, registered, with the sketch ``sketch`` of ``SQL`` on it
    (published where the service's settings say: beside the table by default)."""
    path = lake / table
    data = pa.table(
        {
            "price": pa.array([i // 2 for i in range(ROWS)], pa.int32()),
            "brand": pa.array([i // 200 for i in range(ROWS)], pa.int32()),
            "numSold": pa.array([1 + i % 3 for i in range(ROWS)], pa.int32()),
        }
    )
    write_in_files(path, data, FILES)
    service.register_table(table, str(path))
    service.create_sketch(
        sketch, SQL.format(t=table), [f"{table}.price"], bounds=[",".join(str(b) for b in range(0, 1001, 100))]
    )
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"({path} is missing)"


def start(argv: list[str], log: Path, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.Popen:
    """A long-running process in its own process group (so :func:`stop` ends it and its children), output to
    ``log``."""
    with open(log, "ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True)


def wait_for(
    ready: Callable[[], bool], procs: list[subprocess.Popen], log: Path, what: str, timeout: float = 180.0
) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        for proc in procs:
            assert proc.poll() is None, f"{what} exited with {proc.returncode}:\n{tail(log)}"
        assert time.monotonic() < deadline, f"{what} not ready within {timeout:.0f} s:\n{tail(log)}"
        time.sleep(0.5)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def no_pythonpath() -> dict[str, str]:
    """This environment without PYTHONPATH: a client of the extension imports no imp code."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


class SqlUi:
    """The SQL executions of one Spark application as its UI's REST API reports them (``/api/v1/.../sql``): the
    physical plan of each and the files its file scans read (the scans' "number of files read" metric)."""

    def __init__(self, ui_url: str) -> None:
        self.ui_url = ui_url
        apps = requests.get(f"{ui_url}/api/v1/applications", timeout=60).json()
        self.app = apps[0]["id"]

    def executions(self) -> list[dict[str, Any]]:
        url = f"{self.ui_url}/api/v1/applications/{self.app}/sql"
        out: list[dict[str, Any]] = requests.get(
            url, params={"details": "true", "planDescription": "true", "length": "10000"}, timeout=60
        ).json()
        return out

    def last_id(self) -> int:
        return max((e["id"] for e in self.executions()), default=-1)

    def finished_after(self, after: int, timeout: float = 30.0) -> list[dict[str, Any]]:
        """The executions with an id above ``after``, once none of them is running (metrics are final then)."""
        deadline = time.monotonic() + timeout
        while True:
            new = [e for e in self.executions() if e["id"] > after]
            if new and all(e["status"] != "RUNNING" for e in new):
                return sorted(new, key=lambda e: e["id"])
            assert time.monotonic() < deadline, f"executions after {after} did not finish: {new}"
            time.sleep(0.3)


def files_read(execution: dict[str, Any]) -> int:
    """Files read by the file scans of one execution of :meth:`SqlUi.executions`."""
    total = 0
    for node in execution.get("nodes", []):
        for metric in node.get("metrics", []):
            if metric["name"] == "number of files read":
                total += int(str(metric["value"]).replace(",", ""))
    return total


def sketches_in(execution: dict[str, Any]) -> list[str]:
    """The ``imp_sketch(NAME, vN)`` markers in an execution's physical plan (the sketch versions applied)."""
    import re

    return sorted(set(re.findall(r"imp_sketch\([^)]*\)", execution.get("planDescription", ""))))


__all__ = [
    "FILES",
    "ROWS",
    "SQL",
    "SUBMIT",
    "SqlUi",
    "files_read",
    "free_port",
    "listening",
    "no_pythonpath",
    "pyspark_jars",
    "sketched_table",
    "sketches_in",
    "start",
    "stop",
    "tail",
    "wait_for",
]

"""Maintenance over a running Spark Connect server: no JVM in the task's process, the same sketches."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from imp_core.catalog.embedded import stop_embedded
from imp_core.config import Settings

pytestmark = [pytest.mark.spark, pytest.mark.postgres, pytest.mark.slow]

SQL = "SELECT s.w, SUM(r.v) AS sv FROM r JOIN s ON r.k = s.k WHERE r.v > 300 GROUP BY s.w"
CDF = {"delta.enableChangeDataFeed": "true"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, spark_connect: str) -> Iterator[dict[str, str]]:
    home = tmp_path_factory.mktemp("imp-connect")
    e = dict(os.environ, IMP_HOME=str(home), IMP_SPARK_MASTER="local[2]", IMP_SHUFFLE_PARTITIONS="2",
             PYSPARK_PYTHON=sys.executable, IMP_TEST_REMOTE=spark_connect)
    e.pop("IMP_CATALOG_URL", None)
    e.pop("IMP_SPARK_REMOTE", None)
    yield e
    stop_embedded(Settings.from_env(e))


def imp(env: dict[str, str], *args: str, remote: bool = False) -> subprocess.CompletedProcess[str]:
    run_env = dict(env)
    if remote:
        # no Java reachable: a task that started a JVM of its own would fail here
        java_dirs = {str(Path(p).resolve().parent) for p in [shutil.which("java") or ""] if p}
        run_env["PATH"] = os.pathsep.join(d for d in env["PATH"].split(os.pathsep)
                                          if str(Path(d).resolve()) not in java_dirs)
        run_env["JAVA_HOME"] = "/nonexistent"
        run_env["IMP_SPARK_REMOTE"] = env["IMP_TEST_REMOTE"]
    return subprocess.run([sys.executable, "-m", "imp_core.cli.main", *args], env=run_env, capture_output=True,
                          text=True, timeout=600)


def fragments(env: dict[str, str], version: int) -> list:
    out = imp(env, "sketch", "show", "j", "--version", str(version), "--json")
    assert out.returncode == 0, out.stderr
    return [p["fragments"] for p in json.loads(out.stdout)["partitions"]]


@pytest.mark.usefixtures("spark")  # the reference recapture runs on the test session's JVM
def test_capture_and_maintenance_through_spark_connect_match_a_recapture(env: dict[str, str], tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    r, s = str(tmp_path / "r"), str(tmp_path / "s")
    write_deltalake(r, pa.table({"k": list(range(600)), "v": [i % 50 for i in range(600)]}), configuration=CDF)
    write_deltalake(s, pa.table({"k": list(range(0, 600, 3)), "w": [i % 7 for i in range(0, 600, 3)]}),
                    configuration=CDF)
    for name, path in (("r", r), ("s", s)):
        assert imp(env, "table", "register", name, path).returncode == 0
    created = imp(env, "sketch", "create", "j", "--sql", SQL, "--on", "r.k", "--fragments", "12", remote=True)
    assert created.returncode == 0, created.stderr
    write_deltalake(r, pa.table({"k": [3, 6, 9, 2000], "v": [400, 410, 420, 43]}), mode="append")
    write_deltalake(s, pa.table({"k": [2000, 1], "w": [1, 2]}), mode="append")
    maintained = imp(env, "sketch", "maintain", "j", remote=True)
    assert maintained.returncode == 0, maintained.stderr
    assert "committed version(s) [2]" in maintained.stdout
    # the reference: `imp sketch recapture` on a local JVM (the CLI's entry point in this process, on the test
    # session's Spark: not the server's)
    from imp_core.cli.main import main

    for key in ("IMP_HOME", "IMP_SPARK_MASTER", "IMP_SHUFFLE_PARTITIONS"):
        monkeypatch.setenv(key, env[key])
    monkeypatch.delenv("IMP_CATALOG_URL", raising=False)
    monkeypatch.delenv("IMP_SPARK_REMOTE", raising=False)
    assert main(["sketch", "recapture", "j"]) == 0, capsys.readouterr().err
    assert fragments(env, 2) == fragments(env, 3)
    assert fragments(env, 1) == [[]] and fragments(env, 2) == [[0]]  # the new rows of k 3, 6, 9 (fragment 0)


def test_an_unreachable_server_is_a_one_line_error_without_the_token(env: dict[str, str], tmp_path: Path) -> None:
    u = str(tmp_path / "u")
    write_deltalake(u, pa.table({"a": [1, 2, 3]}), configuration=CDF)
    assert imp(env, "table", "register", "u", u).returncode == 0
    before = imp(env, "sketch", "list", "--json").stdout
    server = env["IMP_TEST_REMOTE"].split("/;")[0]
    for url, says in ((f"sc://127.0.0.1:{_free_port()}/;token=s3cr3t-t0ken", "no Spark Connect server answers"),
                      (f"{server}/;token=s3cr3t-t0ken", "the server refused the token")):
        out = imp(dict(env, IMP_TEST_REMOTE=url), "sketch", "create", "k", "--sql", "SELECT a FROM u WHERE a > 1",
                  "--on", "u.a", "--fragments", "2", remote=True)
        assert out.returncode == 2, out.stderr
        errors = [ln for ln in out.stderr.splitlines() if ln.startswith("imp: error:")]
        assert len(errors) == 1 and says in errors[0], out.stderr
        assert "s3cr3t" not in out.stderr + out.stdout
    assert imp(env, "sketch", "list", "--json").stdout == before  # nothing registered

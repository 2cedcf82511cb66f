"""Benchmark "nightly": a night's maintenance of many sketches, one job per sketch vs grouped jobs vs Spark Connect.

``SKETCHES`` sketches of the paper's microbenchmark shapes (group-by/HAVING, a join, top-k, distinct) over ``TABLES``
tables, ``CHANGE_ROWS`` change rows per table since the sketches were last maintained. The night measured is a
night like any other: the sketches were captured and then maintained through one earlier night (so the join
sketches' side caches, built through Spark on the first night after a capture, come from their saved state, as on
every later night); ``IMP_BENCH_NIGHTLY_AFTER_CAPTURE=1`` measures the first night after the capture instead. Every
variant maintains the same backlog: before each, every sketch is put back at that start (a catalog clone of the
version with its operator state). Measured:

- the whole nightly run through ``airflow dags test imp_nightly_maintenance`` (group size 1: one spark-submit per
  sketch, as before grouping; the default group size; the default group size on a Spark Connect server), and
- the jobs alone (the same jobs started one after the other outside Airflow), plus a recapture of every sketch in
  group jobs (``maintain-group --strategy=recapture``), the work a platform without incremental maintenance does.

Every variant must leave every sketch with the same fragments (checked), and the recapture must agree with them.
``IMP_BENCH_NIGHTLY_SKETCHES`` and ``IMP_BENCH_SCALE`` set the size; the paper-scale run is 200 sketches over five
tables of 10M rows.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from benchmarks import data
from benchmarks.harness import Experiment, scaled
from benchmarks.maintenance import spark_session
from benchmarks.strategies import _clone_at_start, _drop_sketch, _job_error, service_for
from imp_core.catalog.embedded import embedded_url, stop_embedded
from imp_core.cli import connect_server
from imp_core.jobs import SUBMIT_PATH, MaintainGroupJob, MaintainJob
from imp_core.maintenance.groups import plan_groups
from imp_core.maintenance.service import SketchService
from imp_core.maintenance.strategy import Strategy
from imp_core.spark import connector
from imp_core.spark.session import driver_memory

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
TABLES = 5
GROUPS = 5000
CHANGE_ROWS = 1000
GROUP_SIZE = 25
SHAPES = {
    "groups": "SELECT a, AVG(b) AS ab FROM {t} GROUP BY a HAVING AVG(c) < 1600",
    "join": "SELECT a, AVG(b) AS ab FROM {t} JOIN {h} ON (a = ttid) WHERE b < 1000 GROUP BY a HAVING AVG(c) < 1600",
    "topk": "SELECT a, b FROM {t} ORDER BY b DESC LIMIT 10",
    "distinct": "SELECT DISTINCT a FROM {t} WHERE b < 1000",
}


class Night:
    """The tables, the captured base sketches and their copies, and an Airflow home to run the DAG in."""

    def __init__(self, service: SketchService, rows: int, tables: int, sketches: int) -> None:
        self.service = service
        self.rows = rows
        self.table_count = tables
        self.tables: dict[str, Path] = {}
        self.bases: dict[str, list[str]] = {}  # captured sketch -> the tables it reads
        self.names = [f"n{i:03d}" for i in range(sketches)]
        self.after_capture = os.environ.get("IMP_BENCH_NIGHTLY_AFTER_CAPTURE") == "1"

    def prepare(self) -> None:
        helper = data.join_helper(f"nh_{GROUPS}", GROUPS * 2, GROUPS, 0.5)
        data.reset(helper)
        self.service.register_table("nh", str(helper), replace=True)
        for i in range(self.table_count):
            name = f"nt{i}"
            path = data.base_table(f"nt{i}_{self.rows}", self.rows, GROUPS)
            data.reset(path)
            self.tables[name] = path
            self.service.register_table(name, str(path), replace=True)
        for name in self.tables:
            for shape, sql in SHAPES.items():
                base = f"base_{shape}_{name}"
                _drop_sketch(self.service, base)
                self.service.create_sketch(base, sql.format(t=name, h="nh"), [f"{name}.a"], fragments=100,
                                           strategy=Strategy.EAGER)
                self.bases[base] = [name, "nh"] if "{h}" in sql else [name]
        if not self.after_capture:  # an earlier night, maintained: the night measured starts from its versions
            for i, path in enumerate(self.tables.values()):
                data.change(path, CHANGE_ROWS, seed=800 + i, groups=GROUPS, next_id=data.max_id(path) + 1)
            for base in self.bases:
                done = self.service.maintain(base, strategy=Strategy.LAZY)
                if [v.version for v in done.versions] != [2]:
                    raise AssertionError(f"nightly: the earlier night left {base} at {done.versions}, not version 2")
        for i, path in enumerate(self.tables.values()):  # the night's changes: one commit per table
            data.change(path, CHANGE_ROWS, seed=900 + i, groups=GROUPS, next_id=data.max_id(path) + 1)

    def base_of(self, sketch: str) -> str:
        return list(self.bases)[self.names.index(sketch) % len(self.bases)]

    def reset_sketches(self) -> None:
        """Every sketch back at the start of the night (same backlog for every variant)."""
        start = 1 if self.after_capture else 2
        for name in self.names:
            _clone_at_start(self.service, self.base_of(name), name, start)

    def groups(self, size: int) -> list[tuple[str, ...]]:
        return plan_groups({n: self.bases[self.base_of(n)] for n in self.names}, size)

    def fragments(self) -> dict[str, object]:
        return {n: self.service.describe(n)["partitions"][0]["fragments"] for n in self.names}


def _airflow_home(service: SketchService, work: Path, **extra: str) -> dict[str, str]:
    home = work / "airflow"
    home.mkdir(parents=True, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("IMP_", "AIRFLOW", "PYSPARK_GATEWAY"))}
    env.update({
        "IMP_HOME": str(service.settings.home), "IMP_SHUFFLE_PARTITIONS": "8", "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable, "PATH": os.pathsep.join([str(BIN), env.get("PATH", "")]),
        "PYTHONWARNINGS": "ignore", "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor", "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(port),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
        "AIRFLOW_CONN_IMP_CATALOG": json.dumps({"conn_type": "postgres",
                                                "extra": {"url": embedded_url(service.settings)}}),
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32), "AIRFLOW__CORE__FERNET_KEY": "",
        # maintenance only: the layout and range split/merge tasks would rewrite tables and ranges between variants
        "IMP_LAYOUT": "off", "IMP_REPARTITION": "off",
    })
    env.update(extra)
    if not (home / "airflow.db").exists():
        done = subprocess.run([str(BIN / "airflow"), "db", "migrate"], env=env, cwd=home, capture_output=True,
                              text=True, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"airflow db migrate failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    return env


def _dags_test(env: dict[str, str], group_size: int) -> None:
    done = subprocess.run([str(BIN / "airflow"), "dags", "test", "imp_nightly_maintenance", "-c",
                           json.dumps({"group_size": group_size})], env=env, cwd=env["AIRFLOW_HOME"],
                          capture_output=True, text=True, timeout=24 * 3600)
    if done.returncode != 0:
        raise RuntimeError(f"the nightly run failed: {_job_error(done.stdout + done.stderr)[-3000:]}")


def _job_env(service: SketchService) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("IMP_", "PYSPARK_GATEWAY"))}
    env.update({"IMP_HOME": str(service.settings.home), "PYSPARK_PYTHON": sys.executable,
                "PYSPARK_DRIVER_PYTHON": sys.executable, "IMP_SHUFFLE_PARTITIONS": "8"})
    return env


def _run_jobs(argvs: list[list[str]], env: dict[str, str], remote: str | None = None) -> None:
    submit = [str(BIN / "spark-submit"), "--master", "local[2]", "--driver-memory", driver_memory(),
              "--conf", "spark.ui.enabled=false",
              "--conf", "spark.sql.shuffle.partitions=8", *connector.submit_args(), SUBMIT_PATH]
    for argv in argvs:
        if remote is None:
            done = subprocess.run([*submit, *argv], env=env, capture_output=True, text=True)
        else:
            done = subprocess.run([sys.executable, SUBMIT_PATH, *argv], env={**env, "IMP_SPARK_REMOTE": remote},
                                  capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"job {argv[:3]} failed: {_job_error(done.stdout + done.stderr)}")


def nightly(service: SketchService, quick: bool, runs: int, work: Path) -> Experiment:
    rows = scaled(200_000 if quick else 10_000_000)
    tables = int(os.environ.get("IMP_BENCH_NIGHTLY_TABLES") or (2 if quick else TABLES))
    count = int(os.environ.get("IMP_BENCH_NIGHTLY_SKETCHES") or (8 if quick else 200))
    night = Night(service, rows, tables, count)
    t0 = time.perf_counter()
    night.prepare()
    setup = time.perf_counter() - t0
    exp = Experiment("nightly", f"A night's maintenance: {count} sketches (group-by/HAVING, join, top-k, distinct) "
                     f"over {tables} tables of {rows:,} rows, {CHANGE_ROWS:,} change rows per table",
                     ratios=[("per-sketch jobs", "grouped jobs"), ("per-sketch jobs", "grouped, Connect"),
                             ("recapture all", "grouped jobs")], y_label="seconds")
    token = secrets.token_hex(16)
    os.environ[connect_server.ENV_TOKEN] = token
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server_settings = service.settings
    t0 = time.perf_counter()
    connect_server.start(server_settings, port=port)
    started = time.perf_counter() - t0
    remote = f"sc://localhost:{port}/;token={token}"
    connection = json.dumps({"conn_type": "spark_connect", "host": "localhost", "port": port, "password": token})
    airflow = _airflow_home(service, work)
    airflow_connect = {**airflow, "IMP_MAINTENANCE_RUNNER": "connect", "AIRFLOW_CONN_SPARK_CONNECT_DEFAULT": connection}
    env = _job_env(service)
    trigger = "bench:nightly"
    per_sketch = [MaintainJob(n, Strategy.EAGER, 1000, trigger).argv() for n in night.names]
    grouped = [MaintainGroupJob(g, Strategy.EAGER, 1000, trigger).argv() for g in night.groups(GROUP_SIZE)]
    recapture = [MaintainGroupJob(g, Strategy.RECAPTURE, None, trigger).argv() for g in night.groups(GROUP_SIZE)]
    answers: dict[str, object] = {}

    def variant(name: str, fn: Callable[[], None]) -> Callable[[], float]:
        def once() -> float:
            night.reset_sketches()
            t = time.perf_counter()
            fn()
            elapsed = time.perf_counter() - t
            got = night.fragments()
            if answers and got != answers:
                wrong = [n for n in night.names if got[n] != answers[n]][:5]
                raise AssertionError(f"nightly: {name} left different sketches than the first variant: {wrong}")
            answers.update(got)
            print(f"   {name}: {elapsed:.1f} s", flush=True)
            return elapsed
        return once

    try:
        variants = {
            "per-sketch jobs": variant("per-sketch jobs", lambda: _run_jobs(per_sketch, env)),
            "grouped jobs": variant("grouped jobs", lambda: _run_jobs(grouped, env)),
            "grouped, Connect": variant("grouped, Connect", lambda: _run_jobs(grouped, env, remote)),
            "recapture all": variant("recapture all", lambda: _run_jobs(recapture, env)),
        }
        exp.measure("jobs alone", variants, runs, warmup=0)
        dags = {
            "per-sketch jobs": variant("Airflow, group size 1", lambda: _dags_test(airflow, 1)),
            "grouped jobs": variant("Airflow, grouped", lambda: _dags_test(airflow, GROUP_SIZE)),
            "grouped, Connect": variant("Airflow, Connect", lambda: _dags_test(airflow_connect, GROUP_SIZE)),
        }
        exp.measure("airflow dags test", dags, runs, warmup=0)
    finally:
        connect_server.stop(server_settings)
        os.environ.pop(connect_server.ENV_TOKEN, None)
    groups = len(grouped)
    night_kind = "the first night after the capture" if night.after_capture else "a night after an earlier one"
    for case in exp.cases():
        for v in ("grouped jobs", "grouped, Connect"):
            vals = exp.values(case, v)
            if vals:
                exp.add(case, f"{v} per sketch", 0, sorted(vals)[len(vals) // 2] / count)
    exp.notes += [
        f"- {count} sketches: {len(night.bases)} distinct queries (4 shapes x {tables} tables), each captured once "
        f"and copied; every copy is maintained on its own. Groups of {GROUP_SIZE}: {groups} jobs "
        f"(per-sketch: {count} jobs).",
        f"- {night_kind}; set-up (tables, captures, the earlier night, changes) {setup:.0f} s; the Spark Connect "
        f"server started in {started:.1f} s once (long-lived, not counted). `airflow dags test` runs mapped tasks "
        f"one after the other, so the Airflow rows have no job parallelism; every variant left every sketch with the "
        f"same fragments.",
    ]
    return exp


def run(quick: bool = False, runs: int = 5) -> Iterator[Experiment]:
    spark = spark_session()
    work = Path(tempfile.mkdtemp(prefix="imp-nightly-"))
    service = service_for(work / "home", spark)
    try:
        yield nightly(service, quick, min(runs, 1 if not quick else runs), work)
    finally:
        service.catalog.close()
        stop_embedded(service.settings)
        shutil.rmtree(work, ignore_errors=True)

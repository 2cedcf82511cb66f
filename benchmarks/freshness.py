"""Benchmark "freshness": how soon after a Delta commit the sketches that read the table are fresh again, through the
real Airflow stack (api-server, scheduler, DAG processor, triggerer) and ``imp_maintain_on_commit``.

``TABLES`` synthetic tables, ``SKETCHES`` sketches (four shapes per table: group-by/HAVING, a count with HAVING,
top-k, DISTINCT); one commit of ``CHANGE_ROWS`` change rows every ``INTERVAL`` seconds, round robin over the
tables, for ``DURATION`` seconds, with the DAG's defaults (``IMP_WATCH_INTERVAL`` 5 s, eager batches of 1000 change
rows, group size 25). Per commit and sketch reading its table: the time from the commit (its log file's
modification time) to the commit of the first sketch version that covers it. Reported: p50 and p95 of those
latencies, the CPU the triggerer's processes used over the window, the number of maintenance runs. At the end
every sketch must equal a recapture at the final table versions (checked; the benchmark fails otherwise).

``IMP_BENCH_FRESHNESS_MINUTES`` shortens the window; quick mode runs two tables, eight sketches and two minutes.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import sqlite3
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import requests

from benchmarks import data
from benchmarks.harness import Experiment, scaled
from benchmarks.maintenance import spark_session
from benchmarks.nightly import BIN, _airflow_home
from benchmarks.strategies import _drop_sketch, service_for
from imp_core.airflow.delta_log import DeltaLog
from imp_core.catalog.embedded import stop_embedded
from imp_core.maintenance.service import SketchService

DAG = "imp_maintain_on_commit"
TABLES = 5
SKETCHES = 20
GROUPS = 1000
CHANGE_ROWS = 100
INTERVAL = 10.0
DURATION = 600.0
SHAPES = {
    "groups": "SELECT a, AVG(b) AS ab FROM {t} GROUP BY a HAVING AVG(c) < 1600",
    "count": "SELECT a, COUNT(*) AS n FROM {t} WHERE c > 500 GROUP BY a HAVING COUNT(*) > 100",
    "topk": "SELECT a, b FROM {t} ORDER BY b DESC LIMIT 10",
    "distinct": "SELECT DISTINCT a FROM {t} WHERE b < 1000",
}
STACK = ("api-server", "scheduler", "dag-processor", "triggerer")


class Stack:
    """A running Airflow for the benchmark, on 127.0.0.1 ports the OS picked."""

    def __init__(self, service: SketchService, work: Path) -> None:
        with __import__("socket").socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.base = f"http://127.0.0.1:{port}"
        self.password = secrets.token_urlsafe(12)
        passwords = work / "passwords.json"
        passwords.write_text(json.dumps({"admin": self.password}))
        self.env = _airflow_home(service, work, **{
            "AIRFLOW__API__HOST": "127.0.0.1", "AIRFLOW__API__PORT": str(port), "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API__BASE_URL": self.base, "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.base}/execution/",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True", "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
        })
        self.home = Path(self.env["AIRFLOW_HOME"])
        self.procs: dict[str, subprocess.Popen] = {}
        self._token: str | None = None

    def start(self) -> None:
        for name in STACK:
            out = open(self.home / f"{name}.out", "a")  # noqa: SIM115 - closed when the process ends
            self.procs[name] = subprocess.Popen([str(BIN / "airflow"), name], env=self.env, cwd=self.home,
                                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.until(lambda: self.api("GET", f"/api/v2/dags/{DAG}").status_code == 200, 300, "the DAG parsed")
        assert self.api("PATCH", f"/api/v2/dags/{DAG}", json={"is_paused": False}).status_code == 200

    def api(self, method: str, path: str, **kw: Any) -> requests.Response:
        if self._token is None:
            r = requests.post(f"{self.base}/auth/token", json={"username": "admin", "password": self.password},
                              timeout=30)
            self._token = r.json()["access_token"]
        return requests.request(method, f"{self.base}{path}", headers={"Authorization": f"Bearer {self._token}"},
                                timeout=60, **kw)

    def watch(self, uris: list[str]) -> None:
        """Reparse the DAG (the catalog's tables become watched assets) and wait for every table's trigger."""
        token = self.api("GET", f"/api/v2/dags/{DAG}/details").json()["file_token"]
        assert self.api("PUT", f"/api/v2/parseDagFile/{token}").status_code == 201
        self.until(lambda: all(f"watching {u} " in (self.home / "triggerer.out").read_text() for u in uris), 300,
                   "every table watched")

    def until(self, ok: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while True:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"airflow {name} exited: {(self.home / f'{name}.out').read_text()[-3000:]}")
            try:
                if ok():
                    return
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"freshness: no {what} after {timeout:.0f} s")
            time.sleep(1)

    def triggerer_cpu(self) -> float:
        """CPU seconds (user + system) the triggerer and its trigger runner used so far."""
        proc = psutil.Process(self.procs["triggerer"].pid)
        total = 0.0
        for p in [proc, *proc.children(recursive=True)]:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.NoSuchProcess:
                pass
        return total

    def runs(self, since: float) -> list[tuple[str, str]]:
        with sqlite3.connect(self.home / "airflow.db") as db:
            return [(r[0], r[1]) for r in db.execute(
                "SELECT run_id, state FROM dag_run WHERE dag_id = ? AND queued_at >= datetime(?, 'unixepoch')",
                (DAG, since))]

    def run_times(self, since: float) -> list[tuple[float, float, float]]:
        """Per finished maintenance run: seconds from queued to started, from started to ended, and in its
        ``maintain_group`` task(s) (the Spark job: JVM, session, maintenance)."""
        with sqlite3.connect(self.home / "airflow.db") as db:
            rows = db.execute(
                "SELECT (julianday(r.start_date) - julianday(r.queued_at)) * 86400, "
                "(julianday(r.end_date) - julianday(r.start_date)) * 86400, "
                "(SELECT COALESCE(SUM(t.duration), 0) FROM task_instance t WHERE t.dag_id = r.dag_id "
                "AND t.run_id = r.run_id AND t.task_id = 'maintain_group') "
                "FROM dag_run r WHERE r.dag_id = ? AND r.queued_at >= datetime(?, 'unixepoch') "
                "AND r.end_date IS NOT NULL ORDER BY r.queued_at", (DAG, since))
            return [(float(a or 0), float(b or 0), float(c or 0)) for a, b, c in rows]

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def freshness(service: SketchService, quick: bool, work: Path) -> Experiment:
    from imp_core.airflow.assets import table_uri

    tables = 2 if quick else TABLES
    count = 8 if quick else SKETCHES
    duration = 60 * float(os.environ.get("IMP_BENCH_FRESHNESS_MINUTES") or (2 if quick else DURATION / 60))
    rows = scaled(20_000 if quick else 200_000)
    paths: dict[str, Path] = {}
    readers: dict[str, list[str]] = {}
    for i in range(tables):
        name = f"fr{i}"
        paths[name] = data.base_table(f"fr{i}_{rows}", rows, GROUPS)
        data.reset(paths[name])
        service.register_table(name, str(paths[name]), replace=True)
    for k in range(count):
        table, shape = list(paths)[k % tables], list(SHAPES)[(k // tables) % len(SHAPES)]
        name = f"fr_{shape}_{k}"
        _drop_sketch(service, name)
        service.create_sketch(name, SHAPES[shape].format(t=table), [f"{table}.a"], fragments=100)
        readers.setdefault(table, []).append(name)

    stack = Stack(service, work)
    commits: list[tuple[str, int, float]] = []
    try:
        stack.start()
        stack.watch([table_uri(str(p)) for p in paths.values()])
        next_ids = {t: data.max_id(p) + 1 for t, p in paths.items()}
        cpu0, start = stack.triggerer_cpu(), time.time()
        print(f"   {len(paths)} tables, {count} sketches: one commit every {INTERVAL:.0f} s for {duration:.0f} s",
              flush=True)
        k = 0
        while time.time() - start < duration:
            table = list(paths)[k % len(paths)]
            next_ids[table] = data.change(paths[table], CHANGE_ROWS, seed=1000 + k, groups=GROUPS,
                                          next_id=next_ids[table])
            log = DeltaLog(str(paths[table]))
            latest = log.latest()
            assert latest is not None
            commits.append((table, latest.version, latest.committed_at))
            k += 1
            time.sleep(max(0.0, start + k * INTERVAL - time.time()))
        cpu = stack.triggerer_cpu() - cpu0
        window = time.time() - start
        final = {t: max(v for tt, v, _ in commits if tt == t) for t in paths}
        stack.until(lambda: all(service.catalog.latest_version(service.catalog.get_sketch(s).id).table_versions[t]
                                >= final[t] for t in paths if t in final for s in readers.get(t, [])), 600,
                    "sketch covering the last commits")
        stack.until(lambda: all(state not in ("queued", "running") for _, state in stack.runs(start)), 600,
                    "end of the last run")
        runs = stack.runs(start)
        times = stack.run_times(start)
    finally:
        stack.stop()

    latencies, per_commit = _latencies(service, commits, readers)
    exact = _exact(service, readers)
    if not all(exact):
        raise AssertionError(f"freshness: {exact.count(False)} sketch(es) differ from a recapture at the end")

    def pct(values: list[float], q: float) -> float:
        return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] if len(values) > 1 else values[0]

    exp = Experiment("freshness", f"Fresh after a commit: {len(paths)} tables, {count} sketches, one commit of "
                     f"{CHANGE_ROWS} change rows every {INTERVAL:.0f} s for {window / 60:.0f} min through Airflow "
                     f"(api-server, scheduler, DAG processor, triggerer)", timed=False, log_y=False,
                     y_label="seconds from the commit to the covering sketch version")
    exp.warmup = False
    for i, value in enumerate(latencies):
        exp.add("commit -> covering sketch version (each commit x sketch)", "latency", i, value)
    for i, value in enumerate(per_commit):
        exp.add("commit -> every sketch of its table fresh", "latency", i, value)
    exp.add("p50 / p95 (each commit x sketch)", "p50", 0, pct(latencies, 50))
    exp.add("p50 / p95 (each commit x sketch)", "p95", 0, pct(latencies, 95))
    exp.add("triggerer CPU over the window", "CPU", 0, cpu)
    exp.add("triggerer CPU over the window", "share of one core", 0, 100 * cpu / window, unit="%")
    exp.add("maintenance runs", "runs", 0, len(runs), unit="runs")
    exp.add("maintenance runs", "commits", 0, len(commits), unit="commits")
    for i, (waited, took, job) in enumerate(times):
        exp.add("each maintenance run", "queued", i, waited)
        exp.add("each maintenance run", "run", i, took)
        exp.add("each maintenance run", "Spark job", i, job)
    took = statistics.median(t for _, t, _ in times) if times else 0.0
    job = statistics.median(j for _, _, j in times) if times else 0.0
    exp.notes.append(f"p50 {pct(latencies, 50):.1f} s, p95 {pct(latencies, 95):.1f} s (target p95 < 60 s) over "
                     f"{len(commits)} commits x the sketches of their table; {len(runs)} maintenance runs for "
                     f"{len(commits)} commits; the triggerer used {cpu:.1f} CPU s in {window:.0f} s "
                     f"({100 * cpu / window:.1f}% of one core); a run took {took:.0f} s (median), {job:.0f} s of it in "
                     f"the Spark job; every sketch equal to a recapture at the end: "
                     f"{'yes' if all(exact) else 'no'}.")
    return exp


def _latencies(service: SketchService, commits: list[tuple[str, int, float]],
               readers: dict[str, list[str]]) -> tuple[list[float], list[float]]:
    """Per (commit, sketch of its table): seconds from the commit to the first sketch version covering it; and per
    commit the slowest of its sketches."""
    versions = {s: service.catalog.versions(service.catalog.get_sketch(s).id) for ss in readers.values() for s in ss}
    latencies: list[float] = []
    per_commit: list[float] = []
    for table, version, committed in commits:
        mine = [next(v for v in versions[s] if v.table_versions.get(table, -1) >= version).created_at.timestamp()
                - committed for s in readers[table]]
        latencies += mine
        per_commit.append(max(mine))
    return latencies, per_commit


def _exact(service: SketchService, readers: dict[str, list[str]]) -> list[bool]:
    """Whether each sketch's latest version equals a recapture at the same table versions."""
    out = []
    for sketch in (s for ss in readers.values() for s in ss):
        latest = service.catalog.latest_version(service.catalog.get_sketch(sketch).id)
        again = service.recapture(sketch, trigger="bench-freshness-oracle")
        out.append(again.fragments == latest.fragments and dict(again.table_versions) == dict(latest.table_versions))
    return out


def run(quick: bool = False, runs: int = 5) -> Iterator[Experiment]:
    del runs  # one window: the latencies are its repetitions
    spark = spark_session()
    work = Path(tempfile.mkdtemp(prefix="imp-freshness-"))
    service = service_for(work / "home", spark)
    try:
        yield freshness(service, quick, work)
    finally:
        service.catalog.close()
        stop_embedded(service.settings)
        shutil.rmtree(work, ignore_errors=True)

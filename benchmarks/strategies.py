"""Maintenance strategies and the mixed workload (IMP paper 8.5 and 8.1), through the full service (catalog commits
included).

* ``eager_vs_lazy``: 1,000 single-row updates, maintained eagerly in batches of 1 ... 1,000 change rows (one
  committed sketch version per batch) versus one lazy maintenance; total time.
* ``mixed_workload``: a sequence of operations (queries and updates of a given size, at a given query:update ratio);
  IMP = lazy maintenance + sketch use, FM = recapture + sketch use, NS = no sketch. Total time of the sequence.
* ``compaction``: the mixed workload's table as its updates left it, then after OPTIMIZE ZORDER BY the sketch's
  column; the sketch maintained through the rewrite; the query with (IMP) and without (NS) the sketch, both times.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from deltalake import DeltaTable

from benchmarks import data, harness
from benchmarks.harness import Experiment, scaled
from benchmarks.maintenance import spark_session
from imp_core.catalog import NewVersion, StateBlob
from imp_core.config import Settings
from imp_core.errors import NotFoundError
from imp_core.jobs import SUBMIT_PATH, MaintainJob, RecaptureJob
from imp_core.maintenance.service import SketchService
from imp_core.maintenance.strategy import Strategy
from imp_core.spark import connector
from imp_core.spark.session import driver_memory


def service_for(home: Path, spark) -> SketchService:  # noqa: ANN001
    settings = Settings.from_env(home=home, spark_master="local[2]", shuffle_partitions=8)
    return SketchService(settings, spark=spark, progress=lambda m: None)


def _drop_sketch(service: SketchService, name: str) -> None:
    try:
        service.catalog.drop_sketch(name)
    except NotFoundError:
        pass


def _answer(result: Any) -> list[list[Any]]:
    """A query result's rows in a comparable form: sorted, floats rounded (AVG over files read in another order
    differs in the last bits)."""
    return sorted([round(v, 6) if isinstance(v, float) else v for v in r] for r in result.rows)


def _fresh_sketch(service: SketchService, name: str, sql: str, on: str, fragments: int,
                  strategy: Strategy = Strategy.EAGER) -> None:
    _drop_sketch(service, name)
    service.create_sketch(name, sql, [on], fragments=fragments, strategy=strategy)


def _clone_at_start(service: SketchService, source: str, name: str, version: int = 1) -> None:
    """A new sketch whose version 1 is ``source``'s version ``version`` (same table versions, sketch and operator
    state), so every run maintains the same backlog from the same start."""
    _drop_sketch(service, name)
    record = service.catalog.get_sketch(source)
    first = service.catalog.get_version(record.id, version)
    states = [StateBlob(b.operator_id, b.format, b.format_version, b.payload, chunks=b.chunks)
              for b in service.catalog.load_states(record.id, version).values()]
    service.catalog.create_sketch(name, record.sql, record.dialect, record.template_key, record.plan_json,
                                  record.partitions, record.safety, Strategy.EAGER,
                                  NewVersion(first.table_versions, first.bits, first.fragments, "capture",
                                             table_identities=first.table_identities,
                                             state_options=first.state_options,
                                             fragment_rows=first.fragment_rows), states)


def eager_vs_lazy(service: SketchService, quick: bool, runs: int) -> Experiment:
    rows = scaled(200_000 if quick else 10_000_000)
    updates = 20 if quick else 1000
    groups = 5000
    name = f"edb_{rows}"
    path = data.base_table(name, rows, groups)
    sql = f"SELECT a, AVG(c) AS ac FROM {name} GROUP BY a HAVING AVG(c) > 1500 AND AVG(c) < 1800"
    exp = Experiment("eager_vs_lazy", f"Maintaining {updates:,} single-row updates ({rows:,} rows, 5K groups): "
                     f"eager in batches of n change rows vs lazy, total time incl. catalog commits",
                     log_x=True, x_label="batch size (change rows)", y_label="seconds", warmup=False)
    data.reset(path)
    service.register_table(name, str(path), replace=True)
    _fresh_sketch(service, "edb", sql, f"{name}.a", 1000)
    start = service.catalog.latest_version(service.catalog.get_sketch("edb").id).table_versions
    # the updates: each commit changes one row (an update = delete of the old row + insert of the new one)
    rng = np.random.default_rng(5)
    dt = DeltaTable(str(path))
    ids = rng.choice(rows, updates, replace=False)
    t0 = time.perf_counter()
    for i in ids:
        dt.update(updates={"c": "c + 1000"}, predicate=f"id = {int(i)}")
    exp.notes.append(f"- setup: {updates} update commits took {time.perf_counter() - t0:.0f} s")
    sizes = [1, 10] if quick else [1, 5, 10, 50, 100, 500, 1000]

    for size in [*sizes, "lazy"]:
        for run in range(runs if size in ("lazy", 1000) else max(1, runs // 2)):
            _clone_at_start(service, "edb", "edb_run")
            record = service.catalog.get_sketch("edb_run")
            assert service.catalog.latest_version(record.id).table_versions == start
            t = time.perf_counter()
            if size == "lazy":
                result = service.maintain("edb_run", strategy=Strategy.LAZY)
            else:
                # an update is 2 change rows
                result = service.maintain("edb_run", strategy=Strategy.EAGER, batch_size=int(size) * 2)
            elapsed = time.perf_counter() - t
            label = "lazy" if size == "lazy" else f"eager {size}"
            exp.add(label, "total", run, elapsed, x=updates if size == "lazy" else float(size),
                    versions=len(result.versions))
    return exp


_METHODS = ("IMP", "FM", "NS")  # the mixed workload's methods, in the order the first query is answered


def mixed_workload(services: dict[str, SketchService], quick: bool, runs: int,
                   cases: list[tuple[int, int, int, int]] | None = None) -> Experiment:
    """Queries and updates interleaved (paper 8.1). The time of the queries counts, with whatever each method does to
    answer them (creating, maintaining or recapturing the sketch, running the query).

    The three methods run side by side over one sequence of updates: each update is executed once, then every query
    of the sequence is answered by NS, FM and IMP in turn (order rotated per query), IMP and FM each with its own
    catalog (``services``) so each finds only its own sketch. Executing the updates is the same work for every method
    (a Delta delete rewrites whole files, seconds here against milliseconds in the paper's Postgres); it is reported
    apart, not counted.

    A case is (queries, updates, change size, operations). The default is the paper's grid of ratios and change
    sizes with 60 operations each (24 for changes of 200 and 2,000 rows, whose random deletes touch most of the
    table's 100 files, so that every update rewrites most of the 10M rows: the same work for every method and not
    counted), plus the target case 1:1 with 20-row changes at the paper's length of 1,000 operations."""
    rows = scaled(200_000 if quick else 10_000_000)
    if cases is None:
        cases = [(1, 1, 20, 6)] if quick else [
            *[(q, u, n, 60 if n <= 20 else 24) for q, u in [(1, 1), (1, 5), (5, 1)] for n in [1, 20, 200, 2000]],
            (1, 1, 20, 1000)]
    lengths = sorted({n_ops for *_, n_ops in cases})
    groups = 5000
    name = f"mixed_{rows}"
    path = data.base_table(name, rows, groups, files=100)
    sql = f"SELECT a, AVG(c) AS ac FROM {name} GROUP BY a HAVING AVG(c) < 300"
    exp = Experiment("mixed_workload", f"Mixed workload: {'/'.join(f'{n:,}' for n in lengths)} operations per case on "
                     f"{rows:,} rows (total time of the queries, "
                     f"with sketch creation and maintenance), IMP = lazy maintenance + use, FM = recapture + use, "
                     f"NS = no sketch", ratios=[("NS", "IMP"), ("FM", "IMP")], log_y=True, y_label="seconds (total)",
                     timed=False)
    update_s: dict[int, list[float]] = {}
    # warm-up, not counted: the first query and the first capture of the session pay Spark's start-up (JIT, caches);
    # none in quick mode
    data.reset(path)
    for service in [] if harness.QUICK else services.values():
        service.register_table(name, str(path), replace=True)
        service.query(sql, use_sketch=False)
        _fresh_sketch(service, "mixed", sql, f"{name}.a", 1000, strategy=Strategy.LAZY)
        service.query(sql)
    for q, u, size, n_ops in cases:
        case = f"{q}Q:{u}U, size {size}" + (f", {n_ops:,} ops" if n_ops >= 100 else "")
        data.reset(path)
        for service in services.values():
            service.register_table(name, str(path), replace=True)
            _drop_sketch(service, "mixed")
        spent, queries, updates = _mixed_case(services, sql, name, path, (q, u, size, n_ops), case, groups)
        if updates:
            update_s.setdefault(size, []).extend(updates)
        for method in _METHODS:
            exp.add(case, method, 0, spent[method], queries=queries, updates=n_ops - queries)
        print(f"   mixed workload {case}: " + ", ".join(f"{m} {spent[m]:.1f} s" for m in _METHODS), flush=True)
    for size, times in sorted(update_s.items()):
        exp.notes.append(f"- executing the updates (not counted): size {size}: median {statistics.median(times):.2f} s "
                         f"per update, {len(times)} updates")
    exp.notes.append("- one sequence per case; the three methods answer each query in turn over the same updates")
    return exp


def _mixed_case(services: dict[str, SketchService], sql: str, table: str, path: Path,
                case: tuple[int, int, int, int], label: str, groups: int) -> tuple[dict[str, float], int, list[float]]:
    """One case (queries, updates, change size, operations) of the mixed workload on a freshly reset table, checking
    after every query that the methods' answers agree.

    Returns:
        Each method's total query time, the number of queries, and the time of each update.
    """
    q, u, size, n_ops = case
    spent = dict.fromkeys(_METHODS, 0.0)
    update_s: list[float] = []
    next_id = data.max_id(path) + 1
    created: set[str] = set()
    answers: dict[str, list] = {}
    queries = 0
    for i in range(n_ops):
        if i % (q + u) >= q:  # an update, executed once for all methods
            t0 = time.perf_counter()
            next_id = data.change(path, size, seed=i, groups=groups, next_id=next_id)
            update_s.append(time.perf_counter() - t0)
            continue
        for method in _METHODS[queries % 3:] + _METHODS[:queries % 3]:
            service = services["FM" if method == "FM" else "IMP"]
            t0 = time.perf_counter()
            result = _answer_by(method, service, sql, table, created)
            spent[method] += time.perf_counter() - t0
            answers[method] = _answer(result)
        queries += 1
        if len({repr(a) for a in answers.values()}) != 1:
            raise AssertionError(f"mixed workload {label}, operation {i}: the methods' answers differ")
    return spent, queries, update_s


def _answer_by(method: str, service: SketchService, sql: str, table: str, created: set[str]) -> Any:
    """``sql`` answered as ``method`` does: NS without a sketch; IMP and FM with the sketch, created on the method's
    first query (noted in ``created``), FM recapturing it first whenever it is stale (IMP maintains lazily on use)."""
    if method == "NS":
        return service.query(sql, use_sketch=False)
    if method not in created:
        service.create_sketch("mixed", sql, [f"{table}.a"], fragments=1000)
        created.add(method)
    elif method == "FM" and service.is_stale("mixed"):
        service.maintain("mixed", strategy="recapture")
    return service.query(sql)


def compaction(service: SketchService, quick: bool, runs: int, path: Path | None = None) -> Experiment:
    """What restores file pruning once small insert files have piled up: OPTIMIZE ZORDER BY the sketch's column.

    Runs on the mixed workload's table as its last case left it (the suite runs it right after ``mixed_workload``):
    every insert appended a small file of rows from random groups, which Delta's min/max statistics cannot prune. A
    sketch is created on that state and maintained through the rewrite, which commits with ``dataChange = false``:
    maintenance must be incremental with no change rows (checked). The query with the sketch (IMP) and without (NS)
    are timed side by side before and after; their answers must agree. The rewrite keeps the table's generated
    file count (target size = table size / 100)."""
    rows = scaled(200_000 if quick else 10_000_000)
    name = f"mixed_{rows}"
    path = path or data.base_table(name, rows, 5000, files=100)
    sql = f"SELECT a, AVG(c) AS ac FROM {name} GROUP BY a HAVING AVG(c) < 300"
    service.register_table(name, str(path), replace=True)
    _drop_sketch(service, "mixed")  # the workload's own sketch would answer the query too
    _fresh_sketch(service, "compact", sql, f"{name}.a", 1000, strategy=Strategy.LAZY)
    exp = Experiment("compaction", f"Q_mixed on the mixed workload's table ({rows:,} rows) after its updates, before "
                     f"and after OPTIMIZE ZORDER BY a; IMP = with the sketch (maintained through the rewrite), NS = "
                     f"without", ratios=[("NS", "IMP")], log_y=False, y_label="seconds")

    def measure(case: str) -> None:
        results: dict[str, Any] = {}

        def query(method: str) -> Callable[[], None]:
            def run_once() -> None:
                results[method] = service.query(sql, use_sketch=method == "IMP")
            return run_once

        exp.measure(case, {"IMP": query("IMP"), "NS": query("NS")}, runs)
        if _answer(results["IMP"]) != _answer(results["NS"]):
            raise AssertionError(f"compaction, {case}: the sketched query's answer differs from the plain query's")
        scan_i, scan_n = results["IMP"].scanned, results["NS"].scanned
        exp.notes.append(f"- {case}: files read with the sketch {scan_i.files_read}/{scan_i.files_total}, without "
                         f"{scan_n.files_read}/{scan_n.files_total}")

    measure("after the updates")
    table = DeltaTable(str(path))
    size = sum(pa.table(table.get_add_actions(flatten=True)).column("size_bytes").to_pylist())
    t0 = time.perf_counter()
    table.optimize.z_order(["a"], target_size=max(1 << 20, size // 100))
    optimize_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    result = service.maintain("compact")
    maintain_s = time.perf_counter() - t0
    if [v.method for v in result.versions] != ["incremental"] or result.delta_rows:
        raise AssertionError(f"compaction: maintenance through OPTIMIZE was {[v.method for v in result.versions]} "
                             f"with {result.delta_rows} change rows; expected one incremental version and none")
    exp.notes.append(f"- OPTIMIZE ZORDER BY (a) with delta-rs: {optimize_s:.1f} s, measured once; maintenance through "
                     f"it: incremental, 0 change rows, {maintain_s:.2f} s")
    measure("after OPTIMIZE ZORDER BY a")
    _drop_sketch(service, "compact")
    return exp


def _job_error(output: str) -> str:
    """The job's own error line (``imp-job: ...``; under spark-submit it arrives on stdout), else the output's end."""
    lines = [ln for ln in output.splitlines() if ln.startswith("imp-job:")]
    return lines[-1] if lines else output.strip()[-500:]


def _timed_job(service: SketchService, variant: str, command: list[str], env: dict[str, str], start: int,
               sketches: dict[str, dict[str, list[int]]]) -> Callable[[], float]:
    """One timed run of the job ``command`` on a fresh clone ``wj_run`` of sketch ``wj`` at version ``start``; the
    fragments it committed (read from the catalog) are kept in ``sketches[variant]``."""
    def run_once() -> float:
        _clone_at_start(service, "wj", "wj_run", start)
        t0 = time.perf_counter()
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        elapsed = time.perf_counter() - t0
        if done.returncode != 0:
            raise RuntimeError(f"{variant} failed: {_job_error(done.stdout + done.stderr)}")
        committed = service.catalog.latest_version(service.catalog.get_sketch("wj_run").id)
        if committed.version < 2:
            raise AssertionError(f"whole_job: {variant} committed no version")
        sketches[variant] = {t: list(f) for t, f in committed.fragments.items()}
        return elapsed
    return run_once


def whole_job(service: SketchService, quick: bool, runs: int) -> Experiment:
    """Maintenance as the whole job an Airflow task runs (process start to catalog commit), IMP vs FM.

    Each run maintains a clone of the same catalog version over the same change: ``IMP job`` is
    ``spark-submit imp_core/jobs/submit.py maintain --strategy lazy``, ``FM job`` the same with ``recapture``, and
    ``IMP CLI`` is ``imp sketch maintain`` (no JVM: single-table maintenance never starts Spark).
    """
    rows = scaled(200_000 if quick else 10_000_000)
    groups = 5000
    name = f"t1gb{groups}g_{rows}"
    path = data.base_table(name, rows, groups)
    data.reset(path)
    service.register_table(name, str(path), replace=True)
    sql = f"SELECT a, AVG(b) AS ab FROM {name} GROUP BY a HAVING AVG(c) < 1600"
    _fresh_sketch(service, "wj", sql, f"{name}.a", 1000)
    exp = Experiment("whole_job", f"Whole maintenance job, process start to commit (what an Airflow task runs), "
                     f"Q_groups 5K groups, {rows:,} rows, 1,000 fragments",
                     ratios=[("FM job", "IMP job"), ("FM job", "IMP CLI")], y_label="seconds")
    home = str(service.settings.home)
    bin_dir = Path(sys.executable).parent
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("IMP_", "PYSPARK_GATEWAY"))},
           "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    submit = [str(bin_dir / "spark-submit"), "--master", "local[2]", "--driver-memory", driver_memory(),
              "--conf", "spark.ui.enabled=false",
              "--conf", "spark.sql.shuffle.partitions=8", *connector.submit_args(), SUBMIT_PATH]
    commands = {
        "IMP job": [*submit, *MaintainJob("wj_run", Strategy.LAZY).argv(), "--home", home],
        "FM job": [*submit, *RecaptureJob("wj_run").argv(), "--home", home],
        "IMP CLI": [str(bin_dir / "imp"), "--home", home, "sketch", "maintain", "wj_run", "--strategy", Strategy.LAZY],
    }
    next_id = data.max_id(path) + 1
    record = service.catalog.get_sketch("wj")
    for i, size in enumerate([10, 1000] if not quick else [10]):
        next_id = data.change(path, size, seed=7000 + i, groups=groups, next_id=next_id)
        start = service.catalog.latest_version(record.id).version
        sketches: dict[str, dict[str, list[int]]] = {}
        variants = {v: _timed_job(service, v, command, env, start, sketches) for v, command in commands.items()}
        exp.measure(f"{size:,} change rows", variants, runs if quick else max(3, runs - 2), x=size)
        if len({json.dumps(f, sort_keys=True) for f in sketches.values()}) != 1:
            raise AssertionError(f"whole_job: the jobs committed different sketches: {sketches}")
        service.maintain("wj", strategy="lazy")
    exp.notes.append("- three runs per variant (each starts a JVM); the ratio shows what job start-up leaves of the "
                     "in-process speed-up")
    return exp


def run(quick: bool = False, runs: int = 5):  # noqa: ANN201
    spark = spark_session()
    with tempfile.TemporaryDirectory() as home:
        service = service_for(Path(home), spark)
        fm_service = service_for(Path(home) / "fm", spark)  # FM's own catalog: each method finds only its sketch
        try:
            yield whole_job(service, quick, runs)
            yield eager_vs_lazy(service, quick, runs)
            yield mixed_workload({"IMP": service, "FM": fm_service}, quick, runs)
            yield compaction(service, quick, runs)
        finally:
            from imp_core.catalog.embedded import stop_embedded

            for s in (service, fm_service):
                s.catalog.close()
                stop_embedded(s.settings)

"""Benchmark "extension": what imp's Spark session extension adds to a query's planning, and what a sketched query
gains through it from any client.

* ``extension_planning``: a query planned with the extension off and on, in milliseconds (per run the medians of
  ``PLANS`` plannings, off and on alternated): its analysis (``spark.sql``: where the rule runs, so what it adds is
  here) and its whole planning to the executed plan (Delta's file pruning and physical planning too, which a
  matched sketch's ranges feed: noisier, each planning lists the files). Cases: a table with no sketch anywhere
  near it; the same with 100 published sketches on other tables in its publish location (synthetic manifests: the
  sketch's own with another table's identity); the sketched query itself (the rule matches, checks and restricts
  the scan).
* ``extension_tpch``: the 22 TPC-H queries (SF0.1, temporary views of the Delta tables, no sketch), each planned to
  its executed plan with the extension off and on; per run the sum over the queries of each query's medians.
* ``extension_queries``: ``Q_skip`` (``SELECT a, AVG(b) AS ab FROM t GROUP BY a HAVING AVG(c) < 312.5`` on a table
  clustered on ``a``, its sketch on ``a`` with 1,000 fragments, ~5% kept) without and with the sketch, through
  ``spark.sql`` (the rule off/on), the same wrapped as a BI tool sends it (``SELECT * FROM (...) q ORDER BY ab DESC
  LIMIT 1000``), ``imp query`` (``use_sketch`` off/on), and the Spark Thrift server (full runs only: a JDBC session
  through beeline, the server's own execution times from its UI). Every pair's rows are compared; a difference fails
  the benchmark.
"""

from __future__ import annotations

import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import data, harness
from benchmarks.harness import Experiment, scaled
from benchmarks.maintenance import spark_session
from benchmarks.strategies import service_for
from benchmarks.tpch22_queries import BY_SIZE, QUERIES
from imp_core.maintenance.service import SketchService
from imp_core.publish import manifest, store
from imp_core.sources.delta import DeltaSource
from imp_core.spark.connector import SKETCH_ENABLED_CONF
from imp_core.use.extension import register_views

PLANS = 20  # plannings per run of a planning case (their median is the run's figure)
OTHERS = 100  # published sketches on other tables
SQL = "SELECT a, AVG(b) AS ab FROM {t} GROUP BY a HAVING AVG(c) < 312.5"
WRAPPED = "SELECT * FROM ({q}) q ORDER BY ab DESC LIMIT 1000"


def _switch(spark: Any, on: bool) -> None:
    spark.conf.set(SKETCH_ENABLED_CONF, "true" if on else "false")


def _paired_ms(spark: Any, sql: str, n: int, whole: bool) -> tuple[float, float]:
    """The median times (ms) of ``n`` plannings of ``sql`` with the extension off and on, alternated (off-on, then
    on-off) so drift hits both: ``spark.sql`` alone (the analysis, where the rule runs), or to the executed plan
    (``whole``: the optimizer with Delta's file pruning and physical planning too). Each planning is a new
    DataFrame (Spark caches a plan per DataFrame)."""
    times: dict[bool, list[float]] = {False: [], True: []}
    for i in range(n):
        for on in (False, True) if i % 2 == 0 else (True, False):
            _switch(spark, on)
            t0 = time.perf_counter()
            df = spark.sql(sql)
            if whole:
                df._jdf.queryExecution().executedPlan()  # noqa: SLF001 - the JVM plan, not a Python row
            times[on].append(time.perf_counter() - t0)
    return statistics.median(times[False]) * 1000, statistics.median(times[True]) * 1000


def _record(exp: Experiment, case: str, runs: int, measure: Callable[[], tuple[float, float]]) -> None:
    """Rounds of ``measure`` (a warm-up first, none in quick mode), each recorded as one run of off and on."""
    warmup = 0 if harness.QUICK else 1
    exp.warmup = warmup > 0
    for i in range(warmup + runs):
        off, on = measure()
        if i >= warmup:
            exp.add(case, "off", i - warmup, off, unit="ms")
            exp.add(case, "on", i - warmup, on, unit="ms")


def _applied(spark: Any, df: Any) -> list[dict[str, Any]]:
    from imp_core.publish.signature import api

    return list(json.loads(api(spark).applied(df._jdf)))  # noqa: SLF001 - Py4J


def _rows(df: Any) -> list[tuple[Any, ...]]:
    return sorted((tuple(round(v, 6) if isinstance(v, float) else v for v in r) for r in df.collect()), key=repr)


def _text_rows(rows: list[list[str]]) -> list[tuple[str, ...]]:
    """beeline's rows (header first) sorted, numbers to 6 decimals (AVG's last bits follow the files read)."""

    def cell(v: str) -> str:
        try:
            return f"{float(v):.6f}"
        except ValueError:
            return v

    return sorted(tuple(cell(v) for v in r) for r in rows[1:])


def _other_manifests(location: str, real: dict[str, Any]) -> None:
    """``OTHERS`` manifests of the real one's shape, each on a table of its own identity (never this session's)."""
    for i in range(OTHERS):
        body = json.loads(json.dumps(real))
        sketch_id = 900_000 + i
        body.update(sketch_id=sketch_id, sketch=f"other_{i}")
        for t in body["tables"]:
            t.update(name=f"other_{i}", id=f"bench-other-table-{i}", path=f"file:/nowhere/other_{i}")
        for p in body["partitions"]:
            p.update(table=f"other_{i}", table_id=f"bench-other-table-{i}")
        store.write(location, store.file_name(sketch_id, 1), manifest.encode(body))


class Setup:
    """The tables and the sketch every experiment uses: ``t`` (clustered on ``a``, sketched) and ``plain`` (no sketch)
    beside it in one lake, so both share the default publish location; ``alone`` (no sketch) in a lake of its own."""

    def __init__(self, spark: Any, service: SketchService, quick: bool) -> None:
        self.spark, self.service = spark, service
        rows = scaled(200_000 if quick else 2_000_000)
        self.files = 20 if quick else 100
        lake, alone = data.DATA / "extension", data.DATA / "extension_alone"
        shutil.rmtree(lake, ignore_errors=True)
        shutil.rmtree(alone, ignore_errors=True)
        self.table = data.write(lake / "ext_t", data.synthetic(rows, 5000), self.files)
        self.plain = data.write(lake / "ext_plain", data.synthetic(rows // 10, 500), 10)
        self.alone = data.write(alone / "ext_alone", data.synthetic(rows // 10, 500), 10)
        service.register_table("ext_t", str(self.table))
        service.create_sketch("ext_q", SQL.format(t="ext_t"), ["ext_t.a"], fragments=1000)
        self.location = str(lake / store.DEFAULT_DIR)
        [name] = store.names(self.location)
        real = manifest.decode(store.read(self.location, name))
        assert real is not None and real["usable"], f"the sketch's manifest is not usable: {real}"
        self.kept = f"{real['partitions'][0]['fragments_kept']} of {real['partitions'][0]['fragments_total']}"
        _other_manifests(self.location, real)
        self.query = SQL.format(t=f"delta.`{self.table}`")


def planning(setup: Setup, runs: int) -> Experiment:
    spark = setup.spark
    exp = Experiment(
        "extension_planning",
        f"Planning with the extension off and on (ms per query, medians of {PLANS} alternated plannings per run)",
        ratios=[("on", "off")],
        log_y=False,
        y_label="ms",
    )
    other = f"SELECT a, SUM(b) FROM delta.`{setup.plain}` GROUP BY a HAVING SUM(c) > 10"
    cases = {
        "no sketch for its tables": f"SELECT a, SUM(b) FROM delta.`{setup.alone}` GROUP BY a HAVING SUM(c) > 10",
        f"{OTHERS} sketches on other tables": other,
        "a match (the sketch applies)": setup.query,
    }
    for case, sql in cases.items():
        for whole, label in ((False, "analysis"), (True, "whole planning")):
            _record(exp, f"{case}: {label}", runs, lambda s=sql, w=whole: _paired_ms(spark, s, PLANS, w))
            added = [b - a for a, b in zip(exp.values(f"{case}: {label}", "off"), exp.values(f"{case}: {label}", "on"))]
            exp.notes.append(
                f"- {case}, {label}: {statistics.median(added):+.2f} ms added (median of per-run differences)"
            )
    _switch(spark, True)
    applied = _applied(spark, spark.sql(setup.query))
    assert applied == [{"sketch": "ext_q", "version": 1}], f"the sketch was not applied to its query: {applied}"
    assert _applied(spark, spark.sql(other)) == [], "a sketch of another table was applied"
    return exp


def tpch(spark: Any, quick: bool, runs: int) -> Experiment:
    root = data.tpch(0.01 if quick else 0.1)
    register_views(spark, {t: DeltaSource(t, root / t) for t in BY_SIZE})
    plans = 1 if quick else 3
    exp = Experiment(
        "extension_tpch",
        "The 22 TPC-H queries planned with the extension off and on, no sketch (ms, "
        f"the sum of each query's median of {plans} alternated plannings to the executed plan)",
        ratios=[("on", "off")],
        log_y=False,
        y_label="ms",
    )

    def total() -> tuple[float, float]:
        pairs = [_paired_ms(spark, sql, plans, True) for sql in QUERIES.values()]
        return sum(p[0] for p in pairs), sum(p[1] for p in pairs)

    _record(exp, "22 queries", runs, total)
    _switch(spark, True)
    return exp


class _Clients:
    """Q_skip's runs by client, each keeping its last answer (compared once the runs are done)."""

    def __init__(self, setup: Setup) -> None:
        self.setup = setup
        self.answers: dict[str, list[tuple[Any, ...]]] = {}
        self.files: dict[str, str] = {}

    def sql(self, sql: str, on: bool, key: str) -> Callable[[], None]:
        def go() -> None:
            _switch(self.setup.spark, on)
            self.answers[key] = _rows(self.setup.spark.sql(sql))

        return go

    def imp(self, on: bool, key: str) -> Callable[[], None]:
        def go() -> None:
            result = self.setup.service.query(SQL.format(t="ext_t"), use_sketch=on)
            if on and not result.sketch:
                raise AssertionError(f"imp query ran without the sketch: {result.notes}")
            self.answers[key] = sorted(
                (tuple(round(v, 6) if isinstance(v, float) else v for v in r) for r in result.rows), key=repr
            )
            self.files[key] = f"{result.scanned.files_read}/{result.scanned.files_total}"

        return go

    def check(self) -> None:
        for a, b in (("sql off", "sql on"), ("bi off", "bi on"), ("imp off", "imp on"), ("sql off", "imp on")):
            if self.answers[a] != self.answers[b]:
                raise AssertionError(f"extension_queries: the answers of {a} and {b} differ")


def queries(setup: Setup, quick: bool, runs: int) -> Experiment:
    exp = Experiment(
        "extension_queries",
        f"Q_skip without and with its sketch ({setup.kept} fragments kept, {setup.files} files) by client",
        ratios=[("without sketch", "with sketch")],
        log_y=False,
    )
    c = _Clients(setup)
    wrapped = WRAPPED.format(q=setup.query)
    clients = {
        "spark.sql": (c.sql(setup.query, False, "sql off"), c.sql(setup.query, True, "sql on")),
        "BI-wrapped spark.sql": (c.sql(wrapped, False, "bi off"), c.sql(wrapped, True, "bi on")),
        "imp query": (c.imp(False, "imp off"), c.imp(True, "imp on")),
    }
    for case, (off, on) in clients.items():
        exp.measure(case, {"without sketch": off, "with sketch": on}, runs)
    _switch(setup.spark, True)
    c.check()
    exp.notes.append(f"- imp query: files read {c.files['imp on']} with the sketch, {c.files['imp off']} without")
    if not quick:
        thrift(setup, exp, runs)
    sql_speedup, imp_speedup = (
        exp.ratio_median(case, "without sketch", "with sketch") for case in ("spark.sql", "imp query")
    )
    if sql_speedup and imp_speedup:
        exp.notes.append(f"- spark.sql's speed-up over imp query's: {sql_speedup / imp_speedup:.3f}")
    return exp


def thrift(setup: Setup, exp: Experiment, runs: int) -> None:
    """Q_skip in one JDBC session of a Thrift server started with only the printed settings: per run the rule off
    and on, the server's execution time of each statement (its UI), warm-up round first."""
    from tests.spark.clients import SqlUi, files_read, free_port, listening, start, stop, wait_for
    from tests.spark.test_thrift_server import beeline, server_argv, statement_executions

    with tempfile.TemporaryDirectory(prefix="imp-bench-thrift-") as tmp:
        work = Path(tmp)
        port, ui_port = free_port(), free_port()
        log = work / "server.log"
        proc = start(server_argv(work, port, ui_port), log, cwd=work)
        try:
            wait_for(lambda: listening(port), [proc], log, "the Thrift server")
            ui = SqlUi(f"http://127.0.0.1:{ui_port}")
            statements = []
            for _ in range(runs + 1):
                statements += [
                    f"SET {SKETCH_ENABLED_CONF}=false",
                    setup.query,
                    f"SET {SKETCH_ENABLED_CONF}=true",
                    setup.query,
                ]
            before = ui.last_id()
            results = beeline(port, statements)
            executions = statement_executions(ui, before, len(statements))
        finally:
            stop(proc)
    files: dict[str, int] = {}
    for i in range(runs + 1):
        off, on = executions[4 * i + 1], executions[4 * i + 3]
        if _text_rows(results[4 * i + 1]) != _text_rows(results[4 * i + 3]):
            raise AssertionError("extension_queries: the Thrift server's rows differ with the sketch")
        files = {"without sketch": sum(map(files_read, off)), "with sketch": sum(map(files_read, on))}
        if i == 0:
            continue  # the warm-up round
        for variant, runs_of in (("without sketch", off), ("with sketch", on)):
            exp.add("Thrift server (JDBC)", variant, i - 1, sum(e["duration"] for e in runs_of) / 1000)
    if files["with sketch"] >= files["without sketch"]:
        raise AssertionError(f"the Thrift server's query read {files} files: the sketch was not applied")
    exp.notes.append(
        f"- Thrift server: files read {files['with sketch']} with the sketch, "
        f"{files['without sketch']} without; times are the server's own (its UI), not beeline's"
    )


def run(quick: bool = False, runs: int = 5):  # noqa: ANN201
    spark = spark_session()
    with tempfile.TemporaryDirectory() as home:
        service = service_for(Path(home), spark)
        try:
            setup = Setup(spark, service, quick)
            yield planning(setup, runs)
            yield queries(setup, quick, runs)
            yield tpch(spark, quick, runs)
        finally:
            from imp_core.catalog.embedded import stop_embedded

            _switch(spark, True)
            service.catalog.close()
            stop_embedded(service.settings)


__all__ = ["run"]

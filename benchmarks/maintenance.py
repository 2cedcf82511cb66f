"""Incremental (IMP) versus full maintenance (FM), the IMP paper's Section 8.2-8.4 experiments on our stack.

For each query and change size: commit a change to the Delta table (half random deletes, half inserts), then measure,
interleaved in the same run,

* **IMP**: read the change feed of the new versions and run the incremental engine from the saved state (joins of
  the delta with the other table run on Spark at the right version) -> sketch;
* **FM**: the capture on Spark at the new versions (the instrumented query that rebuilds sketch and state).

Both in process, Spark warm, state load and catalog commit excluded (measured separately in the whole-job numbers).
Every IMP result is checked against the FM sketch: a mismatch aborts the benchmark.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from benchmarks import data
from benchmarks.harness import Experiment, scaled
from imp_core.config import Optimizations, Settings
from imp_core.engine import frames
from imp_core.engine.pipeline import Pipeline
from imp_core.maintenance.changes import read_changes
from imp_core.plan.expr import kind_of_type
from imp_core.plan.sql import parse_query
from imp_core.sketch.partition import Partition, PartitionSet
from imp_core.sources.delta import VERSION, DeltaSource
from imp_core.spark.backend import SparkBackend
from imp_core.spark.bounds import equi_depth_bounds

BATCHES = [10, 50, 100, 500, 1000]


# the first engine's state (aggregation frames rewritten per batch, top-k re-sorted), kept for side-by-side runs
FIRST_ENGINE = Optimizations(agg_index=False, topk_index=False, join_index=False)


def spark_session():  # noqa: ANN201
    from imp_core.spark.session import get_spark

    return get_spark(Settings.from_env(spark_master="local[2]", shuffle_partitions=8))


class Setup:
    """One query over cached tables, with its pipeline state kept at the table's current version."""

    def __init__(self, spark, sql: str, tables: dict[str, Path], on: tuple[str, str], fragments: int,  # noqa: ANN001
                 opts: Optimizations | None = None, dialect: str = "spark") -> None:
        self.spark = spark
        self.sources = {n: DeltaSource(n, p) for n, p in tables.items()}
        for p in tables.values():
            data.reset(p)
        self.versions = {n: s.current_version() for n, s in self.sources.items()}
        schemas = {n: s.schema() for n, s in self.sources.items()}
        self.query = parse_query(sql, schemas, dialect)
        table, column = on
        kind = kind_of_type(schemas[table].field(column).type)
        source = self.sources[table]
        bounds = equi_depth_bounds(source.scan(spark, self.versions[table]), column, fragments, kind,
                                   source.column_stats(self.versions[table], column))
        self.partitions = PartitionSet((Partition(table, column, bounds, kind),))
        self.opts = opts or Optimizations()
        self.backend = SparkBackend(spark, self.sources, self.opts)
        pipe = self.pipeline()
        t0 = time.perf_counter()
        pipe.capture(self.backend, dict(self.versions))
        self.capture_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        pipe.warm_caches(self.backend, dict(self.versions))  # Bloom filters / small sides: a one-time cost
        self.caches_s = time.perf_counter() - t0
        self.blobs = pipe.state_blobs()
        self.sketch = pipe.sketch()
        self.state_mb = pipe.state_size_bytes() / 1e6
        self.next_id = {n: data.max_id(Path(s.path)) + 1 for n, s in self.sources.items() if "id" in schemas[n].names}

    def record_memory(self, exp: Experiment, label: str) -> None:
        """Paper 8.6: operator state (in memory and serialized), sketch bitset and bounds, after capture."""
        import json

        from imp_core.sketch.sketch import Sketch

        sketch = Sketch.from_global(self.partitions, self.sketch)
        exp.add(label, "state in memory (MB)", 0, self.state_mb, unit="MB")
        exp.add(label, "state serialized (MB)", 0, sum(len(b) for b in self.blobs.values()) / 1e6, unit="MB")
        exp.add(label, "sketch bitset (KB)", 0, sum(len(b) for b in sketch.bits(self.partitions).values()) / 1e3,
                unit="KB")
        exp.add(label, "bounds (KB)", 0, len(json.dumps(self.partitions.to_json(), default=str)) / 1e3, unit="KB")

    def pipeline(self) -> Pipeline:
        return Pipeline.configured(self.query.plan, self.partitions, self.opts)

    def commit_change(self, table: str, rows: int, seed: int, groups: int, delete_share: float = 0.5) -> dict:
        path = Path(self.sources[table].path)
        self.next_id[table] = data.change(path, rows, seed, groups, self.next_id[table], delete_share)
        new = dict(self.versions)
        new[table] = self.sources[table].current_version()
        return new

    def imp(self, target: dict[str, int]) -> tuple[float, Pipeline, int]:
        pipe = self.pipeline()
        pipe.load_state_blobs(self.blobs)
        t0 = time.perf_counter()
        reached = dict(self.versions)
        rows = 0
        for table in sorted(target):
            if target[table] == reached[table]:
                continue
            changes = read_changes(self.sources[table], self.query.plan, reached[table], target[table], self.opts)
            reached[table] = target[table]
            pipe.maintain_pass(table, frames.drop(changes, VERSION), self.backend, dict(reached),
                               netting=self.opts.netting)
            rows += changes.height
        return time.perf_counter() - t0, pipe, rows

    def fm(self, target: dict[str, int]) -> tuple[float, Pipeline]:
        pipe = self.pipeline()
        t0 = time.perf_counter()
        pipe.capture(self.backend, dict(target))
        return time.perf_counter() - t0, pipe

    def advance(self, target: dict[str, int], pipe: Pipeline) -> None:
        self.versions = dict(target)
        self.blobs = pipe.state_blobs()
        self.sketch = pipe.sketch()


def timed_imp(setup: Setup, target: dict[str, int], last: dict[str, Pipeline], key: str) -> Callable[[], float]:
    """One timed IMP run of ``setup`` to the table versions ``target``; its pipeline is kept in ``last[key]``."""
    def run_once() -> float:
        elapsed, pipe, _ = setup.imp(target)
        last[key] = pipe
        return elapsed
    return run_once


def timed_fm(setup: Setup, target: dict[str, int], last: dict[str, Pipeline], key: str) -> Callable[[], float]:
    """One timed full maintenance (FM) run of ``setup`` to ``target``; its pipeline is kept in ``last[key]``."""
    def run_once() -> float:
        elapsed, pipe = setup.fm(target)
        last[key] = pipe
        return elapsed
    return run_once


def imp_vs_fm(exp: Experiment, setup: Setup, table: str, batches: list[int], runs: int, groups: int,
              label: str = "", delete_share: float = 0.5) -> None:
    """Measure IMP and FM for each change size, interleaved; check IMP's sketch equals FM's."""
    for i, size in enumerate(batches):
        target = setup.commit_change(table, size, seed=1000 + i, groups=groups, delete_share=delete_share)
        last: dict[str, Pipeline] = {}
        case = f"{label}{size:,}" if label else f"{size:,} rows"
        exp.measure(case, {"IMP": timed_imp(setup, target, last, "imp"), "FM": timed_fm(setup, target, last, "fm")},
                    runs, x=size)
        imp_pipe, fm_pipe = last["imp"], last["fm"]
        if imp_pipe.sketch() != fm_pipe.sketch():
            raise AssertionError(f"{exp.name} {case}: IMP sketch differs from FM sketch")
        setup.advance(target, imp_pipe)


MEMORY = Experiment("memory", "Memory (paper 8.6): operator state after capture, sketch bitset and bounds, per query",
                    log_y=True, y_label="size", timed=False)


def q_groups(spark, quick: bool, runs: int) -> Experiment:  # noqa: ANN001
    rows = scaled(200_000 if quick else 10_000_000)
    variants = [(50, 3), (1000, 320), (5000, 1600), (500_000, 1600)]
    if quick:
        variants = [(5000, 1600)]
    exp = Experiment("q_groups", f"Q_groups: IMP vs FM, {rows:,} rows, 1,000 fragments, change of n rows "
                     f"(half deletes, half inserts)", ratios=[("FM", "IMP")], log_x=False, x_label="case",
                     y_label="seconds")
    batches = [1000] if quick else BATCHES
    for groups, threshold in variants:
        name = f"t1gb{groups}g_{rows}"
        path = data.base_table(name, rows, groups)
        sql = f"SELECT a, AVG(b) AS ab FROM {name} GROUP BY a HAVING AVG(c) < {threshold}"
        setup = Setup(spark, sql, {name: path}, (name, "a"), 1000)
        setup.record_memory(MEMORY, f"Q_groups {groups:,} groups")
        imp_vs_fm(exp, setup, name, batches, runs, groups, label=f"{groups:,} groups, n=")
        for r in exp.rows:
            r.x = None
    return exp


def breakeven(spark, quick: bool, runs: int) -> Experiment:  # noqa: ANN001
    rows = scaled(200_000 if quick else 10_000_000)
    groups = 5000
    name = f"t1gb{groups}g_{rows}"
    path = data.base_table(name, rows, groups)
    sql = f"SELECT a, AVG(b) AS ab FROM {name} GROUP BY a HAVING AVG(c) < 1600"
    setup = Setup(spark, sql, {name: path}, (name, "a"), 1000)
    shares = [0.01, 0.05] if quick else [0.001, 0.01, 0.02, 0.05, 0.1, 0.2]
    exp = Experiment("breakeven_groups", f"Break-even, Q_groups (5K groups, {rows:,} rows): change size as % of "
                     f"the table", ratios=[("FM", "IMP")], log_x=True, x_label="change rows", y_label="seconds")
    imp_vs_fm(exp, setup, name, [int(rows * s) for s in shares], max(3, runs - 2), groups)
    return exp


def joinsel(spark, quick: bool, runs: int) -> Experiment:  # noqa: ANN001
    rows = scaled(200_000 if quick else 10_000_000)
    groups = 5000
    big = f"t1gbjoin_{rows}"
    big_path = data.base_table(big, rows, groups)
    exp = Experiment("q_joinsel", f"Q_joinsel: IMP vs FM, {rows:,} x {rows:,} rows, change on the grouped table",
                     ratios=[("FM", "IMP")], log_y=True, y_label="seconds")
    batches = [1000] if quick else BATCHES
    for pct in ([5] if quick else [1, 5, 10]):
        helper = f"tjoinhelppercent{pct}_{rows}"
        helper_path = data.join_helper(helper, rows, groups, pct / 100)
        sql = (f"SELECT a, AVG(b) AS ab FROM {big} JOIN {helper} ON (a = ttid) WHERE b < 1000 "
               f"GROUP BY a HAVING AVG(c) < 1000")
        setup = Setup(spark, sql, {big: big_path, helper: helper_path}, (big, "a"), 1000)
        setup.record_memory(MEMORY, f"Q_joinsel {pct}%")
        imp_vs_fm(exp, setup, big, batches, runs, groups, label=f"{pct}% sel, n=")
    for r in exp.rows:
        r.x = None
    return exp


def q_join(spark, quick: bool, runs: int) -> Experiment:  # noqa: ANN001
    """Q_join (paper A.1.3, Fig. 11c/12c): 1-n joins of a grouped table with a helper of unique keys; every row of
    the grouped table finds exactly one partner (n = rows per join value: 20, 2K, 200K)."""
    rows = scaled(200_000 if quick else 10_000_000)
    helper = f"tjoinhelp_{rows}"
    helper_path = data.join_helper(helper, rows, rows, 1.0)
    # (groups, label, WHERE threshold on b, HAVING threshold on avg(c)) as in the paper's SQL
    variants = [(500_000, "1-20", 100_000, 100_000), (5000, "1-2K", 1000, 1000), (50, "1-200K", 10, 10)]
    if quick:
        variants = [(5000, "1-2K", 1000, 1000)]
    exp = Experiment("q_join", f"Q_join 1-n: IMP vs FM, {rows:,} x {rows:,} rows, change on the grouped table",
                     ratios=[("FM", "IMP")], y_label="seconds")
    batches = [1000] if quick else BATCHES
    for groups, label, b_max, c_max in variants:
        name = f"t1gb{groups}g_{rows}" if groups != 5000 else f"t1gbjoin_{rows}"
        path = data.base_table(name, rows, groups)
        sql = (f"SELECT a, avg(b) AS ab FROM (SELECT a AS a, b AS b, c AS c FROM {name} WHERE b < {b_max}) tt "
               f"JOIN {helper} ON (a = ttid) GROUP BY a HAVING avg(c) < {c_max}")
        setup = Setup(spark, sql, {name: path, helper: helper_path}, (name, "a"), 1000)
        setup.record_memory(MEMORY, f"Q_join {label}")
        imp_vs_fm(exp, setup, name, batches, runs, groups, label=f"{label}, n=")
    for r in exp.rows:
        r.x = None
    return exp


def joinsel_optimizations(spark, quick: bool, runs: int) -> Experiment:  # noqa: ANN001
    """Q_joinsel with and without the join optimizations (paper Fig. 13b/d): all on; Bloom filters and join-key
    push-down without the partner index (the paper's optimizations); none of them."""
    rows = scaled(200_000 if quick else 10_000_000)
    groups = 5000
    big = f"t1gbjoin_{rows}"
    big_path = data.base_table(big, rows, groups)
    exp = Experiment("joinsel_optimizations", f"Q_joinsel, IMP with and without the join optimizations, "
                     f"{rows:,} x {rows:,} rows", ratios=[("none", "all on"), ("none", "Bloom + keys")],
                     y_label="seconds")
    configs = {
        "all on": Optimizations(),
        "Bloom + keys": Optimizations(partner_index=False, small_side_in_memory=False),
        "none": Optimizations(bloom_filters=False, join_key_pushdown=False, small_side_in_memory=False,
                              partner_index=False),
    }
    for pct in ([5] if quick else [1, 5, 10]):
        helper = f"tjoinhelppercent{pct}_{rows}"
        helper_path = data.join_helper(helper, rows, groups, pct / 100)
        sql = (f"SELECT a, AVG(b) AS ab FROM {big} JOIN {helper} ON (a = ttid) WHERE b < 1000 "
               f"GROUP BY a HAVING AVG(c) < 1000")
        tables = {big: big_path, helper: helper_path}
        setups = {name: Setup(spark, sql, tables, (big, "a"), 1000, opts) for name, opts in configs.items()}
        first = setups["all on"]
        for name, setup in setups.items():
            exp.notes.append(f"- {pct}%, {name}: join caches built once after capture in {setup.caches_s:.1f} s")
        for i, size in enumerate([1000] if quick else [10, 100, 1000, 10_000]):
            target = first.commit_change(big, size, seed=5000 + i, groups=groups)
            for setup in setups.values():
                setup.versions = dict(first.versions)
            last: dict[str, Pipeline] = {}
            variants = {name: timed_imp(setups[name], target, last, name) for name in configs}
            exp.measure(f"{pct}% sel, n={size:,}", variants, runs, x=size)
            sketches = {name: last[name].sketch() for name in configs}
            if len({frozenset(v) for v in sketches.values()}) != 1:
                raise AssertionError("the join optimizations changed the sketch")
            for name, setup in setups.items():
                setup.advance(target, last[name])
    for r in exp.rows:
        r.x = None
    return exp


def q_having(spark, quick: bool, runs: int) -> Experiment:  # noqa: ANN001
    rows = scaled(200_000 if quick else 10_000_000)
    groups = 5000
    name = f"r500_{rows}"
    path = data.base_table(name, rows, groups)
    having = {
        1: "",
        2: "HAVING avg(c) < 1000",
        3: "HAVING avg(c) < 1000 AND avg(d) < 1200",
        10: "HAVING avg(c) < 1000 AND avg(d) < 1200 AND avg(e) > 0 AND avg(f) > 0 AND avg(g) > 0 AND avg(h) > 0 "
            "AND avg(i) > 0 AND avg(j) > 0",
    }
    exp = Experiment("q_having", f"Q_having: 1/2/3/10 aggregation functions, {rows:,} rows, 5K groups",
                     ratios=[("FM", "IMP")], y_label="seconds")
    for n, clause in ([(10, having[10])] if quick else having.items()):
        sql = f"SELECT a, avg(b) AS ab FROM {name} GROUP BY a {clause}"
        setup = Setup(spark, sql, {name: path}, (name, "a"), 1000)
        setup.record_memory(MEMORY, f"Q_having {n} aggs")
        imp_vs_fm(exp, setup, name, [1000] if quick else [10, 100, 1000], runs, groups, label=f"{n} aggs, n=")
    for r in exp.rows:
        r.x = None
    return exp


def q_sketch(spark, quick: bool, runs: int) -> Experiment:  # noqa: ANN001
    rows = scaled(200_000 if quick else 10_000_000)
    groups = 5000
    name = f"t1gbjoin_{rows}"
    path = data.base_table(name, rows, groups)
    helper = f"tjoinhelppercent5_{rows}"
    helper_path = data.join_helper(helper, rows, groups, 0.05)
    exp = Experiment("q_sketch", f"Q_sketch: number of fragments, {rows:,} rows, change of 1,000 rows",
                     ratios=[("FM", "IMP")], log_x=True, x_label="fragments", y_label="seconds")
    sql = (f"SELECT a, avg(b) AS ab FROM (SELECT a AS a, b AS b, c AS c FROM {name} WHERE b < 1000) tt "
           f"JOIN {helper} ON (a = ttid) GROUP BY a HAVING avg(c) < 1000")
    for frags in ([100] if quick else [10, 100, 1000, 5000]):
        setup = Setup(spark, sql, {name: path, helper: helper_path}, (name, "a"), frags)
        setup.record_memory(MEMORY, f"Q_sketch {frags} fragments")
        before = len(exp.rows)
        imp_vs_fm(exp, setup, name, [1000], runs, groups, label=f"{frags} fragments, n=")
        for r in exp.rows[before:]:
            r.x = frags
    return exp


def q_selpd(spark, quick: bool, runs: int) -> Experiment:  # noqa: ANN001
    """Selection push-down (paper Fig. 13c): delta = 2.5% of the table; the share of it passing the WHERE varies."""
    rows = scaled(200_000 if quick else 10_000_000)
    groups = 1000
    name = f"t1gb1000g_{rows}"
    path = data.base_table(name, rows, groups)
    exp = Experiment("q_selpd", f"Q_selpd: selection push-down on/off, change = 2.5% of {rows:,} rows",
                     ratios=[("IMP push-down off", "IMP push-down on")], log_x=False,
                     x_label="share of the change passing the selection", y_label="seconds")
    # b is ~ a * 1.25 + noise with a uniform in [0, 1000): b < t keeps about t / 1250 of the rows
    for share in ([0.1] if quick else [0.02, 0.1, 0.25, 0.5, 1.0]):
        threshold = round(1250 * share + (10_000 if share >= 1.0 else 0), 1)
        sql = f"SELECT a, avg(b) AS ab FROM {name} WHERE b < {threshold} GROUP BY a HAVING avg(c) < 300"
        on = Setup(spark, sql, {name: path}, (name, "a"), 1000)
        off = Setup(spark, sql, {name: path}, (name, "a"), 1000, Optimizations(selection_pushdown=False))
        target = on.commit_change(name, int(rows * 0.025), seed=int(share * 1000), groups=groups)
        off.versions = dict(on.versions)
        holder: dict[str, Pipeline] = {}
        variants = {"IMP push-down on": timed_imp(on, target, holder, "on"),
                    "IMP push-down off": timed_imp(off, target, holder, "off")}
        exp.measure(f"{share:.0%}", variants, runs, x=share)
        if holder["on"].sketch() != holder["off"].sketch():
            raise AssertionError("selection push-down changed the sketch")
    return exp


def sketch_sizes() -> Experiment:
    """Paper Fig. 18: size of a sketch (bitset) and of its partition's bounds by number of fragments."""
    import json

    from imp_core.sketch.sketch import Sketch

    exp = Experiment("sketch_sizes", "Sketch bitset and bounds size by number of fragments (paper Fig. 18)",
                     log_x=True, log_y=True, x_label="fragments", y_label="KB", timed=False)
    for n in (100, 200, 500, 1000, 2000, 5000, 10_000, 20_000, 100_000):
        parts = PartitionSet((Partition("t", "a", tuple(range(0, 10 * (n + 1), 10)), "int"),))
        full = Sketch.from_global(parts, range(n))
        exp.add(f"{n:,}", "sketch bitset (KB)", 0, sum(len(b) for b in full.bits(parts).values()) / 1e3, "KB", x=n)
        exp.add(f"{n:,}", "bounds as JSON (KB)", 0, len(json.dumps(parts.to_json())) / 1e3, "KB", x=n)
    return exp


def run(quick: bool = False, runs: int = 5):  # noqa: ANN201
    """Yield each experiment as soon as it is measured (the caller writes it), so a long run keeps what it did."""
    spark = spark_session()
    MEMORY.rows.clear()
    for fn in (q_groups, q_having, joinsel, q_join, joinsel_optimizations, q_sketch, q_selpd, breakeven):
        t0 = time.perf_counter()
        exp = fn(spark, quick, runs)
        print(f"   {exp.name}: {time.perf_counter() - t0:.0f} s", flush=True)
        yield exp
        if MEMORY.rows:  # written after each experiment, so a stopped run keeps the sizes measured so far
            yield MEMORY
    yield sketch_sizes()

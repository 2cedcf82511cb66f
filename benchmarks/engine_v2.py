"""Engine v2 side by side with the first engine (issue 19): the same harness, both engines in one run.

``python -m benchmarks --only engine_v2``. "v1" is the first engine's state (``IMP_OPTIMIZATIONS=-aggindex,-topkindex``:
aggregation state as whole frames rewritten per batch, top-k input re-sorted per batch), "v2" the keyed state
(docs/ARCHITECTURE.md, "Keyed state"). Experiments:

* ``engine_v2_batch``: the in-memory pipeline of ``benchmarks.engine`` (10M rows, 5K groups, 1,000 fragments), a
  batch of 10, 1,000 and 100K rows: v1, v2 and v2 with the change-feed read;
* ``engine_v2_groups``: Q_groups' aggregation driven directly (``benchmarks.group_state``) at 5K, 500K and 10M
  groups: 1,000-row batches, then capture, save and load times and state size (variants ``v2 save`` etc.), per
  engine;
* ``engine_v2_q18h``: TPC-H SF1 Q18h (the HAVING part of Q18, 1.5M groups) in memory over lineitem, 1,000-row
  batches (500 deletes of line items, 500 inserted copies);
* ``engine_v2_q_groups``: Q_groups with 5K groups through Spark and the Delta change feed, IMP v1, IMP v2 and FM
  interleaved (the paper's comparison, as ``benchmarks.maintenance``).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import polars as pl

from benchmarks import data, engine, group_state
from benchmarks.harness import SCALE, Experiment, scaled
from benchmarks.maintenance import FIRST_ENGINE, Setup, spark_session, timed_fm, timed_imp
from imp_core.engine.local import LocalBackend
from imp_core.engine.pipeline import Pipeline
from imp_core.engine.schema import MULT
from imp_core.plan.sql import parse_query
from imp_core.sketch.partition import Partition, PartitionSet

Q18H = "SELECT l_orderkey, sum(l_quantity) AS qty FROM lineitem GROUP BY l_orderkey HAVING sum(l_quantity) > 300"


def _apply_and_undo(pipe: Pipeline, table: str, batch: pl.DataFrame) -> Callable[[], float]:
    """One timed run of ``batch`` through ``pipe``, then its inverse (untimed): every run starts from one state."""
    undo = batch.with_columns(-pl.col(MULT))

    def run_once() -> float:
        t = time.perf_counter()
        pipe.maintain_pass(table, batch, None, {table: 1})  # type: ignore[arg-type]
        elapsed = time.perf_counter() - t
        pipe.maintain_pass(table, undo, None, {table: 1})  # type: ignore[arg-type]
        return elapsed
    return run_once


def batch_experiment(quick: bool, runs: int) -> Experiment:
    rows = scaled(200_000 if quick else 10_000_000)
    groups, fragments = 5000, 1000
    table = engine.table(rows, groups)
    pipes = {v: engine.pipeline_for(table, groups, fragments, v2=v == "v2") for v in ("v1", "v2")}
    exp = Experiment("engine_v2_batch", f"Engine v1 vs v2: in-memory pipeline, {rows:,} rows, {groups:,} groups, "
                     f"{fragments:,} fragments, time per change batch", ratios=[("v1", "v2")], log_x=True,
                     x_label="change rows", y_label="seconds per batch")
    with tempfile.TemporaryDirectory() as tmp:
        for size in [10, 1000] if quick else [10, 1000, 100_000]:
            batch = engine.change_batch(table, size, seed=size)
            with_cdf = engine.batch_variants(pipes["v2"], batch, engine.cdf_source(batch, Path(tmp)))["with CDF read"]
            exp.measure(f"{size:,} rows", {"v1": _apply_and_undo(pipes["v1"], "t", batch),
                                           "v2": _apply_and_undo(pipes["v2"], "t", batch),
                                           "v2 with CDF read": with_cdf}, runs, x=size)
    for case in exp.cases():
        size = next(r.x for r in exp.rows if r.case == case)
        med = sorted(exp.values(case, "v2"))[runs // 2]
        exp.notes.append(f"- {case}, v2: {size / med:,.0f} delta rows/s")  # type: ignore[operator]
    return exp


def groups_experiment(quick: bool, batches: int) -> Experiment:
    sizes = [5_000, 50_000] if quick else [5_000, 500_000, 10_000_000]
    exp = Experiment("engine_v2_groups", "Engine v1 vs v2: Q_groups' aggregation alone, 1,000-row batches (half "
                     "deletes, half inserts, 2% new groups), by number of groups", ratios=[("v1", "v2")],
                     log_y=True, y_label="seconds per batch", warmup=False)
    for n in sizes:
        n = max(1000, int(n * SCALE))
        got = group_state.compare(n, 1000, batches)
        for state, engine_name in (("frames", "v1"), ("keyed", "v2")):
            r = got[state]
            for i, t in enumerate(r["times"]):  # type: ignore[arg-type]
                exp.add(f"{n:,} groups", engine_name, i, t)
            # the state's own figures, one measurement each: capture, save and load times, groups and F_g in memory
            for what, key, unit in (("capture", "capture", "s"), ("save", "save", "s"), ("load", "load", "s"),
                                    ("in memory", "memory", "MB"), ("saved", "mb", "MB")):
                exp.add(f"{n:,} groups", f"{engine_name} {what}", 0, float(r[key]), unit)  # type: ignore[arg-type]
    return exp


def q18h_experiment(quick: bool, runs: int) -> Experiment:
    root = data.tpch(round((0.1 if quick else 1.0) * SCALE, 3) or 0.01)
    from deltalake import DeltaTable

    lineitem = pl.from_arrow(DeltaTable(str(root / "lineitem")).to_pyarrow_dataset().to_table(
        columns=["l_orderkey", "l_linenumber", "l_quantity"]))
    assert isinstance(lineitem, pl.DataFrame)
    q = parse_query(Q18H, {"lineitem": lineitem.to_arrow().schema})
    keys = lineitem.get_column("l_orderkey").to_numpy()
    bounds = tuple(int(x) for x in np.unique(np.quantile(keys, np.linspace(0, 1, 1001)).astype(np.int64)))
    parts = PartitionSet((Partition("lineitem", "l_orderkey", bounds, "int"),))
    pipes = {}
    for v in ("v1", "v2"):
        pipes[v] = Pipeline(q.plan, parts, agg_index=v == "v2", topk_index=v == "v2")
        pipes[v].capture(LocalBackend(lambda name, version: lineitem), {"lineitem": 0})
    groups = lineitem.get_column("l_orderkey").n_unique()
    exp = Experiment("engine_v2_q18h", f"Engine v1 vs v2: TPC-H Q18h in memory, lineitem {lineitem.height:,} rows, "
                     f"{groups:,} groups, time per batch", ratios=[("v1", "v2")], log_x=True,
                     x_label="change rows", y_label="seconds per batch")
    rng = np.random.default_rng(18)
    for size in [10, 1000] if quick else [10, 1000, 10_000]:
        gone = lineitem[rng.choice(lineitem.height, size // 2, replace=False)]
        new = lineitem[rng.choice(lineitem.height, size - size // 2, replace=False)].with_columns(
            (pl.col("l_linenumber") + 1000).alias("l_linenumber"))
        batch = pl.concat([gone.with_columns(pl.lit(-1, dtype=pl.Int64).alias(MULT)),
                           new.with_columns(pl.lit(1, dtype=pl.Int64).alias(MULT))])
        exp.measure(f"{size:,} rows", {v: _apply_and_undo(p, "lineitem", batch) for v, p in pipes.items()}, runs,
                    x=size)
    return exp


def q_groups_experiment(quick: bool, runs: int) -> Experiment:
    spark = spark_session()
    rows, groups = scaled(200_000 if quick else 10_000_000), 5000
    name = f"t1gb{groups}g_{rows}"
    path = data.base_table(name, rows, groups)
    sql = f"SELECT a, AVG(b) AS ab FROM {name} GROUP BY a HAVING AVG(c) < 1600"
    v2 = Setup(spark, sql, {name: path}, (name, "a"), 1000)
    v1 = Setup(spark, sql, {name: path}, (name, "a"), 1000, opts=FIRST_ENGINE)
    exp = Experiment("engine_v2_q_groups", f"Engine v1 vs v2: Q_groups, {rows:,} rows, {groups:,} groups, 1,000 "
                     f"fragments, IMP (change-feed read + engine) vs FM (Spark)",
                     ratios=[("FM", "IMP v2"), ("FM", "IMP v1")], log_x=True, x_label="change rows")
    for i, size in enumerate([10, 1000]):
        target = v2.commit_change(name, size, seed=1000 + i, groups=groups)
        last: dict[str, Pipeline] = {}
        exp.measure(f"n={size:,}", {"IMP v1": timed_imp(v1, target, last, "v1"),
                                    "IMP v2": timed_imp(v2, target, last, "v2"),
                                    "FM": timed_fm(v2, target, last, "fm")}, runs, x=size)
        if not last["v1"].sketch() == last["v2"].sketch() == last["fm"].sketch():
            raise AssertionError(f"engine_v2_q_groups n={size}: the sketches differ")
        v1.advance(target, last["v1"])
        v2.advance(target, last["v2"])
    return exp


def run(quick: bool = False, runs: int = 5):  # noqa: ANN201
    """Yields each experiment when done (the caller writes its files), so a long run keeps what it measured."""
    yield batch_experiment(quick, runs)
    yield groups_experiment(quick, 5 if quick else 20)
    yield q18h_experiment(quick, runs)
    yield q_groups_experiment(quick, runs)


__all__ = ["run"]

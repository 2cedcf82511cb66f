"""Top-k under deletions with bounded buffers (IMP paper 8.4.3, Fig. 14/15).

``Q_top-k`` = ``SELECT a, avg(b) AS ab FROM R GROUP BY a ORDER BY a LIMIT 10`` over 50,000 rows in 5,000 groups
(~10 rows per group), sketch on ``a``. Updates delete 20 rows each, under the paper's strategies: always the 2
minimal groups; random rows; and R:M = 2:1 / 4:1 mixes (R random updates, then M updates deleting the 2 minimal
groups). The top-k operator keeps a buffer of the best l = 20 / 50 / 100 groups (or all); when deletions exhaust it,
maintenance recaptures (FM) and the buffer refills. Per configuration: total time over the updates, number of
recaptures, and the state size after each update.
"""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa

from benchmarks import data
from benchmarks.harness import Experiment, scaled
from benchmarks.maintenance import Setup, spark_session
from imp_core.config import Optimizations
from imp_core.errors import BufferExhaustedError


def _table(path, rows: int, groups: int) -> None:  # noqa: ANN001
    rng = np.random.default_rng(11)
    a = rng.integers(0, groups, rows).astype(np.int64)
    data.write(path, pa.table({"id": np.arange(rows, dtype=np.int64), "a": a,
                               "b": rng.normal(100, 10, rows).round(2)}), files=4)


def run(quick: bool = False, runs: int = 5) -> list[Experiment]:
    spark = spark_session()
    rows, groups = (scaled(10_000), 1_000) if quick else (scaled(50_000), 5_000)
    updates = 15 if quick else 500
    path = data.DATA / f"topk_{rows}"
    if not (path / "_delta_log").exists():
        data.DATA.mkdir(parents=True, exist_ok=True)
        _table(path, rows, groups)
    name = path.name
    sql = f"SELECT a, avg(b) AS ab FROM {name} GROUP BY a ORDER BY a LIMIT 10"
    exp = Experiment("topk_buffers", f"Top-k (k=10) under deletions of 20 rows per update, {rows:,} rows, "
                     f"{groups:,} groups: total time of {updates} updates", log_y=True, y_label="seconds (total)",
                     timed=False)
    memory = Experiment("topk_memory", "Top-k state size (MB) after the updates, by buffer size", log_y=False,
                        y_label="MB", timed=False)
    per_update = Experiment("topk_update", f"Top-k (k=10): maintenance time per update (IMP, or FM when the buffer ran "
                            f"out), {updates} updates of 20 deleted rows", log_y=True, y_label="seconds per update",
                            warmup=False)
    strategies = ["minimal", "random", "2:1", "4:1"] if not quick else ["2:1"]
    for strategy in strategies:
        for buffer in ((20, 0) if quick else (20, 50, 100, 0)):
            label = f"l={buffer}" if buffer else "all"
            setup = Setup(spark, sql, {name: path}, (name, "a"), 100, Optimizations(topk_buffer=buffer))
            source = setup.sources[name]
            rng = np.random.default_rng(3)
            total = 0.0
            recaptures = 0
            for u in range(updates):
                from deltalake import DeltaTable

                dt = DeltaTable(str(path))
                live = dt.to_pyarrow_dataset().to_table(columns=["id", "a"])
                if live.num_rows == 0:
                    break
                minimal_turn = strategy == "minimal" or (
                    ":" in strategy and u % (int(strategy.split(":")[0]) + 1) >= int(strategy.split(":")[0]))
                if minimal_turn:
                    smallest = np.unique(live.column("a").to_numpy())[:2]
                    dt.delete(f"a IN ({', '.join(str(int(x)) for x in smallest)})")
                else:
                    ids = rng.choice(live.column("id").to_numpy(), min(20, live.num_rows), replace=False)
                    dt.delete(f"id IN ({', '.join(str(int(x)) for x in ids)})")
                target = dict(setup.versions)
                target[name] = source.current_version()
                t0 = time.perf_counter()
                try:
                    _, pipe, _ = setup.imp(target)
                except BufferExhaustedError:
                    _, pipe = setup.fm(target)
                    recaptures += 1
                elapsed = time.perf_counter() - t0
                total += elapsed
                per_update.add(strategy, label, u, elapsed)
                setup.advance(target, pipe)
            exp.add(strategy, label, 0, total, recaptures=recaptures)
            exp.notes.append(f"- {strategy}, {label}: {recaptures} recaptures (buffer exhausted)")
            pipe = setup.pipeline()
            pipe.load_state_blobs(setup.blobs)
            memory.add(strategy, label, 0, pipe.state_size_bytes() / 1e6, unit="MB")
            data.reset(path)
    exp.notes.append("- one run per configuration (each is a sequence of updates); `recaptures` in the CSV")
    return [exp, per_update, memory]

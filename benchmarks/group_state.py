"""Aggregation state, whole frames vs keyed, side by side: cost of a batch by number of groups (issue 19).

``python -m benchmarks.group_state [--groups 5000 500000 10000000] [--batches 20] [--rows 1000]`` prints the figures
(the before/after table of docs/BENCHMARKS.md). The operator is Q_groups' aggregation, ``SELECT g, SUM(v), COUNT(*)
FROM t GROUP BY g`` with 100 range fragments on ``g``, driven directly: a capture of ``2 x groups`` rows, then
batches of ``rows`` changed rows (half deletions of existing rows, half insertions, into random groups; about one in
50 insertions opens a new group and one in 50 deletions empties a group). Reported per state: median (min-max)
seconds per batch, capture, save and load seconds, saved size, the state's size in memory after the capture (groups
and F_g) and the process's peak memory (with the benchmark's own input). Both states must give
the same output on every batch (checked).
"""

from __future__ import annotations

import argparse
import gc
import resource
import statistics
import time

import numpy as np
import polars as pl
import pyarrow as pa

from benchmarks.harness import print_header, print_row, spread
from imp_core.engine.operators.aggregation import Aggregation
from imp_core.engine.schema import MULT, frag_col
from imp_core.plan.expr import INT, AggCall, Col

FRAGMENTS = 100


def _op(keyed: bool) -> Aggregation:
    aggs = (("s", AggCall("sum", Col("v", INT), pa.int64())), ("c", AggCall("count", None, pa.int64())))
    return Aggregation("aggregation@r", (("g", Col("g", INT)),), aggs, {"g": pl.Int64}, keyed=keyed)


def _frame(g: np.ndarray, v: np.ndarray, mult: np.ndarray, groups: int) -> pl.DataFrame:
    frag = np.minimum(g * FRAGMENTS // max(groups, 1), FRAGMENTS - 1).astype(np.uint32)
    return pl.DataFrame({"g": g.copy(), "v": v.copy(), MULT: mult, frag_col(0): frag})  # the caller reuses g, v


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def batches(groups: int, rows: int, count: int, seed: int = 11) -> tuple[pl.DataFrame, list[pl.DataFrame]]:
    """The capture's input and ``count`` batches, valid against each other (deletions of rows that exist)."""
    rng = np.random.default_rng(seed)
    g = np.repeat(np.arange(groups, dtype=np.int64), 2)
    v = rng.integers(0, 1000, g.size).astype(np.int64)
    start = _frame(g, v, np.ones(g.size, dtype=np.int64), groups)
    out = []
    half = rows // 2
    for _ in range(count):
        idx = rng.choice(g.size, half, replace=False)
        new_g = rng.integers(0, groups, half).astype(np.int64)
        fresh = rng.random(half) < 0.02
        new_g[fresh] = groups + rng.integers(0, groups, int(fresh.sum()))  # new groups beyond the captured ones
        new_v = rng.integers(0, 1000, half).astype(np.int64)
        out.append(_frame(np.concatenate([g[idx], new_g]), np.concatenate([v[idx], new_v]),
                          np.concatenate([-np.ones(half, dtype=np.int64), np.ones(half, dtype=np.int64)]), groups))
        g[idx], v[idx] = new_g, new_v
    return start, out


def compare(groups: int, rows: int, count: int, states: tuple[str, ...] = ("frames", "keyed")
            ) -> dict[str, dict[str, float]]:
    """Both states captured from the same input, then fed the same batches alternately (each batch timed per
    state); their outputs must agree on every batch."""
    start, deltas = batches(groups, rows, count)
    gc.collect()
    ops = {name: _op(name == "keyed") for name in states}
    out: dict[str, dict[str, float]] = {}
    for name, op in ops.items():
        t0 = time.perf_counter()
        op.bootstrap(op.layout.of_delta(start))
        out[name] = {"capture": time.perf_counter() - t0, "memory": op.memory_bytes() / 1e6}
    del start
    times: dict[str, list[float]] = {name: [] for name in ops}
    for d in deltas:
        seen = None
        for name, op in ops.items():
            t0 = time.perf_counter()
            result = op.process(d)
            times[name].append(time.perf_counter() - t0)
            result = result.sort(["g", MULT])
            assert seen is None or seen.equals(result), "the two states disagree"
            seen = result
    for name, op in ops.items():
        t0 = time.perf_counter()
        blob = op.state_to_bytes()
        save = time.perf_counter() - t0
        fresh = _op(name == "keyed")
        t0 = time.perf_counter()
        fresh.load_state(blob)
        out[name].update(median=statistics.median(times[name]), min=min(times[name]), max=max(times[name]),
                         times=times[name], save=save, load=time.perf_counter() - t0, mb=len(blob) / 1e6)  # type: ignore[dict-item]
        del fresh
    for name in out:
        out[name]["rss"] = _rss_mb()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.group_state", description=__doc__)
    p.add_argument("--groups", type=int, nargs="*", default=[5_000, 500_000])
    p.add_argument("--rows", type=int, default=1_000)
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--states", nargs="*", choices=["frames", "keyed"], default=["frames", "keyed"])
    args = p.parse_args(argv)
    print_header(["groups", "state", "rows per batch", "batches", "s per batch, median (min-max)", "capture s",
                  "save s", "load s", "saved MB", "in memory MB", "peak RSS MB (both states and the input)"])
    for n in args.groups:
        for state, r in compare(n, args.rows, args.batches, tuple(args.states)).items():
            print_row(f"{n:,}", state, f"{args.rows:,}", args.batches, spread(r), f"{r['capture']:.2f}",
                      f"{r['save']:.2f}", f"{r['load']:.2f}", f"{r['mb']:.1f}", f"{r['memory']:.1f}", f"{r['rss']:.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

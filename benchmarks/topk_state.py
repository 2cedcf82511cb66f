"""Top-k state, old vs indexed, side by side: time per 1,000-row batch by input state size (issue 19).

``python -m benchmarks.topk_state [--sizes 10000 1000000] [--batches 30]`` prints the figures (it writes no files;
``engine_v2`` records the engines side by side in docs/bench). The operator is the
nightly benchmark's top-10 sketch, ``SELECT a, b FROM t ORDER BY b DESC LIMIT 10`` (fragments on ``a``), driven
directly: a capture of ``n`` rows, then batches updating 500 random rows (500 deletions + 500 insertions). The
``top-heavy`` workload also deletes the 10 best rows in every batch (every batch changes the answer; the indexed
head runs out of rows every ~50 batches and is refilled from the rest). Reported: median (min-max) seconds per
batch, capture time and saved state size.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import polars as pl

from benchmarks.harness import print_header, print_row, spread
from imp_core.engine.operators.topk import TopKOp
from imp_core.engine.schema import MULT, frag_col
from imp_core.plan.expr import FLOAT, Col
from imp_core.plan.nodes import SortKey

SCHEMA = {"a": pl.Int64, "b": pl.Float64}
FRAGMENTS = 100
GROUPS = 5_000


def _frame(a: np.ndarray, b: np.ndarray, mult: np.ndarray) -> pl.DataFrame:
    frag = (a * FRAGMENTS // GROUPS).astype(np.uint32)
    return pl.DataFrame({"a": a, "b": b, MULT: mult, frag_col(0): frag})


def _op(index: bool) -> TopKOp:
    return TopKOp("topk@r", (SortKey(Col("b", FLOAT), descending=True),), 10, SCHEMA, index=index)


def measure(n: int, index: bool, batches: int, top_heavy: bool, seed: int = 7) -> dict[str, object]:
    """Capture ``n`` rows, then time ``batches`` batches of 1,000 changed rows."""
    rng = np.random.default_rng(seed)
    a = rng.integers(0, GROUPS, n).astype(np.int64)
    b = rng.normal(100, 10, n).round(4)
    op = _op(index)
    t0 = time.perf_counter()
    op.process(_frame(a, b, np.ones(n, dtype=np.int64)))
    capture = time.perf_counter() - t0
    times = []
    for _ in range(batches):
        if top_heavy:
            best = np.argpartition(-b, 10)[:10]
            rest = rng.choice(n, 500, replace=False)
            idx = np.unique(np.concatenate([best, rest]))[:500]
        else:
            idx = rng.choice(n, 500, replace=False)
        new_a = rng.integers(0, GROUPS, idx.size).astype(np.int64)
        new_b = rng.normal(100, 10, idx.size).round(4)
        d = _frame(np.concatenate([a[idx], new_a]), np.concatenate([b[idx], new_b]),
                   np.concatenate([-np.ones(idx.size, dtype=np.int64), np.ones(idx.size, dtype=np.int64)]))
        a[idx], b[idx] = new_a, new_b
        t0 = time.perf_counter()
        op.process(d)
        times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    blob = op.state_to_bytes()
    save = time.perf_counter() - t0
    # the answer must be the same: the top-10 values of the final b
    out = op.output_relation()
    got = sorted(np.repeat(out.get_column("b").to_numpy(), out.get_column(MULT).to_numpy()).tolist(), reverse=True)
    assert got[:10] == np.sort(b)[::-1][:10].tolist(), "wrong top-10"
    return {"median": statistics.median(times), "mean": statistics.fmean(times), "min": min(times),
            "max": max(times), "capture": capture,
            "save": save, "bytes": len(blob)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.topk_state", description=__doc__)
    p.add_argument("--sizes", type=int, nargs="*", default=[10_000, 1_000_000])
    p.add_argument("--batches", type=int, default=30)
    p.add_argument("--workloads", nargs="*", choices=["random", "top-heavy"], default=["random", "top-heavy"])
    p.add_argument("--states", nargs="*", choices=["old", "indexed"], default=["old", "indexed"])
    args = p.parse_args(argv)
    print_header(["workload", "input rows", "state", "batches", "s per 1,000-row batch, median (min-max)", "mean",
                  "capture s", "save s", "state MB"])
    for workload in args.workloads:
        for n in args.sizes:
            for state in args.states:
                r = measure(n, state == "indexed", args.batches, workload == "top-heavy")
                print_row(workload, f"{n:,}", state, args.batches, spread(r), f"{r['mean']:.4f}", f"{r['capture']:.2f}",
                          f"{r['save']:.2f}", f"{int(r['bytes']) / 1e6:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

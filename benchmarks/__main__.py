"""``python -m benchmarks [--quick] [--only NAME ...] [--runs N]``: run the benchmark suite.

Writes docs/bench/<experiment>.csv and .png and regenerates the tables in docs/BENCHMARKS.md. ``make bench`` runs
everything at full scale (about six hours on 2 cores: TPC-H about 40 min, the microbenchmarks about 1.5 h, top-k
about 45 min, the strategies about 2.5 h, of which the mixed workload's grid takes 30 min and its 1,000-operation
case 1.5 h); ``make bench-quick`` runs every experiment at a small scale.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time

from benchmarks import harness

SUITES = ["engine", "skipping", "floor", "skew", "mixed_layout", "maintenance", "tpch", "topk", "strategies",
          "lakehouse", "nightly", "engine_v2", "tpch22", "scale", "state_store", "state_parts", "freshness"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    p.add_argument("--quick", action="store_true", help="small scale, for CI smoke tests and a first look")
    p.add_argument("--only", nargs="*", choices=SUITES, help="run only these suites")
    p.add_argument("--runs", type=int, default=None, help="measured runs per case (default 5, quick 3)")
    args = p.parse_args(argv)
    runs = args.runs or (3 if args.quick else 5)
    harness.QUICK = args.quick
    for name in args.only or SUITES:
        module = importlib.import_module(f"benchmarks.{name}")
        t0 = time.perf_counter()
        print(f"== {name} ({'quick' if args.quick else 'full'}, {runs} runs)", flush=True)
        for exp in module.run(quick=args.quick, runs=runs):
            exp.write()
            print(exp.markdown(), flush=True)
            print(flush=True)
        print(f"== {name} done in {time.perf_counter() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``python -m benchmarks [--quick] [--only NAME ...] [--runs N] [--report]``: run the benchmark suite.

Each suite (``benchmarks/registry.py``) writes docs/bench/<experiment>.csv, .json and .png, and docs/BENCHMARKS.md is
regenerated from the CSVs after every experiment. ``make bench`` runs every suite at full scale (about ten hours on 2
cores, the durations in the registry); ``make bench-quick`` runs every suite at a small scale; ``--report`` only
regenerates the document from the CSVs (``make bench-report``).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time

from benchmarks import harness, report
from benchmarks.registry import SUITES as REGISTRY

SUITES = [s.name for s in REGISTRY]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    p.add_argument("--quick", action="store_true", help="small scale, for CI smoke tests and a first look")
    p.add_argument("--only", nargs="*", choices=SUITES, help="run only these suites")
    p.add_argument("--runs", type=int, default=None, help="measured runs per case (default 5, quick 3)")
    p.add_argument("--report", action="store_true", help="only regenerate docs/BENCHMARKS.md from docs/bench/*.csv")
    args = p.parse_args(argv)
    if args.report:
        report.refresh()
        print(f"regenerated {harness.DOC} from {harness.OUT}/*.csv")
        return 0
    runs = args.runs or (3 if args.quick else 5)
    harness.QUICK = args.quick
    for name in args.only or SUITES:
        module = importlib.import_module(f"benchmarks.{name}")
        t0 = time.perf_counter()
        print(f"== {name} ({'quick' if args.quick else 'full'}, {runs} runs)", flush=True)
        for exp in module.run(quick=args.quick, runs=runs):
            exp.write()
            report.refresh()
            print(exp.markdown(), flush=True)
            print(flush=True)
        print(f"== {name} done in {time.perf_counter() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

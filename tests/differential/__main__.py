"""The long differential run without pytest: ``python -m tests.differential --streams 2000 --jobs 2``.

Each job is a process with its own IMP home (embedded catalog) and Spark session that runs every ``jobs``-th
stream from ``--seed``; the parent prints the summary (streams, checks, differences) and every difference's
reproduction, and exits 1 if there was one. Runs for hours at 2,000 streams; ``--streams 8`` is the CI run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

SUMMARY = "DIFFERENTIAL "


def _guarded(harness: Any, seed: int) -> Any:
    """One stream's outcome; an exception the harness does not classify (a crash) is a difference of that stream,
    so that one bad stream neither ends the job nor hides the streams after it."""
    from imp_core.errors import first_line
    from tests.differential.generate import draw_stream
    from tests.differential.run import Difference, Outcome

    stream = draw_stream(seed)
    try:
        return harness.run(stream)
    except Exception as e:  # noqa: BLE001 - reported as the stream's difference
        return Outcome(stream, differences=[Difference(-1, "-", "crash", f"{type(e).__name__}: {first_line(e)}")])


def _worker(first: int, count: int, job: int, jobs: int, master: str) -> int:
    from dataclasses import replace

    from imp_core.catalog.embedded import stop_embedded
    from imp_core.config import Settings
    from imp_core.maintenance.service import SketchService
    from imp_core.spark.session import get_spark
    from tests.differential.run import Harness, summary

    with tempfile.TemporaryDirectory(prefix=f"imp-differential-{job}-") as tmp:
        settings = Settings.from_env({}, home=Path(tmp) / "home", spark_master=master, shuffle_partitions=2)
        spark = get_spark(settings)
        memory = SketchService(settings, spark=spark)
        outside = SketchService(replace(settings, state_budget=0), catalog=memory.catalog, spark=spark)
        harness = Harness(memory, outside, Path(tmp) / "tables")
        outcomes = []
        try:
            for seed in range(first + job, first + count, jobs):
                outcome = _guarded(harness, seed)
                outcomes.append(outcome)
                print(
                    f"seed {seed}: {len(outcome.differences)} differences, {outcome.steps} checks, "
                    f"{outcome.seconds:.1f} s ("
                    + ", ".join(f"{k} {v:.1f}" for k, v in outcome.timings.most_common(4))
                    + ")"
                    + (f" (not sketchable: {outcome.skipped})" if outcome.skipped else ""),
                    flush=True,
                )
                if outcome.differences:
                    print(outcome.report(), flush=True)
        finally:
            memory.close()
            spark.stop()
            stop_embedded(settings)
        print(summary(outcomes), flush=True)
        totals = {
            "streams": len(outcomes),
            "skipped": sum(o.skipped is not None for o in outcomes),
            "checks": sum(o.steps for o in outcomes),
            "differences": sum(len(o.differences) for o in outcomes),
            "failed_seeds": [o.stream.seed for o in outcomes if o.differences],
        }
        print(SUMMARY + json.dumps(totals), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.differential", description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0, help="seed of the first stream")
    parser.add_argument("--jobs", type=int, default=1, help="processes (each with its own Spark and catalog)")
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    master = "local[1]" if args.jobs > 1 else "local[2]"
    if args.worker is not None:
        return _worker(args.seed, args.streams, args.worker, args.jobs, master)
    t0 = time.perf_counter()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.differential",
                "--streams",
                str(args.streams),
                "--seed",
                str(args.seed),
                "--jobs",
                str(args.jobs),
                "--worker",
                str(j),
            ],
            stdout=subprocess.PIPE,
            text=True,
            env=dict(os.environ),
        )
        for j in range(args.jobs)
    ]
    totals = {"streams": 0, "skipped": 0, "checks": 0, "differences": 0, "failed_seeds": []}
    lock = threading.Lock()

    def relay(j: int, proc: subprocess.Popen[str]) -> None:  # every job's lines as they come (a full pipe stalls it)
        assert proc.stdout is not None
        for line in proc.stdout:
            with lock:
                if line.startswith(SUMMARY):
                    for k, v in json.loads(line[len(SUMMARY) :]).items():
                        totals[k] += v
                else:
                    print(f"[job {j}] {line}", end="", flush=True)
        proc.wait()

    readers = [threading.Thread(target=relay, args=(j, proc)) for j, proc in enumerate(procs)]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join()
    failed = any(p.returncode for p in procs)
    print(
        f"differential: {totals['streams']} streams ({totals['skipped']} not sketchable), {totals['checks']} "
        f"checks, {totals['differences']} differences (seeds {sorted(totals['failed_seeds'])}), "
        f"{time.perf_counter() - t0:.0f} s" + (", a job failed" if failed else "")
    )
    return 1 if totals["differences"] or failed else 0


if __name__ == "__main__":
    sys.exit(main())

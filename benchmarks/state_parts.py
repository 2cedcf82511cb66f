"""In-memory state saved and loaded whole or streamed in parts (issue 38, "save and load streamed in chunks").

``python -m benchmarks --only state_parts``: Q_groups' keyed aggregation (``benchmarks.group_state``) captured over
``2 x groups`` rows, then its state saved and loaded, each run in a fresh process per way: as one self-contained
blob (``state_to_bytes``), and as the catalog stores it, frames of at
least ``PART_FROM`` written to a sink part by part (here files in a temporary folder, standing in for the catalog's
``state_chunk`` rows) and read back one at a time. Reported: seconds, and the process's peak RSS above its RSS before
the step (sampled every 2 ms), for the save and for the load.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.harness import Experiment

GROUPS = 10_000_000
WAYS = {"blob": "one blob", "parts": "parts"}


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _Peak:
    """Time and peak RSS above the start of a ``with`` block."""

    def __enter__(self) -> _Peak:
        self.base = self.peak = _rss()
        self._on = True
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        self.t0 = time.perf_counter()
        return self

    def _sample(self) -> None:
        while self._on:
            self.peak = max(self.peak, _rss())
            time.sleep(0.002)

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.t0
        self._on = False
        self._thread.join()
        self.above = (max(self.peak, _rss()) - self.base) / 1e6


def child(groups: int, way: str) -> dict[str, Any]:
    """One save and one load of a fresh state (run in its own process, so peaks are its own)."""
    from benchmarks.group_state import _op, batches

    start, _ = batches(groups, 1000, 0)
    op = _op(True)
    op.bootstrap(op.layout.of_delta(start))
    del start
    gc.collect()
    folder = Path(tempfile.mkdtemp(prefix="imp-parts-"))
    fresh = _op(True)
    if way == "blob":
        with _Peak() as save:
            blob = op.state_to_bytes()
        stored = len(blob)
        gc.collect()
        with _Peak() as load:
            fresh.load_state(blob)
    else:
        def sink(digest: str, data: bytes) -> None:
            (folder / digest).write_bytes(data)

        with _Peak() as save:
            blob, _ = op.saved_state(sink)
        stored = len(blob) + sum(p.stat().st_size for p in folder.iterdir())
        gc.collect()
        with _Peak() as load:
            fresh.load_state(blob, fetch=lambda d: (folder / d).read_bytes())
    assert fresh.canonical()["groups"].equals(op.canonical()["groups"]), "the loaded state differs"
    for p in folder.iterdir():
        p.unlink()
    folder.rmdir()
    return {"save": save.seconds, "load": load.seconds, "save_mb": save.above, "load_mb": load.above,
            "state_mb": op.state_size_bytes() / 1e6, "stored_mb": stored / 1e6}


def run(quick: bool = False, runs: int = 5) -> Iterator[Experiment]:
    groups = GROUPS if not quick else 50_000
    exp = Experiment("state_parts", f"Keyed aggregation state of {groups:,} groups saved and loaded as one blob or "
                                    f"streamed in parts, a fresh process per run (seconds; MB = peak RSS above the "
                                    f"step's start)", warmup=False, y_label="seconds or MB")
    last: dict[str, dict[str, Any]] = {}
    root = Path(__file__).resolve().parent.parent
    for i in range(1, runs + 1):
        for way, label in WAYS.items():
            done = subprocess.run([sys.executable, "-m", "benchmarks.state_parts", str(groups), way],
                                  capture_output=True, text=True, check=True, cwd=root)
            r = last[way] = json.loads(done.stdout.strip().splitlines()[-1])
            case = f"{groups:,} groups, {label}"
            exp.add(case, "save", i, r["save"], x=groups)
            exp.add(case, "load", i, r["load"], x=groups)
            exp.add(case, "save, MB above", i, r["save_mb"], unit="MB", x=groups)
            exp.add(case, "load, MB above", i, r["load_mb"], unit="MB", x=groups)
    for way, r in last.items():
        exp.notes.append(f"- {WAYS[way]}: state in memory {r['state_mb']:.0f} MB, stored {r['stored_mb']:.0f} MB")
    yield exp


if __name__ == "__main__":
    print(json.dumps(child(int(sys.argv[1]), sys.argv[2])))

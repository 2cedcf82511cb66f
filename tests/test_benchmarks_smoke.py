"""The benchmark harness runs end to end (every suite, tiny data, one run): a smoke test, not a speed test."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.__main__ import SUITES
from benchmarks.registry import SUITES as REGISTRY

pytestmark = [pytest.mark.spark, pytest.mark.slow]

# suites the smoke run leaves out: minutes of spark-submit and Airflow runs even when tiny (run by hand)
BY_HAND = ("nightly", "freshness")
# every experiment a quick run of the other suites writes
EXPECTED = [n for s in REGISTRY if s.name not in BY_HAND for n in (*s.experiments, *s.hidden)]


def test_quick_harness_writes_every_experiment(tmp_path: Path) -> None:
    out = tmp_path / "out" / "bench"
    env = dict(
        os.environ,
        IMP_BENCH_SCALE="0.1",
        IMP_BENCH_DATA=str(tmp_path / "data"),
        IMP_BENCH_OUT=str(out),
        IMP_HOME=str(tmp_path / "home"),
        PYSPARK_PYTHON=sys.executable,
    )
    env.pop("IMP_CATALOG_URL", None)
    suites = [s for s in SUITES if s not in BY_HAND]
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--runs", "1", "--only", *suites],
        env=env,
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    doc = (out.parent / "BENCHMARKS.md").read_text()
    for name in EXPECTED:
        with open(out / f"{name}.csv") as f:
            rows = list(csv.DictReader(f))
        assert rows, name
        assert all(float(r["value"]) >= 0 and r["commit"] and r["date"] for r in rows), name
        assert (out / f"{name}.json").exists() and (out / f"{name}.png").stat().st_size > 1000, name
    for block in {s.block for s in REGISTRY if s.name not in BY_HAND} | {"targets", "suites"}:
        assert f"<!-- bench:{block} -->" in doc, block
    # IMP's sketch is checked against FM's inside the harness; the ratios exist for the maintenance experiments
    assert "FM/IMP" in doc
    # the scale suite's case (SF0.01 Q18, state in Delta tables) ran, matched FM's sketch at every change size and
    # recorded its processes' peak memory
    with open(out / "scale.csv") as f:
        scale = list(csv.DictReader(f))
    assert {r["exact"] for r in scale if r["variant"] == "IMP"} == {"True"}
    assert all(int(r["driver_mb"]) > 0 and int(r["jvm_mb"]) > 0 for r in scale if r["case"].endswith("capture"))

"""The benchmark harness runs end to end (every suite, tiny data, one run): a smoke test, not a speed test."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.__main__ import SUITES

pytestmark = [pytest.mark.spark, pytest.mark.slow]

EXPECTED = ["engine_throughput", "engine_state", "capture", "skipping", "q_groups", "q_having", "q_joinsel", "q_join",
            "joinsel_optimizations", "q_sketch", "q_selpd", "breakeven_groups", "memory", "sketch_sizes", "tpch",
            "topk_buffers", "topk_update", "topk_memory", "whole_job", "eager_vs_lazy", "mixed_workload",
            "compaction", "lakehouse_cdf", "lakehouse_connector", "engine_v2_batch", "engine_v2_groups",
            "engine_v2_q18h", "engine_v2_q_groups", "sql_floor", "skipping_100m", "skew_split", "mixed_layout",
            "tpch22", "scale", "state_store", "state_parts"]


def test_quick_harness_writes_every_experiment(tmp_path: Path) -> None:
    out = tmp_path / "out" / "bench"
    env = dict(os.environ, IMP_BENCH_SCALE="0.1", IMP_BENCH_DATA=str(tmp_path / "data"), IMP_BENCH_OUT=str(out),
               IMP_HOME=str(tmp_path / "home"), PYSPARK_PYTHON=sys.executable)
    env.pop("IMP_CATALOG_URL", None)
    # every suite but "nightly" and "freshness" (minutes of spark-submit and Airflow runs even when tiny; by hand)
    suites = [s for s in SUITES if s not in ("nightly", "freshness")]
    done = subprocess.run([sys.executable, "-m", "benchmarks", "--quick", "--runs", "1", "--only", *suites], env=env,
                          cwd=Path(__file__)
                          .resolve().parent.parent, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    doc = (out.parent / "BENCHMARKS.md").read_text()
    for name in EXPECTED:
        with open(out / f"{name}.csv") as f:
            rows = list(csv.DictReader(f))
        assert rows, name
        assert all(float(r["value"]) >= 0 for r in rows), name
        assert (out / f"{name}.png").stat().st_size > 1000, name
        assert f"<!-- bench:{name} -->" in doc, name
    # IMP's sketch is checked against FM's inside the harness; the ratios exist for the maintenance experiments
    assert "FM/IMP" in doc
    # the scale suite's case (SF0.01 Q18, state in Delta tables) ran and matched FM's sketch at every change size
    assert "SF0.01 Q18 external: state" in doc and "equal to FM's: yes" in doc

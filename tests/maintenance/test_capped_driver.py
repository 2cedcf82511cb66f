"""A driver capped in memory (a memory cgroup holding the Python process only; the Spark JVM stays outside it):
capturing a sketch whose aggregation state does not fit fails with the state in memory (the kernel kills the
process), and finishes with the state in Delta tables, with the sketch full maintenance must give (computed by
DuckDB from the table)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from deltalake import write_deltalake

from tests.oracles import provenance_fragments

pytestmark = [pytest.mark.spark, pytest.mark.postgres, pytest.mark.slow]

ROWS = 6_000_000
HEADROOM_MB = 700
SCRIPT = str(Path(__file__).with_name("capped_capture.py"))


CGROUPS = Path("/sys/fs/cgroup/memory")  # cgroup v1's memory controller, as this machine mounts it


def capped(service, path: Path, budget: str) -> tuple[int, dict]:  # noqa: ANN001
    env = dict(os.environ, IMP_HOME=str(service.settings.home / f"capped-{budget}"), IMP_SPARK_MASTER="local[2]",
               IMP_STATE_MEMORY_BUDGET=budget, PYSPARK_PYTHON=sys.executable, IMP_SHUFFLE_PARTITIONS="4")
    env.pop("IMP_CATALOG_URL", None)
    assert os.access(CGROUPS, os.W_OK), f"{CGROUPS} is not writable: the test needs cgroup v1's memory controller"
    group = CGROUPS / f"imp-capped-{os.getpid()}-{budget}"
    group.mkdir(exist_ok=True)
    try:
        done = subprocess.run([sys.executable, SCRIPT, str(path), str(HEADROOM_MB), str(group)], env=env,
                              capture_output=True, text=True, timeout=1200)
    finally:
        group.rmdir()
        # the capture's embedded catalog outlives it (a killed process never stops it): stop it here
        from imp_core.catalog.embedded import stop_embedded
        from imp_core.config import Settings

        stop_embedded(Settings.from_env({"IMP_HOME": env["IMP_HOME"]}))
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("CAPPED ")]
    return done.returncode, json.loads(lines[-1].split(" ", 1)[1]) if lines else {"ok": False, "error": "died"}


def test_a_capped_driver_captures_only_with_external_state(service, tmp_path: Path) -> None:  # noqa: ANN001
    path = tmp_path / "capped"
    i = np.arange(ROWS, dtype=np.int64)
    write_deltalake(str(path), pa.table({"k": i // 2, "v": i % 29}), configuration={"delta.enableChangeDataFeed":
                                                                                     "true"})
    code, memory = capped(service, path, "64g")
    # 3M groups' state and output do not fit the cap: the kernel kills the process (or an allocation fails)
    assert code == -9 or memory.get("error") == "MemoryError", (code, memory)
    code, outside = capped(service, path, "0")
    assert code == 0 and outside["ok"], outside
    assert outside["placement"]["aggregation@r.0.0"] == "external"
    expected = provenance_fragments(str(path), "SELECT k FROM t WHERE k IN (SELECT k FROM t GROUP BY k HAVING "
                                               "SUM(v) > 25)", [0, 500_000, 1_000_000, 2_000_000, 3_000_000])
    assert outside["fragments"] == expected

"""A sketch capture in a driver process whose memory is capped, for tests/maintenance/test_capped_driver.py.

``python capped_capture.py TABLE_PATH HEADROOM_MB CGROUP``: starts Spark first (the JVM is a child process and stays
outside the cap), then moves this process alone into the memory cgroup ``CGROUP`` (cgroup v1, created by the test)
limited to ``HEADROOM_MB`` of memory charged from then on (RLIMIT_AS is no measure of memory here: the allocators
reserve address space they never touch), registers the table and creates the sketch with the
``IMP_STATE_MEMORY_BUDGET`` of the environment. Prints one line ``CAPPED {json}`` with the outcome: the sketch's
fragments and where its state lives, or the error that stopped it; the kernel kills the process (SIGKILL) when it
needs more than the cap.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

SQL = "SELECT k, SUM(v) AS s, COUNT(*) AS n FROM capped GROUP BY k HAVING SUM(v) > 25"


def cap(cgroup: Path, headroom_mb: int) -> None:
    """Move this process (not its JVM) into ``cgroup`` with a memory limit of ``headroom_mb``."""
    (cgroup / "memory.limit_in_bytes").write_text(str(headroom_mb << 20))
    (cgroup / "cgroup.procs").write_text(str(os.getpid()))


def main(path: str, headroom_mb: int, cgroup: Path) -> dict[str, object]:
    from imp_core.config import Settings
    from imp_core.maintenance.service import SketchService

    service = SketchService(Settings.from_env())
    service.spark.range(1).count()  # the JVM runs before the cap: only this process is limited
    service.catalog.list_tables()
    cap(cgroup, headroom_mb)
    try:
        service.register_table("capped", path)
        _, version = service.create_sketch("capped", SQL, ["capped.k"], bounds=["0,500000,1000000,2000000,3000000"])
        placed = {s["operator"]: s["where"] for s in service.describe("capped")["state"]}
        return {"ok": True, "fragments": version.fragments["capped"], "placement": placed}
    except MemoryError:
        return {"ok": False, "error": "MemoryError"}
    except Exception as e:  # noqa: BLE001 - reported to the test
        return {"ok": False, "error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}


if __name__ == "__main__":
    outcome = main(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]))
    sys.stdout.write("CAPPED " + json.dumps(outcome) + "\n")
    sys.stdout.flush()

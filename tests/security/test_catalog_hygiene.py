"""A failed or killed ``sketch create`` leaves nothing behind (finding 7 of issue 15).

The review found that a failed create left a ``maintenance_run`` row pointing at no sketch, and that a killed
capture left a ``running`` row that nothing ever cleared.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.security.conftest import BOUNDS, TOP_SQL, Lab

pytestmark = [pytest.mark.postgres, pytest.mark.spark]


def _orphans(lab: Lab) -> list[tuple]:
    return lab.sql("SELECT id, status FROM maintenance_run WHERE sketch_id IS NULL ORDER BY id")


def test_a_failed_create_leaves_no_run(lab: Lab) -> None:
    path = lab.table("broken_sales")
    for data in path.glob("*.parquet"):  # the capture on Spark fails: the log names files that are gone
        data.unlink()
    before = _orphans(lab)
    done = lab.imp_here("sketch", "create", "broken_top", "--sql", TOP_SQL.format(t="broken_sales"), "--on",
                        "broken_sales.price", "--bounds", BOUNDS)  # the session's Spark, no JVM of its own
    assert done.returncode != 0 and "error" in done.stderr.strip().splitlines()[-1], done.stderr
    assert "broken_top" not in [r.name for r in lab.catalog.list_sketches()]
    assert _orphans(lab) == before, "the failed create left a run that belongs to no sketch"


def test_a_killed_capture_is_cleared_by_the_next_create(lab: Lab) -> None:
    lab.table("kill_sales")
    before = _orphans(lab)
    proc = subprocess.Popen([sys.executable, "-m", "imp_core.cli.main", "sketch", "create", "kill_top", "--sql",
                             TOP_SQL.format(t="kill_sales"), "--on", "kill_sales.price", "--bounds", BOUNDS],
                            env=lab.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + 240
    try:
        while not [r for r in _orphans(lab) if r not in before and r[1] == "running"]:
            assert proc.poll() is None, "the capture ended before it could be killed"
            assert time.monotonic() < deadline, "the capture never recorded its run"
            time.sleep(0.1)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the capture and its Spark JVM, as an OOM kill would
        proc.wait(timeout=60)
    left = [r for r in _orphans(lab) if r not in before]
    assert [status for _, status in left] == ["running"]  # what the crash left

    lab.sketch("kill_other", "kill_sales")  # the next create
    assert [r for r in _orphans(lab) if r not in before] == [], "the dead capture's run is still there"
    assert "kill_top" not in [r.name for r in lab.catalog.list_sketches()]

"""Per-sketch maintenance locks: one holder per sketch, different sketches in parallel.

"Blocked" is read from Postgres (a backend waiting in ``pg_locks``), not inferred from a thread that did not get
anywhere within a timeout: a thread that was simply not scheduled yet would pass such a test.
"""

from __future__ import annotations

import threading
import time

import pytest
import sqlalchemy as sa

from imp_core.catalog import Catalog
from imp_core.catalog.locks import SKETCH_LOCK_NAMESPACE

pytestmark = pytest.mark.postgres


def waiting_for_sketch_lock(catalog: Catalog, sketch_id: int) -> int:
    """Backends waiting for (not holding) the maintenance lock of ``sketch_id``."""
    with catalog.engine.connect() as conn:
        return int(conn.execute(
            sa.text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                    "AND classid = :ns AND objid = :s AND objsubid = 2"),
            {"ns": SKETCH_LOCK_NAMESPACE, "s": sketch_id}).scalar_one())


def wait_until(condition, timeout: float = 20.0) -> bool:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


def test_same_sketch_lock_serializes_holders(catalog: Catalog) -> None:
    acquired = threading.Event()
    release = threading.Event()

    def second_maintainer() -> None:
        with catalog.sketch_lock(1):
            acquired.set()
            release.wait(10)

    with catalog.sketch_lock(1):
        assert waiting_for_sketch_lock(catalog, 1) == 0
        waiter = threading.Thread(target=second_maintainer)
        waiter.start()
        assert wait_until(lambda: waiting_for_sketch_lock(catalog, 1) == 1), \
            "the second holder never queued for the lock in Postgres"
        assert not acquired.is_set(), "the second holder got the lock while the first held it"
    assert acquired.wait(10), "the second holder never got the lock after the first released it"
    assert waiting_for_sketch_lock(catalog, 1) == 0
    with catalog.try_sketch_lock(1) as got:
        assert got is False  # the second holder has it now
    release.set()
    waiter.join(10)
    with catalog.try_sketch_lock(1) as got:
        assert got is True


def test_different_sketches_do_not_block_each_other(catalog: Catalog) -> None:
    acquired = threading.Event()

    def other_sketch() -> None:
        with catalog.sketch_lock(2):
            acquired.set()

    with catalog.sketch_lock(1):
        worker = threading.Thread(target=other_sketch)
        worker.start()
        assert acquired.wait(10), "locking sketch 2 waited for sketch 1"
        worker.join(10)
        assert waiting_for_sketch_lock(catalog, 2) == 0


def test_lock_is_released_when_the_block_raises(catalog: Catalog) -> None:
    with pytest.raises(RuntimeError), catalog.sketch_lock(7):
        raise RuntimeError("maintenance failed")
    with catalog.try_sketch_lock(7) as got:
        assert got is True

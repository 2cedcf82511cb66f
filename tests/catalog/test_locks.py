"""Per-sketch maintenance locks: one holder per sketch, different sketches in parallel."""

from __future__ import annotations

import threading

import pytest

from imp_core.catalog import Catalog

pytestmark = pytest.mark.postgres


def test_same_sketch_lock_serializes_holders(catalog: Catalog) -> None:
    acquired = threading.Event()
    release = threading.Event()

    def second_maintainer() -> None:
        with catalog.sketch_lock(1):
            acquired.set()
            release.wait(10)

    with catalog.sketch_lock(1):
        waiter = threading.Thread(target=second_maintainer)
        waiter.start()
        assert not acquired.wait(0.5), "the second holder got the lock while the first held it"
    assert acquired.wait(10), "the second holder never got the lock after the first released it"
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


def test_lock_is_released_when_the_block_raises(catalog: Catalog) -> None:
    with pytest.raises(RuntimeError), catalog.sketch_lock(7):
        raise RuntimeError("maintenance failed")
    with catalog.try_sketch_lock(7) as got:
        assert got is True

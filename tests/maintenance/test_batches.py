"""Eager batch planning: commit order, batches of at least batch_size rows, versions never split."""

from __future__ import annotations

import pytest

from imp_core.maintenance.batches import PendingVersion, plan_batches


def test_batches_follow_commit_order_across_tables() -> None:
    commits = [
        PendingVersion("r", 1, 10.0, 3),
        PendingVersion("s", 5, 11.0, 4),
        PendingVersion("r", 2, 12.0, 1),
        PendingVersion("s", 6, 13.0, 9),
    ]
    assert plan_batches({"r": 0, "s": 4}, commits, 5) == [{"r": 1, "s": 5}, {"r": 2, "s": 6}]


def test_a_version_is_never_split_and_the_rest_forms_a_last_batch() -> None:
    commits = [PendingVersion("t", v, float(v), rows) for v, rows in [(1, 100), (2, 1), (3, 1)]]
    assert plan_batches({"t": 0}, commits, 10) == [{"t": 1}, {"t": 3}]
    assert plan_batches({"t": 0}, commits, 1) == [{"t": 1}, {"t": 2}, {"t": 3}]


def test_empty_versions_ride_along() -> None:
    commits = [PendingVersion("t", 1, 1.0, 0), PendingVersion("t", 2, 2.0, 0)]
    assert plan_batches({"t": 0}, commits, 5) == [{"t": 2}]
    with pytest.raises(ValueError):
        plan_batches({"t": 0}, commits, 0)

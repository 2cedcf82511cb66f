"""Grouping sketches into maintenance jobs by the tables they read."""

from __future__ import annotations

import pytest

from imp_core.errors import UsageError
from imp_core.maintenance.groups import plan_groups


def test_sketches_on_one_table_share_a_group_and_groups_are_filled() -> None:
    tables = {"a1": ["a"], "a2": ["a"], "b1": ["b"], "ab": ["a", "c"], "d1": ["d"], "d2": ["d"]}
    groups = plan_groups(tables, 4)
    assert sorted(n for g in groups for n in g) == sorted(tables)  # every sketch exactly once
    assert all(len(g) <= 4 for g in groups)
    # a1, a2 and ab are connected through table a and land together; the rest fills the room left
    assert any({"a1", "a2", "ab"} <= set(g) for g in groups)
    assert len(groups) == 2  # 6 sketches in jobs of 4: two jobs, not one per component (four)


def test_a_component_larger_than_the_group_is_cut_with_equal_tables_adjacent() -> None:
    tables = {f"x{i}": ["x"] for i in range(5)} | {f"xy{i}": ["x", "y"] for i in range(3)}
    groups = plan_groups(tables, 3)
    assert [len(g) for g in groups] == [3, 3, 2]
    assert set(groups[0]) == {"x0", "x1", "x2"}  # same table set together, names in order
    assert plan_groups(tables, 3) == groups  # deterministic


def test_group_of_one_is_one_job_per_sketch_and_bad_sizes_are_refused() -> None:
    tables = {"s2": ["t"], "s1": ["t"], "s3": ["u"]}
    assert sorted(plan_groups(tables, 1)) == [("s1",), ("s2",), ("s3",)]
    assert plan_groups({}, 5) == []
    with pytest.raises(UsageError, match="at least 1"):
        plan_groups(tables, 0)

"""Change feeds shared by the sketches of one job: one read per table, slices equal to each sketch's own read."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from imp_core.errors import SourceError
from imp_core.maintenance.feeds import ChangeFeeds
from imp_core.sources.delta import DeltaSource


@pytest.fixture()
def table(tmp_path: Path) -> DeltaSource:
    """Version 0 insert, 1 delete, 2 update, 3 append: every change type of the feed."""
    path = str(tmp_path / "t")
    write_deltalake(
        path,
        pa.table({"a": list(range(20)), "b": [float(i) for i in range(20)], "s": [str(i % 3) for i in range(20)]}),
        configuration={"delta.enableChangeDataFeed": "true"},
    )
    DeltaTable(path).delete("a < 3")
    DeltaTable(path).update(updates={"b": "b + 100"}, predicate="a >= 15")
    write_deltalake(path, pa.table({"a": [100, 101], "b": [1.5, 2.5], "s": ["x", "y"]}), mode="append")
    return DeltaSource("t", path)


def _sorted(t: pa.Table) -> list[dict]:
    return sorted(t.to_pylist(), key=lambda r: tuple(str(v) for v in r.values()))


def test_planned_ranges_are_read_once_and_sliced_exactly(table: DeltaSource) -> None:
    feeds = ChangeFeeds()
    needs = [(0, 3, ["a", "b"], "s1"), (1, 3, ["a", "s"], "s2"), (0, 2, ["b"], "s3")]
    for after, upto, cols, name in needs:
        feeds.plan(table, after, upto, cols, sketch=name)
    assert feeds.sharing() == {"t": 3}
    for after, upto, cols, _ in needs:
        got = feeds.changes(table, after, upto, cols, predicate='"b" > 1000')  # a hint; the slice ignores it
        want = table.changes(after, upto, cols)
        assert got.schema == want.schema
        assert _sorted(got) == _sorted(want)
    # a row-count-only request (eager batching) is served too
    assert _sorted(feeds.changes(table, 1, 2, [])) == _sorted(table.changes(1, 2, []))
    assert feeds.reads == {"t": 1}


def test_requests_outside_the_plan_or_over_the_size_limit_read_directly(table: DeltaSource) -> None:
    feeds = ChangeFeeds()
    feeds.plan(table, 1, 2, ["a"])
    assert feeds.changes(table, 1, 3, ["a"]).num_rows == table.changes(1, 3, ["a"]).num_rows  # past the plan
    assert feeds.changes(table, 1, 2, ["b"]).column_names[0] == "b"  # a column nobody planned
    assert feeds.reads == {"t": 2}
    small = ChangeFeeds(max_rows=1)
    small.plan(table, 0, 3, None)
    small.changes(table, 0, 3)
    small.changes(table, 1, 3)
    assert small.reads == {"t": 2}  # too large to hold: each request is its own read


def test_a_failing_shared_read_leaves_each_sketch_its_own_error(table: DeltaSource) -> None:
    feeds = ChangeFeeds()
    feeds.plan(table, 0, 3, ["a", "missing"])
    with pytest.raises(SourceError, match="missing"):
        feeds.changes(table, 0, 3, ["a", "missing"])
    assert _sorted(feeds.changes(table, 0, 3, ["a"])) == _sorted(table.changes(0, 3, ["a"]))

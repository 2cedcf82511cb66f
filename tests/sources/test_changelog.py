"""The log fast path reads exactly the change rows delta-rs' load_cdf reads."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from imp_core.sources import reader
from imp_core.sources.delta import DeltaSource

CDF = {"delta.enableChangeDataFeed": "true"}


def both(source: DeltaSource, after: int, upto: int) -> tuple[list, list]:
    schema = source.schema(upto)
    fast = reader._from_log(source, after, upto, schema.names)
    assert fast is not None, "the fast path should handle this range"
    raw = reader._from_delta_rs(source, after, upto, schema.names, None)
    slow = reader.signed(source.name, raw, schema.names, schema)

    def rows(t: pa.Table) -> list:
        return sorted(tuple(r.values()) for r in t.to_pylist())

    assert fast.schema == slow.schema
    return rows(fast), rows(slow)


@pytest.mark.parametrize("partitioned", [False, True])
def test_fast_path_equals_delta_rs(tmp_path: Path, partitioned: bool) -> None:
    path = str(tmp_path / "t")
    part = ["p"] if partitioned else None
    write_deltalake(path, pa.table({"id": list(range(20)), "p": ["a", "b"] * 10, "x": [1.5] * 20}),
                    partition_by=part, configuration=CDF)  # v0
    write_deltalake(path, pa.table({"id": [100, 101], "p": ["a", "c"], "x": [2.0, None]}), mode="append",
                    partition_by=part)  # v1 append
    dt = DeltaTable(path)
    dt.delete("id < 3")  # v2 delete (cdc files)
    dt.update(updates={"x": "x * 2"}, predicate="id >= 10 AND id < 14")  # v3 update (pre/post images)
    (DeltaTable(path).merge(pa.table({"id": [4, 200], "p": ["a", "b"], "x": [9.0, 9.0]}), predicate="s.id = t.id",
                            source_alias="s", target_alias="t")
     .when_matched_update_all().when_not_matched_insert_all().execute())  # v4 merge
    if partitioned:
        DeltaTable(path).delete("p = 'c'")  # v5: drops a whole partition file
    source = DeltaSource("t", path)
    last = source.current_version()
    for after, upto in [(0, 1), (1, 2), (2, 3), (3, 4), (0, last), (last - 1, last)]:
        fast, slow = both(source, after, upto)
        assert fast == slow, (after, upto)
        assert fast, (after, upto)


def test_fast_path_declines_metadata_changes_and_vacuumed_files(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"id": [1, 2]}), configuration=CDF)
    DeltaTable(path).alter.set_table_properties({"delta.logRetentionDuration": "interval 30 days"})  # v1 metadata
    write_deltalake(path, pa.table({"id": [3]}), mode="append")  # v2
    source = DeltaSource("t", path)
    assert reader._from_log(source, 0, 2, ["id"]) is None  # metadata inside the range
    assert reader._from_log(source, 1, 2, ["id"]) is not None
    DeltaTable(path).delete("id = 1")  # v3 with a cdc file
    for f in Path(path, "_change_data").rglob("*.parquet"):
        f.unlink()
    assert reader._from_log(source, 2, 3, ["id"]) is None  # falls back (and delta-rs then fails clearly)


def test_consecutive_ranges_open_the_table_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Eager maintenance reads (v0, v1], (v1, v2], ...: metadata is carried over commits without a metaData action
    instead of replaying the log at every version."""
    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"id": [1, 2], "x": [1.0, 2.0]}), configuration=CDF)  # v0
    for i in range(4):
        write_deltalake(path, pa.table({"id": [10 + i], "x": [float(i)]}), mode="append")  # v1..v4
    source = DeltaSource("t", path)
    opened: list[int | None] = []
    real_open = source._open
    monkeypatch.setattr(source, "_open", lambda version=None: opened.append(version) or real_open(version))
    rows = [source.changes(v, v + 1, ["id", "x"]).column("id").to_pylist() for v in range(4)]
    assert rows == [[10], [11], [12], [13]]
    assert [v for v in opened if v is not None] == [0]  # version 0 once, none of 1..4
    assert source.changes(4, 4, ["x"]).num_rows == 0 and source.changes(4, 4, ["x"]).column_names[0] == "x"


def test_compaction_and_zorder_are_not_changes(tmp_path: Path) -> None:
    """OPTIMIZE rewrites files (``dataChange = false``): neither path may read the rewritten rows as changes.

    This is what a nightly compaction clustered on the sketch column commits between two maintenance runs; a reader
    that took its removes for deletes and its adds for inserts would double-count every row of the table.
    """
    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"id": list(range(10)), "a": [i % 3 for i in range(10)]}), configuration=CDF)
    for i in range(4):  # v1..v4: small files, as nightly appends leave them
        write_deltalake(path, pa.table({"id": [100 + i, 200 + i], "a": [i, 2 - i % 3]}), mode="append")
    before = len(DeltaTable(path).file_uris())
    metrics = DeltaTable(path).optimize.compact()  # v5
    assert metrics["numFilesRemoved"] == before and metrics["numFilesAdded"] == 1
    write_deltalake(path, pa.table({"id": [300], "a": [1]}), mode="append")  # v6
    DeltaTable(path).delete("id = 100")  # v7
    metrics = DeltaTable(path).optimize.z_order(["a"])  # v8
    assert metrics["numFilesRemoved"] >= 1
    source = DeltaSource("t", path)
    assert source.current_version() == 8
    for after, upto in [(4, 5), (7, 8)]:
        fast, slow = both(source, after, upto)
        assert fast == slow == [], (after, upto)
    fast, slow = both(source, 4, 8)
    assert fast == slow
    assert sorted((r[0], r[2]) for r in fast) == [(100, -1), (300, 1)]  # (id, __mult): only the real changes

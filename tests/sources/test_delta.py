"""The Delta table source: versions, files and statistics, the change feed, and its error cases."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from imp_core.engine.schema import MULT
from imp_core.errors import ChangeFeedUnavailableError, SourceError
from imp_core.sources.delta import ESTIMATED_ROW_BYTES, VERSION, DeltaSource

CDF = {"delta.enableChangeDataFeed": "true"}


@pytest.fixture()
def table(tmp_path: Path) -> DeltaSource:
    path = tmp_path / "t"
    write_deltalake(str(path), pa.table({"id": [1, 2, 3], "x": [1.5, 2.5, None]}), configuration=CDF)  # v0
    write_deltalake(str(path), pa.table({"id": [4], "x": [4.5]}), mode="append")  # v1
    dt = DeltaTable(str(path))
    dt.delete("id = 2")  # v2
    dt.update(updates={"x": "x + 10"}, predicate="id = 1")  # v3
    return DeltaSource("t", path)


def test_versions_files_and_stats(table: DeltaSource) -> None:
    assert table.current_version() == 3
    files = table.files(1)
    assert sum(f.num_records or 0 for f in files) == 4
    assert min(f.min_values["id"] for f in files) == 1 and max(f.max_values["id"] for f in files) == 4
    assert table.schema(0).names == ["id", "x"]


def test_a_table_without_file_statistics_never_counts_as_empty(tmp_path: Path) -> None:
    """A writer that records no statistics leaves ``numRecords`` out: the row count (what placement and the join
    caches size by) estimates those files' rows from their size, generously, instead of counting 0."""
    import json

    path = tmp_path / "t"
    write_deltalake(str(path), pa.table({"id": list(range(5000)), "x": [i * 0.5 for i in range(5000)]}))
    assert DeltaSource("t", path).row_count(0) == 5000
    log = path / "_delta_log" / f"{0:020d}.json"
    actions = [json.loads(line) for line in log.read_text().splitlines()]
    for action in actions:
        action.get("add", {}).pop("stats", None)
    log.write_text("\n".join(json.dumps(a) for a in actions) + "\n")
    source = DeltaSource("t", path)
    [stats] = source.files(0)
    assert stats.num_records is None
    assert source.row_count(0) == stats.size_bytes // ESTIMATED_ROW_BYTES >= 5000


def test_change_feed_signs(table: DeltaSource) -> None:
    rows = table.changes(0, 3).to_pylist()
    got = sorted((r["id"], r["x"], r[MULT], r[VERSION]) for r in rows)
    # v1 insert 4; v2 delete 2; v3 update 1: pre-image deleted (-1), post-image inserted (+1)
    assert got == [(1, 1.5, -1, 3), (1, 11.5, 1, 3), (2, 2.5, -1, 2), (4, 4.5, 1, 1)]
    assert "_change_type" not in table.changes(0, 3).column_names
    assert table.changes(3, 3).num_rows == 0
    assert table.changes(1, 2, columns=["id"]).column_names == ["id", MULT, VERSION]


def test_not_a_delta_table(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match=r"table nope: .* is not a Delta table"):
        DeltaSource("nope", tmp_path / "missing").current_version()


def test_version_out_of_range(table: DeltaSource) -> None:
    with pytest.raises(SourceError, match=r"version 9 is out of range \(the table has versions 0\.\.3\)"):
        table.changes(0, 9)
    with pytest.raises(SourceError, match="out of range"):
        table.files(7)


def test_cdf_not_enabled(tmp_path: Path) -> None:
    path = tmp_path / "plain"
    write_deltalake(str(path), pa.table({"id": [1]}))
    write_deltalake(str(path), pa.table({"id": [2]}), mode="append")
    source = DeltaSource("plain", path)
    with pytest.raises(ChangeFeedUnavailableError, match="does not have Change Data Feed enabled"):
        source.require_cdf()
    with pytest.raises(ChangeFeedUnavailableError, match="Change Data Feed disabled"):
        source.changes(0, 1)


def test_cdf_vacuumed(table: DeltaSource) -> None:
    # deleting the change files of version 2 (what VACUUM does once they expire) makes the range unreadable
    for f in Path(table.path, "_change_data").glob("*"):
        if f.is_file():
            f.unlink()
        else:
            shutil.rmtree(f)
    with pytest.raises(ChangeFeedUnavailableError, match=r"change feed for versions 1\.\.3 cannot be read"):
        table.changes(0, 3)


def test_cdf_enabled_later_is_refused_for_earlier_versions(tmp_path: Path) -> None:
    path = tmp_path / "late"
    write_deltalake(str(path), pa.table({"id": [1]}))  # v0 without CDF
    write_deltalake(str(path), pa.table({"id": [2]}), mode="append")  # v1 without CDF
    DeltaTable(str(path)).alter.set_table_properties(CDF)  # v2
    write_deltalake(str(path), pa.table({"id": [3]}), mode="append")  # v3
    source = DeltaSource("late", path)
    assert source.changes(2, 3).num_rows == 1
    with pytest.raises(ChangeFeedUnavailableError, match="disabled at version 1"):
        source.changes(0, 3)

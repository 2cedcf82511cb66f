"""A commit's change rows from its log entry (``DeltaSource.commits``, ``sources/delta.changed_rows``): the rows
it inserted, deleted and updated (an update twice: pre- and post-image), never the rows a rewrite copied, or unknown;
for tables written by delta-rs and by Delta's Spark connector, each with every kind of commit. The cost model and
eager batching size their steps by these figures."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from imp_core.sources.delta import DeltaSource, changed_rows

CDF = {"delta.enableChangeDataFeed": "true"}
ROWS = 500  # one file: a small DELETE or UPDATE rewrites it, copying the rest


def _rows(start: int, n: int) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(range(start, start + n), pa.int64()),
            "v": pa.array([i % 7 for i in range(start, start + n)], pa.int64()),
        }
    )


def _by_operation(path: Path, after: int) -> list[tuple[str, int | None]]:
    source = DeltaSource("t", path)
    return [(c.operation, c.rows) for c in source.commits(after, source.current_version())]


def test_delta_rs_commits_count_changed_rows_not_copied_ones(tmp_path: Path) -> None:
    path = tmp_path / "t"
    write_deltalake(str(path), _rows(0, ROWS), configuration=CDF)  # v0
    write_deltalake(str(path), _rows(1000, 3), mode="append")  # v1: 3 inserted
    DeltaTable(str(path)).delete("id < 10")  # v2: 10 deleted, 490 copied
    DeltaTable(str(path)).update(updates={"v": "v + 1"}, predicate="id >= 10 AND id < 14")  # v3: 4 updated
    (
        DeltaTable(str(path))
        .merge(pa.concat_tables([_rows(20, 2), _rows(2000, 1)]), "t.id = s.id", source_alias="s", target_alias="t")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute()
    )  # v4: 2 updated, 1 inserted
    DeltaTable(str(path)).optimize.compact()  # v5: no row changes
    write_deltalake(str(path), _rows(0, 5), mode="overwrite")  # v6: replaces every row, not counted by delta-rs
    assert _by_operation(path, 0) == [
        ("WRITE", 3),
        ("DELETE", 10),
        ("UPDATE", 8),
        ("MERGE", 2 * 2 + 1),
        ("OPTIMIZE", 0),
        ("WRITE", None),
    ]


def test_a_change_row_count_is_the_change_feed_size(tmp_path: Path) -> None:
    """The figure is what the change feed of the commit holds (what maintenance reads), row for row."""
    path = tmp_path / "t"
    write_deltalake(str(path), _rows(0, ROWS), configuration=CDF)
    DeltaTable(str(path)).delete("id < 10")
    DeltaTable(str(path)).update(updates={"v": "v + 1"}, predicate="id >= 10 AND id < 14")
    source = DeltaSource("t", path)
    feed = source.changes(0, 2, columns=[])
    assert sum(c.rows or 0 for c in source.commits(0, 2)) == feed.num_rows == 10 + 8


@pytest.mark.spark
def test_spark_written_commits_count_changed_rows_not_copied_ones(spark, tmp_path: Path) -> None:  # noqa: ANN001
    path = tmp_path / "s"
    uri = str(path)
    spark.createDataFrame(_rows(0, ROWS).to_pandas()).coalesce(1).write.format("delta").option(
        "delta.enableChangeDataFeed", "true"
    ).option("delta.enableDeletionVectors", "false").save(uri)  # v0
    spark.createDataFrame(_rows(1000, 3).to_pandas()).write.format("delta").mode("append").save(uri)  # v1
    spark.sql(f"DELETE FROM delta.`{uri}` WHERE id < 10")  # v2
    spark.sql(f"UPDATE delta.`{uri}` SET v = v + 1 WHERE id >= 10 AND id < 14")  # v3
    spark.createDataFrame(pa.concat_tables([_rows(20, 2), _rows(2000, 1)]).to_pandas()).createOrReplaceTempView(
        "imp_commit_rows_src"
    )
    spark.sql(
        f"MERGE INTO delta.`{uri}` t USING imp_commit_rows_src s ON t.id = s.id "
        f"WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
    )  # v4
    spark.sql(f"OPTIMIZE delta.`{uri}`")  # v5
    spark.createDataFrame(_rows(0, 5).to_pandas()).write.format("delta").mode("overwrite").save(uri)  # v6
    found = _by_operation(path, 0)
    assert found == [
        ("WRITE", 3),
        ("DELETE", 10),
        ("UPDATE", 8),
        ("MERGE", 2 * 2 + 1),
        ("OPTIMIZE", 0),
        ("WRITE", None),
    ], found
    source = DeltaSource("s", path)
    assert sum(c.rows or 0 for c in source.commits(0, 3)) == source.changes(0, 3, columns=[]).num_rows


@pytest.mark.parametrize(
    ("operation", "parameters", "metrics", "rows"),
    [
        ("DELETE", {}, {"numDeletedRows": "10", "numCopiedRows": "499990"}, 10),
        ("UPDATE", {}, {"numUpdatedRows": "10", "numCopiedRows": "499990"}, 20),
        (
            "MERGE",
            {},
            {
                "numTargetRowsInserted": "1",
                "numTargetRowsUpdated": "2",
                "numTargetRowsDeleted": "3",
                "numTargetRowsCopied": "9000",
                "numOutputRows": "9003",
            },
            1 + 4 + 3,
        ),
        ("WRITE", {"mode": "Append"}, {"numOutputRows": "7"}, 7),
        ("STREAMING UPDATE", {"outputMode": "Append"}, {"numOutputRows": "4"}, 4),
        ("STREAMING UPDATE", {"outputMode": "Complete"}, {"numOutputRows": "4"}, None),
        ("WRITE", {"mode": "Overwrite"}, {"numOutputRows": "7"}, None),
        ("DELETE", {}, {}, None),  # a writer that records no metrics
        ("RESTORE", {}, {"numRestoredFiles": "1"}, None),
        ("SET TBLPROPERTIES", {}, {}, 0),
    ],
)
def test_changed_rows_of_log_entries(operation: str, parameters: dict, metrics: dict, rows: int | None) -> None:
    assert changed_rows(operation, parameters, metrics) == rows

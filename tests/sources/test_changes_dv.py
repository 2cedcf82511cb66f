"""The change feed of tables written by delta-spark with deletion vectors and column mapping: whatever path reads it
(the log fast path, delta-rs, Spark), the change rows equal Spark's own ``readChangeFeed``."""

from __future__ import annotations

from pathlib import Path

import pytest

from imp_core.sources import changelog
from imp_core.sources.delta import DeltaSource

pytestmark = pytest.mark.spark


def spark_feed(spark, path: str, after: int, upto: int, cols: list[str]) -> list[tuple]:  # noqa: ANN001
    df = (spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", after + 1)
          .option("endingVersion", upto).load(path))
    sign = {"insert": 1, "update_postimage": 1, "delete": -1, "update_preimage": -1}
    return sorted((*(r[c] for c in cols), sign[r["_change_type"]], r["_commit_version"]) for r in df.collect())


def ours(source: DeltaSource, after: int, upto: int, cols: list[str]) -> list[tuple]:
    t = source.changes(after, upto, cols).to_pylist()
    return sorted((*(r[c] for c in cols), r["__mult"], r["__version"]) for r in t)


@pytest.mark.parametrize("mapping", ["none", "name"])
def test_every_commit_matches_sparks_change_feed(spark, tmp_path: Path, mapping: str) -> None:  # noqa: ANN001
    path = str(tmp_path / "t")
    spark.sql(f"CREATE TABLE delta.`{path}` (id BIGINT, g BIGINT, price BIGINT) USING delta TBLPROPERTIES ("
              f"'delta.enableChangeDataFeed' = 'true', 'delta.enableDeletionVectors' = 'true', "
              f"'delta.columnMapping.mode' = '{mapping}')")
    spark.sql(f"INSERT INTO delta.`{path}` SELECT id, id % 4, id * 3 FROM range(40)")  # v1
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id % 5 = 0")  # v2: deletion vectors, no cdc files
    spark.sql(f"UPDATE delta.`{path}` SET price = price + 1 WHERE g = 1")  # v3: cdc files and deletion vectors
    spark.sql(f"MERGE INTO delta.`{path}` t USING (SELECT id FROM range(30, 45)) s ON t.id = s.id "
              f"WHEN MATCHED THEN DELETE WHEN NOT MATCHED THEN INSERT (id, g, price) VALUES (s.id, 9, 9)")  # v4
    source = DeltaSource("t", path, spark=lambda: spark)
    cols = ["id", "g", "price"]
    for after, upto in [(0, 1), (1, 2), (2, 3), (3, 4), (0, 4)]:
        assert ours(source, after, upto, cols) == spark_feed(spark, path, after, upto, cols), (after, upto)
    if mapping == "none":
        schema = source.schema(2)
        assert changelog.read_range(Path(path), 1, 2, cols, schema, []) is None  # deletion vectors: delta-rs
        assert changelog.read_range(Path(path), 2, 3, cols, schema, []) is not None  # cdc files: the fast path

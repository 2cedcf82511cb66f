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
    for after, upto in [(1, 2), (2, 3), (3, 4), (0, 4)]:
        assert ours(source, after, upto, cols) == spark_feed(spark, path, after, upto, cols), (after, upto)
    if mapping == "none":
        schema = source.schema(2)
        assert changelog.read_range(Path(path), 1, 2, cols, schema, []) is None  # deletion vectors: delta-rs
        assert changelog.read_range(Path(path), 2, 3, cols, schema, []) is not None  # cdc files: the fast path


def test_ranges_above_the_switch_over_point_are_read_by_spark(spark, tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    import pyarrow as pa
    from deltalake import write_deltalake

    from imp_core.errors import ConfigError
    from imp_core.sources import spark_cdf

    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"id": [1, 2, 3]}), configuration={"delta.enableChangeDataFeed": "true"})
    write_deltalake(path, pa.table({"id": [4, 5]}), mode="append")
    calls = []
    real = spark_cdf.read_change_feed
    monkeypatch.setattr(spark_cdf, "read_change_feed", lambda *a: calls.append(a[2:4]) or real(*a))
    expected = DeltaSource("t", path).changes(0, 1, ["id"])  # the log fast path
    monkeypatch.setenv(spark_cdf.ENV_SPARK_ROWS, "2")
    by_spark = DeltaSource("t", path, spark=lambda: spark).changes(-1, 1, ["id"])
    assert calls == [(-1, 1)]
    assert sorted(by_spark.column("id").to_pylist()) == [1, 2, 3, 4, 5]
    assert by_spark.filter(pa.compute.equal(by_spark.column("__version"), 1)).to_pylist() == expected.to_pylist()
    monkeypatch.setenv(spark_cdf.ENV_SPARK_ROWS, "many")
    with pytest.raises(ConfigError, match="IMP_CDF_SPARK_ROWS must be an integer"):
        spark_cdf.spark_rows_threshold()

"""The lakehouse matrix: tables written by delta-spark (through the connector) and by delta-rs, with the features
real tables have, on a local path and on an S3-compatible server on 127.0.0.1.

Each cell is one change made the way users make it; after it, the lazily maintained sketch must equal a recapture
(full maintenance on Spark), and the query must return the same rows with and without the sketch (Spark is the
truth). Small tables and one shared Spark session keep it lean.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from imp_core.errors import SchemaChangedError
from tests.conftest import s3_write_options

pytestmark = [pytest.mark.spark, pytest.mark.postgres, pytest.mark.slow]

SQL = "SELECT g, SUM(price) AS rev FROM {t} GROUP BY g HAVING SUM(price) > 500"
BOUNDS = "0,100,200,300,400"
SPARK_PROPS = ("'delta.enableChangeDataFeed' = 'true', 'delta.enableDeletionVectors' = 'true', "
               "'delta.columnMapping.mode' = 'name'")


@pytest.fixture(scope="module", params=["local", "s3"])
def root(request, tmp_path_factory) -> str:  # noqa: ANN001
    if request.param == "local":
        return str(tmp_path_factory.mktemp("lake"))
    request.getfixturevalue("s3_server")
    return "s3://lake/matrix"


def uri_for_spark(uri: str) -> str:
    return uri.replace("s3://", "s3a://", 1)


def check(service, name: str, table: str) -> None:  # noqa: ANN001
    """The oracle of every cell: maintained == recaptured, and the query's rows with the sketch == without."""
    result = service.maintain(name, strategy="lazy", trigger="matrix")
    assert result.recaptured is None, result.recaptured  # incremental maintenance handled the change
    record = service.catalog.get_sketch(name)
    maintained = service.catalog.latest_version(record.id)
    again = service.recapture(name, trigger="matrix-oracle")
    assert again.fragments == maintained.fragments, (table, maintained.fragments, again.fragments)
    sql = SQL.format(t=table)
    with_sketch, without = service.query(sql), service.query(sql, use_sketch=False)
    assert with_sketch.sketch is not None and with_sketch.sketch["name"] == name
    assert sorted(map(tuple, with_sketch.rows)) == sorted(map(tuple, without.rows))


def test_tables_written_by_delta_spark(service, spark, root: str) -> None:  # noqa: ANN001
    """Deletion vectors, column mapping by name (the partition column was renamed before registration), MERGE,
    UPDATE, DELETE, OPTIMIZE ZORDER, an added column and a checkpoint (more than 10 commits), one after another on
    one table; then a rename after registration, which is refused in one line. Locally each commit is checked on
    its own; on S3 (the same reader code over another file system) all of them in one lazy step."""
    kind = "s3" if root.startswith("s3") else "local"
    table, uri = f"mx_spark_{kind}", f"{root}/spark_t"
    target = f"delta.`{uri_for_spark(uri)}`"
    if kind == "s3":
        from imp_core.sources.storage import configure_spark

        configure_spark(spark)
    spark.sql(f"CREATE TABLE {target} (id BIGINT, g BIGINT, cost BIGINT, note STRING) USING delta "
              f"TBLPROPERTIES ({SPARK_PROPS})")
    spark.sql(f"INSERT INTO {target} SELECT id, id % 7, (id * 37) % 450, 'n' FROM range(60)")
    spark.sql(f"ALTER TABLE {target} RENAME COLUMN cost TO price")  # the files keep their physical names
    service.register_table(table, uri)
    source = service.source(table)
    assert {"deletionVectors", "columnMapping"} <= set(source.protocol().reader_features)
    name = f"{table}_top"
    service.create_sketch(name, SQL.format(t=table), [f"{table}.price"], bounds=[BOUNDS], trigger="matrix")

    cells = {
        "delete (deletion vectors)": f"DELETE FROM {target} WHERE id % 5 = 0",
        "update": f"UPDATE {target} SET price = price + 120 WHERE g = 3",
        "merge into": (f"MERGE INTO {target} t USING (SELECT id, id % 7 AS g, 444 AS price FROM range(55, 70)) s "
                       f"ON t.id = s.id WHEN MATCHED AND s.id % 2 = 0 THEN DELETE "
                       f"WHEN MATCHED THEN UPDATE SET price = s.price "
                       f"WHEN NOT MATCHED THEN INSERT (id, g, price, note) VALUES (s.id, s.g, s.price, 'm')"),
        "optimize zorder": f"OPTIMIZE {target} ZORDER BY (price)",
        "add a column (schema evolution)": f"ALTER TABLE {target} ADD COLUMNS (extra INT)",
    }
    for cell, statement in cells.items():
        spark.sql(statement)
        if kind == "local":  # every kind of commit on its own; on S3, the same commits read together below
            check(service, name, table)
        assert service.source(table).current_version() >= 2, cell

    # a checkpoint: more than 10 commits (delta-spark checkpoints every 10), maintained in one lazy step; inserts
    # until the checkpoint is written, then one more, so the step reads commits before and after it
    inserts = 0
    while not any(p.endswith(".checkpoint.parquet") for p in _log_files(spark, uri)):
        assert inserts < 11, "delta-spark wrote no checkpoint in 11 commits"
        inserts += 1
        spark.sql(f"INSERT INTO {target} (id, g, price, note, extra) VALUES ({100 + inserts}, {inserts % 7}, "
                  f"{40 * inserts}, 'c', {inserts})")
    spark.sql(f"INSERT INTO {target} (id, g, price, note, extra) VALUES (200, 1, 440, 'c', 0)")
    assert service.source(table).current_version() > 10
    check(service, name, table)

    # renaming a column of a registered table: the sketch's plan reads every column, so it is refused in one line
    # and the catalog keeps the last version
    before = service.catalog.latest_version(service.catalog.get_sketch(name).id)
    spark.sql(f"ALTER TABLE {target} RENAME COLUMN note TO remark")
    with pytest.raises(SchemaChangedError, match="no longer has column note.*register it again") as info:
        service.maintain(name, strategy="lazy", trigger="matrix")
    assert "\n" not in str(info.value)
    assert service.catalog.latest_version(service.catalog.get_sketch(name).id).version == before.version


def test_liquid_clustering(service, spark, root: str) -> None:  # noqa: ANN001
    kind = "s3" if root.startswith("s3") else "local"
    table, uri = f"mx_cluster_{kind}", f"{root}/clustered_t"
    target = f"delta.`{uri_for_spark(uri)}`"
    spark.sql(f"CREATE TABLE {target} (id BIGINT, g BIGINT, price BIGINT) USING delta CLUSTER BY (price) "
              f"TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')")
    spark.sql(f"INSERT INTO {target} SELECT id, id % 5, (id * 53) % 480 FROM range(40)")
    service.register_table(table, uri)
    name = f"{table}_top"
    service.create_sketch(name, SQL.format(t=table), [f"{table}.price"], bounds=[BOUNDS], trigger="matrix")
    spark.sql(f"INSERT INTO {target} SELECT id, id % 5, 450 FROM range(40, 50)")
    spark.sql(f"OPTIMIZE {target}")  # clusters the files by price
    check(service, name, table)


def test_tables_written_by_delta_rs(service, root: str) -> None:  # noqa: ANN001
    from deltalake import DeltaTable, write_deltalake

    kind = "s3" if root.startswith("s3") else "local"
    table, uri = f"mx_rs_{kind}", f"{root}/rs_t"
    options = s3_write_options() if kind == "s3" else None
    rows = pa.table({"id": pa.array(range(50), pa.int64()), "g": pa.array([i % 6 for i in range(50)], pa.int64()),
                     "price": pa.array([(i * 41) % 470 for i in range(50)], pa.int64())})
    write_deltalake(uri, rows, configuration={"delta.enableChangeDataFeed": "true"}, storage_options=options)
    service.register_table(table, uri)
    name = f"{table}_top"
    service.create_sketch(name, SQL.format(t=table), [f"{table}.price"], bounds=[BOUNDS], trigger="matrix")
    dt = DeltaTable(uri, storage_options=options)
    dt.delete("id % 4 = 0")
    check(service, name, table)
    dt.update(predicate="g = 2", updates={"price": "price + 100"})
    dt.merge(pa.table({"id": pa.array([1, 77], pa.int64()), "g": pa.array([1, 5], pa.int64()),
                       "price": pa.array([499, 499], pa.int64())}), predicate="t.id = s.id", source_alias="s",
             target_alias="t").when_matched_update_all().when_not_matched_insert_all().execute()
    check(service, name, table)
    dt.optimize.z_order(["price"])
    check(service, name, table)


def _log_files(spark, uri: str) -> list[str]:  # noqa: ANN001
    jvm = spark.sparkContext._jvm
    path = jvm.org.apache.hadoop.fs.Path(uri_for_spark(uri) + "/_delta_log")
    fs = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    return [str(s.getPath().getName()) for s in fs.listStatus(path)]

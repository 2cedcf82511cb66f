"""Tables by name: ``imp table register NAME --table CATALOG.DB.TABLE`` resolves the name to its location and Delta
table id at registration and re-checks both on every maintenance."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from imp_core.errors import SourceError, UsageError
from imp_core.sources.names import location_uri, quoted

pytestmark = [pytest.mark.spark, pytest.mark.postgres]

SQL = "SELECT g, SUM(price) AS rev FROM {t} GROUP BY g HAVING SUM(price) > 50"


def test_names_are_quoted_and_locations_normalized() -> None:
    assert quoted("spark_catalog.shop.sales") == "`spark_catalog`.`shop`.`sales`"
    with pytest.raises(UsageError, match="CATALOG.DB.TABLE"):
        quoted("shop.sales; DROP TABLE x")
    assert location_uri("file:/tmp/a%20b/t/") == "/tmp/a b/t"
    assert location_uri("s3a://bucket/t") == "s3://bucket/t"


def test_a_session_catalog_name_is_resolved_and_rechecked(service, spark, tmp_path: Path) -> None:  # noqa: ANN001
    spark.sql("CREATE DATABASE IF NOT EXISTS imp_names")
    first, second = tmp_path / "v1", tmp_path / "v2"
    for where in (first, second):
        spark.sql(f"CREATE TABLE delta.`{where}` (id BIGINT, g BIGINT, price BIGINT) USING delta "
                  f"TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')")
        spark.sql(f"INSERT INTO delta.`{where}` SELECT id, id % 3, id * 10 FROM range(12)")
    spark.sql(f"CREATE TABLE imp_names.orders USING delta LOCATION '{first}'")
    record = service.register_table("named_orders", table="imp_names.orders")
    assert record.path == str(first)
    assert service.catalog.table_identity("named_orders")[0] == "imp_names.orders"
    service.create_sketch("named_orders_top", SQL.format(t="named_orders"), ["named_orders.price"],
                          bounds=["0,40,80"], trigger="test")
    spark.sql(f"INSERT INTO delta.`{first}` VALUES (30, 1, 300)")
    assert service.maintain("named_orders_top").versions[-1].fragments  # same table: maintained

    spark.sql("DROP TABLE imp_names.orders")
    spark.sql(f"CREATE TABLE imp_names.orders USING delta LOCATION '{second}'")  # the name now means another table
    latest = service.catalog.latest_version(service.catalog.get_sketch("named_orders_top").id).version
    with pytest.raises(SourceError, match="now points at .*--replace") as info:
        service.maintain("named_orders_top")
    assert "\n" not in str(info.value)
    assert service.catalog.latest_version(service.catalog.get_sketch("named_orders_top").id).version == latest

    with pytest.raises(SourceError, match="cannot be resolved in the Spark catalog"):
        service.register_table("nowhere", table="imp_names.no_such_table")
    with pytest.raises(UsageError, match="PATH or --table"):
        service.register_table("both", str(first), table="imp_names.orders")


@pytest.mark.slow
def test_names_in_sparks_builtin_hive_metastore(tmp_path: Path) -> None:
    """Spark's built-in metastore (Derby, under IMP_HOME): register by name through the CLI, maintain, then the
    name is dropped and created again at another location."""
    home = Path(os.environ.get("TMPDIR", "/tmp")) / f"imp-names-{os.getpid()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("IMP_", "PYSPARK_GATEWAY"))}
    env.update({"IMP_HOME": str(home), "IMP_SPARK_METASTORE": "hive", "IMP_SPARK_MASTER": "local[2]",
                "IMP_SHUFFLE_PARTITIONS": "2", "PYSPARK_PYTHON": sys.executable})
    steps = str(Path(__file__).with_name("metastore_steps.py"))
    try:
        done = subprocess.run([sys.executable, steps, str(tmp_path)], env=env, cwd=tmp_path, text=True,
                              capture_output=True, timeout=600, check=False)
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
        [line] = [ln for ln in done.stdout.splitlines() if ln.startswith("METASTORE-STEPS ")]
        out = json.loads(line.split(" ", 1)[1])
    finally:
        from imp_core.catalog.embedded import stop_embedded
        from imp_core.config import Settings

        stop_embedded(Settings.from_env({"IMP_HOME": str(home)}))
    assert out["catalog"] == "hive" and out["cli_exit"] == 0
    assert out["path"] == str(tmp_path / "sales_v1") and out["maintained"] == [2]
    assert "now points at" in out["error"] and str(tmp_path / "sales_v2") in out["error"]

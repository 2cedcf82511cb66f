"""Steps of the tables-by-name test that need Spark's Hive metastore (its built-in Derby database), run in their
own process (the test session's Spark uses the in-memory catalog). ``python metastore_steps.py DATA``."""

from __future__ import annotations

import json
import sys

from imp_core.cli.main import main as imp
from imp_core.config import Settings
from imp_core.errors import ImpError
from imp_core.maintenance.service import SketchService
from imp_core.spark.session import get_spark

SQL = "SELECT g, SUM(price) AS rev FROM named_sales GROUP BY g HAVING SUM(price) > 50"


def create(spark, data: str, where: str) -> None:  # noqa: ANN001
    spark.sql("CREATE DATABASE IF NOT EXISTS shop")
    spark.sql(
        f"CREATE TABLE shop.sales (id BIGINT, g BIGINT, price BIGINT) USING delta LOCATION '{data}/{where}' "
        f"TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')"
    )
    spark.sql("INSERT INTO shop.sales SELECT id, id % 3, id * 10 FROM range(12)")


def main(data: str) -> dict[str, object]:
    spark = get_spark()
    out: dict[str, object] = {"catalog": spark.conf.get("spark.sql.catalogImplementation")}
    service = SketchService(Settings.from_env(), spark=spark)
    create(spark, data, "sales_v1")
    out["cli_exit"] = imp(["table", "register", "named_sales", "--table", "spark_catalog.shop.sales", "--json"])
    out["path"] = service.catalog.get_table("named_sales").path
    service.create_sketch("named_top", SQL, ["named_sales.price"], bounds=["0,40,80"], trigger="metastore")
    spark.sql("INSERT INTO shop.sales VALUES (20, 1, 200)")
    out["maintained"] = [v.version for v in service.maintain("named_top", trigger="metastore").versions]
    # drop the table and create it again elsewhere under the same name
    spark.sql("DROP TABLE shop.sales")
    create(spark, data, "sales_v2")
    try:
        service.maintain("named_top", trigger="metastore")
        out["error"] = None
    except ImpError as e:
        out["error"] = str(e)
    return out


if __name__ == "__main__":
    sys.stdout.write("METASTORE-STEPS " + json.dumps(main(sys.argv[1]), default=str) + "\n")

"""The change feed of a large range (or of a column-mapped table, whose feed delta-rs cannot read), read by Spark's
``readChangeFeed`` in parallel and returned to the driver as Arrow.

The switch-over point from delta-rs is ``IMP_CDF_SPARK_ROWS`` change rows (0 = never by size). See
docs/ARCHITECTURE.md, "Data flow" and docs/BENCHMARKS.md, "Change feed".
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pyarrow as pa

from imp_core.errors import ConfigError
from imp_core.sources import storage

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ENV_SPARK_ROWS = "IMP_CDF_SPARK_ROWS"
DEFAULT_SPARK_ROWS = 0  # never by size: delta-rs was faster at 1K-10M rows on local[2] (docs/BENCHMARKS.md)
_SCHEMA_MODE = "spark.databricks.delta.changeDataFeed.defaultSchemaModeForColumnMappingTable"


def spark_rows_threshold() -> int:
    """Change rows from which a range is read with Spark instead of delta-rs."""
    raw = os.environ.get(ENV_SPARK_ROWS)
    if not raw:
        return DEFAULT_SPARK_ROWS
    try:
        value = int(raw)
    except ValueError as e:
        raise ConfigError(f"{ENV_SPARK_ROWS} must be an integer (change rows), got {raw!r}") from e
    if value < 0:
        raise ConfigError(f"{ENV_SPARK_ROWS} must be at least 0, got {value}")
    return value


def read_change_feed(spark: SparkSession, uri: str, after: int, upto: int, columns: list[str]) -> pa.Table:
    """Change rows of versions ``(after, upto]``: ``columns`` plus ``_change_type`` and ``_commit_version``."""
    from pyspark.sql import functions as F  # this module imports without Spark

    if storage.is_s3(uri):
        storage.configure_spark(spark)
    spark.conf.set(_SCHEMA_MODE, "endVersion")
    df = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", after + 1)
        .option("endingVersion", upto)
        .load(storage.spark_uri(uri))
    )
    cols = [F.col("`" + c.replace("`", "``") + "`") for c in columns]
    return df.select(*cols, F.col("_change_type"), F.col("_commit_version")).toArrow()


__all__ = ["DEFAULT_SPARK_ROWS", "ENV_SPARK_ROWS", "read_change_feed", "spark_rows_threshold"]

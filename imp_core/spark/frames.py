"""polars frames to Spark DataFrames and back, always through Arrow (no Python on the executors)."""

from __future__ import annotations

from collections.abc import Mapping

import polars as pl
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from imp_core.engine.annotation import FRAG_DTYPE, SET_DTYPE
from imp_core.spark.types import arrow_schema_to_spark


def to_polars(df: DataFrame) -> pl.DataFrame:
    table = df.toArrow()
    return pl.from_arrow(table) if table.num_rows else pl.from_arrow(table.schema.empty_table())  # type: ignore[return-value]


def to_spark(spark: SparkSession, df: pl.DataFrame) -> DataFrame:
    """A polars frame as a Spark DataFrame (unsigned fragment ids become signed ints on the way).

    Always through Arrow, also when empty: the JVM builds the frame from Arrow batches, so executors never start a
    Python worker (``createDataFrame([], schema)`` would, and a cluster's workers need not have Python).
    """
    table = _arrow(df)
    schema = arrow_schema_to_spark(table.schema)
    if table.num_rows == 0:  # pyspark cannot convert an empty list column: one row of NULLs, filtered out on the JVM
        nulls = pa.table({f.name: pa.nulls(1, f.type) for f in table.schema})
        return spark.createDataFrame(nulls, schema).where(F.lit(False))
    return spark.createDataFrame(table, schema)


def spark_schema(schema: Mapping[str, pl.DataType]) -> T.StructType:
    """The Spark schema :func:`to_spark` gives a frame of ``schema``."""
    return arrow_schema_to_spark(_arrow(pl.DataFrame(schema=dict(schema))).schema)


def _arrow(df: pl.DataFrame) -> pa.Table:
    casts: dict[str, pl.DataType] = {}
    for name, dtype in df.schema.items():
        if dtype == FRAG_DTYPE:
            casts[name] = pl.Int32()
        elif dtype == SET_DTYPE:
            casts[name] = pl.List(pl.Int32)
    table = df.cast(casts).to_arrow() if casts else df.to_arrow()  # type: ignore[arg-type]
    return table.cast(pa.schema([pa.field(f.name, _plain(f.type)) for f in table.schema]))


def _plain(t: pa.DataType) -> pa.DataType:
    if t == pa.string_view() or pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_list(t) or (pa.types.is_list(t) and t.value_type == pa.uint32()):
        return pa.list_(pa.int32())
    return t


__all__ = ["spark_schema", "to_polars", "to_spark"]

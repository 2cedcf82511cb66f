"""polars frames to Spark and back (imp_core/spark/frames.py): types kept, also for empty frames with list columns."""

from __future__ import annotations

import polars as pl
import pytest

from imp_core.engine.annotation import FRAG_DTYPE, SET_DTYPE
from imp_core.spark.frames import spark_schema, to_polars, to_spark

pytestmark = [pytest.mark.spark]

SCHEMA = {"k": pl.Int64, "v": pl.Decimal(12, 2), "__mult": pl.Int64, "__f0": FRAG_DTYPE, "__sk": SET_DTYPE}


@pytest.mark.parametrize("rows", [[], [(1, None, 1, 3, [0, 2]), (None, 1.5, -1, None, [])]])
def test_a_frame_goes_to_spark_and_back_with_its_types(spark, rows: list[tuple]) -> None:  # noqa: ANN001
    """An empty frame with a fragment-set column too (a result of operators in memory that is empty: pyspark cannot
    convert an empty list column by itself)."""
    df = pl.DataFrame(rows, schema=SCHEMA, orient="row")
    sdf = to_spark(spark, df)
    assert sdf.schema == spark_schema(SCHEMA)
    assert sdf.schema["__sk"].dataType.simpleString() == "array<int>"
    back = to_polars(sdf)
    assert back.height == len(rows)
    assert back.cast(SCHEMA).sort("k", nulls_last=True).equals(df.sort("k", nulls_last=True))  # type: ignore[arg-type]

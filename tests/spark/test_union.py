"""UNION ALL on the Spark backend: for each query shape of ``tests/engine/test_union.py`` (a top-level union, top-k
over one, a branch with an aggregation, a join above one, DISTINCT over a self-union) Spark's capture reaches the
operator state the in-memory capture reaches, before and after a maintenance pass of changes to one input."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from imp_core.engine.local import LocalBackend
from imp_core.engine.pipeline import Pipeline
from imp_core.plan.sql import parse_query
from imp_core.sketch.partition import Partition, PartitionSet
from imp_core.sources.delta import DeltaSource
from imp_core.spark.backend import SparkBackend
from tests.conftest import write_delta
from tests.engine.test_union import SHAPES
from tests.oracles import same_state

pytestmark = pytest.mark.spark

SCHEMA = pa.schema([("g", pa.int64()), ("v", pa.int64())])
PARTS = PartitionSet((Partition("T1", "g", (0, 5, 10), "int"), Partition("T2", "g", (0, 5, 10), "int")))


def test_union_shapes_capture_on_spark_like_in_memory(spark: SparkSession, tmp_path: Path) -> None:
    write_delta(tmp_path / "T1", pa.table({"g": [1, 1, 6, 3, 9, None], "v": [4, -2, 20, 7, 12, 5]}, SCHEMA),
                mode="overwrite")
    write_delta(tmp_path / "T2", pa.table({"g": [1, 7, 6, 3], "v": [3, 1, 9, -4]}, SCHEMA), mode="overwrite")
    sources = {t: DeltaSource(t, tmp_path / t) for t in ("T1", "T2")}
    backend = SparkBackend(spark, sources)
    write_delta(tmp_path / "T2", pa.table({"g": [6, 2], "v": [30, 8]}, SCHEMA))  # version 1
    changes = pl.from_arrow(sources["T2"].changes(0, 1))
    local = LocalBackend(lambda t, v: pl.from_arrow(sources[t].table_at(v).to_pyarrow_table()))
    for sql in SHAPES:
        plan = parse_query(sql, {"T1": SCHEMA, "T2": SCHEMA}).plan
        on_spark, in_memory = Pipeline(plan, PARTS), Pipeline(plan, PARTS)
        on_spark.capture(backend, {"T1": 0, "T2": 0})
        in_memory.capture(local, {"T1": 0, "T2": 0})
        same_state(on_spark, in_memory)
        on_spark.maintain_pass("T2", changes, backend, {"T1": 0, "T2": 1})
        recaptured = Pipeline(plan, PARTS)
        recaptured.capture(backend, {"T1": 0, "T2": 1})
        same_state(on_spark, recaptured)

"""The Spark backend gives the same capture and maintenance as the in-memory backend (paper Example 5.1)."""

from __future__ import annotations

import polars as pl
import pytest

from imp_core.engine.annotation import MULT
from imp_core.engine.local import LocalBackend
from imp_core.sources.delta import DeltaSource
from imp_core.spark.backend import SparkBackend
from tests.conftest import write_delta
from tests.engine.test_example_5_1 import DELTA_R, R0, S0, build

pytestmark = pytest.mark.spark


def test_example_5_1_on_spark_and_delta(spark, tmp_path) -> None:
    write_delta(tmp_path / "R", R0.to_arrow(), mode="overwrite")
    write_delta(tmp_path / "S", S0.to_arrow(), mode="overwrite")
    sources = {"R": DeltaSource("R", tmp_path / "R"), "S": DeltaSource("S", tmp_path / "S")}
    backend = SparkBackend(spark, sources)

    pipe, _ = build()
    first = pipe.capture(backend, {"R": 0, "S": 0})
    assert pipe.sketch() == {1, 2} and set(first.added) == {1, 2}

    write_delta(tmp_path / "R", DELTA_R.drop(MULT).to_arrow())
    changes = pl.from_arrow(sources["R"].changes(0, 1))
    out = pipe.maintain_pass("R", changes, backend, {"R": 1, "S": 0})
    assert set(out.added) == {0, 3}
    assert pipe.sketch() == {0, 1, 2, 3}

    # the state Spark's capture builds equals the state maintenance reached
    fresh, _ = build()
    fresh.capture(backend, {"R": 1, "S": 0})
    local, _ = build()
    local.capture(LocalBackend(lambda t, v: pl.from_arrow(sources[t].table_at(v).to_pyarrow_table())),
                  {"R": 1, "S": 0})
    for a, b, c in zip(pipe.stateful(), fresh.stateful(), local.stateful()):
        for name, df in a.canonical().items():
            assert df.equals(b.canonical()[name]), (a.op_id, name)
            assert df.equals(c.canonical()[name]), (a.op_id, name)


@pytest.mark.parametrize("small_rows", [0, 100])
def test_join_caches_on_spark(spark, tmp_path, small_rows: int) -> None:  # noqa: ANN001
    """Bloom filter (small_rows=0) or a cached small side (100): the Spark backend builds them and the sketch is
    unchanged."""
    from imp_core.engine.operators.join import JoinCaching
    from imp_core.engine.pipeline import Pipeline
    from tests.engine.test_example_5_1 import build as build_plain

    write_delta(tmp_path / "R", R0.to_arrow(), mode="overwrite")
    write_delta(tmp_path / "S", S0.to_arrow(), mode="overwrite")
    sources = {"R": DeltaSource("R", tmp_path / "R"), "S": DeltaSource("S", tmp_path / "S")}
    backend = SparkBackend(spark, sources)
    plain, _ = build_plain()
    pipe = Pipeline(plain.plan, plain.partitions, join_caching=JoinCaching(bloom=True, small_rows=small_rows))
    pipe.capture(backend, {"R": 0, "S": 0})
    write_delta(tmp_path / "R", DELTA_R.drop(MULT).to_arrow())
    out = pipe.maintain_pass("R", pl.from_arrow(sources["R"].changes(0, 1)).drop("__version"), backend,
                             {"R": 1, "S": 0})
    assert set(out.added) == {0, 3} and pipe.sketch() == {0, 1, 2, 3}
    join = [op for op in pipe.stateful() if op.kind == "join"][0]
    assert join.caches["right"][0] == ("rows" if small_rows else "bloom")

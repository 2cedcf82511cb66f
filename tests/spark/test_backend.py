"""The Spark backend: Example 5.1 on Spark and Delta (checked against DuckDB), join caches, and the join side that
joins a shipped delta with a table at a version (checked against DuckDB joins of the same rows)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from imp_core.config import Optimizations
from imp_core.engine.backend import Relation
from imp_core.engine.local import LocalBackend
from imp_core.engine.operators.context import JoinCaching
from imp_core.engine.pipeline import Pipeline
from imp_core.engine.schema import MULT
from imp_core.plan.nodes import Join
from imp_core.plan.sql import parse_query
from imp_core.sketch.partition import Partition, PartitionSet
from imp_core.sources.delta import DeltaSource
from imp_core.spark.backend import SparkBackend
from tests.conftest import write_delta
from tests.engine.test_example_5_1 import DELTA_R, R0, S0, build
from tests.engine.test_example_5_1 import build as build_plain
from tests.oracles import canonical, duck, fragments_of, snapshot

pytestmark = pytest.mark.spark


def test_example_5_1_on_spark_and_delta(spark: SparkSession, tmp_path: Path) -> None:
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

    # the maintained aggregation state holds the per-group SUM and COUNT DuckDB computes over the snapshots

    [agg] = [op for op in pipe.stateful() if op.kind == "aggregation"]
    groups = agg.groups.filter(pl.col("__cnt") > 0)
    assert canonical(groups.select("a", "__s0").rows()) == canonical(duck(
        "SELECT r.a, SUM(s.c) FROM r JOIN s ON r.b = s.d WHERE r.a > 3 GROUP BY r.a",
        r=snapshot(tmp_path / "R", 1), s=snapshot(tmp_path / "S", 0))) == [(5, 7), (9, 6)]

    # consistency (not an oracle: the same operator code): Spark's capture reaches the state maintenance reached
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


@pytest.mark.parametrize("limit", [0, 1_000])
def test_a_side_reading_more_rows_than_side_cache_rows_gets_no_cache(spark, tmp_path, limit: int) -> None:  # noqa: ANN001
    """A side whose tables hold more than ``side_cache_rows`` rows (from their Delta logs) is never summarized (no
    Spark job evaluates it whole): each delta is joined with it on Spark, and the sketch is the same."""

    write_delta(tmp_path / "R", R0.to_arrow(), mode="overwrite")
    write_delta(tmp_path / "S", S0.to_arrow(), mode="overwrite")
    sources = {"R": DeltaSource("R", tmp_path / "R"), "S": DeltaSource("S", tmp_path / "S")}
    backend = SparkBackend(spark, sources, Optimizations(side_cache_rows=limit))
    plain, _ = build_plain()
    pipe = Pipeline(plain.plan, plain.partitions, join_caching=JoinCaching(bloom=True, small_rows=0))
    pipe.capture(backend, {"R": 0, "S": 0})
    [join] = [op for op in pipe.stateful() if op.kind == "join"]
    side = Relation(join.node.right, pipe.annotations)
    assert backend.too_large_to_cache(side, {"R": 0, "S": 0}) == (S0.height > limit)
    write_delta(tmp_path / "R", DELTA_R.drop(MULT).to_arrow())
    jobs = backend.spark_jobs
    out = pipe.maintain_pass("R", pl.from_arrow(sources["R"].changes(0, 1)).drop("__version"), backend,
                             {"R": 1, "S": 0})
    assert set(out.added) == {0, 3} and pipe.sketch() == {0, 1, 2, 3}
    assert (join.caches["right"] is None) == (limit == 0)
    assert backend.spark_jobs - jobs == (1 if limit == 0 else 2)  # the join alone, or the key counts and the join


# -- the Spark join side (a shipped delta joined with the other input at a version) ---------------------------------


def join_through_side(spark, tmp_path, delta: pa.Table, right: pa.Table, on: str, pushdown: bool):  # noqa: ANN001, ANN201
    """Join ``delta`` (columns of r plus ``__mult``) with table s through ``SparkBackend.join_delta`` and,
    independently, through DuckDB; return (ours, expected) as canonical rows (r columns, s columns, multiplicity)."""

    r_cols = [c for c in delta.column_names if c != MULT]
    write_delta(tmp_path / "r", delta.select(r_cols).slice(0, 0), mode="overwrite")
    write_delta(tmp_path / "s", right, mode="overwrite")
    sources = {"r": DeltaSource("r", tmp_path / "r"), "s": DeltaSource("s", tmp_path / "s")}
    plan = parse_query(f"SELECT r.x, s.y FROM r JOIN s ON {on}", {t: s.schema() for t, s in sources.items()}).plan
    bounds = (0, 10, 100, 1000)
    pipe = Pipeline(plan, PartitionSet((Partition("r", "x", bounds, "int"),)))
    [join] = [n for n in plan.walk() if isinstance(n, Join)]
    annotated = pipe.op(join.left).process(pl.from_arrow(delta))
    backend = SparkBackend(spark, sources, Optimizations(join_key_pushdown=pushdown))
    out = backend.join_delta(join, annotated, True, Relation(join.right, pipe.annotations), {"r": 0, "s": 0})

    names = [*join.left.names, *join.right.names]
    assert out.columns[:len(names) + 1] == [*names, MULT]
    if out.height:
        assert out.columns == [*names, MULT, "__f0"]
        for x, frag in zip(out.get_column("r.x").to_list(), out.get_column("__f0").to_list()):
            assert [frag] == fragments_of([x], bounds)  # each joined row keeps its delta row's fragment
    on_duck = on.replace("r.", "d.")
    s_cols = right.column_names
    expected = duck(f"SELECT {', '.join(f'd.{c}' for c in r_cols)}, {', '.join(f's.{c}' for c in s_cols)}, "
                    f"d.{MULT} * 1 FROM d JOIN s ON {on_duck}", d=delta, s=snapshot(tmp_path / "s"))
    return canonical(out.select([*names, MULT]).rows()), canonical(expected), backend


@pytest.mark.parametrize("pushdown", [True, False])
def test_join_side_over_2000_keys_uses_the_range_fallback(spark, tmp_path, pushdown: bool) -> None:  # noqa: ANN001
    """Over 2,000 distinct delta keys the large side is restricted by the keys' range, not an IN list; rows outside
    the range are skipped, every partner inside is found (inserts and deletes)."""
    n = 2500
    delta = pa.table({"k": [3 * i for i in range(n)], "x": [i % 1200 for i in range(n)],
                      MULT: [1 if i % 4 else -1 for i in range(n)]})
    right = pa.table({"k": [i for i in range(-50, 3 * n + 50)] + [6, 6], "y": list(range(3 * n + 100)) + [7, 8]})
    ours, expected, _ = join_through_side(spark, tmp_path, delta, right, "r.k = s.k", pushdown)
    assert len(expected) == n + 2 and ours == expected


@pytest.mark.parametrize("keys", [5, 2100])
def test_join_side_matches_nan_and_signed_zero_keys_as_spark_does(spark, tmp_path, keys: int) -> None:  # noqa: ANN001
    """Spark joins NaN with NaN and -0.0 with 0.0; the key push-down (an IN list, or the range fallback above 2,000
    keys, whose polars min/max skip NaN) must keep those partners."""
    nan = float("nan")
    ks = [nan, -0.0] + [float(i) for i in range(1, keys - 1)]
    delta = pa.table({"k": ks, "x": list(range(keys)), MULT: [1] * keys})
    right = pa.table({"k": [nan, 0.0, -0.0, 1.0, 1e9], "y": [1, 2, 3, 4, 5]})
    ours, expected, _ = join_through_side(spark, tmp_path, delta, right, "r.k = s.k", pushdown=True)
    assert len(expected) == 4  # NaN-NaN, -0.0 with both zeros, 1.0
    assert ours == expected


def test_join_side_never_joins_null_keys(spark, tmp_path) -> None:  # noqa: ANN001
    delta = pa.table({"k": pa.array([1, None, 2], pa.int64()), "x": [1, 2, 3], MULT: [1, 1, -1]})
    right = pa.table({"k": pa.array([1, None, None, 3], pa.int64()), "y": [10, 20, 30, 40]})
    ours, expected, _ = join_through_side(spark, tmp_path, delta, right, "r.k = s.k", pushdown=True)
    assert ours == expected == [(1, 1, 1, 10, 1)]

    only_nulls = pa.table({"k": pa.array([None, None], pa.int64()), "x": [1, 2], MULT: [1, 1]})
    ours, expected, backend = join_through_side(spark, tmp_path, only_nulls, right, "r.k = s.k", pushdown=True)
    assert ours == expected == [] and backend.spark_jobs == 0  # no key can match: no Spark job at all


@pytest.mark.parametrize("keys", [4, 2100])
def test_join_side_with_composite_keys(spark, tmp_path, keys: int) -> None:  # noqa: ANN001
    """The push-down restricts by the first key only; the join still needs every key to match."""
    delta = pa.table({"k": [i // 2 for i in range(keys)], "j": ["a" if i % 2 else "b" for i in range(keys)],
                      "x": list(range(keys)), MULT: [1] * keys})
    right = pa.table({"k": [0, 0, 1, 1, keys], "j": ["a", "c", "b", "a", "a"], "y": [1, 2, 3, 4, 5]})
    ours, expected, _ = join_through_side(spark, tmp_path, delta, right, "r.k = s.k AND r.j = s.j", pushdown=True)
    assert sorted(r[-2] for r in expected) == [1, 3, 4]  # (0,a), (1,b), (1,a); (0,c) and k = keys have no partner
    assert ours == expected

"""The anti join on Spark: the plain compile answers as Spark's own ``NOT EXISTS`` / ``NOT IN`` on data with NULLs
(and an empty subquery), and for a few query shapes Spark's capture reaches the operator state the in-memory capture
reaches, before and after a maintenance pass of changes to the subquery's table (plans built by hand)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession

from imp_core.engine.backend import Relation
from imp_core.engine.local import LocalBackend
from imp_core.engine.pipeline import Pipeline
from imp_core.engine.schema import MULT
from imp_core.plan.expr import INT, AggCall, Binary, Col, Lit
from imp_core.plan.nodes import Aggregate, AntiJoin, Field, Join, Plan, Project, Scan, Select
from imp_core.sketch.partition import Partition, PartitionSet
from imp_core.sources.delta import DeltaSource
from imp_core.spark.backend import SparkBackend
from imp_core.spark.compile import PlanCompiler
from tests.conftest import write_delta
from tests.oracles import canonical, same_state

pytestmark = pytest.mark.spark

SCHEMA = pa.schema([("g", pa.int64()), ("v", pa.int64())])
PARTS = PartitionSet((Partition("T1", "g", (0, 5, 10), "int"), Partition("T2", "g", (0, 5, 10), "int")))
T1 = Scan("T1", "T1", (Field("g", INT), Field("v", INT)))
T2 = Scan("T2", "T2", (Field("g", INT), Field("v", INT)))
ON = Binary("=", Col("T1.g", INT), Col("T2.g", INT))

LEFT = [(1, 4), (1, -2), (None, 5), (3, 7), (6, 20), (9, 12)]
RIGHTS = {
    "with_a_null_key": [(1, 3), (None, 1), (6, 9)],
    "without_nulls": [(1, 3), (7, 1), (6, 9), (6, 2)],
    "empty": [],
}


def _compiled(spark: SparkSession, plan: Plan, frames: dict[str, DataFrame]) -> list[tuple]:
    df = PlanCompiler(spark, lambda scan: frames[scan.table], plain=True).compile(plan)
    return canonical(tuple(r) for r in df.collect())


@pytest.mark.parametrize("right", list(RIGHTS))
def test_the_plain_compile_answers_as_sparks_not_exists_and_not_in(spark: SparkSession, right: str) -> None:
    frames = {"T1": spark.createDataFrame(LEFT, "g long, v long"),
              "T2": spark.createDataFrame(RIGHTS[right], "g long, v long")}
    for name, df in frames.items():
        df.createOrReplaceTempView(f"anti_{name}")
    not_exists = spark.sql("SELECT g, v FROM anti_T1 WHERE NOT EXISTS (SELECT 1 FROM anti_T2 WHERE anti_T2.g = "
                           "anti_T1.g)").collect()
    not_in = spark.sql("SELECT g, v FROM anti_T1 WHERE g NOT IN (SELECT g FROM anti_T2)").collect()
    assert _compiled(spark, AntiJoin(T1, T2, ON), frames) == canonical(tuple(r) for r in not_exists)
    assert _compiled(spark, AntiJoin(T1, T2, ON, null_aware=True), frames) == canonical(tuple(r) for r in not_in)
    expected_not_in = {"with_a_null_key": [], "without_nulls": [(3, 7), (9, 12)], "empty": canonical(LEFT)}
    assert _compiled(spark, AntiJoin(T1, T2, ON, null_aware=True), frames) == expected_not_in[right]


def _having(plan: Plan) -> Plan:
    agg = Aggregate(plan, (("g", Col("T1.g", INT)),), (("n", AggCall("count", None)),))
    return Select(agg, Binary(">", Col("n", INT), Lit.of(1)))


def _joined(plan: Plan) -> Plan:
    """The anti join's rows joined with T2 again (Spark joins a delta with the anti join's contents from state)."""
    t3 = Project(Scan("T2", "T3", (Field("g", INT), Field("v", INT))), (("g3", Col("T3.g", INT)),))
    return Join(plan, t3, Binary("=", Col("T1.g", INT), Col("g3", INT)))


SHAPES: dict[str, Callable[[], Plan]] = {
    "not_exists": lambda: AntiJoin(T1, T2, ON),
    "not_in": lambda: AntiJoin(T1, T2, ON, null_aware=True),
    "having_over_not_exists": lambda: _having(AntiJoin(T1, T2, ON)),
    "join_above_not_in": lambda: _joined(AntiJoin(T1, T2, ON, null_aware=True)),
}


def test_anti_join_shapes_capture_on_spark_like_in_memory(spark: SparkSession, tmp_path: Path) -> None:
    g1, v1 = zip(*LEFT)
    write_delta(tmp_path / "T1", pa.table({"g": list(g1), "v": list(v1)}, SCHEMA), mode="overwrite")
    write_delta(tmp_path / "T2", pa.table({"g": [1, 7, 3], "v": [3, 1, -4]}, SCHEMA), mode="overwrite")
    sources = {t: DeltaSource(t, tmp_path / t) for t in ("T1", "T2")}
    backend = SparkBackend(spark, sources)
    # versions 1 and 2: key 9 and a NULL key arrive in the subquery, key 3 leaves (its T1 row comes back)
    write_delta(tmp_path / "T2", pa.table({"g": [9, None], "v": [30, 8]}, SCHEMA))
    DeltaTable(str(tmp_path / "T2")).delete("g = 3")
    changes = pl.from_arrow(sources["T2"].changes(0, 2))
    local = LocalBackend(lambda t, v: pl.from_arrow(sources[t].table_at(v).to_pyarrow_table()))
    sketches = {}
    for shape, build in SHAPES.items():
        plan = build()
        on_spark, in_memory = Pipeline(plan, PARTS), Pipeline(plan, PARTS)
        on_spark.capture(backend, {"T1": 0, "T2": 0})
        in_memory.capture(local, {"T1": 0, "T2": 0})
        same_state(on_spark, in_memory)
        before = on_spark.sketch()
        on_spark.maintain_pass("T2", changes, backend, {"T1": 0, "T2": 2})
        recaptured = Pipeline(plan, PARTS)
        recaptured.capture(backend, {"T1": 0, "T2": 2})
        same_state(on_spark, recaptured)
        sketches[shape] = (before, on_spark.sketch())
        if isinstance(plan, AntiJoin):  # compiled with annotations (no state held): the left rows' fragments only
            rel = Relation(plan, on_spark.annotations)
            got, want = backend.relation(rel, {"T1": 0, "T2": 2}), local.relation(rel, {"T1": 0, "T2": 2})
            assert got.columns == want.columns == ["T1.g", "T1.v", MULT, "__f0"]
            assert canonical(got.rows()) == canonical(want.rows())
        if shape == "not_exists":  # NOT EXISTS (1, 7, 9, NULL): the NULL key's row stays, 3's comes back, 9's goes
            rows = on_spark.relation_from_state(plan)
            assert rows is not None and canonical(rows.select("T1.g", "T1.v").rows()) == canonical(
                [(None, 5), (3, 7), (6, 20)])
    # NOT IN (1, 7, 3) keeps T1's 6 and 9 (fragment 1), NOT IN (1, 7, 9, NULL) nothing
    assert sketches["not_in"] == ({1}, set())

"""The analysis of order-dependent float sums: which operators decide membership conservatively, which shapes are
refused, and what the intervals and conservative decisions are (``imp_core.engine.order_dependence``)."""

from __future__ import annotations

import math
import random

import polars as pl
import pyarrow as pa
import pytest

from imp_core.engine.local import LocalBackend
from imp_core.engine.order_dependence import OrderDependence, sum_interval
from imp_core.engine.pipeline import Pipeline
from imp_core.errors import UnsupportedError
from imp_core.plan.nodes import Select, TopK
from imp_core.plan.sql import parse_query
from imp_core.sketch.partition import Partition, PartitionSet

SCHEMA = {"t": pa.schema([("g", pa.int64()), ("x", pa.float64()), ("d", pa.decimal128(10, 2)), ("i", pa.int64())]),
          "u": pa.schema([("g", pa.int64()), ("y", pa.float64())])}


def analysis(sql: str) -> tuple[OrderDependence, object]:
    plan = parse_query(sql, SCHEMA).plan
    return OrderDependence(plan), plan


@pytest.mark.parametrize("sql", [
    "SELECT g, SUM(x) AS s FROM t GROUP BY g HAVING SUM(x) > 1",
    "SELECT g FROM t GROUP BY g HAVING SUM(x) * 2 - 1 >= ROUND(AVG(x), 1)",
    "SELECT g FROM t GROUP BY g HAVING AVG(i) BETWEEN 1 AND 2 OR NOT (SUM(x) IN (1.5, 2.5))",
    "SELECT g FROM t GROUP BY g HAVING SUM(x) / COUNT(*) > 1 AND SUM(x) IS NOT NULL",
])
def test_having_over_float_sums_is_conservative(sql: str) -> None:
    od, plan = analysis(sql)
    assert any(od.role(n).conservative for n in plan.walk() if isinstance(n, Select))


@pytest.mark.parametrize("sql", [
    "SELECT g FROM t GROUP BY g HAVING SUM(d) > 1",  # exact decimal sum
    "SELECT g FROM t GROUP BY g HAVING SUM(i) > 1 AND MAX(x) > 1 AND COUNT(x) > 1",  # exact
])
def test_exact_aggregates_are_decided_exactly(sql: str) -> None:
    od, _ = analysis(sql)
    assert not od.any_conservative


@pytest.mark.parametrize("sql", [
    "SELECT g, SUM(x) AS s FROM t GROUP BY g ORDER BY s DESC LIMIT 3",
    "SELECT g, SUM(x) AS s FROM t GROUP BY g HAVING SUM(x) > 1 ORDER BY g LIMIT 3",  # maybe rows, flagged
])
def test_top_k_over_float_sums_is_conservative(sql: str) -> None:
    od, plan = analysis(sql)
    assert any(od.role(n).conservative for n in plan.walk() if isinstance(n, TopK))


@pytest.mark.parametrize("sql, why", [
    ("SELECT q.g FROM (SELECT g, SUM(x) AS s FROM t GROUP BY g) AS q JOIN u ON q.s = u.y", "join condition"),
    ("SELECT DISTINCT s FROM (SELECT g, SUM(x) AS s FROM t GROUP BY g) AS q ORDER BY s LIMIT 2", "LIMIT"),
    ("SELECT q.g, u.y FROM (SELECT g FROM t GROUP BY g HAVING SUM(x) > 1) AS q JOIN u ON q.g = u.g "
     "ORDER BY u.y LIMIT 2", "LIMIT"),
    ("SELECT g FROM t GROUP BY g HAVING CASE WHEN SUM(x) > 1 THEN 1 ELSE 0 END = 1", "cannot bound"),
    ("SELECT g FROM t GROUP BY g HAVING (COUNT(*) / SUM(x)) IS NULL", "cannot bound"),
    ("SELECT n, COUNT(*) AS c FROM (SELECT g, COUNT(*) AS n FROM t GROUP BY g HAVING SUM(x) > 1) AS q "
     "GROUP BY n HAVING COUNT(*) > 2", "cannot bound"),
])
def test_unsound_shapes_are_refused_with_the_remedy(sql: str, why: str) -> None:
    with pytest.raises(UnsupportedError, match="cast the SUM/AVG argument to DECIMAL") as e:
        analysis(sql)
    assert why in str(e.value)


def test_interval_holds_every_summation_order() -> None:
    """[lo, hi] around the engine's sum holds the sums of 2,000 random orders of values that cancel badly."""

    rng = random.Random(3)
    values = [rng.choice([1e16, -1e16, 1.0, 0.1, 1 / 3, -2.5e-3]) * rng.random() for _ in range(200)]
    exact = math.fsum(values)
    frame = pl.DataFrame({"v": [exact], "n": [len(values)], "a": [math.fsum(abs(v) for v in values)]})
    lo_e, hi_e = sum_interval(pl.col("v"), pl.col("n"), pl.col("a"), pl.lit(False), divide=False)
    lo, hi = frame.select(lo_e.alias("lo"), hi_e.alias("hi")).row(0)
    for _ in range(2000):
        rng.shuffle(values)
        total = 0.0
        for v in values:
            total += v
        assert lo <= total <= hi
    assert hi - lo < 1e-10 * frame.item(0, "a")  # and it is tight


def test_conservative_sketch_grows_only_at_the_boundary() -> None:
    """Groups far from the threshold are decided exactly; only the one at it is kept by both answers."""
    data = pl.DataFrame({"g": [1, 1, 1, 2, 3], "x": [0.1, 0.2, 0.3, 5.0, 0.01], "d": [None] * 5, "i": [0] * 5},
                        schema={"g": pl.Int64, "x": pl.Float64, "d": pl.Decimal(10, 2), "i": pl.Int64})
    plan = parse_query("SELECT g, SUM(x) AS s FROM t GROUP BY g HAVING SUM(x) > 0.6", SCHEMA).plan
    pipe = Pipeline(plan, PartitionSet((Partition("t", "g", (1, 2, 3, 4), "int"),)))
    pipe.capture(LocalBackend(lambda name, v: data), {"t": 0})
    assert pipe.sketch() == {0, 1}  # group 1 (at 0.6) and group 2 (5.0); not group 3 (0.01)


NOT_IN = ("SELECT t.g, COUNT(*) AS n FROM t WHERE t.i NOT IN (SELECT u.g FROM u GROUP BY u.g HAVING SUM(u.y) > 1.5) "
          "GROUP BY t.g")


def test_a_not_in_is_blocked_only_by_the_subquery_rows_that_surely_pass() -> None:
    """A right row a conservative HAVING kept may be absent from Spark's subquery; blocking with it would drop left
    rows Spark keeps. Key 8 sums to 1.5 (at the threshold: kept, not sure) and must not block; key 7 (2.0) does."""
    od, plan = analysis(NOT_IN)
    assert [od.role(n).certain_right for n in plan.walk() if type(n).__name__ == "AntiJoin"] == [True]
    tables = {
        "t": pl.DataFrame({"g": [1, 2, 3], "x": [0.0] * 3, "d": [None] * 3, "i": [8, 6, 7]},
                          schema={"g": pl.Int64, "x": pl.Float64, "d": pl.Decimal(10, 2), "i": pl.Int64}),
        "u": pl.DataFrame({"g": [8, 8, 7], "y": [1.0, 0.5, 2.0]}),
    }
    pipe = Pipeline(plan, PartitionSet((Partition("t", "g", (1, 2, 3, 4), "int"),)))
    pipe.capture(LocalBackend(lambda name, v: tables[name]), {"t": 0, "u": 0})
    assert pipe.sketch() == {0, 1}  # t.g = 1 (key 8) and 2 (key 6, in no group); not 3 (key 7, surely blocked)


def test_a_not_in_over_subquery_rows_that_may_not_exist_unflagged_is_refused() -> None:
    sql = ("SELECT t.g FROM t WHERE t.i NOT IN (SELECT q.g FROM (SELECT g FROM u GROUP BY g HAVING SUM(y) > 1) AS q "
           "JOIN u AS u2 ON q.g = u2.g)")
    with pytest.raises(UnsupportedError, match="NOT EXISTS / NOT IN over a subquery whose rows"):
        analysis(sql)


def test_intervals_through_abs_division_and_monotone_functions() -> None:
    """ABS, a quotient by an uncertain divisor that may be 0 (unknown), ROUND: conservative and exact where they can
    be; a group with no values (SUM NULL) never passes."""
    data = pl.DataFrame({"g": [1, 1, 1, 2, 3, 3], "x": [0.1, 0.2, -0.9, None, 1.0, -1.0], "d": [None] * 6,
                         "i": [0] * 6}, schema={"g": pl.Int64, "x": pl.Float64, "d": pl.Decimal(10, 2), "i": pl.Int64})
    parts = PartitionSet((Partition("t", "g", (1, 2, 3, 4), "int"),))
    for having, expected in [("ABS(SUM(x)) >= 0.6", {0}), ("ROUND(SUM(x), 1) = -0.6", {0}),
                             ("COUNT(*) / SUM(x) > 100", {2}), ("SUM(x) IS NULL", {1})]:
        plan = parse_query(f"SELECT g FROM t GROUP BY g HAVING {having}", SCHEMA).plan
        pipe = Pipeline(plan, parts)
        pipe.capture(LocalBackend(lambda name, v: data), {"t": 0})
        assert pipe.sketch() == expected, having

"""Subqueries in WHERE and HAVING on the in-memory backend (docs/SQL.md, "Subqueries").

Each shape is maintained under random inserts and deletes into both tables and checked after every pass three ways:
the maintained sketch equals a fresh capture, the engine's answer equals DuckDB's answer to the same SQL, and DuckDB's
answer over only the sketch's fragments equals its answer over everything (the sketch is sufficient).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import polars as pl
import pytest

from imp_core.engine.local import LocalBackend
from imp_core.engine.pipeline import Pipeline
from imp_core.errors import PlanError
from imp_core.plan.safety import check
from imp_core.plan.sql import parse_query
from imp_core.sketch.partition import Partition, PartitionSet
from tests.engine.two_tables import SCHEMA, VERSIONS, duck, maintained_like_a_recapture, reader, rows

SHAPES = [
    # uncorrelated IN: a join with the subquery's distinct values
    "SELECT g, v FROM T1 WHERE v IN (SELECT v FROM T2 WHERE g > 2)",
    # IN over a grouped subquery with HAVING (TPC-H Q18's shape) under an aggregation
    "SELECT g, SUM(v) AS s FROM T1 WHERE g IN (SELECT g FROM T2 GROUP BY g HAVING SUM(v) > 6) GROUP BY g",
    # correlated EXISTS (TPC-H Q4's shape), counted per group
    "SELECT g, COUNT(*) AS n FROM T1 WHERE EXISTS (SELECT * FROM T2 WHERE T2.g = T1.g "
    "AND T2.v > 3) GROUP BY g",
    # correlated IN: the value and the correlation key
    "SELECT g, v FROM T1 WHERE v IN (SELECT T2.v FROM T2 WHERE T2.g = T1.g)",
    # uncorrelated scalar subquery (TPC-H Q22's shape; an AVG of a DOUBLE would depend on Spark's adding order)
    "SELECT g, v FROM T1 WHERE v > (SELECT AVG(CAST(v AS DECIMAL(10, 2))) FROM T2 WHERE v > 0)",
    # correlated scalar subquery (TPC-H Q17's shape)
    "SELECT SUM(v) AS s FROM T1 WHERE v < (SELECT 0.5 * AVG(CAST(T2.v AS DECIMAL(10, 2))) FROM T2 WHERE T2.g = T1.g)",
    # scalar subquery in HAVING (TPC-H Q11's shape)
    "SELECT g, SUM(v) AS s FROM T1 GROUP BY g HAVING SUM(v) > (SELECT SUM(v) * 0.2 FROM T2)",
    # a scalar subquery over a filtered table under GROUP BY (TPC-H Q22 shape)
    "SELECT g, COUNT(*) AS n, SUM(v) AS s FROM T1 WHERE v > (SELECT AVG(CAST(v AS DECIMAL(10, 2))) FROM T1 "
    "WHERE v > 2) GROUP BY g",
    # NOT EXISTS (TPC-H Q22's shape) under an aggregation, and NOT IN with its NULL rules (T2.v may be NULL-free or
    # not: the random rows never hold NULL, the rule is exercised by tests/engine/test_anti_join.py)
    "SELECT g, COUNT(*) AS n FROM T1 WHERE NOT EXISTS (SELECT * FROM T2 WHERE T2.g = T1.g AND T2.v > 8) GROUP BY g",
    "SELECT g, v FROM T1 WHERE v NOT IN (SELECT v FROM T2 WHERE g < 4)",
    # EXISTS and NOT EXISTS correlated by an inequality besides the key (TPC-H Q21's shape)
    "SELECT g, v FROM T1 WHERE EXISTS (SELECT * FROM T2 WHERE T2.g = T1.g AND T2.v <> T1.v)",
    "SELECT g, COUNT(*) AS n FROM T1 WHERE NOT EXISTS (SELECT * FROM T2 WHERE T2.g = T1.g AND T2.v <> T1.v "
    "AND T2.v > 3) GROUP BY g",
    # a top-k over a semi join
    "SELECT g, v FROM T1 WHERE g IN (SELECT g FROM T2 WHERE v > 5) ORDER BY v DESC, g LIMIT 3",
]


@pytest.mark.parametrize("sql", SHAPES)
def test_subquery_shapes_are_maintained_exactly_and_their_sketches_suffice(sql: str) -> None:
    maintained_like_a_recapture(sql)


@pytest.mark.parametrize(("sql", "message"), [
    ("SELECT g FROM T1 WHERE EXISTS (SELECT * FROM T2 WHERE T2.g < T1.g)",
     "correlated condition other than inner = outer in EXISTS"),
    ("SELECT g FROM T1 WHERE g = 1 OR g IN (SELECT g FROM T2)", "IN \\(subquery\\) under OR or NOT"),
    ("SELECT g FROM T1 WHERE v < (SELECT COUNT(*) FROM T2 WHERE T2.g = T1.g)",
     "correlated scalar subquery with COUNT"),
    ("SELECT g FROM T1 WHERE v < (SELECT v FROM T2)", "scalar subquery that is not one aggregate row"),
    ("SELECT g FROM T1 WHERE (g, v) IN (SELECT g, v FROM T2)", "IN with several columns"),
    ("SELECT g FROM T1 WHERE g IN (SELECT g, v FROM T2)", "must select exactly one column"),
    ("SELECT g, (SELECT MAX(v) FROM T2) AS m FROM T1", "a subquery in SELECT"),
])
def test_what_cannot_be_decorrelated_is_refused_with_the_place(sql: str, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        parse_query(sql, {"T1": SCHEMA, "T2": SCHEMA})


@pytest.mark.parametrize(("sql", "parts", "safe"), [
    # a scalar AVG: when the answer has a row, the sketch keeps all the AVG's input; when not, AVG over none is NULL
    ("SELECT g, v FROM T1 WHERE v > (SELECT AVG(CAST(v AS DECIMAL(10, 2))) FROM T2)", {"T2": "g"}, True),
    # COUNT over no rows is 0, not NULL: an empty sketch would let rows through
    ("SELECT g, v FROM T1 WHERE v > (SELECT COUNT(*) FROM T2 WHERE v > 3)", {"T2": "g"}, False),
    # COALESCE makes a NULL AVG a number
    ("SELECT g, v FROM T1 WHERE v > (SELECT COALESCE(MAX(v), 0) FROM T2)", {"T2": "g"}, False),
    # under an aggregation without GROUP BY the answer always has a row, whose sketch may lack the AVG's input
    ("SELECT COUNT(*) AS n FROM T1 WHERE v > (SELECT MAX(v) FROM T2)", {"T2": "g"}, False),
    # in one branch of a union the answer's rows may all come from the other branch
    ("SELECT g FROM T1 WHERE v > (SELECT MAX(v) FROM T2) UNION ALL SELECT g FROM T2", {"T2": "g"}, False),
    # a correlated AVG is partial unless its groups are determined by the sketch's column
    ("SELECT g, v FROM T1 WHERE v < (SELECT AVG(CAST(T2.v AS DECIMAL(10, 2))) FROM T2 WHERE T2.g = T1.g)",
     {"T2": "v"}, False),
    ("SELECT g, v FROM T1 WHERE v < (SELECT AVG(CAST(T2.v AS DECIMAL(10, 2))) FROM T2 WHERE T2.g = T1.g)",
     {"T2": "g"}, True),
])
def test_safety_of_scalar_subqueries(sql: str, parts: dict[str, str], safe: bool) -> None:
    report = check(parse_query(sql, {"T1": SCHEMA, "T2": SCHEMA}).plan, parts)
    assert report.safe is safe, report.reason


def test_an_empty_answer_over_a_count_shows_why_count_is_unsafe() -> None:
    """The COUNT case above on data: the answer is empty, so the sketch is; over no T2 rows COUNT is 0 and T1's row
    passes."""
    sql = "SELECT g, v FROM T1 WHERE v > (SELECT COUNT(*) FROM T2 WHERE v > 3)"
    tables = {"T1": rows([1], [1]), "T2": rows([1, 2], [5, 6])}
    pipe = Pipeline(parse_query(sql, {"T1": SCHEMA, "T2": SCHEMA}).plan,
                    PartitionSet((Partition("T2", "g", (0, 5, 10), "int"),)))
    pipe.capture(LocalBackend(reader(tables)), VERSIONS)
    assert pipe.sketch() == set() and duck(sql, tables) == Counter()
    # T2 restricted to the (empty) sketch
    assert duck(sql, {"T1": tables["T1"], "T2": tables["T2"].head(0)}) == Counter({(1.0, 1.0): 1})


def test_a_having_scalar_subquery_keeps_its_fragments_out_of_the_groups() -> None:
    """TPC-H Q11's shape: the scalar's annotation is all of its input's fragments. Joined above the grouped
    aggregation, it reaches each group's one output row; below it, it entered every input row and each group's
    ``F_g`` held every fragment (groups x fragments pairs). Sketch and answer are the same either way (the shape is
    maintained exactly in ``SHAPES``)."""
    sql = "SELECT g, SUM(v) AS s FROM T1 GROUP BY g HAVING SUM(v) > (SELECT SUM(v) * 0.01 FROM T1)"
    tables = {"T1": rows(list(range(20)), [1] * 20), "T2": rows([1], [1])}
    pipe = Pipeline(parse_query(sql, {"T1": SCHEMA, "T2": SCHEMA}).plan,
                    PartitionSet((Partition("T1", "g", (0, 5, 10, 15, 20), "int"),)))
    pipe.capture(LocalBackend(reader(tables)), VERSIONS)
    assert pipe.sketch() == {0, 1, 2, 3}
    grouped = [op.canonical() for op in pipe.stateful() if op.kind == "aggregation" and
               op.canonical()["groups"].height == 20]
    assert len(grouped) == 1 and grouped[0]["fcounts"].height == 20  # one (group, fragment) pair per group


def test_a_having_count_above_another_tables_scalar_is_safe_on_any_column() -> None:
    """Joined above the groups, the scalar is one exact value per answer row (it reads T2 only), so ``COUNT(*) > s``
    rejects partial groups of T1 as it does for a constant: a sketch on ``T1.v`` (which does not decide ``g``'s groups)
    is accepted and suffices, judged by DuckDB over random tables."""
    sql = "SELECT g, COUNT(*) AS n FROM T1 GROUP BY g HAVING COUNT(*) > (SELECT MAX(v) FROM T2)"
    plan = parse_query(sql, {"T1": SCHEMA, "T2": SCHEMA}).plan
    assert check(plan, {"T1": "v"}).safe
    parts = PartitionSet((Partition("T1", "v", (-5, 0, 5, 10, 15), "int"),))
    rng = np.random.default_rng(5)
    for _ in range(40):
        tables = {"T1": rows(rng.integers(0, 4, 12).tolist(), rng.integers(-5, 15, 12).tolist()),
                  "T2": rows([0], rng.integers(0, 4, 1).tolist())}
        pipe = Pipeline(plan, parts)
        pipe.capture(LocalBackend(reader(tables)), VERSIONS)
        frag = ((pl.col("v") + 5) // 5).cast(pl.Int64)
        kept = {"T1": tables["T1"].filter(frag.is_in(sorted(pipe.sketch()))), "T2": tables["T2"]}
        assert duck(sql, kept, partitioned=()) == duck(sql, tables, partitioned=()), pipe.sketch()

"""Subqueries in WHERE and HAVING on the in-memory backend (docs/SQL.md, "Subqueries").

Each shape is maintained under random inserts and deletes into both tables and checked after every pass three ways:
the maintained sketch equals a fresh capture, the engine's answer equals DuckDB's answer to the same SQL, and DuckDB's
answer over only the sketch's fragments equals its answer over everything (the sketch is sufficient).
"""

from __future__ import annotations

from collections import Counter

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pytest

from imp_core.engine.annotation import as_sets
from imp_core.engine.local import LocalBackend
from imp_core.engine.pipeline import Pipeline
from imp_core.engine.schema import MULT
from imp_core.errors import PlanError
from imp_core.plan.safety import check
from imp_core.plan.sql import parse_query
from imp_core.sketch.partition import Partition, PartitionSet

SCHEMA = pa.schema([("g", pa.int64()), ("v", pa.int64())])
PARTS = PartitionSet((Partition("T1", "g", (0, 5, 10), "int"), Partition("T2", "g", (0, 5, 10), "int")))
VERSIONS = {"T1": 0, "T2": 0}

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
    "SELECT g, COUNT(*) AS n, SUM(v) AS s FROM T1 WHERE v > (SELECT AVG(CAST(v AS DECIMAL(10, 2))) FROM T1 WHERE v > 2) "
    "GROUP BY g",
    # a top-k over a semi join
    "SELECT g, v FROM T1 WHERE g IN (SELECT g FROM T2 WHERE v > 5) ORDER BY v DESC, g LIMIT 3",
]


def rows(g: list[int], v: list[int], mult: list[int] | None = None) -> pl.DataFrame:
    df = pl.DataFrame({"g": g, "v": v}, schema={"g": pl.Int64, "v": pl.Int64})
    return df if mult is None else df.with_columns(pl.Series(MULT, mult, dtype=pl.Int64))


def apply(table: pl.DataFrame, change: pl.DataFrame) -> pl.DataFrame:
    out = table
    for g, v, m in change.rows():
        if m > 0:
            out = pl.concat([out, rows([g] * m, [v] * m)])
        else:
            at = out.with_row_index().filter((pl.col("g") == g) & (pl.col("v") == v)).get_column("index")[:(-m)]
            out = out.with_row_index().filter(~pl.col("index").is_in(at.implode())).drop("index")
    return out


def duck(sql: str, tables: dict[str, pl.DataFrame], sketch: set[int] | None = None) -> Counter:
    """DuckDB's answer, over only the rows in ``sketch``'s fragments when given (T1: 0-1, T2: 2-3)."""
    con = duckdb.connect()
    try:
        for i, (name, df) in enumerate(sorted(tables.items())):
            if sketch is not None:
                frag = pl.when(pl.col("g") < 5).then(2 * i).otherwise(2 * i + 1)
                df = df.filter(frag.is_in(sorted(sketch)))
            con.register(name, df.to_arrow())
        return Counter(tuple(float(x) if isinstance(x, (int, float)) or hasattr(x, "as_tuple") else x for x in r)
                       for r in con.execute(sql).fetchall())
    finally:
        con.close()


def engine_answer(pipe: Pipeline, backend: LocalBackend) -> Counter:
    rel = as_sets(backend.relation(pipe.as_relation(pipe.plan), VERSIONS))
    data = rel.drop([MULT, "__sk"])
    out: Counter = Counter()
    for row, m in zip(data.iter_rows(), rel.get_column(MULT).to_list()):
        out[tuple(float(x) if isinstance(x, (int, float)) or hasattr(x, "as_tuple") else x for x in row)] += m
    return +out


def reader(tables: dict[str, pl.DataFrame]):  # noqa: ANN201
    return lambda name, version: tables[name]


@pytest.mark.parametrize("sql", SHAPES)
def test_subquery_shapes_are_maintained_exactly_and_their_sketches_suffice(sql: str) -> None:
    plan = parse_query(sql, {"T1": SCHEMA, "T2": SCHEMA}).plan
    safe = check(plan, {"T1": "g", "T2": "g"}).safe
    rng = np.random.default_rng(11)
    tables = {"T1": rows(rng.integers(0, 10, 8).tolist(), rng.integers(-5, 15, 8).tolist()),
              "T2": rows(rng.integers(0, 10, 8).tolist(), rng.integers(-5, 15, 8).tolist())}
    pipe = Pipeline(plan, PARTS)
    pipe.capture(LocalBackend(reader(tables)), VERSIONS)
    for _ in range(8):
        table = str(rng.choice(["T1", "T2"]))
        current = tables[table]
        ins = rows(rng.integers(0, 10, 3).tolist(), rng.integers(-5, 15, 3).tolist(), [1] * 3)
        dels = current.sample(min(2, current.height), seed=int(rng.integers(1 << 30))).with_columns(
            pl.lit(-1, dtype=pl.Int64).alias(MULT))
        change = pl.concat([ins, dels])
        tables[table] = apply(current, change)
        backend = LocalBackend(reader(tables))
        pipe.maintain_pass(table, change, backend, VERSIONS)
        fresh = Pipeline(plan, PARTS)
        fresh.capture(backend, VERSIONS)
        assert pipe.sketch() == fresh.sketch()
        expected = duck(sql, tables)
        assert engine_answer(pipe, backend) == expected
        if safe:
            assert duck(sql, tables, pipe.sketch()) == expected, pipe.sketch()


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

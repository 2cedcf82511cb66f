"""Scans narrowed to the columns a query reads (plan/columns.py): what stays, and that the narrowed plan answers as
the whole one does."""

from __future__ import annotations

import polars as pl
import pyarrow as pa
import pytest

from imp_core.engine.local import LocalBackend
from imp_core.engine.pipeline import Pipeline
from imp_core.plan.columns import narrowed, read_columns
from imp_core.plan.sql import parse_query
from imp_core.sketch.partition import Partition, PartitionSet

SCHEMAS = {
    "t": pa.schema([("a", pa.int64()), ("b", pa.int64()), ("c", pa.float64()), ("note", pa.string())]),
    "u": pa.schema([("k", pa.int64()), ("m", pa.int64()), ("unused", pa.string())]),
}


def columns(sql: str, keep: dict[str, set[str]] | None = None) -> dict[str, list[str]]:
    plan = narrowed(parse_query(sql, SCHEMAS).plan, keep)
    return {t: read_columns(plan, t) for t in sorted(plan.tables())}


@pytest.mark.parametrize("sql,expected", [
    ("SELECT a, SUM(b) AS s FROM t GROUP BY a HAVING SUM(b) > 5", {"t": ["a", "b"]}),
    ("SELECT a FROM t WHERE c > 1", {"t": ["a", "c"]}),
    ("SELECT * FROM t", {"t": ["a", "b", "c", "note"]}),
    ("SELECT DISTINCT a FROM t", {"t": ["a"]}),
    ("SELECT COUNT(*) AS n FROM t", {"t": ["a"]}),  # a scan keeps one column: rows must stay rows
    ("SELECT t.a, u.m FROM t JOIN u ON t.b = u.k", {"t": ["a", "b"], "u": ["k", "m"]}),
    ("SELECT a FROM t WHERE NOT EXISTS (SELECT 1 FROM u WHERE u.k = t.a)", {"t": ["a"], "u": ["k"]}),
    ("SELECT a FROM t ORDER BY c DESC LIMIT 3", {"t": ["a", "c"]}),
    ("SELECT a, b FROM (SELECT a, b, RANK() OVER (PARTITION BY a ORDER BY c) AS r FROM t) q WHERE r <= 2",
     {"t": ["a", "b", "c"]}),
    ("SELECT a FROM t UNION ALL SELECT k FROM u", {"t": ["a"], "u": ["k"]}),
    ("SELECT a, b FROM t EXCEPT SELECT k, m FROM u", {"t": ["a", "b"], "u": ["k", "m"]}),
    ("SELECT t.a, u.m FROM t LEFT JOIN u ON t.a = u.k", {"t": ["a"], "u": ["k", "m"]}),
    ("SELECT a FROM t WHERE b > (SELECT AVG(CAST(m AS DECIMAL(18, 0))) FROM u)", {"t": ["a", "b"], "u": ["m"]}),
])
def test_a_scan_keeps_the_columns_an_operator_above_reads(sql: str, expected: dict[str, list[str]]) -> None:
    assert columns(sql) == expected


def test_keep_adds_a_partition_column_the_query_does_not_read() -> None:
    assert columns("SELECT a, SUM(b) AS s FROM t GROUP BY a", {"t": {"note"}}) == {"t": ["a", "b", "note"]}
    assert columns("SELECT COUNT(*) AS n FROM t", {"t": {"c"}}) == {"t": ["c"]}


def test_a_narrowed_plan_captures_the_sketch_of_the_whole_one() -> None:
    data = {"t": pl.DataFrame({"a": [1, 1, 2, 3], "b": [5, 7, 1, 9], "c": [0.5, 1.5, 2.5, 3.5],
                               "note": ["x", "y", "z", "w"]}),
            "u": pl.DataFrame({"k": [5, 9], "m": [10, 20], "unused": ["p", "q"]})}
    sql = "SELECT t.a, SUM(u.m) AS s FROM t JOIN u ON t.b = u.k GROUP BY t.a HAVING SUM(u.m) > 5"
    whole = parse_query(sql, SCHEMAS).plan
    parts = PartitionSet((Partition("t", "note", ("a", "x", "z"), "string"),))
    sketches = []
    for plan in (whole, narrowed(whole, {"t": {"note"}})):
        pipe = Pipeline(plan, parts)
        pipe.capture(LocalBackend(lambda name, v: data[name]), {"t": 0, "u": 0})
        sketches.append(pipe.sketch())
    assert sketches[0] == sketches[1] == {0, 1}

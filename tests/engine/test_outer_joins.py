"""Outer joins on the in-memory backend (docs/SQL.md, "Outer joins"): the inner join plus the preserved side's
unmatched rows padded with NULLs; padded rows appear and disappear as matches come and go. Each shape is maintained
under random changes to both tables and compared with a recapture, DuckDB's answer and DuckDB's answer over the
sketch (tests/engine/two_tables.py)."""

from __future__ import annotations

import pytest

from imp_core.plan.safety import check
from imp_core.plan.sql import parse_query
from tests.engine.two_tables import SCHEMA, maintained_like_a_recapture

SHAPES = [
    "SELECT T1.g, T1.v, T2.v AS w FROM T1 LEFT JOIN T2 ON T1.g = T2.g",
    # TPC-H Q13's shape: count the matches per left key (padded rows count 0), then group by the count
    "SELECT n, COUNT(*) AS k FROM (SELECT T1.g AS g, COUNT(T2.v) AS n FROM T1 LEFT OUTER JOIN T2 ON T1.g = T2.g "
    "AND T2.v > 3 GROUP BY T1.g) c GROUP BY n",
    "SELECT T1.v, T2.g FROM T1 RIGHT JOIN T2 ON T1.g = T2.g WHERE T2.v > 0",
    "SELECT T1.g AS a, T2.g AS b FROM T1 FULL OUTER JOIN T2 ON T1.g = T2.g AND T1.v = T2.v",
    # a WHERE on the padded side rejects the padded rows (NULL), as in SQL
    "SELECT T1.g, T2.v FROM T1 LEFT JOIN T2 ON T1.g = T2.g WHERE T2.v > 2",
]


@pytest.mark.parametrize("sql", SHAPES)
def test_outer_join_shapes_are_maintained_exactly(sql: str) -> None:
    maintained_like_a_recapture(sql, seed=5)
    # partitioned on the preserved side only: safe, so the sketch's sufficiency is checked too
    preserved = ("T2",) if "RIGHT JOIN" in sql else ("T1",)
    assert maintained_like_a_recapture(sql, seed=6, partitioned=preserved) is ("FULL" not in sql)


def test_a_sketch_on_the_padded_side_is_unsafe_and_on_the_preserved_side_safe() -> None:
    plan = parse_query(SHAPES[0], {"T1": SCHEMA, "T2": SCHEMA}).plan
    assert check(plan, {"T1": "v"}).safe
    report = check(plan, {"T2": "v"})
    assert not report.safe and "T2" in report.reason

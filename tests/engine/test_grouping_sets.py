"""GROUPING SETS, ROLLUP and CUBE on the in-memory backend (docs/SQL.md, "GROUPING SETS, ROLLUP, CUBE"): the bag union
of one aggregation per grouping set, the keys outside a set NULL. Each shape is maintained under random changes to
both tables and compared with a recapture, DuckDB's answer and DuckDB's answer over the sketch
(tests/engine/two_tables.py)."""

from __future__ import annotations

import polars as pl
import pytest

from imp_core.engine.local import LocalBackend
from imp_core.engine.pipeline import Pipeline
from imp_core.errors import PlanError
from imp_core.plan.sql import parse_query
from tests.engine.two_tables import SCHEMA, VERSIONS, maintained_like_a_recapture, parts, reader, rows

SHAPES = [
    "SELECT g, v, COUNT(*) AS n FROM T1 GROUP BY ROLLUP(g, v)",
    "SELECT g, SUM(v) AS s FROM T1 WHERE v > -3 GROUP BY CUBE(g) HAVING SUM(v) > 4",
    "SELECT T1.g AS g, T2.v AS w, COUNT(*) AS n FROM T1 JOIN T2 ON T1.g = T2.g "
    "GROUP BY GROUPING SETS ((T1.g), (T2.v), ())",
    "SELECT g, v, MAX(v) AS m FROM T2 GROUP BY ROLLUP(g, v) ORDER BY m DESC, g, v LIMIT 4",
    # GROUPING() / GROUPING_ID(): constants per set, told apart from a NULL key
    "SELECT g, v, GROUPING(g) AS rg, GROUPING_ID(g, v) AS id, SUM(v) AS s FROM T1 GROUP BY CUBE(g, v) "
    "HAVING GROUPING(v) = 1 OR SUM(v) > 3",
]


@pytest.mark.parametrize("sql", SHAPES)
def test_grouping_sets_are_maintained_exactly(sql: str) -> None:
    maintained_like_a_recapture(sql, seed=9)


def test_with_rollup_is_rollup() -> None:
    tables = {"T1": SCHEMA, "T2": SCHEMA}
    assert (parse_query("SELECT g, v, COUNT(*) AS n FROM T1 GROUP BY g, v WITH ROLLUP", tables).plan ==
            parse_query("SELECT g, v, COUNT(*) AS n FROM T1 GROUP BY ROLLUP(g, v)", tables).plan)


@pytest.mark.parametrize(("sql", "message"), [
    ("SELECT g, GROUPING(g) AS r FROM T1 GROUP BY g", "need GROUP BY ROLLUP, CUBE or GROUPING SETS"),
    ("SELECT g, GROUPING(v) AS r FROM T1 GROUP BY ROLLUP(g)", "must be one of the GROUP BY expressions"),
    ("SELECT g FROM T1 WHERE GROUPING(g) = 0 GROUP BY ROLLUP(g)", "not allowed in WHERE"),
])
def test_grouping_outside_its_place_is_a_one_line_error(sql: str, message: str) -> None:
    with pytest.raises(PlanError, match=message) as e:
        parse_query(sql, {"T1": SCHEMA, "T2": SCHEMA})
    assert "\n" not in str(e.value) and e.value.line == 1


def test_over_no_rows_every_set_is_empty_as_in_spark() -> None:
    """Spark groups by the keys and the set's id, so over no rows ROLLUP has no row, not a grand total of 0 (DuckDB
    returns one)."""
    sql = "SELECT g, COUNT(*) AS n FROM T1 GROUP BY ROLLUP(g)"
    pipe = Pipeline(parse_query(sql, {"T1": SCHEMA, "T2": SCHEMA}).plan, parts(("T1",)))
    empty = {"T1": rows([], []), "T2": rows([], [])}
    pipe.capture(LocalBackend(reader(empty)), VERSIONS)
    assert LocalBackend(reader(empty)).relation(pipe.as_relation(pipe.plan), VERSIONS).filter(
        pl.col("__mult") > 0).height == 0

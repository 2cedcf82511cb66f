"""Top-k per group (``ROW_NUMBER`` / ``RANK`` / ``DENSE_RANK`` filtered by a constant) on the in-memory backend
(docs/SQL.md, "Top-k per group"): the operator's rule on hand-made batches, and query shapes maintained under random
changes to both tables, compared with a recapture, DuckDB's answer and DuckDB's answer over the sketch
(tests/engine/two_tables.py)."""

from __future__ import annotations

import polars as pl
import pyarrow as pa
import pytest

from imp_core.engine.operators.group_topk import GroupTopKOp
from imp_core.engine.schema import MULT, SET
from imp_core.errors import StateError, UnsupportedError
from imp_core.plan.expr import Col
from imp_core.plan.nodes import Field, GroupTopK, Scan, SortKey
from imp_core.plan.sql import parse_query
from tests.engine.two_tables import SCHEMA, maintained_like_a_recapture

SHAPES = [
    # groups are whole fragments (PARTITION BY the partition column): safe even below another filter
    ("SELECT g, v, rn FROM (SELECT g, v, ROW_NUMBER() OVER (PARTITION BY g ORDER BY v DESC) AS rn FROM T1) x "
     "WHERE rn <= 2", True),
    ("SELECT g, v FROM (SELECT g, v, ROW_NUMBER() OVER (PARTITION BY g ORDER BY v) AS rn FROM T1) x WHERE rn = 2",
     True),
    # one ranking over everything: every kept row is in the answer, so a sub-bag holding them ranks them alike
    ("SELECT v, r FROM (SELECT v, RANK() OVER (ORDER BY v) AS r FROM T1) x WHERE r <= 3", True),
    ("SELECT g, v, d FROM (SELECT g, v, DENSE_RANK() OVER (PARTITION BY v % 3 ORDER BY g DESC) AS d FROM T1) x "
     "WHERE d < 3", True),
    # a filter that drops kept rows (the first ones, or by value) loses their fragments: not safe
    ("SELECT g, v FROM (SELECT g, v, RANK() OVER (PARTITION BY v % 2 ORDER BY g) AS r FROM T1) x WHERE r = 2",
     False),
    ("SELECT g, v FROM (SELECT g, v, RANK() OVER (PARTITION BY v % 2 ORDER BY g, v) AS r FROM T1) x "
     "WHERE r <= 2 AND v > 3", False),
    # over an aggregation, under an aggregation, joined
    ("SELECT g, s, r FROM (SELECT g, s, RANK() OVER (ORDER BY s DESC) AS r FROM "
     "(SELECT g, SUM(v) AS s FROM T1 GROUP BY g) a) b WHERE r <= 2", True),
    ("SELECT g, SUM(v) AS s, COUNT(*) AS n FROM (SELECT g, v, ROW_NUMBER() OVER (PARTITION BY g ORDER BY v DESC) "
     "AS rn FROM T1) x WHERE rn <= 2 GROUP BY g", True),
    ("SELECT x.g, x.v, T2.v AS w FROM (SELECT g, v, DENSE_RANK() OVER (PARTITION BY g ORDER BY v) AS d FROM T1) x "
     "JOIN T2 ON x.g = T2.g WHERE x.d <= 1", True),
    # the ranking reads a join of both tables
    ("SELECT a, b, rn FROM (SELECT T1.g AS a, T2.v AS b, ROW_NUMBER() OVER (PARTITION BY T1.g ORDER BY T2.v, T1.v) "
     "AS rn FROM T1 JOIN T2 ON T1.v = T2.v) x WHERE rn <= 1", True),
]


@pytest.mark.parametrize(("sql", "safe"), SHAPES)
def test_rankings_are_maintained_exactly(sql: str, safe: bool) -> None:
    assert maintained_like_a_recapture(sql, seed=5, rounds=10) is safe
    assert maintained_like_a_recapture(sql, seed=6, rounds=6, partitioned=("T1",)) in (True, False)


def _op(function: str, k: int) -> GroupTopKOp:
    scan = Scan("t", "t", (Field("g", pa.int64()), Field("v", pa.int64())))
    node = GroupTopK(scan, (Col("t.g", pa.int64()),), (SortKey(Col("t.v", pa.int64()), descending=True),),
                     function, "rk", k)
    return GroupTopKOp("group_topk@0", node)


def _delta(g: list[int], v: list[int], mult: list[int], frags: list[int]) -> pl.DataFrame:
    return pl.DataFrame({"t.g": g, "t.v": v, MULT: mult, SET: [[f] for f in frags]},
                        schema={"t.g": pl.Int64, "t.v": pl.Int64, MULT: pl.Int64, SET: pl.List(pl.Int32)})


def _rows(out: pl.DataFrame) -> set[tuple]:
    return {(r["t.g"], r["t.v"], r["rk"], r[MULT], tuple(r[SET])) for r in out.iter_rows(named=True)}


@pytest.mark.parametrize(("function", "first", "after"), [
    # group 1 holds 9, 7, 7 (two copies from fragments 0 and 1), 5; k = 2
    ("row_number", {(1, 9, 1, 1, (0,)), (1, 7, 2, 1, (0,))}, {(1, 9, 1, -1, (0,)), (1, 7, 2, -1, (0,)),
                                                                (1, 7, 1, 1, (0,)), (1, 7, 2, 1, (1,))}),
    # RANK: 5 comes third after the two 7s, so it stays out
    ("rank", {(1, 9, 1, 1, (0,)), (1, 7, 2, 1, (0,)), (1, 7, 2, 1, (1,))},
     {(1, 9, 1, -1, (0,)), (1, 7, 2, -1, (0,)), (1, 7, 2, -1, (1,)), (1, 7, 1, 1, (0,)), (1, 7, 1, 1, (1,))}),
    ("dense_rank", {(1, 9, 1, 1, (0,)), (1, 7, 2, 1, (0,)), (1, 7, 2, 1, (1,))},
     {(1, 9, 1, -1, (0,)), (1, 7, 2, -1, (0,)), (1, 7, 2, -1, (1,)), (1, 7, 1, 1, (0,)), (1, 7, 1, 1, (1,)),
      (1, 5, 2, 1, (0,))}),
])
def test_deleting_the_first_row_moves_every_rank_up(function: str, first: set, after: set) -> None:
    op = _op(function, 2)
    out = op.process(_delta([1, 1, 1, 1, 2], [9, 7, 7, 5, 3], [1, 1, 1, 1, 1], [0, 0, 1, 0, 2]))
    assert _rows(out) - {r for r in _rows(out) if r[0] == 2} == first
    assert {r for r in _rows(out) if r[0] == 2} == {(2, 3, 1, 1, (2,))}
    # deleting group 1's best row re-ranks group 1 only; group 2 is not touched
    assert _rows(op.process(_delta([1], [9], [-1], [0]))) == after


def test_copies_of_one_row_are_numbered_one_by_one() -> None:
    op = _op("row_number", 3)
    out = op.process(_delta([1], [4], [5], [0]))
    assert _rows(out) == {(1, 4, 1, 1, (0,)), (1, 4, 2, 1, (0,)), (1, 4, 3, 1, (0,))}
    assert _rows(op.process(_delta([1], [4], [-3], [0]))) == {(1, 4, 3, -1, (0,))}


def test_state_round_trips_and_a_deletion_of_an_unknown_row_is_refused() -> None:
    op = _op("rank", 2)
    op.process(_delta([1, 1, 2], [9, 7, 3], [1, 1, 1], [0, 0, 2]))
    other = _op("rank", 2)
    other.load_state(op.state_to_bytes())
    assert other.canonical()["rows"].equals(op.canonical()["rows"])
    assert _rows(other.output_relation()) == _rows(op.output_relation())
    with pytest.raises(StateError, match="different query"):
        _op("rank", 3).load_state(op.state_to_bytes())
    with pytest.raises(StateError, match="recapture"):
        other.process(_delta([1], [8], [-1], [0]))


@pytest.mark.parametrize(("sql", "message"), [
    ("SELECT g, ROW_NUMBER() OVER (PARTITION BY g ORDER BY v) AS rn FROM T1", "not filtered by a constant bound"),
    ("SELECT * FROM (SELECT g, ROW_NUMBER() OVER (PARTITION BY g ORDER BY v) AS rn FROM T1) x WHERE rn > 2",
     "not filtered by a constant bound"),
    ("SELECT * FROM (SELECT g, SUM(v) OVER (PARTITION BY g) AS s FROM T1) x", "window function SUM"),
    ("SELECT * FROM (SELECT g, RANK() OVER (PARTITION BY g) AS r FROM T1) x WHERE r <= 1", "without ORDER BY"),
    ("SELECT * FROM (SELECT g, RANK() OVER (ORDER BY v ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS r "
     "FROM T1) x WHERE r <= 1", "window frame"),
    ("SELECT * FROM (SELECT g, RANK() OVER (ORDER BY v) AS r, ROW_NUMBER() OVER (ORDER BY g) AS n FROM T1) x "
     "WHERE r <= 1 AND n <= 1", "more than one window"),
    ("SELECT g, RANK() OVER (ORDER BY SUM(v)) AS r FROM T1 GROUP BY g", "GROUP BY or aggregates"),
    ("SELECT g FROM T1 ORDER BY ROW_NUMBER() OVER (ORDER BY v) LIMIT 1", "window function"),
])
def test_rankings_the_engine_cannot_maintain_are_refused_with_the_fix(sql: str, message: str) -> None:
    with pytest.raises(UnsupportedError, match=message) as e:
        parse_query(sql, {"T1": SCHEMA, "T2": SCHEMA})
    assert "\n" not in str(e.value)

"""The reuse check: tighter top-level conditions reuse a sketch; anything else does not."""

from __future__ import annotations

import pyarrow as pa
import pytest

from imp_core.plan.expr import Binary, Col, Lit
from imp_core.plan.nodes import AntiJoin, Select
from imp_core.plan.reuse import can_reuse
from imp_core.plan.sql import parse_query
from imp_core.plan.template import template_key

T = {"t": pa.schema([("a", pa.int64()), ("b", pa.float64()), ("c", pa.float64())])}
AGG = "SELECT a, AVG(b) AS ab FROM t WHERE b < {w} GROUP BY a HAVING AVG(c) {op} {h}"


def reuse(old: str, new: str) -> bool:
    assert template_key(old)[0] == template_key(new)[0]
    return can_reuse(parse_query(old, T).plan, parse_query(new, T).plan)[0]


@pytest.mark.parametrize("op,old,new,ok", [
    (">", 10, 20, True), (">", 10, 10, True), (">", 10, 5, False),
    ("<", 10, 5, True), ("<", 10, 20, False), (">=", 1.5, 2, True), ("<=", 3, 4, False),
])
def test_having_constants(op: str, old: float, new: float, ok: bool) -> None:
    assert reuse(AGG.format(w=1000, op=op, h=old), AGG.format(w=1000, op=op, h=new)) is ok


def test_where_below_an_aggregation_must_not_change() -> None:
    assert not reuse(AGG.format(w=1000, op=">", h=1), AGG.format(w=500, op=">", h=1))


def test_where_of_a_query_without_aggregation_may_tighten() -> None:
    q = "SELECT a, b FROM t WHERE b > {x} AND c < {y}"
    assert reuse(q.format(x=1, y=9), q.format(x=2, y=8))
    assert not reuse(q.format(x=1, y=9), q.format(x=0, y=8))


def test_negation_flips_and_equality_must_stay() -> None:
    q = "SELECT a FROM t WHERE NOT (b > {x})"
    assert reuse(q.format(x=5), q.format(x=3))  # NOT b > 3 is tighter than NOT b > 5
    assert not reuse(q.format(x=5), q.format(x=7))
    eq = "SELECT a FROM t WHERE a = {x}"
    assert not reuse(eq.format(x=1), eq.format(x=2))


def test_top_k_blocks_reuse_below_it() -> None:
    q = "SELECT a, SUM(b) AS s FROM t GROUP BY a HAVING SUM(b) > {x} ORDER BY s DESC LIMIT 3"
    assert not reuse(q.format(x=1), q.format(x=2))


def test_a_distinct_aggregate_is_another_query() -> None:
    plain = "SELECT a, COUNT(b) AS n FROM t GROUP BY a HAVING COUNT(b) > 2"
    distinct = "SELECT a, COUNT(DISTINCT b) AS n FROM t GROUP BY a HAVING COUNT(DISTINCT b) > 2"
    assert template_key(plain)[0] != template_key(distinct)[0]
    assert not can_reuse(parse_query(plain, T).plan, parse_query(distinct, T).plan)[0]
    assert not can_reuse(parse_query(distinct, T).plan, parse_query(plain, T).plan)[0]
    assert can_reuse(parse_query(distinct, T).plan, parse_query(distinct.replace("> 2", "> 3"), T).plan)[0]


def test_union_all_branches_reuse_like_the_query_around_them() -> None:
    top = "SELECT a FROM t WHERE b > {x} UNION ALL SELECT a FROM t WHERE c < {y}"
    assert reuse(top.format(x=1, y=9), top.format(x=2, y=8))
    assert not reuse(top.format(x=1, y=9), top.format(x=1, y=10))
    below = "SELECT a, COUNT(*) AS n FROM (SELECT a FROM t WHERE b > {x} UNION ALL SELECT a FROM t) u GROUP BY a"
    assert not reuse(below.format(x=1), below.format(x=2))


def test_a_constant_inside_or_around_an_anti_join_blocks_reuse_below_it() -> None:
    """Tightening the subquery's condition lets more outer rows through; the outer one is kept conservative."""
    u = pa.schema([("k", pa.int64()), ("w", pa.float64())])
    outer = parse_query("SELECT a, b FROM t", T).plan
    tables = {"u": u}

    def plan(w: float, b: float, null_aware: bool = False) -> AntiJoin:
        left = Select(outer, Binary(">", Col("b", pa.float64()), Lit.of(b)))
        right = parse_query(f"SELECT k FROM u WHERE w > {w}", tables).plan
        return AntiJoin(left, right, Binary("=", Col("a", pa.int64()), Col("k", pa.int64())), null_aware)

    assert can_reuse(plan(1.0, 2.0), plan(1.0, 2.0)) == (True, "reusable")
    assert not can_reuse(plan(1.0, 2.0), plan(5.0, 2.0))[0]
    assert not can_reuse(plan(1.0, 2.0), plan(1.0, 3.0))[0]
    assert can_reuse(plan(1.0, 2.0), plan(1.0, 2.0, null_aware=True)) == (False, "the plans differ outside their "
                                                                           "conditions")

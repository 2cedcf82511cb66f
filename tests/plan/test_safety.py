"""The safety check, one test per rule of docs/SAFETY.md, each with a safe and an unsafe case.

Sign knowledge comes from a stub oracle (``table.column -> "+" | "-"``), so each verdict is the rule's alone. Two unsafe
verdicts are also shown to be real with DuckDB: over the fragments the answer needs, the query returns a different
answer than over the whole table.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from imp_core.errors import UnsafeSketchError
from imp_core.plan.expr import Binary, Col
from imp_core.plan.nodes import AntiJoin, Field, Plan, Project, Scan
from imp_core.plan.safety import SafetyReport, check, require_safe, safe_columns
from imp_core.plan.sql import parse_query
from tests.oracles import canonical, duck, fragments_of

SCHEMAS = {
    "t": pa.schema([("a", pa.int64()), ("b", pa.int64()), ("c", pa.float64()), ("x", pa.int64())]),
    "h": pa.schema([("ttid", pa.int64()), ("k", pa.int64())]),
    "sales": pa.schema([("id", pa.int64()), ("brand", pa.string()), ("price", pa.int64()), ("numSold", pa.int64())]),
    "u": pa.schema([("m", pa.int64()), ("k", pa.int64())]),
    "r": pa.schema([("b", pa.int64()), ("n", pa.int64())]),
}


def verdict(sql: str, partitions: dict[str, str], signs: dict[str, str] | None = None) -> SafetyReport:
    plan = parse_query(sql, SCHEMAS).plan
    return check(plan, partitions, lambda table, column: (signs or {}).get(f"{table}.{column}"))


def assert_safe(report: SafetyReport, assumptions: tuple[str, ...] = ()) -> None:
    assert report.safe and report.reason == "safe", report
    assert tuple(str(a) for a in report.assumptions) == assumptions


def assert_unsafe(report: SafetyReport, reason: str) -> None:
    assert not report.safe and reason in report.reason, report
    assert report.assumptions == ()  # an unsafe verdict relies on nothing


# -- rules -----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("column", ["a", "b", "c", "x"])
def test_no_aggregation_is_safe_on_any_column(column: str) -> None:
    assert_safe(verdict("SELECT a, x FROM t WHERE x > 5", {"t": column}))
    assert_safe(verdict("SELECT DISTINCT a FROM t WHERE x > 5", {"t": column}))


def test_aggregation_without_having_is_safe_and_a_having_above_it_is_not() -> None:
    assert_safe(verdict("SELECT a, SUM(c) AS s FROM t GROUP BY a", {"t": "b"}))
    assert_unsafe(verdict("SELECT a, SUM(c) AS s FROM t GROUP BY a HAVING AVG(c) < 10", {"t": "b"}),
                  "can accept a partial group")


def test_aggregation_partitioned_on_a_group_by_column() -> None:
    sql = "SELECT a, AVG(c) AS ac FROM t GROUP BY a HAVING AVG(c) < 10"
    assert_safe(verdict(sql, {"t": "a"}))
    assert_unsafe(verdict(sql, {"t": "b"}), "the condition (ac < 10) can accept a partial group")


@pytest.mark.parametrize("having", ["SUM(price * numSold) > 5000", "COUNT(*) > 10", "MAX(price) > 3",
                                    "MIN(price) < 3"])
def test_having_that_rejects_partial_groups_is_safe(having: str) -> None:
    sql = f"SELECT brand FROM sales GROUP BY brand HAVING {having}"
    signs = {"sales.price": "+", "sales.numSold": "+"}
    needs_signs = having.startswith("SUM")
    assert_safe(verdict(sql, {"sales": "id"}, signs),
                ("sales.numSold >= 0", "sales.price >= 0") if needs_signs else ())
    if needs_signs:  # the verdict stands on the signs: without them, or with a mixed sign, it is unsafe
        assert_unsafe(verdict(sql, {"sales": "id"}), "can accept a partial group")
        assert_unsafe(verdict(sql, {"sales": "id"}, {"sales.price": "+"}), "can accept a partial group")


def test_sum_of_non_positive_values_mirrors_the_rule() -> None:
    sql = "SELECT a, SUM(x) AS s FROM t GROUP BY a HAVING SUM(x) < -5"
    assert_safe(verdict(sql, {"t": "b"}, {"t.x": "-"}), ("t.x <= 0",))
    assert_unsafe(verdict(sql, {"t": "b"}, {"t.x": "+"}), "can accept a partial group")


@pytest.mark.parametrize("having,signs", [("AVG(c) < 10", {}), ("SUM(x) < 100", {"t.x": "+"}),
                                          ("COUNT(*) = 3", {}), ("MAX(x) < 3", {}), ("SUM(x) > 100", {})])
def test_having_that_can_accept_partial_groups_is_unsafe(having: str, signs: dict[str, str]) -> None:
    sql = f"SELECT a, COUNT(*) AS n FROM t GROUP BY a HAVING {having}"
    assert_unsafe(verdict(sql, {"t": "b"}, signs), "can accept a partial group")
    assert_safe(verdict(sql, {"t": "a"}, signs))  # on the group-by column the same query is safe


@pytest.mark.parametrize("order,signs,safe", [
    ("SUM(x) DESC", {"t.x": "+"}, True),
    ("COUNT(*) DESC", {}, True),
    ("MIN(x) ASC", {}, True),
    ("MAX(x) DESC", {}, True),
    ("SUM(x) ASC", {"t.x": "+"}, False),
    ("SUM(x) DESC", {}, False),
    ("COUNT(*) ASC", {}, False),
    ("MIN(x) DESC", {}, False),
])
def test_topk_over_partial_groups(order: str, signs: dict[str, str], safe: bool) -> None:
    agg, direction = order.rsplit(" ", 1)
    sql = f"SELECT a, {agg} AS s FROM t GROUP BY a ORDER BY s {direction} LIMIT 3"
    report = verdict(sql, {"t": "b"}, signs)
    if safe:
        assert_safe(report, ("t.x >= 0",) if agg == "SUM(x)" else ())
    else:
        assert_unsafe(report, f"ORDER BY s {direction} can rank a partial group higher than its full version")


@pytest.mark.parametrize("column", ["m", "k"])
def test_topk_directly_over_a_table_is_safe(column: str) -> None:
    assert_safe(verdict("SELECT m, k FROM u ORDER BY m LIMIT 5", {"u": column}))


def test_joins_propagate_group_by_columns_through_equalities() -> None:
    sql = "SELECT t.a, AVG(t.c) AS ac FROM t JOIN h ON t.a = h.ttid GROUP BY t.a HAVING AVG(t.c) < 10"
    assert_safe(verdict(sql, {"t": "a"}))
    assert_safe(verdict(sql, {"h": "ttid"}))  # equal to the group-by column t.a
    assert_unsafe(verdict(sql, {"h": "k"}), "can accept a partial group")
    assert_unsafe(verdict(sql, {"t": "b"}), "can accept a partial group")


def test_several_partitioned_tables_must_all_be_safe_together() -> None:
    sql = "SELECT t.a, AVG(t.c) AS ac FROM t JOIN h ON t.a = h.ttid GROUP BY t.a HAVING AVG(t.c) < 10"
    assert_safe(verdict(sql, {"t": "a", "h": "ttid"}))
    assert_unsafe(verdict(sql, {"t": "a", "h": "k"}), "can accept a partial group")


def test_topk_under_a_filter_join_or_topk_is_unsafe_on_partitioned_inputs() -> None:
    inner = "SELECT m FROM u ORDER BY m LIMIT 2"
    assert_safe(verdict(inner, {"u": "m"}))
    assert_unsafe(verdict(f"SELECT * FROM ({inner}) q WHERE q.m > 2", {"u": "m"}),
                  "a filter, join or top-k above ORDER BY ... LIMIT drops some of its rows")
    assert_unsafe(verdict(f"SELECT * FROM ({inner}) q ORDER BY q.m DESC LIMIT 1", {"u": "m"}),
                  "drops some of its rows")
    assert_safe(verdict(f"SELECT * FROM ({inner}) q WHERE q.m > 2", {"t": "a"}))  # u not partitioned


def test_aggregation_over_a_topk_with_ties_is_unsafe() -> None:
    tied = "SELECT COUNT(*) AS n FROM (SELECT b, n FROM r ORDER BY b LIMIT 1) q"
    assert_unsafe(verdict(tied, {"r": "b"}), "an aggregation reads ORDER BY ... LIMIT whose order can tie")
    assert_safe(verdict(tied.replace("ORDER BY b", "ORDER BY b, n"), {"r": "b"}))


# -- the entry points -----------------------------------------------------------------------------------------------


def test_require_safe_names_the_safe_columns_and_safe_columns_lists_them() -> None:
    sql = "SELECT a, AVG(c) AS ac FROM t GROUP BY a HAVING AVG(c) < 10"
    plan = parse_query(sql, SCHEMAS).plan
    assert safe_columns(plan) == ["t.a"]
    with pytest.raises(UnsafeSketchError, match=r"a sketch on t\.b is not safe for this query \(the condition .* "
                                                r"can accept a partial group\); safe columns: t\.a"):
        require_safe(plan, {"t": "b"})
    assert require_safe(plan, {"t": "a"}).safe
    having_avg_everywhere = parse_query("SELECT COUNT(*) AS n FROM t HAVING AVG(c) < 10", SCHEMAS).plan
    with pytest.raises(UnsafeSketchError, match="no single column of these tables is safe"):
        require_safe(having_avg_everywhere, {"t": "a"})


# -- the unsafe verdicts are real ----------------------------------------------------------------------------------


def answers_over_sketch(sql: str, table: pa.Table, column: str, bounds: list[int], provenance: str) -> tuple:
    """The query over the whole table and over only the fragments its provenance needs (DuckDB)."""
    needed = fragments_of((r[0] for r in duck(provenance, t=table)), bounds)
    frag = [fragments_of([v], bounds)[0] for v in table.column(column).to_pylist()]
    kept = table.filter(pa.array([f in needed for f in frag]))
    return canonical(duck(sql, t=table)), canonical(duck(sql, t=kept))


def test_having_avg_on_a_non_group_column_really_changes_the_answer() -> None:
    sql = "SELECT a, AVG(c) AS ac FROM t GROUP BY a HAVING AVG(c) < 10"
    assert not verdict(sql, {"t": "b"}).safe
    # group 1 lies in fragment 0; group 2 in fragments 0 (c 5) and 1 (c 40): AVG 22.5 fails, its fragment-0
    # part alone passes
    table = pa.table({"a": [1, 1, 2, 2], "b": [0, 3, 5, 12], "c": [1.0, 2.0, 5.0, 40.0], "x": [0, 0, 0, 0]})
    full, sketched = answers_over_sketch(sql, table, "b", [0, 10, 20],
                                         "SELECT b FROM t WHERE a IN (SELECT a FROM t GROUP BY a HAVING AVG(c) < 10)")
    assert full == [(1, 1.5)] and sketched == [(1, 1.5), (2, 5.0)]


def test_topk_sum_ascending_really_changes_the_answer() -> None:
    sql = "SELECT a, SUM(x) AS s FROM t GROUP BY a ORDER BY s ASC LIMIT 1"
    assert not verdict(sql, {"t": "b"}, {"t.x": "+"}).safe
    # group 1 (sum 3) is the answer, in fragment 0; group 2 sums to 10 but only its fragment-0 row (2) is kept
    table = pa.table({"a": [1, 2, 2], "b": [1, 2, 15], "c": [0.0, 0.0, 0.0], "x": [3, 2, 8]})
    full, sketched = answers_over_sketch(sql, table, "b", [0, 10, 20], "SELECT b FROM t WHERE a = 1")
    assert full == [(1, 3)] and sketched == [(2, 2)]


# -- DISTINCT aggregates ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("having,signs,assumptions", [
    ("COUNT(DISTINCT x) > 2", {}, ()),  # like COUNT: a partial group holds a subset of the values
    ("SUM(DISTINCT x) > 100", {"t.x": "+"}, ("t.x >= 0",)),  # like SUM: the values' sign decides
    ("SUM(DISTINCT x) < -5", {"t.x": "-"}, ("t.x <= 0",)),
])
def test_having_on_a_distinct_aggregate_that_rejects_partial_groups(having: str, signs: dict[str, str],
                                                                    assumptions: tuple[str, ...]) -> None:
    sql = f"SELECT a, COUNT(DISTINCT x) AS n FROM t GROUP BY a HAVING {having}"
    assert_safe(verdict(sql, {"t": "b"}, signs), assumptions)


@pytest.mark.parametrize("having,signs", [("COUNT(DISTINCT x) < 3", {}), ("COUNT(DISTINCT x) = 3", {}),
                                          ("SUM(DISTINCT x) > 100", {}), ("SUM(DISTINCT x) < 100", {"t.x": "+"})])
def test_having_on_a_distinct_aggregate_that_can_accept_partial_groups(having: str, signs: dict[str, str]) -> None:
    sql = f"SELECT a, COUNT(DISTINCT x) AS n FROM t GROUP BY a HAVING {having}"
    assert_unsafe(verdict(sql, {"t": "b"}, signs), "can accept a partial group")
    assert_safe(verdict(sql, {"t": "a"}, signs))


def test_distinct_aggregate_of_a_partial_aggregate_is_unknown() -> None:
    # the inner SUM of a partial group is off, and off values can be more distinct than the true ones ({5, 5} has
    # one value, {3, 5} two): COUNT(DISTINCT) above it can grow, unlike COUNT
    sql = ("SELECT COUNT(DISTINCT s) AS n FROM (SELECT a, SUM(x) AS s FROM t GROUP BY a) q "
           "HAVING COUNT(DISTINCT s) > 1")
    assert_unsafe(verdict(sql, {"t": "b"}, {"t.x": "+"}), "partial")
    assert_safe(verdict(sql.replace("DISTINCT s", "s"), {"t": "b"}, {"t.x": "+"}), ("t.x >= 0",))


def test_count_distinct_having_really_holds_over_the_sketch() -> None:
    sql = "SELECT a, COUNT(DISTINCT x) AS n FROM t GROUP BY a HAVING COUNT(DISTINCT x) > 1"
    assert verdict(sql, {"t": "b"}).safe
    # group 1 has values {1, 2} (in the answer); group 2 {7, 7} across both fragments: its part is never more
    table = pa.table({"a": [1, 1, 2, 2], "b": [1, 2, 5, 15], "c": [0.0] * 4, "x": [1, 2, 7, 7]})
    full, sketched = answers_over_sketch(sql, table, "b", [0, 10, 20],
                                         "SELECT b FROM t WHERE a IN (SELECT a FROM t GROUP BY a "
                                         "HAVING COUNT(DISTINCT x) > 1)")
    assert full == sketched == [(1, 2)]


def test_union_all_is_safe_when_each_branch_is() -> None:
    two = "SELECT a, SUM(x) AS s FROM (SELECT a, x FROM t UNION ALL SELECT m, k FROM u) q GROUP BY a HAVING SUM(x) > 5"
    # grouped on the partition column in every branch, each group's rows lie in one fragment of each table; but the
    # sketch can keep a group's fragment of t (for another group) without its fragment of u: a partial group
    assert_unsafe(verdict(two, {"t": "a", "u": "m"}), "can accept a partial group")
    # one partitioned table: a group's t rows are in or out together, but its u rows are always there, so a group
    # can be partial (only its u rows); SUM > 5 then rejects it only when the rows that can go (t's) are >= 0
    assert_unsafe(verdict(two, {"t": "a"}), "can accept a partial group")
    assert_safe(verdict(two, {"t": "a"}, {"t.x": "+"}), ("t.x >= 0",))
    assert_unsafe(verdict(two, {"t": "a"}, {"u.k": "+"}), "can accept a partial group")
    # partitioned elsewhere, the same: only the signs of the rows that can go count
    assert_safe(verdict(two, {"t": "b"}, {"t.x": "+"}), ("t.x >= 0",))
    assert_safe(verdict(two, {"t": "b"}, {"t.x": "+", "u.k": "+"}), ("t.x >= 0",))
    assert_unsafe(verdict(two, {"t": "b"}, {"u.k": "+"}), "can accept a partial group")
    # a self-union: the partition column determines the group only if it does in both branches
    self_union = ("SELECT a, AVG(c) AS ac FROM (SELECT a, c FROM t WHERE x > 1 UNION ALL SELECT a, c FROM t WHERE "
                  "x < 0) q GROUP BY a HAVING AVG(c) < 10")
    assert_safe(verdict(self_union, {"t": "a"}))
    crossed = ("SELECT a, AVG(c) AS ac FROM (SELECT a, c FROM t UNION ALL SELECT b, c FROM t) q GROUP BY a "
               "HAVING AVG(c) < 10")
    assert_unsafe(verdict(crossed, {"t": "a"}), "can accept a partial group")


# the reproduction of issue 39: r(a, b), s(a, v); group 1 has r's (1, 20) and s's (1, 0)
MIXED_SCHEMAS = {"r": pa.schema([("a", pa.int64()), ("b", pa.int64())]),
                 "s": pa.schema([("a", pa.int64()), ("v", pa.int64())])}
MIXED = "(SELECT r.a AS g, r.b AS v FROM r UNION ALL SELECT s.a AS g, s.v AS v FROM s) un"


def mixed_verdict(sql: str, partitions: dict[str, str], signs: dict[str, str] | None = None) -> SafetyReport:
    plan = parse_query(sql, MIXED_SCHEMAS).plan
    return check(plan, partitions, lambda table, column: (signs or {}).get(f"{table}.{column}"))


def over_fragments(sql: str, tables: dict[str, pa.Table], table: str, column: str, bounds: list[int],
                   needed_values: str) -> tuple:
    """``sql`` over all rows and over only the fragments of ``table.column`` that ``needed_values`` (the partition
    column of the rows the answer depends on) falls in (DuckDB)."""
    needed = fragments_of((r[0] for r in duck(needed_values, **tables)), bounds)
    t = tables[table]
    keep = pa.array([fragments_of([v], bounds)[0] in needed for v in t.column(column).to_pylist()])
    return canonical(duck(sql, **tables)), canonical(duck(sql, **{**tables, table: t.filter(keep)}))


@pytest.mark.parametrize("agg,having", [("AVG(un.v)", "< 10"), ("SUM(un.v)", "< 10"), ("COUNT(*)", "< 2"),
                                        ("MIN(un.v)", "> 10"), ("MAX(un.v)", "< 10")])
def test_a_union_all_group_fed_by_an_unsketched_branch_is_partial(agg: str, having: str) -> None:
    sql = f"SELECT un.g, {agg} AS y FROM {MIXED} GROUP BY un.g HAVING {agg} {having}"
    signs = {"r.b": "+", "s.v": "+", "r.a": "+", "s.a": "+"}
    unsafe = mixed_verdict(sql, {"r": "a"}, signs)
    assert_unsafe(unsafe, "can accept a partial group")
    # every condition here can accept a group left with its s rows only: a sketch on r is never safe
    assert_unsafe(mixed_verdict(sql, {"r": "b"}, signs), "can accept a partial group")
    # sketched on s instead, the group keeps its r rows: the same holds
    assert_unsafe(mixed_verdict(sql, {"s": "a"}, signs), "can accept a partial group")


def test_the_issue_39_reproduction_really_changes_the_answer() -> None:
    sql = f"SELECT un.g, AVG(un.v) AS av FROM {MIXED} GROUP BY un.g HAVING AVG(un.v) < 10"
    assert_unsafe(mixed_verdict(sql, {"r": "a"}), "can accept a partial group")
    r = pa.table({"a": [1, 5], "b": [20, 0]})
    s = pa.table({"a": [1], "v": [0]})
    # the answer (5, 0.0) depends on r's row a = 5 only: fragment 1 of [0, 3, 6]; over it group 1 is s's row alone
    full, sketched = over_fragments(sql, {"r": r, "s": s}, "r", "a", [0, 3, 6],
                                    f"SELECT r.a FROM r WHERE r.a IN (SELECT un.g FROM {MIXED} GROUP BY un.g "
                                    f"HAVING AVG(un.v) < 10)")
    assert full == [(5, 0.0)] and sketched == [(1, 0.0), (5, 0.0)]


def test_a_union_all_group_is_safe_when_partial_groups_can_only_fail() -> None:
    # COUNT, SUM of non-negative values, MAX compared from below, MIN from above: a group that lost its r rows can
    # only fail; the sign that matters is that of the rows that can go (r's), never the other branch's
    for agg, having in [("SUM(un.v)", "> 10"), ("COUNT(*)", "> 1"), ("MAX(un.v)", "> 10"), ("MIN(un.v)", "< 3")]:
        sql = f"SELECT un.g, {agg} AS y FROM {MIXED} GROUP BY un.g HAVING {agg} {having}"
        need = ("r.b >= 0",) if agg.startswith("SUM") else ()
        assert_safe(mixed_verdict(sql, {"r": "a"}, {"r.b": "+"}), need)
        assert_safe(mixed_verdict(sql, {"r": "b"}, {"r.b": "+"}), need)
    sql = f"SELECT un.g, SUM(un.v) AS y FROM {MIXED} GROUP BY un.g HAVING SUM(un.v) > 10"
    assert_unsafe(mixed_verdict(sql, {"r": "a"}, {"s.v": "+"}), "can accept a partial group")
    r = pa.table({"a": [1, 1, 5], "b": [3, 20, 0]})
    s = pa.table({"a": [1, 5], "v": [9, 30]})
    full, sketched = over_fragments(sql, {"r": r, "s": s}, "r", "b", [0, 10, 30],
                                    f"SELECT r.b FROM r WHERE r.a IN (SELECT un.g FROM {MIXED} GROUP BY un.g "
                                    f"HAVING SUM(un.v) > 10)")
    assert full == sketched == [(1, 32), (5, 30)]


def test_except_is_safe_on_any_column_of_its_left_input_only() -> None:
    # EXCEPT groups both inputs' rows and keeps a group with left rows and no right row: a sketch can only take left
    # rows away (the right rows' count is exact), which can only make a group fail
    for sql in ("SELECT a FROM r EXCEPT SELECT a FROM s", "SELECT a, b FROM r EXCEPT SELECT a, v FROM s"):
        assert_safe(mixed_verdict(sql, {"r": "a"}))
        assert_safe(mixed_verdict(sql, {"r": "b"}))
        assert_unsafe(mixed_verdict(sql, {"s": "a"}), "can accept a partial group")
        assert_unsafe(mixed_verdict(sql, {"s": "v"}), "can accept a partial group")
    for sql in ("SELECT a FROM r INTERSECT SELECT a FROM s", "SELECT a FROM s INTERSECT SELECT a FROM r"):
        for part in ({"r": "a"}, {"r": "b"}, {"s": "a"}, {"s": "v"}):
            assert_safe(mixed_verdict(sql, part))
    # a sketch on the right input loses a right row and lets its left row through
    sql = "SELECT a FROM r EXCEPT SELECT a FROM s"
    r, s = pa.table({"a": [1, 2], "b": [0, 0]}), pa.table({"a": [2], "v": [50]})
    full, sketched = over_fragments(sql, {"r": r, "s": s}, "s", "v", [0, 10, 100], "SELECT s.v FROM s WHERE FALSE")
    assert full == [(1,)] and sketched == [(1,), (2,)]


def test_an_outer_join_group_on_the_padded_side_is_partial() -> None:
    # LEFT JOIN = inner join UNION ALL the padded left rows: grouped by the preserved key, both branches carry its
    # fragment; grouped by the padded-against side's key, a group (NULL) gathers padded rows of any fragment
    base = "SELECT {k}, COUNT(*) AS n FROM r LEFT JOIN s ON r.a = s.a GROUP BY {k} HAVING COUNT(*) < 2"
    assert_safe(mixed_verdict(base.format(k="r.a"), {"r": "a"}))
    assert_unsafe(mixed_verdict(base.format(k="s.v"), {"r": "a"}), "can accept a partial group")
    sql = base.format(k="s.v")
    r, s = pa.table({"a": [1, 4, 5, 7], "b": [0, 0, 0, 0]}), pa.table({"a": [5, 7], "v": [6, 5]})
    # the answer, groups 5 and 6, needs r's matched rows (fragments 1 and 2 of [0, 3, 6, 9]); the padded NULL group
    # (a = 1, 4) fails with 2 rows, but over those fragments it keeps a = 4 alone and passes
    full, sketched = over_fragments(sql, {"r": r, "s": s}, "r", "a", [0, 3, 6, 9],
                                    "SELECT r.a FROM r JOIN s ON r.a = s.a")
    assert full == canonical([(5, 1), (6, 1)]) and sketched == canonical([(None, 1), (5, 1), (6, 1)])


def test_a_ranking_over_a_union_all_with_an_unsketched_branch_is_not_per_group_whole() -> None:
    # PARTITION BY the union's column: r's rows of a group are in or out together, s's always stay and re-rank
    sql = ("SELECT q.g, q.v FROM (SELECT un.g, un.v, ROW_NUMBER() OVER (PARTITION BY un.g ORDER BY un.v) AS rn "
           f"FROM {MIXED}) q WHERE q.rn = 2")
    assert_unsafe(mixed_verdict(sql, {"r": "a"}), "drops some of its rows")
    self_union = sql.replace("SELECT s.a AS g, s.v AS v FROM s", "SELECT r2.a AS g, r2.b AS v FROM r r2")
    assert_safe(mixed_verdict(self_union, {"r": "a"}))
    r, s = pa.table({"a": [1, 5], "b": [0, 1]}), pa.table({"a": [1, 1], "v": [5, 9]})
    full, sketched = over_fragments(sql, {"r": r, "s": s}, "r", "a", [0, 3, 6], "SELECT r.a FROM r WHERE FALSE")
    assert full == [(1, 5)] and sketched == [(1, 9)]


# -- NOT EXISTS / NOT IN (anti join; plans built by hand) -----------------------------------------------------------


def _scan(table: str, alias: str | None = None) -> Scan:
    return Scan(table, alias or table, tuple(Field(f.name, f.type) for f in SCHEMAS[table]))


def _anti(left: Plan, right: Plan, lcol: str, rcol: str, null_aware: bool = False) -> AntiJoin:
    return AntiJoin(left, right, Binary("=", Col(lcol, left.field(lcol).dtype), Col(rcol, right.field(rcol).dtype)),
                    null_aware)


ANTI_REASON = "would drop rows of the NOT EXISTS/NOT IN subquery and let extra rows through"


@pytest.mark.parametrize("null_aware", [False, True])
def test_an_anti_join_is_safe_on_the_outer_tables_only(null_aware: bool) -> None:
    plan = _anti(_scan("t"), _scan("u"), "t.a", "u.k", null_aware)
    for column in ("a", "b", "x"):
        assert_safe(check(plan, {"t": column}))
    assert_unsafe(check(plan, {"u": "m"}), f"a sketch on u {ANTI_REASON}")
    assert_unsafe(check(plan, {"t": "a", "u": "m"}), f"a sketch on u {ANTI_REASON}")
    assert safe_columns(plan) == ["t.a", "t.b", "t.c", "t.x"]  # none of u
    # one table on both sides: the sketch filters every scan of it, the subquery's too
    inner = Project(_scan("t", "t2"), (("k2", Col("t2.x", pa.int64())),))
    assert_unsafe(check(_anti(_scan("t"), inner, "t.a", "k2", null_aware), {"t": "a"}), f"a sketch on t {ANTI_REASON}")


def test_an_anti_join_over_partial_groups_is_safe_unless_it_compares_an_aggregate() -> None:
    groups = parse_query("SELECT a, SUM(x) AS s FROM t GROUP BY a", SCHEMAS).plan
    by_group, by_sum = _anti(groups, _scan("u"), "a", "u.k"), _anti(groups, _scan("u"), "s", "u.k")
    assert_safe(check(by_group, {"t": "a"}))
    assert_safe(check(by_sum, {"t": "a"}))  # whole groups: every value exact
    assert_safe(check(by_group, {"t": "b"}))  # a partial group's key is its full group's: kept or dropped alike
    assert_unsafe(check(by_sum, {"t": "b"}), "a NOT EXISTS/NOT IN compares a partial aggregate")


def test_a_sketch_on_the_subquery_table_really_changes_the_answer() -> None:
    sql = "SELECT a FROM t WHERE NOT EXISTS (SELECT 1 FROM u WHERE u.k = t.a)"
    t = pa.table({"a": [1, 2, 3], "b": [0, 0, 0], "c": [0.0] * 3, "x": [0, 0, 0]})
    u = pa.table({"m": [1, 15], "k": [1, 2]})
    # the answer's provenance holds no row of u, so a sketch on u.m keeps none of its fragments
    assert canonical(duck(sql, t=t, u=u)) == [(3,)]
    assert canonical(duck(sql, t=t, u=u.slice(0, 0))) == [(1,), (2,), (3,)]

"""Focused unit tests of each incremental operator (paper Section 5, with the errata's Δ+/Δ− signs).

Deltas are written by hand: data columns, ``__mult`` (+n inserted copies, −n deleted copies) and the annotation,
either one fragment column per partitioned scan (``__f0``, ``__f1``) or a fragment set (``__sk``).
"""

from __future__ import annotations

import datetime as dt

import numpy as np
import polars as pl
import pytest

from imp_core.engine.annotation import FRAG_DTYPE, SET_DTYPE, ScanAnnotation, as_sets, consolidate
from imp_core.engine.operators.aggregation import Aggregation
from imp_core.engine.operators.join import JoinOp
from imp_core.engine.operators.merge import Merge
from imp_core.engine.operators.projection import Projection
from imp_core.engine.operators.selection import Selection
from imp_core.engine.operators.table_access import TableAccess
from imp_core.engine.operators.topk import TopKOp
from imp_core.engine.schema import MULT, SET, frag_col
from imp_core.errors import StateError
from imp_core.plan.expr import DATE, FLOAT, INT, STRING, AggCall, Binary, Col, IsNull, Lit, Unary
from imp_core.plan.nodes import Field, Join, Scan, SortKey
from imp_core.sketch.partition import Partition

# --- helpers ------------------------------------------------------------------------------------------------------


def delta(data: dict[str, list], mult: list[int], *, frags: dict[str, list[int]] | None = None,
          sets: list[list[int]] | None = None, types: dict[str, pl.DataType] | None = None) -> pl.DataFrame:
    """An annotated delta: data columns, ``__mult``, fragment columns (``frags``) or fragment sets (``sets``)."""
    columns: dict[str, pl.Series] = {}
    for name, values in data.items():
        columns[name] = pl.Series(name, values, dtype=(types or {}).get(name))
    columns[MULT] = pl.Series(MULT, mult, dtype=pl.Int64)
    for name, values in (frags or {}).items():
        columns[name] = pl.Series(name, values, dtype=FRAG_DTYPE)
    if sets is not None:
        columns[SET] = pl.Series(SET, sets, dtype=SET_DTYPE)
    return pl.DataFrame(columns)


def rows(df: pl.DataFrame, *cols: str) -> list[tuple]:
    """Rows of an annotated delta as sorted (data..., mult, fragment set) tuples."""
    df = as_sets(df)
    names = list(cols) or [c for c in df.columns if c not in (MULT, SET)]
    out = [(*(r[c] for c in names), r[MULT], tuple(r[SET])) for r in df.iter_rows(named=True)]
    return sorted(out, key=repr)


def srt(expected: list[tuple]) -> list[tuple]:
    return sorted(expected, key=repr)


def net(df: pl.DataFrame) -> list[tuple]:
    """Rows after netting identical (row, annotation) pairs."""
    return rows(consolidate(as_sets(df)))


# --- table access -------------------------------------------------------------------------------------------------


def test_table_access_annotates_with_global_fragments() -> None:
    scan = Scan("sales", "s", (Field("price", INT), Field("brand", STRING)))
    part = Partition("sales", "price", (0, 100, 500, 1000), "int")  # fragments [0,100) [100,500) [500,1000)
    op = TableAccess("scan", scan, ScanAnnotation(scan, frag_col(0), part, offset=7))
    changes = pl.DataFrame({"price": [-5, 0, 99, 100, 499, 500, 10_000, None], "brand": ["a"] * 8,
                            MULT: [1, 1, 1, -1, 1, 2, 1, 1]})
    out = op.process(changes)
    assert out.columns == ["s.price", "s.brand", MULT, "__f0"]
    # first and last fragments are open-ended; NULL belongs to fragment 0; ids are offset to global ones
    assert out.get_column("__f0").to_list() == [7, 7, 7, 8, 8, 9, 9, 7]
    assert out.get_column(MULT).to_list() == [1, 1, 1, -1, 1, 2, 1, 1]


def test_table_access_without_partition_has_no_annotation() -> None:
    scan = Scan("t", "x", (Field("a", INT),))
    out = TableAccess("scan", scan, None).process(pl.DataFrame({"a": [1, 2], MULT: [1, -1]}))
    assert out.columns == ["x.a", MULT]


def test_table_access_string_and_date_partitions() -> None:
    scan = Scan("t", "t", (Field("s", STRING), Field("d", DATE)))
    by_string = TableAccess("a", scan, ScanAnnotation(scan, frag_col(0), Partition("t", "s", ("b", "d", "f"), "string"),
                                                      0))
    by_date = TableAccess("b", scan, ScanAnnotation(scan, frag_col(0), Partition(
        "t", "d", (dt.date(2024, 1, 1), dt.date(2024, 2, 1), dt.date(2024, 3, 1)), "date"), 0))
    changes = pl.DataFrame({"s": ["a", "b", "c", "d", "zz", None],
                            "d": [dt.date(2023, 1, 1), dt.date(2024, 1, 31), dt.date(2024, 2, 1), None,
                                  dt.date(2030, 1, 1), dt.date(2024, 1, 1)], MULT: [1] * 6})
    assert by_string.process(changes).get_column("__f0").to_list() == [0, 0, 0, 1, 1, 0]
    assert by_date.process(changes).get_column("__f0").to_list() == [0, 0, 1, 0, 1, 0]


# --- selection and projection ---------------------------------------------------------------------------------------


def test_selection_keeps_matching_rows_with_their_annotation_and_sign() -> None:
    d = delta({"a": [1, 5, None, 7]}, [1, -2, 1, 3], frags={"__f0": [0, 1, 2, 3]})
    op = Selection("sel", Binary(">", Col("a", INT), Lit.of(3)))
    out = op.process(d)
    # NULL > 3 is NULL: not selected (SQL WHERE)
    assert rows(out) == [(5, -2, (1,)), (7, 3, (3,))]


def test_selection_three_valued_logic() -> None:
    d = delta({"a": [None, 1, 5]}, [1, 1, 1], frags={"__f0": [0, 1, 2]})
    # NOT (a > 3): NOT NULL is NULL, so the NULL row is dropped like the row where it is FALSE
    op = Selection("sel", Unary("not", Binary(">", Col("a", INT), Lit.of(3))))
    assert rows(op.process(d)) == [(1, 1, (1,))]
    # a IS NULL OR a > 3: NULL OR FALSE = FALSE for 1, TRUE for NULL and 5
    op = Selection("sel", Binary("or", IsNull(Col("a", INT)), Binary(">", Col("a", INT), Lit.of(3))))
    assert rows(op.process(d)) == srt([(None, 1, (0,)), (5, 1, (2,))])


def test_projection_computes_expressions_and_keeps_duplicates() -> None:
    d = delta({"a": [1, 1, 2], "b": [10, 10, 20]}, [1, 1, -1], sets=[[0], [0], [1, 2]])
    op = Projection("p", (("s", Binary("+", Col("a", INT), Col("b", INT))),))
    out = op.process(d)
    assert out.columns == ["s", MULT, SET]
    assert out.height == 3  # bag semantics: duplicates are not merged here
    assert rows(out) == [(11, 1, (0,)), (11, 1, (0,)), (22, -1, (1, 2))]


# --- join ---------------------------------------------------------------------------------------------------------


def join_op(condition: bool = True, theta: bool = False) -> JoinOp:
    left = Scan("L", "l", (Field("k", INT), Field("v", STRING)))
    right = Scan("R", "r", (Field("k", INT), Field("w", STRING)))
    cond = Binary("=", Col("l.k", INT), Col("r.k", INT)) if condition else None
    if theta:
        cond = Binary("<", Col("l.k", INT), Col("r.k", INT))
    return JoinOp("join", Join(left, right, cond))


class Side:
    """A join input's current annotated contents (what a backend holds)."""

    def __init__(self, op: JoinOp, current: pl.DataFrame) -> None:
        self.op, self.current = op, current

    def join_delta(self, d: pl.DataFrame, delta_is_left: bool) -> pl.DataFrame:
        return self.op.join_frames(d, self.current) if delta_is_left else self.op.join_frames(self.current, d)


def L(ks: list[int], mult: list[int], frags: list[int], v: str = "x") -> pl.DataFrame:
    return delta({"l.k": ks, "l.v": [v] * len(ks)}, mult, frags={"__f0": frags})


def R(ks: list[int], mult: list[int], frags: list[int], w: str = "y") -> pl.DataFrame:
    return delta({"r.k": ks, "r.w": [w] * len(ks)}, mult, frags={"__f0": frags})


@pytest.mark.parametrize(("left_sign", "right_sign", "out_sign"), [
    (+1, +1, +1),  # Δ+ s ⋈ Δ+ t = Δ+
    (-1, -1, +1),  # Δ− s ⋈ Δ− t = Δ+   (errata)
    (+1, -1, -1),  # Δ+ s ⋈ Δ− t = Δ−   (errata)
    (-1, +1, -1),  # Δ− s ⋈ Δ+ t = Δ−
])
def test_join_signs_of_delta_pairs(left_sign: int, right_sign: int, out_sign: int) -> None:
    op = join_op()
    out = op.join_frames(L([1], [2 * left_sign], [0]), R([1], [3 * right_sign], [5]))
    # multiplicity n·m with the sign of the pair; annotation = union of both sides (one fragment per scan)
    assert rows(out, "l.k", "r.k") == [(1, 1, 6 * out_sign, (0, 5))]
    assert [c for c in out.columns if c.startswith("__f")] == ["__f0", "__f1"]


def test_join_delta_with_current_contents_of_the_other_side() -> None:
    op = join_op()
    right_now = R([1, 1, 2], [1, 1, 1], [5, 6, 5])
    # Δ+ s ⋈ t ∈ R = Δ+;  Δ− s ⋈ t ∈ R = Δ−
    out = op.process(L([1, 2, 3], [1, -1, 1], [0, 1, 2]), None, Side(op, pl.DataFrame()), Side(op, right_now))
    assert rows(out, "l.k", "r.k") == srt([(1, 1, 1, (0, 5)), (1, 1, 1, (0, 6)), (2, 2, -1, (1, 5))])


@pytest.mark.parametrize("theta", [False, True])
def test_join_both_sides_changed_equals_recomputation(theta: bool) -> None:
    """Δ(L⋈R) from deltas on both sides (each joined with the other side *after* the pass) equals L'⋈R' − L⋈R."""
    op = join_op(theta=theta)
    l0 = L([1, 2, 2, 3], [1, 1, 1, 1], [0, 0, 1, 1])
    r0 = R([1, 2, 3, 4], [1, 1, 1, 1], [5, 5, 6, 6])
    dl = L([2, 4, 1], [-1, 1, 1], [1, 1, 0])
    dr = R([2, 3, 1], [-1, 1, 1], [5, 5, 6])
    l1, r1 = consolidate(pl.concat([l0, dl])), consolidate(pl.concat([r0, dr]))
    out = op.process(dl, dr, Side(op, l1), Side(op, r1))
    expected = pl.concat([op.join_frames(l1, r1), op.join_frames(l0, r0).with_columns(-pl.col(MULT))])
    assert net(out) == net(expected)
    assert net(out)  # the case is not trivial


def test_join_unions_fragment_sets() -> None:
    op = join_op()
    left = delta({"l.k": [1], "l.v": ["x"]}, [1], sets=[[0, 3]])
    right = delta({"r.k": [1], "r.w": ["y"]}, [-1], frags={"__f0": [5]})
    out = op.join_frames(left, right)
    assert out.columns[-1] == SET
    assert rows(out, "l.k") == [(1, -1, (0, 3, 5))]


def test_cross_product_and_empty_output_schema() -> None:
    op = join_op(condition=False)
    out = op.join_frames(L([1, 2], [1, 1], [0, 1]), R([7], [-1], [5]))
    assert rows(out, "l.k", "r.k") == srt([(1, 7, -1, (0, 5)), (2, 7, -1, (1, 5))])
    # a delta that finds no partner gives an empty delta with *all* join columns (the parent projects them)
    eq = join_op()
    empty = eq.process(L([9], [1], [0]), None, Side(eq, pl.DataFrame()), Side(eq, R([1], [1], [5])))
    assert empty.height == 0
    assert {"l.k", "l.v", "r.k", "r.w", MULT} <= set(empty.columns)


# --- aggregation --------------------------------------------------------------------------------------------------


def agg_op(*funcs: str, global_agg: bool = False) -> Aggregation:
    v = Col("v", INT)
    aggs = tuple((f if f != "count_star" else "cnt", AggCall("count", None) if f == "count_star" else AggCall(f, v))
                 for f in funcs)
    keys = () if global_agg else (("g", Col("g", INT)),)
    return Aggregation("agg", keys, aggs, {} if global_agg else {"g": pl.Int64})


def G(g: list, v: list, mult: list[int], frags: list[int]) -> pl.DataFrame:
    return delta({"g": g, "v": v}, mult, frags={"__f0": frags}, types={"g": pl.Int64, "v": pl.Int64})


def test_aggregation_new_group_emits_only_insert() -> None:
    op = agg_op("sum", "count_star")
    out = op.process(G([1, 1], [5, 7], [1, 1], [0, 1]))
    assert rows(out) == [(1, 12, 2, 1, (0, 1))]


def test_aggregation_changed_group_emits_one_pair_per_batch() -> None:
    op = agg_op("sum", "count_star")
    op.process(G([1, 2], [5, 1], [1, 1], [0, 2]))
    # three changes to group 1 in one batch: one Δ−old / Δ+new pair, not three
    out = op.process(G([1, 1, 1], [3, 4, 5], [1, 1, -1], [1, 1, 0]))
    assert rows(out) == srt([(1, 5, 1, -1, (0,)), (1, 7, 2, 1, (1,))])


def test_aggregation_group_disappears_with_only_a_delete() -> None:
    op = agg_op("sum")
    op.process(G([1, 2], [5, 1], [2, 1], [0, 2]))
    out = op.process(G([1], [5], [-2], [0]))
    assert rows(out) == [(1, 10, -1, (0,))]
    assert op.groups.get_column("g").to_list() == [2]
    assert op.group_fragments.get_column("g").to_list() == [2]


def test_aggregation_unchanged_group_emits_nothing() -> None:
    op = agg_op("sum")
    op.process(G([1], [5], [1], [0]))
    # a zero added in the same fragment changes neither SUM nor the group's sketch
    assert op.process(G([1], [0], [1], [0])).height == 0
    # but a zero from a new fragment changes the sketch: the pair is emitted
    assert rows(op.process(G([1], [0], [1], [3]))) == srt([(1, 5, -1, (0,)), (1, 5, 1, (0, 3))])


def test_aggregation_fragment_leaves_group_sketch_when_its_count_reaches_zero() -> None:
    op = agg_op("count_star")
    op.process(G([1, 1, 1], [1, 2, 3], [1, 1, 1], [0, 0, 4]))
    out = op.process(G([1], [1], [-1], [0]))  # fragment 0 still has one row in the group
    assert rows(out) == srt([(1, 3, -1, (0, 4)), (1, 2, 1, (0, 4))])
    out = op.process(G([1], [2], [-1], [0]))
    assert rows(out) == srt([(1, 2, -1, (0, 4)), (1, 1, 1, (4,))])


def test_aggregation_every_function_with_nulls() -> None:
    op = agg_op("sum", "count", "count_star", "avg", "min", "max")
    out = op.process(G([1, 1, 1, 2], [4, None, 1, None], [1, 1, 2, 1], [0, 0, 0, 1]))
    assert rows(out) == srt([(1, 6, 3, 4, 2.0, 1, 4, 1, (0,)),
                             (2, None, 0, 1, None, None, None, 1, (1,))])  # SUM/AVG/MIN/MAX of only NULLs are NULL


def test_min_max_deleting_the_current_extreme() -> None:
    op = agg_op("min", "max")
    op.process(G([1] * 4, [3, 3, 5, 9], [1, 1, 1, 1], [0, 0, 1, 2]))
    # one of two copies of the minimum goes: MIN stays 3; the maximum goes: MAX falls back to 5
    out = op.process(G([1, 1], [3, 9], [-1, -1], [0, 2]))
    assert rows(out) == srt([(1, 3, 5, 1, (0, 1)), (1, 3, 9, -1, (0, 1, 2))])
    # the other copy goes too: MIN becomes 5
    out = op.process(G([1], [3], [-1], [0]))
    assert rows(out) == srt([(1, 3, 5, -1, (0, 1)), (1, 5, 5, 1, (1,))])
    # all values deleted: the group disappears, its multisets are empty
    out = op.process(G([1], [5], [-1], [1]))
    assert rows(out) == [(1, 5, 5, -1, (1,))]
    assert all(m.values.height == 0 for m in op.multisets.values())


def test_aggregation_without_group_by_always_has_one_row() -> None:
    op = agg_op("sum", "count_star", global_agg=True)
    assert rows(op.output_relation()) == [(None, 0, 1, ())]
    out = op.process(G([0], [4], [1], [2]))
    assert rows(out) == srt([(None, 0, -1, ()), (4, 1, 1, (2,))])
    out = op.process(G([0], [4], [-1], [2]))  # back to empty input: the row stays, with COUNT 0
    assert rows(out) == srt([(None, 0, 1, ()), (4, 1, -1, (2,))])
    # the state is exactly the state of a fresh operator again (capture == maintenance)
    fresh = agg_op("sum", "count_star", global_agg=True)
    assert op.canonical()["groups"].equals(fresh.canonical()["groups"])


def test_aggregation_bootstrap_emits_the_whole_result() -> None:
    op = agg_op("sum", global_agg=True)
    empty = G([], [], [], [])
    out = op.bootstrap(op.layout.of_delta(empty))
    assert rows(out) == [(None, 1, ())]  # one row over an empty input, and no Δ− of a row nobody has seen
    out = op.bootstrap(op.layout.of_delta(G([0, 0], [1, 2], [1, 1], [0, 3])))
    assert rows(out) == [(3, 1, (0, 3))]


def test_aggregation_negative_count_is_a_state_error() -> None:
    op = agg_op("sum")
    op.process(G([1], [5], [1], [0]))
    with pytest.raises(StateError):
        op.process(G([1], [5], [-2], [0]))


def test_distinct_counts_duplicates() -> None:
    op = Aggregation("distinct", (("a", Col("a", INT)),), (), {"a": pl.Int64})
    out = op.process(delta({"a": [1, 1, 2]}, [1, 1, 1], frags={"__f0": [0, 3, 1]}))
    assert rows(out) == srt([(1, 1, (0, 3)), (2, 1, (1,))])
    # one copy goes: the row stays, its sketch loses fragment 3
    assert rows(op.process(delta({"a": [1]}, [-1], frags={"__f0": [3]}))) == srt([(1, -1, (0, 3)), (1, 1, (0,))])
    # the last copy goes: the row disappears
    assert rows(op.process(delta({"a": [1]}, [-1], frags={"__f0": [0]}))) == [(1, -1, (0,))]


# --- top-k --------------------------------------------------------------------------------------------------------


def topk_op(k: int, descending: bool = False) -> TopKOp:
    return TopKOp("topk", (SortKey(Col("o", INT), descending),), k, {"o": pl.Int64, "p": pl.String})


def T(o: list, p: list[str], mult: list[int], sets: list[list[int]]) -> pl.DataFrame:
    return delta({"o": o, "p": p}, mult, sets=sets, types={"o": pl.Int64})


def test_topk_multiplicities_follow_fig_4() -> None:
    op = topk_op(3)
    # t = (1, a) five times: τ_3 keeps it with multiplicity min(5, 3 - 0) = 3
    out = op.process(T([1, 2], ["a", "b"], [5, 1], [[0], [1]]))
    assert rows(out) == [(1, "a", 3, (0,))]
    # two copies go: (1, a)^3 stays, (2, b) has pos 3 and stays out: nothing changes
    out = op.process(T([1], ["a"], [-2], [[0]]))
    assert out.height == 0
    # one more goes: (1, a)^2 and (2, b) enters with min(1, 3 - 2) = 1
    out = op.process(T([1], ["a"], [-1], [[0]]))
    assert rows(out) == srt([(1, "a", -1, (0,)), (2, "b", 1, (1,))])


def test_topk_keeps_every_row_tied_at_the_boundary() -> None:
    op = topk_op(2)
    op.process(T([1, 5, 5, 5, 9], ["a", "b", "c", "c", "d"], [1, 1, 1, 1, 1], [[0], [1], [2], [3], [4]]))
    # pos(5) = 1 < 2: the tuples with o = 5 share the position; each keeps min(R(t), k - pos) = 1 copy. The two
    # copies of (5, c) are one tuple (R = 2) annotated with both fragments, not two rows (a top-k below an
    # aggregation would otherwise count 3 rows with o = 5 where SQL has at most 2)
    assert rows(op.output_relation()) == srt([(1, "a", 1, (0,)), (5, "b", 1, (1,)), (5, "c", 1, (2, 3))])
    # (1, a) goes: pos(5) = 0, so (5, c) now keeps min(2, 2) = 2 copies; (9, d) stays out (pos 3)
    out = op.process(T([1], ["a"], [-1], [[0]]))
    assert rows(out) == srt([(1, "a", -1, (0,)), (5, "c", 1, (2, 3))])
    assert rows(op.output_relation()) == srt([(5, "b", 1, (1,)), (5, "c", 2, (2, 3))])


def test_topk_counts_copies_of_a_tuple_across_fragments() -> None:
    """Fig. 4's R(t) counts every copy of t: three copies from three fragments under LIMIT 2 give t^2."""
    op = topk_op(2)
    out = op.process(T([4, 4, 4], ["x", "x", "x"], [1, 1, 1], [[0], [5], [7]]))
    assert rows(out) == [(4, "x", 2, (0, 5, 7))]
    # a copy leaves: still two copies, from the two remaining fragments
    out = op.process(T([4], ["x"], [-1], [[5]]))
    assert rows(out) == srt([(4, "x", -2, (0, 5, 7)), (4, "x", 2, (0, 7))])


def test_topk_order_descending_with_nulls() -> None:
    op = TopKOp("topk", (SortKey(Col("o", INT), descending=True),), 2, {"o": pl.Int64, "p": pl.String})
    op.process(T([None, 3, 7, 1], ["n", "a", "b", "c"], [1, 1, 1, 1], [[0], [1], [2], [3]]))
    # DESC: NULLs last (they are the smallest values, as in Spark)
    assert rows(op.output_relation()) == srt([(3, "a", 1, (1,)), (7, "b", 1, (2,))])
    op2 = TopKOp("topk", (SortKey(Col("o", INT), descending=True, nulls_first=True),), 1,
                 {"o": pl.Int64, "p": pl.String})
    op2.process(T([None, 3], ["n", "a"], [1, 1], [[0], [1]]))
    assert rows(op2.output_relation()) == [(None, "n", 1, (0,))]


def test_topk_delete_of_unknown_row_is_a_state_error() -> None:
    op = topk_op(1)
    with pytest.raises(StateError):
        op.process(T([1], ["a"], [-1], [[0]]))


def test_topk_output_is_the_difference_of_two_top_k() -> None:
    """Random changes: the emitted deltas always sum up to τ(S') (checked against a direct computation)."""
    rng = np.random.default_rng(7)
    op = topk_op(4, descending=True)
    current: list[tuple] = []
    emitted: dict[tuple, int] = {}
    for _ in range(60):
        o = rng.integers(0, 6, size=3).tolist()
        p = rng.choice(["a", "b"], size=3).tolist()
        f = rng.integers(0, 3, size=3).tolist()
        signs = [1, 1, 1]
        if current and rng.random() < 0.5:
            gone = current[int(rng.integers(0, len(current)))]
            o[0], p[0], f[0], signs[0] = gone[0], gone[1], gone[2], -1
        for oi, pi, fi, si in zip(o, p, f, signs):
            if si > 0:
                current.append((oi, pi, fi))
            else:
                current.remove((oi, pi, fi))
        for r in rows(op.process(T(o, p, signs, [[x] for x in f]))):
            key = (r[0], r[1], r[3])
            emitted[key] = emitted.get(key, 0) + r[2]
        expected = _fig4_top(current, 4)
        assert {k: v for k, v in emitted.items() if v} == expected


def _fig4_top(current: list[tuple], k: int) -> dict[tuple, int]:
    """τ_{k,O DESC} with the paper's Fig. 4 definition: per tuple t = (o, p), R(t) counts its copies in every
    fragment; the output row t^m is annotated with all of them."""
    copies: dict[tuple, list[int]] = {}
    for o, p, f in current:
        copies.setdefault((o, p), []).append(f)
    out = {}
    for (o, p), frags in copies.items():
        pos = sum(len(fs) for other, fs in copies.items() if other[0] > o)  # rows strictly before in DESC order
        if pos < k:
            out[(o, p, tuple(sorted(set(frags))))] = min(len(frags), k - pos)
    return out


# --- merge μ ------------------------------------------------------------------------------------------------------


def test_merge_transitions() -> None:
    op = Merge("merge", 4)
    d = op.process(delta({"x": [1, 2]}, [2, 1], sets=[[0, 1], [1]]))
    assert (d.added, d.removed) == ((0, 1), ())
    assert op.counts.tolist() == [2, 3, 0, 0]
    # n -> m (both non-zero): nothing; 0 -> n: Δ+
    d = op.process(delta({"x": [2, 3]}, [-1, 1], sets=[[1], [3]]))
    assert (d.added, d.removed) == ((3,), ())
    # n -> 0: Δ−
    d = op.process(delta({"x": [1]}, [-2], sets=[[0, 1]]))
    assert (d.added, d.removed) == ((), (0, 1))
    assert op.sketch() == {3}


def test_merge_example_5_2() -> None:
    """Paper Example 5.2: S[ρ1] = 1, S[ρ2] = 3; deleting t3 annotated {ρ1, ρ2} removes ρ1 only."""
    op = Merge("merge", 2)
    op.process(delta({"t": ["t1", "t2", "t3"]}, [1, 1, 1], sets=[[1], [1], [0, 1]]))
    assert op.counts.tolist() == [1, 3]
    d = op.process(delta({"t": ["t3"]}, [-1], sets=[[0, 1]]))
    assert (d.added, d.removed) == ((), (0,))
    assert op.counts.tolist() == [0, 2]


def test_merge_fragment_columns_and_errors() -> None:
    op = Merge("merge", 3)
    d = op.process(delta({"x": [1]}, [1], frags={"__f0": [0], "__f1": [2]}))
    assert d.added == (0, 2)
    with pytest.raises(StateError):
        op.process(delta({"x": [1]}, [-2], frags={"__f0": [0], "__f1": [2]}))
    with pytest.raises(StateError):
        op.process(delta({"x": [1]}, [1], frags={"__f0": [3]}))


def test_consolidate_nets_inserts_and_deletes() -> None:
    d = delta({"a": [1, 1, 2, 1]}, [1, -1, 2, 1], frags={"__f0": [0, 0, 1, 1]})
    assert rows(consolidate(d)) == srt([(1, 1, (1,)), (2, 2, (1,))])


def test_float_keys_and_values_keep_their_types() -> None:
    op = Aggregation("agg", (("x", Col("x", FLOAT)),), (("s", AggCall("sum", Col("x", FLOAT))),), {"x": pl.Float64})
    out = op.process(delta({"x": [0.5, -0.0, 0.0]}, [1, 1, 1], frags={"__f0": [0, 1, 2]}))
    # -0.0 and 0.0 are one group, as in SQL
    assert sorted(out.get_column("x").to_list()) == [0.0, 0.5]
    assert out.schema["s"] == pl.Float64

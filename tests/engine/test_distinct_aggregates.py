"""COUNT(DISTINCT x) and SUM(DISTINCT x) in the aggregation operator (``operators/distinct_values.py``): per (group,
value) counts, so inserting a duplicate or deleting one of several copies leaves the value, and deleting the last
copy removes it. A group's sketch is all of its rows' fragments, as for every aggregate."""

from __future__ import annotations

import decimal
import random

import polars as pl
import pytest

from imp_core.engine.operators.aggregation import Aggregation
from imp_core.engine.operators.distinct_values import DistinctValues, KeyedDistinctValues
from imp_core.errors import StateError
from imp_core.plan.expr import FLOAT, INT, AggCall, Col
from tests.engine.test_operators import delta, rows, srt

D = decimal.Decimal


def distinct_op(*funcs: str, keyed: bool = True, global_agg: bool = False, arg_type=INT) -> Aggregation:  # noqa: ANN001
    v = Col("v", arg_type)
    aggs = tuple((f"{f}{i}", AggCall("count", None) if f == "count_star" else
                  AggCall(f.removesuffix("_d"), v, distinct=f.endswith("_d"))) for i, f in enumerate(funcs))
    keys = () if global_agg else (("g", Col("g", INT)),)
    return Aggregation("agg", keys, aggs, {} if global_agg else {"g": pl.Int64}, keyed=keyed)


def G(g: list, v: list, mult: list[int], frags: list[int], v_type: pl.DataType = pl.Int64) -> pl.DataFrame:
    return delta({"g": g, "v": v}, mult, frags={"__f0": frags}, types={"g": pl.Int64, "v": v_type})


def random_batch(rng: random.Random, held: list[tuple[int, int | None, int]], values: list[int | None],
                 deletes: float) -> pl.DataFrame:
    """1-6 random changes: with probability ``deletes`` a delete of a row of ``held`` (the (g, v, fragment) rows
    present), else an insert of a row with a value from ``values``; ``held`` follows them."""
    batch = []
    for _ in range(rng.randint(1, 6)):
        if held and rng.random() < deletes:
            batch.append((held.pop(rng.randrange(len(held))), -1))
        else:
            row = (rng.randint(0, 3), rng.choice(values), rng.randint(0, 3))
            batch.append((row, 1))
            held.append(row)
    g, v, f = zip(*(r for r, _ in batch))
    return G(list(g), list(v), [m for _, m in batch], list(f))


@pytest.mark.parametrize("keyed", [True, False])
def test_count_distinct_follows_each_value_count(keyed: bool) -> None:
    op = distinct_op("count_d", "sum_d", "count", keyed=keyed)
    out = op.process(G([1, 1, 1], [3, 3, 5], [1, 1, 1], [0, 0, 1]))
    assert rows(out) == [(1, 2, 8, 3, 1, (0, 1))]
    # a duplicate of a held value: COUNT(DISTINCT) and SUM(DISTINCT) stay (COUNT does not)
    out = op.process(G([1], [5], [1], [1]))
    assert rows(out) == srt([(1, 2, 8, 3, -1, (0, 1)), (1, 2, 8, 4, 1, (0, 1))])
    # one of two copies of 3 goes: both stay
    out = op.process(G([1], [3], [-1], [0]))
    assert rows(out) == srt([(1, 2, 8, 4, -1, (0, 1)), (1, 2, 8, 3, 1, (0, 1))])
    # the last copy of 3 goes: 3 leaves the distinct set, and fragment 0 the group's sketch
    out = op.process(G([1], [3], [-1], [0]))
    assert rows(out) == srt([(1, 2, 8, 3, -1, (0, 1)), (1, 1, 5, 2, 1, (1,))])
    # a new value comes in
    out = op.process(G([1], [-4], [1], [1]))
    assert rows(out) == srt([(1, 1, 5, 2, -1, (1,)), (1, 2, 1, 3, 1, (1,))])


@pytest.mark.parametrize("keyed", [True, False])
def test_nulls_are_not_values(keyed: bool) -> None:
    op = distinct_op("count_d", "sum_d", "count_star", keyed=keyed)
    out = op.process(G([1, 1, 2], [None, 7, None], [1, 1, 2], [0, 0, 1]))
    # group 2 holds only NULLs: COUNT(DISTINCT) 0, SUM(DISTINCT) NULL, but its rows are its provenance
    assert rows(out) == srt([(1, 1, 7, 2, 1, (0,)), (2, 0, None, 2, 1, (1,))])
    # deleting the only value of group 1 leaves a group of NULLs
    out = op.process(G([1], [7], [-1], [0]))
    assert rows(out) == srt([(1, 1, 7, 2, -1, (0,)), (1, 0, None, 1, 1, (0,))])
    assert all(m.values.height == 0 for m in op.multisets.values())


@pytest.mark.parametrize("keyed", [True, False])
def test_without_group_by_the_empty_input_counts_zero(keyed: bool) -> None:
    op = distinct_op("count_d", "sum_d", keyed=keyed, global_agg=True)
    assert rows(op.output_relation()) == [(0, None, 1, ())]
    op.process(G([0, 0], [2, 2], [1, 1], [0, 3]))
    assert rows(op.output_relation()) == [(1, 2, 1, (0, 3))]
    out = op.process(G([0, 0], [2, 2], [-1, -1], [0, 3]))
    assert rows(out) == srt([(1, 2, -1, (0, 3)), (0, None, 1, ())])
    fresh = distinct_op("count_d", "sum_d", keyed=keyed, global_agg=True)
    assert op.canonical()["groups"].equals(fresh.canonical()["groups"])


def test_floats_are_distinct_as_spark_sees_them() -> None:
    # -0.0 = 0.0 and every NaN is one value (Spark normalizes floats in DISTINCT and GROUP BY)
    op = distinct_op("count_d", arg_type=FLOAT)
    out = op.process(G([1] * 5, [0.0, -0.0, float("nan"), float("nan"), 1.5], [1] * 5, [0] * 5, pl.Float64))
    assert rows(out) == [(1, 3, 1, (0,))]


def test_decimal_sum_distinct_is_exact() -> None:
    import pyarrow as pa
    op = distinct_op("sum_d", arg_type=pa.decimal128(10, 2))
    v_type = pl.Decimal(10, 2)
    op.process(G([1, 1, 1], [D("0.10"), D("0.10"), D("0.20")], [1, 1, 1], [0, 0, 0], v_type))
    assert rows(op.output_relation()) == [(1, D("0.30"), 1, (0,))]
    assert op.output_relation().schema["sum_d0"] == pl.Decimal(38, 2)  # decimals are held as DECIMAL(38, s)


def test_decimal_sum_distinct_beyond_38_digits_is_null() -> None:
    import pyarrow as pa
    # DECIMAL(38, 0): SUM is DECIMAL(38, 0) and 2 * (10^38 - 1) does not fit: NULL, as in Spark (ANSI off)
    op = distinct_op("sum_d", arg_type=pa.decimal128(38, 0))
    huge = D(10 ** 38 - 1)
    op.process(G([1, 1, 2], [huge, D(10 ** 38 - 2), D(5)], [1, 1, 1], [0, 0, 0], pl.Decimal(38, 0)))
    assert rows(op.output_relation()) == srt([(1, None, 1, (0,)), (2, D(5), 1, (0,))])


@pytest.mark.parametrize("keyed", [True, False])
def test_state_round_trips_and_is_told_apart_from_plain_count(keyed: bool) -> None:
    op = distinct_op("count_d", "sum_d", keyed=keyed)
    op.process(G([1, 1, 1, 2], [3, 3, 5, 4], [1, 1, 1, 1], [0, 1, 1, 2]))
    meta, frames = op.state_frames()
    again = distinct_op("count_d", "sum_d", keyed=keyed)
    again.set_state_frames(meta, frames)
    out = again.process(G([1, 1], [3, 3], [-1, -1], [0, 1]))  # both copies of 3
    assert rows(out) == srt([(1, 2, 8, -1, (0, 1)), (1, 1, 5, 1, (1,))])
    plain = distinct_op("count", "sum", keyed=keyed)
    with pytest.raises(StateError, match="different aggregation"):
        plain.set_state_frames(meta, frames)


def test_deleting_a_value_never_seen_is_a_state_error() -> None:
    op = distinct_op("count_d")
    op.process(G([1, 1], [3, 4], [1, 1], [0, 0]))
    with pytest.raises(StateError, match=r"COUNT\(DISTINCT\) state lost a value"):
        op.process(G([1, 1], [5, 9], [-1, 1], [0, 0]))


def test_keyed_state_keeps_distinct_counts_by_slot() -> None:
    assert isinstance(distinct_op("count_d").multisets[0], KeyedDistinctValues)
    assert isinstance(distinct_op("count_d", keyed=False).multisets[0], DistinctValues)


@pytest.mark.parametrize("keyed", [True, False])
def test_random_changes_equal_a_recomputation(keyed: bool) -> None:
    """Random batches of inserts and deletes (only of rows present) against COUNT(DISTINCT) and SUM(DISTINCT)
    recomputed from the rows in Python, with the state saved and loaded halfway."""
    rng = random.Random(21)
    op = distinct_op("count_d", "sum_d", "count_star", keyed=keyed)
    held: list[tuple[int, int | None, int]] = []  # (g, v, fragment) of every row present
    for step in range(40):
        op.process(random_batch(rng, held, [None, -2, 0, 1, 1, 5, 2 ** 63 - 1], 0.4))
        if step == 20:
            meta, frames = op.state_frames()
            op = distinct_op("count_d", "sum_d", "count_star", keyed=keyed)
            op.set_state_frames(meta, frames)
        expected = []
        for group in sorted({r[0] for r in held}):
            values = {r[1] for r in held if r[0] == group and r[1] is not None}
            total = (sum(values) + 2 ** 63) % 2 ** 64 - 2 ** 63 if values else None
            expected.append((group, len(values), total, sum(r[0] == group for r in held), 1,
                             tuple(sorted({r[2] for r in held if r[0] == group}))))
        assert rows(op.output_relation()) == srt(expected), step


@pytest.mark.parametrize("keyed", [True, False])
def test_aggregates_over_one_argument_keep_its_counts_once(keyed: bool) -> None:
    """MIN, MAX, COUNT(DISTINCT) and SUM(DISTINCT) of v keep one multiset (saved once, as ``mm`` of the first);
    random inserts and deletes against a recomputation in Python, with the state saved and loaded halfway, and a
    state saved with one multiset per aggregate (as earlier engines did) loads too."""
    funcs = ("min", "count_d", "max", "sum_d", "count_star")
    op = distinct_op(*funcs, keyed=keyed)
    assert [m.owner for m in op.multisets.values()] == [None, op.multisets[0], op.multisets[0], op.multisets[0]]
    rng = random.Random(38)
    held: list[tuple[int, int | None, int]] = []
    for step in range(40):
        op.process(random_batch(rng, held, [None, -2, 0, 1, 1, 5, 7], 0.45))
        if step in (15, 30):
            meta, frames = op.state_frames()
            assert [n for n in frames if n.startswith("mm")] == ["mm0"]
            if step == 30:  # the older layout: every aggregate's own copy
                frames = {**frames, "mm1": frames["mm0"], "mm2": frames["mm0"], "mm3": frames["mm0"]}
            op = distinct_op(*funcs, keyed=keyed)
            op.set_state_frames(meta, frames)
        expected = []
        for group in sorted({r[0] for r in held}):
            values = [r[1] for r in held if r[0] == group and r[1] is not None]
            expected.append((group, min(values, default=None), len(set(values)), max(values, default=None),
                             sum(set(values)) if values else None, sum(r[0] == group for r in held), 1,
                             tuple(sorted({r[2] for r in held if r[0] == group}))))
        assert rows(op.output_relation()) == srt(expected), step


def test_a_bounded_min_max_buffer_keeps_its_own_values() -> None:
    """A MIN/MAX buffer keeps each aggregate's best values: MIN and MAX of one argument cannot share them."""
    v = Col("v", INT)
    op = Aggregation("agg", (("g", Col("g", INT)),), (("lo", AggCall("min", v)), ("hi", AggCall("max", v))),
                     {"g": pl.Int64}, minmax_buffer=2)
    assert all(m.owner is None for m in op.multisets.values())
    op.process(G([1] * 5, [1, 2, 3, 4, 5], [1] * 5, [0] * 5))
    assert sorted(op.multisets[0].values.get_column("__v").to_list()) == [1, 2]
    assert sorted(op.multisets[1].values.get_column("__v").to_list()) == [4, 5]

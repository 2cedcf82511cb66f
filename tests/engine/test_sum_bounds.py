"""The error bound of a float sum that was added up plainly (``order_dependence.rounding_bound``, ``grown_bound``):
it covers the rounding of any summation order, never shrinks on a delete, and keeps a group whose stored sum lost
its small terms (issue 53, item 3)."""

from __future__ import annotations

import random
from fractions import Fraction

import polars as pl
import pyarrow as pa
import pytest

from imp_core.engine.operators.aggregation import Aggregation
from imp_core.engine.operators.partials import agg_columns
from imp_core.engine.operators.sum_state import check_layout
from imp_core.engine.order_dependence import grown_bound, rounding_bound
from imp_core.engine.schema import GROUP_ROWS, MULT, hi_name, lo_name
from imp_core.errors import StateError
from imp_core.plan.expr import FLOAT, INT, AggCall, Col


def _bound(n: int, magnitude: float) -> float:
    return pl.select(rounding_bound(pl.lit(n), pl.lit(magnitude))).item()


def test_the_rounding_bound_covers_plain_sums_in_any_order() -> None:
    rng = random.Random(5)
    for _ in range(200):
        xs = [rng.choice([1e16, -1e16, 1.0, 0.1, -3.3e-5, 7e10]) * rng.random() for _ in range(rng.randrange(1, 60))]
        exact = sum(map(Fraction, xs))
        for _ in range(5):
            rng.shuffle(xs)
            plain = 0.0
            for x in xs:
                plain += x
            magnitude = 0.0
            for x in xs:
                magnitude += abs(x)
            assert abs(Fraction(plain) - exact) <= Fraction(_bound(len(xs), magnitude))


def test_the_grown_bound_never_shrinks() -> None:
    frame = pl.DataFrame({"old": [0.0, 2.0, 5.0, None], "batch": [1.0, -7.0, None, 0.5]})
    grown = frame.select(grown_bound(pl.col("old"), pl.col("batch"))).to_series().to_list()
    assert grown == [1.0, 2.0, 5.0, 0.5]
    assert all(g >= (o or 0.0) for g, o in zip(grown, frame.get_column("old").to_list()))


def _having_sum(keyed: bool) -> Aggregation:
    aggs = (("s", AggCall("sum", Col("x", FLOAT), pa.float64())),)
    return Aggregation("aggregation@r", (("g", Col("g", INT)),), aggs, {"g": pl.Int64()}, bounds={"s"}, keyed=keyed)


@pytest.mark.parametrize("keyed", [True, False])
def test_a_sum_rounded_by_its_backend_keeps_its_group_after_the_large_terms_go(keyed: bool) -> None:
    """Spark's capture of 1e16, 1.0, -1e16 gives 0.0 (three terms of magnitude 2e16); deleting both large terms
    leaves 1.0, which the interval around the stored 0.0 must still cover."""
    op = _having_sum(keyed)
    cols = agg_columns(0)
    [rounding] = op.layout.roundings
    rows = pl.DataFrame(
        {
            "g": [1],
            GROUP_ROWS: [3],
            cols.non_null: [3],
            cols.sum: [0.0],
            cols.nan: [0],
            cols.pos_inf: [0],
            cols.neg_inf: [0],
            cols.abs_sum: [2e16],
            rounding.terms: [3],
            rounding.magnitude: [2e16],
        }
    )
    op.bootstrap(op.layout.from_grouped(rows, [], {}))
    bound = op.groups.get_column(cols.bound).item()
    assert bound >= 1.0
    out = op.process(pl.DataFrame({"g": [1, 1], "x": [1e16, -1e16], MULT: [-1, -1]}))
    row = out.filter(pl.col(MULT) == 1)
    assert row.get_column(lo_name("s")).item() <= 1.0 <= row.get_column(hi_name("s")).item()
    assert op.groups.get_column(cols.bound).item() == bound  # the deletes did not shrink it
    meta, frames = op.state_frames()
    again = _having_sum(keyed)
    again.set_state_frames(meta, frames)  # saved and loaded with the state
    assert again.groups.get_column(cols.bound).item() == bound
    assert cols.bound not in op.canonical()["groups"].columns  # a route-dependent bound is not part of the value


def test_sums_the_engine_adds_itself_carry_no_bound() -> None:
    op = _having_sum(True)
    op.process(pl.DataFrame({"g": [1, 1, 1], "x": [1e16, 1.0, -1e16], MULT: [1, 1, 1]}))
    assert op.groups.get_column(agg_columns(0).bound).item() == 0.0
    assert op.output_relation().get_column("s").item() == 1.0


def test_state_of_the_previous_layout_loads_only_without_bounds_or_wide_sums() -> None:
    plain = Aggregation(
        "aggregation@r",
        (("g", Col("g", INT)),),
        (("s", AggCall("sum", Col("x", FLOAT), pa.float64())),),
        {"g": pl.Int64()},
    )
    check_layout(plain.op_id, plain.layout, 2)
    with pytest.raises(StateError, match="layout 2, now 3.*recapture"):
        check_layout("aggregation@r", _having_sum(True).layout, 2)

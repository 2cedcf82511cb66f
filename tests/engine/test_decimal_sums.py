"""DECIMAL sums that can leave 38 digits (``imp_core.engine.decimal_sums``): exact in two parts, NULL beyond 38
digits as Spark's, back in range after deletes (issue 53, item 4); narrower decimals keep one column."""

from __future__ import annotations

import random
from decimal import Context, Decimal

import polars as pl
import pyarrow as pa
import pytest

from imp_core.engine import decimal_sums
from imp_core.engine.operators.aggregation import Aggregation
from imp_core.engine.schema import MULT
from imp_core.plan.expr import INT, AggCall, Col

BIG = Decimal(6 * 10**37)
WIDE = Context(prec=60)


@pytest.mark.parametrize("scale", [0, 2, 19, 20, 30])
def test_split_parts_add_up_exactly_and_the_value_is_null_beyond_38_digits(scale: int) -> None:
    rng = random.Random(scale)
    limit = 10**38 - 1
    units = [
        rng.choice([limit, -limit, rng.randrange(-limit, limit), rng.randrange(-(10**5), 10**5)]) for _ in range(300)
    ]
    groups = [rng.randrange(8) for _ in units]
    values = [Decimal(u).scaleb(-scale, WIDE) for u in units]
    frame = pl.DataFrame({"g": groups, "x": pl.Series(values, dtype=pl.Decimal(38, scale))})
    low, high = decimal_sums.split(pl.col("x"), scale)
    parts = frame.select("g", low.alias("low"), high.alias("high"))
    summed = parts.group_by("g").agg(pl.col("low").sum(), pl.col("high").sum())
    low, high = decimal_sums.normalized(pl.col("low"), pl.col("high"), scale)
    summed = summed.with_columns(low.alias("low"), high.alias("high"))
    out = summed.select("g", decimal_sums.value(pl.col("low"), pl.col("high"), scale).alias("v")).sort("g")
    for g, v in out.iter_rows():
        exact = sum(u for u, h in zip(units, groups) if h == g)
        assert v == (Decimal(exact).scaleb(-scale, WIDE) if abs(exact) <= limit else None), g
    assert all(0 <= int(x.scaleb(scale, WIDE)) < decimal_sums.BASE for x in summed.get_column("low").to_list())


def _decimal_sum(precision: int, func: str = "sum") -> Aggregation:
    t = pa.decimal128(precision, 0)
    out = pa.decimal128(min(38, precision + 10), 0) if func == "sum" else pa.decimal128(38, 4)
    aggs = (("s", AggCall(func, Col("m", t), out)),)
    return Aggregation("aggregation@r", (("g", Col("g", INT)),), aggs, {"g": pl.Int64()})


def _batch(values: list[Decimal], mult: int, precision: int = 38) -> pl.DataFrame:
    return pl.DataFrame(
        {"g": [1] * len(values), "m": pl.Series(values, dtype=pl.Decimal(precision, 0)), MULT: [mult] * len(values)}
    )


def test_an_overflowed_group_is_null_and_comes_back_on_a_delete() -> None:
    op = _decimal_sum(38)
    assert op.layout.wide == [0]
    op.process(_batch([BIG, BIG], 1))
    assert op.output_relation().get_column("s").to_list() == [None]  # 1.2e38: beyond 38 digits
    op.process(_batch([BIG], -1))
    assert op.output_relation().get_column("s").to_list() == [BIG]
    op.process(_batch([-BIG, -BIG, -BIG], 1))  # -1.2e38
    assert op.output_relation().get_column("s").to_list() == [None]
    meta, frames = op.state_frames()
    again = _decimal_sum(38)
    again.set_state_frames(meta, frames)  # saved and loaded
    again.process(_batch([-BIG], -1))
    assert again.output_relation().get_column("s").to_list() == [-BIG]


def test_an_average_of_a_sum_beyond_38_digits_is_null() -> None:
    op = _decimal_sum(38, "avg")
    op.process(_batch([BIG, BIG, Decimal(4)], 1))
    assert op.output_relation().get_column("s").to_list() == [None]
    op.process(_batch([-BIG, -BIG], 1))
    assert op.output_relation().get_column("s").to_list() == [Decimal("0.8")]


def test_many_rows_of_extreme_values_add_up_in_one_batch() -> None:
    op = _decimal_sum(38)
    op.process(_batch([BIG] * 1000 + [-BIG] * 999, 1))
    assert op.output_relation().get_column("s").to_list() == [BIG]


def test_narrow_decimals_stay_on_one_column() -> None:
    op = _decimal_sum(28)
    assert op.layout.wide == [] and "__ov0" not in op.groups.columns
    op.process(_batch([Decimal(10**27)] * 3, 1, precision=28))
    assert op.output_relation().get_column("s").to_list() == [Decimal(3 * 10**27)]

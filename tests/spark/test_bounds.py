"""Equi-depth bounds (``spark/bounds.py``) checked for what they promise.

Strictly increasing; the column's minimum and maximum as first and last bound; fragments of roughly equal size on
a known distribution (sizes counted by a plain binary search over the bounds, not by the code under test); fewer
fragments, never empty ones, when values repeat; every bound a value of the column's own type (so normalizing it
says nothing), for decimals, dates, zoned and naive timestamps, strings and FLOAT.
"""

from __future__ import annotations

import bisect
import datetime as dt
import math
from collections import Counter
from decimal import Decimal as D

import numpy as np
import pyarrow as pa
import pytest

from imp_core.sketch.bounds import kind_of, parse_bounds
from imp_core.sources.delta import DeltaSource
from imp_core.spark.bounds import SAMPLE_ROWS, equi_depth_bounds
from imp_core.spark.types import arrow_schema_to_spark
from tests.conftest import write_delta

pytestmark = pytest.mark.spark


def _frame(spark, column: pa.Array):  # noqa: ANN001, ANN202
    """A one-column DataFrame ``x`` of exactly the Arrow type (createDataFrame alone makes naive timestamps zoned)."""
    table = pa.table({"x": column})
    return spark.createDataFrame(table, schema=arrow_schema_to_spark(table.schema))

UTC = dt.timezone.utc


def _sizes(bounds, values) -> list[int]:  # noqa: ANN001
    inner = list(bounds[1:-1])
    counts = Counter(bisect.bisect_right(inner, v) for v in values)
    return [counts.get(i, 0) for i in range(len(bounds) - 1)]


def _check_promises(bounds, values, dtype) -> None:  # noqa: ANN001
    assert all(a < b for a, b in zip(bounds, bounds[1:])), bounds
    assert bounds[0] == min(values) and bounds[-1] == max(values)
    normalized, notes = parse_bounds(list(bounds), dtype, "t.x")
    assert notes == [] and normalized == tuple(bounds)
    assert {type(b) for b in bounds} == {type(values[0])}


def test_uniform_integers_give_equal_fragments(spark) -> None:  # noqa: ANN001
    values = list(range(10_000))
    df = _frame(spark, pa.array(values, pa.int64()))
    bounds = equi_depth_bounds(df, "x", 10, "int")
    _check_promises(bounds, values, pa.int64())
    assert len(bounds) == 11
    assert _sizes(bounds, values) == [1000] * 9 + [1000]  # the whole column is the sample: exact quantiles


def test_a_sampled_column_gives_roughly_equal_fragments(spark) -> None:  # noqa: ANN001
    rng = np.random.default_rng(11)
    values = rng.normal(0.0, 1.0, SAMPLE_ROWS + 50_000).tolist()  # more rows than the sample: quantiles estimated
    df = _frame(spark, pa.array(values, pa.float64()))
    bounds = equi_depth_bounds(df, "x", 20, "float")
    assert all(a < b for a, b in zip(bounds, bounds[1:]))
    assert bounds[0] == min(values) and bounds[-1] == max(values)
    sizes = _sizes(bounds, values)
    assert len(sizes) == 20
    expected = len(values) / 20
    assert all(abs(s - expected) < 0.1 * expected for s in sizes), sizes


def test_repeated_values_give_fewer_fragments_never_empty_ones(spark) -> None:  # noqa: ANN001
    values = [5] * 900 + list(range(10)) * 10
    df = _frame(spark, pa.array(values, pa.int32()))
    bounds = equi_depth_bounds(df, "x", 10, "int")
    _check_promises(bounds, values, pa.int32())
    assert len(bounds) < 11 and 5 in bounds
    assert all(s > 0 for s in _sizes(bounds, values)[:-1])


def test_a_single_value_gives_one_fragment_around_it(spark) -> None:  # noqa: ANN001
    df = _frame(spark, pa.array([D("99999999.99")] * 5, pa.decimal128(10, 2)))
    assert equi_depth_bounds(df, "x", 4, "decimal") == (D("99999999.98"), D("99999999.99"))  # no successor fits
    df = _frame(spark, pa.array([0.5] * 3, pa.float32()))
    lo, hi = equi_depth_bounds(df, "x", 4, "float")
    assert lo == 0.5 and hi == float(np.nextafter(np.float32(0.5), np.float32(1)))


VALUE_CLASSES = {
    "decimal(38,8)": (pa.decimal128(38, 8), [D("12345678901234567.12345678") + D(i) / 10**8 for i in range(200)]),
    "date": (pa.date32(), [dt.date(2024, 1, 1) + dt.timedelta(days=i) for i in range(200)]),
    "timestamp": (pa.timestamp("us", tz="UTC"),
                  [dt.datetime(2024, 1, 1, tzinfo=UTC) + dt.timedelta(microseconds=7 * i) for i in range(200)]),
    "timestamp_ntz": (pa.timestamp("us"), [dt.datetime(2024, 1, 1) + dt.timedelta(microseconds=7 * i)
                                           for i in range(200)]),
    "string": (pa.string(), [f"k{i:03d}\té" for i in range(200)]),
    "float32": (pa.float32(), [float(np.float32(i / 7)) for i in range(200)]),
}


@pytest.mark.parametrize("name", list(VALUE_CLASSES))
def test_bounds_keep_the_columns_type(spark, name: str) -> None:  # noqa: ANN001
    dtype, values = VALUE_CLASSES[name]
    df = _frame(spark, pa.array(values, dtype))
    bounds = equi_depth_bounds(df, "x", 8, kind_of(dtype))
    _check_promises(bounds, values, dtype)
    assert set(bounds) <= set(values)  # every bound is a value of the column, not a rounded copy of one
    assert _sizes(bounds, values) == [25] * 8


def test_nan_and_negative_zero_are_not_bounds(spark) -> None:  # noqa: ANN001
    values = [-0.0, 0.0] * 20 + [float(i) for i in range(1, 41)] + [math.nan] * 30
    df = _frame(spark, pa.array(values, pa.float32()))
    bounds = equi_depth_bounds(df, "x", 4, "float")
    assert not any(math.isnan(b) for b in bounds) and bounds[-1] == 40.0
    normalized, _ = parse_bounds(list(bounds), pa.float32(), "t.x")
    assert all(math.copysign(1.0, b) == 1.0 for b in normalized if b == 0)


def test_exact_delta_statistics_save_the_min_max_job(spark, tmp_path) -> None:  # noqa: ANN001

    path = tmp_path / "t"
    write_delta(path, {"i": pa.array(list(range(100)), pa.int64()),
                       "ts": pa.array([dt.datetime(2024, 1, 1, 0, 0, 0, 999999, tzinfo=UTC)] * 100,
                                      pa.timestamp("us", tz="UTC")),
                       "d": pa.array([D("1234567890123456.78")] * 100, pa.decimal128(18, 2)),
                       "s": pa.array(["x" * 80] * 100)}, mode="overwrite")
    source = DeltaSource("t", path)
    assert source.column_stats(0, "i") == (0, 99, 100)
    for inexact in ("ts", "d", "s"):  # millisecond timestamps, JSON-double decimals, truncated strings
        assert source.column_stats(0, inexact) is None
    bounds = equi_depth_bounds(source.scan(spark, 0), "i", 4, "int", source.column_stats(0, "i"))
    assert bounds == (0, 25, 50, 75, 99)

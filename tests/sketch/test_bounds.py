"""Bounds checked and normalized against the partition column's type (``imp_core.sketch.bounds``).

The rule: a bound the type cannot hold is rounded up to the next value of the type (a column value ``v`` satisfies
``v >= b`` exactly when ``v >= ceil(b)``, so every fragment keeps the values the bound meant) and a note says so, or
it is refused with a one-line ``UsageError`` when no such value exists or the meaning is ambiguous.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from decimal import Decimal as D

import numpy as np
import polars as pl
import pyarrow as pa
import pytest

from imp_core.errors import StateError, UsageError
from imp_core.sketch.bounds import kind_of, parse_bounds, type_from_json, type_to_json
from imp_core.sketch.partition import Partition, PartitionSet

UTC = dt.timezone.utc

ROUNDED = [
    # (column type, --bounds text, stored bounds, how many notes)
    (pa.float32(), ["0", "0.7", "1"], (0.0, float(np.nextafter(np.float32(0.7), np.float32(1))), 1.0), 1),
    (pa.float32(), ["0", "0.1", "1"], (0.0, float(np.float32(0.1)), 1.0), 1),  # 0.1f is above 0.1: rounding up
    (pa.float32(), ["-0.0", "0.5", "inf"], (0.0, 0.5, math.inf), 0),
    (pa.float64(), ["-inf", "-0.0", "0.1"], (-math.inf, 0.0, 0.1), 0),  # text is a double literal, as in Spark
    (pa.decimal128(10, 2), ["0", "1.005", "2"], (D("0.00"), D("1.01"), D("2.00")), 1),
    (pa.decimal128(10, 2), ["-1.005", "0", "2"], (D("-1.00"), D("0.00"), D("2.00")), 1),  # up = towards +inf
    (pa.decimal128(38, 8), ["0", "0.123456789", "1e20"], (D(0), D("0.12345679"), D("100000000000000000000")), 1),
    (pa.int32(), ["1", "2.5", "4"], (1, 3, 4), 1),
    (pa.int64(), ["-2.5", "0", "7"], (-2, 0, 7), 1),
    (pa.timestamp("us", tz="UTC"),
     ["2024-01-01T00:00Z", "2024-01-01T00:00:00.0000001Z", "2024-01-02T00:00:00.1234560Z"],
     (dt.datetime(2024, 1, 1, tzinfo=UTC), dt.datetime(2024, 1, 1, 0, 0, 0, 1, tzinfo=UTC),
      dt.datetime(2024, 1, 2, 0, 0, 0, 123456, tzinfo=UTC)), 1),
    (pa.timestamp("us", tz="UTC"), ["2024-01-01T02:00:00+02:00", "2024-01-02T00:00:00+00:00"],
     (dt.datetime(2024, 1, 1, tzinfo=UTC), dt.datetime(2024, 1, 2, tzinfo=UTC)), 0),
    (pa.timestamp("us"), ["2024-01-01 00:00:00.999999999", "2024-01-02"],
     (dt.datetime(2024, 1, 1, 0, 0, 1), dt.datetime(2024, 1, 2)), 1),
    (pa.date32(), ["2024-02-28", "2024-02-28T00:00:01", "2024-03-01"],
     (dt.date(2024, 2, 28), dt.date(2024, 2, 29), dt.date(2024, 3, 1)), 1),
    (pa.string(), ["", "a\tb", "é"], ("", "a\tb", "é"), 0),
]


@pytest.mark.parametrize(("dtype", "text", "stored", "notes"), ROUNDED)
def test_bounds_are_rounded_up_to_the_column_type_and_said(dtype, text, stored, notes) -> None:  # noqa: ANN001
    values, said = parse_bounds(text, dtype, "t.x")
    assert values == stored
    assert [type(v) for v in values] == [type(v) for v in stored]
    assert len(said) == notes
    for note in said:
        assert "\n" not in note and "t.x" in note and "rounded up" in note


REFUSED = [
    (pa.int64(), ["0", str(2**63)], "outside the range of BIGINT"),
    (pa.int32(), ["0", str(2**31)], "outside the range of INT"),
    (pa.int8(), ["-129", "0"], "outside the range of TINYINT"),
    (pa.float64(), ["0", "nan"], "NaN cannot be a bound"),
    (pa.float32(), ["0", "1e39"], "outside the range of FLOAT"),
    (pa.decimal128(10, 2), ["0", "1e8"], "does not fit DECIMAL(10,2)"),
    (pa.decimal128(10, 2), ["1.001", "1.002"], "both become 1.01"),
    (pa.timestamp("us", tz="UTC"), ["2024-01-01T00:00+02:00", "2024-01-02"], "mix timestamps with and without"),
    (pa.timestamp("us"), ["2024-01-01T00:00+02:00", "2024-01-03T00:00+02:00"], "column is TIMESTAMP_NTZ"),
    (pa.date32(), ["2024-01-01T00:00+02:00", "2024-01-03"], "has a time zone"),
    (pa.int64(), ["x", "2"], "not a valid BIGINT value"),
    (pa.int32(), ["1", "2.5", "3"], "both become 3 as INT values"),
    (pa.int64(), ["2", "1"], "strictly increasing"),
    (pa.int64(), ["2"], "at least two bounds"),
    (pa.float32(), ["0", "0.7", "0.70000001"], "both become"),  # one FLOAT value between them: one fragment
]


@pytest.mark.parametrize(("dtype", "text", "message"), REFUSED)
def test_unrepresentable_bounds_are_refused_in_one_line(dtype, text, message) -> None:  # noqa: ANN001
    with pytest.raises(UsageError, match=re.escape(message)) as e:
        parse_bounds(text, dtype, "t.x")
    assert "\n" not in str(e.value) and "t.x" in str(e.value)


def test_computed_bounds_are_already_exact() -> None:
    """Equi-depth bounds are values of the column: normalizing them says nothing (except -0.0 = 0.0)."""
    f32 = [float(np.float32(x)) for x in (-0.0, 0.7, 1.1)]
    assert parse_bounds(f32, pa.float32(), "t.x") == ((0.0, f32[1], f32[2]), [])
    decs = [D("0.10000000"), D("12345678901234567.12345678")]
    assert parse_bounds(decs, pa.decimal128(38, 8), "t.x") == (tuple(decs), [])
    stamps = [dt.datetime(2024, 1, 1, tzinfo=UTC), dt.datetime(2024, 1, 1, 0, 0, 0, 1, tzinfo=UTC)]
    assert parse_bounds(stamps, pa.timestamp("us", tz="UTC"), "t.x") == (tuple(stamps), [])


def test_partition_refuses_bounds_its_type_cannot_hold() -> None:
    with pytest.raises(UsageError, match="not a FLOAT value"):
        Partition("t", "x", (0.0, 0.7, 1.0), "float", pa.float32())
    with pytest.raises(UsageError, match="not a DECIMAL"):
        Partition("t", "x", (D(0), D("1.005"), D(2)), "decimal", pa.decimal128(10, 2))
    with pytest.raises(UsageError, match="not of kind"):
        Partition("t", "x", (0, 1), "int", pa.float64())
    p = Partition("t", "x", (-1.0, -0.0, 1.0), "float", pa.float32())
    assert p.bounds == (-1.0, 0.0, 1.0) and math.copysign(1, p.bounds[1]) == 1.0


@pytest.mark.parametrize("dtype", [pa.int8(), pa.int64(), pa.float32(), pa.float64(), pa.decimal128(38, 8),
                                   pa.decimal128(10, 0), pa.date32(), pa.timestamp("us"),
                                   pa.timestamp("us", tz="UTC"), pa.string()])
def test_partition_json_keeps_the_column_type(dtype) -> None:  # noqa: ANN001
    assert type_from_json(type_to_json(dtype)) == dtype
    samples = {"int": ["-3", "0", "5"], "float": ["-0.7", "0.1", "3"], "decimal": ["-1", "0.5", "7"],
               "date": ["2024-01-01", "2024-02-29", "2024-03-01"],
               "timestamp": ["2024-01-01 00:00:00.000001", "2024-02-29 00:00:00", "2024-03-01 12:00:00.5"],
               "string": ["", "a\tb", "é"]}
    kind = kind_of(dtype)
    values, _ = parse_bounds(samples[kind], dtype, "t.x")
    part = Partition("t", "x", values, kind, dtype)
    back = PartitionSet.from_json(PartitionSet((part,)).to_json()).partitions[0]
    assert back == part and back.dtype == dtype and back.bounds == values


def test_partitions_recorded_without_a_type_get_the_kinds_default() -> None:
    legacy = {"table": "t", "column": "x", "kind": "decimal", "bounds": ["0", "1.5", "2.25"]}
    p = Partition.from_json(legacy)
    assert p.dtype == pa.decimal128(38, 2) and p.bounds == (D(0), D("1.5"), D("2.25"))
    p = Partition.from_json({"table": "t", "column": "x", "kind": "timestamp",
                             "bounds": ["2024-01-01T00:00:00+00:00", "2024-02-01T00:00:00+00:00"]})
    assert p.dtype == pa.timestamp("us", tz="UTC")


def test_engine_refuses_bounds_its_values_cannot_hold() -> None:
    """Casting bounds to the values' type must not change them (polars truncates decimals silently)."""
    p = Partition("t", "x", (D(0), D("1.005"), D(2)), "decimal")  # no type recorded: DECIMAL(38,3)
    assert p.fragment_of(pl.Series([D("1.005")], dtype=pl.Decimal(38, 3))).tolist() == [1]
    with pytest.raises(StateError, match="recapture"):
        p.fragment_of(pl.Series([D("1.00")], dtype=pl.Decimal(10, 2)))


def test_engine_order_is_sparks() -> None:
    """NULL in fragment 0, NaN in the last fragment, -0.0 with 0.0, strings by code point."""
    p = Partition("t", "x", (-1.0, 0.0, 1.0, 2.0), "float", pa.float32())
    values = pl.Series([None, math.nan, -0.0, 0.0, -math.inf, math.inf, 0.999], dtype=pl.Float32)
    assert p.fragment_of(values).tolist() == [0, 2, 1, 1, 0, 2, 1]
    assert p.fragment_of(values.drop_nulls()).tolist() == [2, 1, 1, 0, 2, 1]  # without NULL: NumPy's search
    s = Partition("t", "s", ("", "Z", "a", "é", "😀"), "string")
    assert s.fragment_of(pl.Series(["A", "a", "z", "é", "\uffff", "😀", None])).tolist() == [0, 2, 2, 3, 3, 3, 0]


def test_numpy_search_places_dates_and_times_as_polars_does() -> None:
    """Without NULL, fragments are found by NumPy on the physical integers; with one, by polars: the same ids."""
    days = Partition("t", "d", (dt.date(1969, 12, 1), dt.date(2000, 1, 1), dt.date(2030, 1, 1)), "date")
    dates = pl.Series([dt.date(1969, 12, 31), dt.date(2000, 1, 1), dt.date(1960, 1, 1), dt.date(2031, 1, 1)])
    assert days.fragment_of(dates).tolist() == [0, 1, 0, 1]
    assert days.fragment_of(dates.append(pl.Series([None], dtype=pl.Date))).tolist() == [0, 1, 0, 1, 0]
    utc = dt.timezone.utc
    times = Partition("t", "ts", (dt.datetime(2024, 1, 1, tzinfo=utc), dt.datetime(2024, 6, 1, tzinfo=utc),
                                  dt.datetime(2025, 1, 1, tzinfo=utc)), "timestamp")
    stamps = pl.Series([dt.datetime(2024, 5, 31, 23, 59, 59, 999999), dt.datetime(2024, 6, 1)],
                       dtype=pl.Datetime("us", "UTC"))
    assert times.fragment_of(stamps).tolist() == [0, 1]
    ints = Partition("t", "i", (0, 10, 20, 30), "int")
    assert ints.fragment_of(pl.Series([-5, 0, 9, 10, 29, 99])).tolist() == [0, 0, 0, 1, 2, 2]


@pytest.mark.parametrize("dtype", [pl.Int64, pl.Int32, pl.Int16, pl.UInt32, pl.UInt64, pl.Date])
def test_integer_lookup_table_places_values_as_the_search_does(dtype: pl.DataType) -> None:
    """Integer columns of a batch above 64 rows take their fragment from a lookup table over the bounds' range:
    every value, below, between, on and above the bounds, lands where the binary search puts it."""
    p = Partition("t", "i", (-1_000, 1, 7, 8, 500, 10_000), "int") if dtype != pl.Date else \
        Partition("t", "d", (dt.date(1969, 12, 1), dt.date(1970, 1, 8), dt.date(2000, 1, 1)), "date")
    rng = np.random.default_rng(5)
    lo = 0 if dtype in (pl.UInt32, pl.UInt64) else -20_000
    raw = np.concatenate([rng.integers(lo, 20_000, 3_000), [lo, 0, 1, 6, 7, 8, 499, 500, 9_999, 10_000, 10_001]])
    values = pl.Series(raw).cast(pl.Int32).cast(pl.Date) if dtype == pl.Date else pl.Series(raw).cast(dtype)
    inner = np.array(p.inner_bounds if dtype != pl.Date else
                     [(b - dt.date(1970, 1, 1)).days for b in p.inner_bounds], dtype=np.int64)
    want = np.searchsorted(inner, values.to_physical().to_numpy().astype(np.int64), side="right")
    got = p.fragment_of(values)
    assert got.dtype == np.int32 and got.tolist() == want.tolist()
    assert (p._lookup[dtype] is None) == (dtype == pl.UInt64)  # 64-bit unsigned values keep the search
    extreme = Partition("t", "i", (-2**63, 0, 2**63 - 1), "int")  # no room below the first inner bound's range
    big = pl.Series([-2**63, -1, 0, 1, 2**63 - 1] * 20)
    assert extreme.fragment_of(big).tolist() == [0, 0, 1, 1, 1] * 20

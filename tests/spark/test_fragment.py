"""Spark's fragment ids (``spark/fragment.py``) against an independent oracle, for every value class.

The oracle is a binary search in plain Python over the stored bounds, with Spark's order written out: NULL in
fragment 0, NaN above every number (the last fragment), -0.0 equal to 0.0, strings by code point (the order of their
UTF-8 bytes, Spark's binary collation), decimals and timestamps exact. Spark's own comparisons are the truth for the
use filter: each fragment's range filter must select exactly the rows the oracle puts there. The engine's
``Partition.fragment_of`` (raw change rows and engine-typed columns) is held to the same oracle.
"""

from __future__ import annotations

import bisect
import datetime as dt
import math
from decimal import Decimal as D
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from imp_core.engine.evaluate import polars_type
from imp_core.sketch.bounds import kind_of, parse_bounds
from imp_core.sketch.partition import Partition
from imp_core.spark.fragment import add_fragment, case_fragment, exact_as_double
from imp_core.spark.types import arrow_schema_to_spark
from imp_core.use.query import range_filter

pytestmark = pytest.mark.spark


UTC = dt.timezone.utc


def f32(x: float) -> float:
    return float(np.float32(x))


def f32_next(x: float, toward: float) -> float:
    return float(np.nextafter(np.float32(x), np.float32(toward)))


def ts(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text)


TS_VALUES = ["0001-01-01 00:00:00", "1969-12-31 23:59:59.999999", "1970-01-01 00:00:00", "2023-12-31 23:59:59.999999",
             "2024-01-01 00:00:00", "2024-01-01 00:00:00.000001", "2024-01-01 00:00:00.000002",
             "2024-02-29 12:00:00.499999", "2024-02-29 12:00:00.5", "2024-02-29 12:00:00.500001",
             "9999-12-31 23:59:59.999999"]
TS_BOUNDS = ["1900-01-01 00:00:00", "2024-01-01 00:00:00.000001", "2024-02-29 12:00:00.5", "2100-01-01 00:00:00"]

# name -> (column type, bounds as --bounds text, column values)
CASES: dict[str, tuple[pa.DataType, list[str], list[Any]]] = {
    "double": (pa.float64(), ["-1e300", "-1", "0", "0.1", "1", "1e300"],
               [None, math.nan, math.inf, -math.inf, -0.0, 0.0, 5e-324, -5e-324, 0.1, math.nextafter(0.1, -1),
                math.nextafter(0.1, 1), 1.0, math.nextafter(1.0, 0), -1.0, math.nextafter(-1.0, -2), 1e308, -1e308]),
    "float32": (pa.float32(), ["-1", "-0.0", "0.1", "0.7", "1e38"],
                [None, math.nan, math.inf, -math.inf, -0.0, 0.0, f32(0.7), f32_next(0.7, 1), f32_next(f32(0.7), 1),
                 f32(0.1), f32_next(0.1, 0), -1.0, f32_next(-1.0, -2), f32(3e38), f32(1e38), f32_next(1e38, 0)]),
    "decimal(10,2)": (pa.decimal128(10, 2), ["-5", "0", "1.005", "99999999.99"],
                      [None, D("-5.01"), D("-5.00"), D("-0.01"), D("0.00"), D("1.00"), D("1.01"), D("1.02"),
                       D("99999999.99"), D("-99999999.99")]),
    "decimal(15,4) unscaled": (pa.decimal128(15, 4), ["-1", "0.0001", "12345.6789", "99999999999"],
                               [None, D("-1.0001"), D("-1"), D("0"), D("0.0001"), D("12345.6788"),
                                D("12345.6789"), D("12345.6790"), D("99999999999.9999"), D("-99999999999.9999")]),
    "decimal(38,8) wide bounds": (pa.decimal128(38, 8),
                                  ["-1", "0.00000001", "12345678901234567.12345678", "12345678901234567.12345679",
                                   "1e20"],
                                  [None, D("0"), D("0.00000001"), D("12345678901234567.12345677"),
                                   D("12345678901234567.12345678"), D("12345678901234567.12345679"),
                                   D("12345678901234567.12345680"), D("-" + "9" * 30), D("9" * 30)]),
    "decimal(38,8) short bounds": (pa.decimal128(38, 8), ["0", "10000000000000000", "20000000000000000"],
                                   [D("9999999999999999.99999999"), D("10000000000000000"),
                                    D("10000000000000000.00000001"), D("19999999999999999.99999999"),
                                    D("20000000000000000")]),
    "bigint": (pa.int64(), ["-100", "0", "7", str(2**53 - 1)],
               [None, -(2**63), 2**63 - 1, 2**53 - 2, 2**53 - 1, 2**53, 2**53 + 1, -1, 0, 6, 7, -100, -101]),
    "bigint far bounds": (pa.int64(), ["0", str(2**60), str(2**60 + 1), str(2**62)],
                          [2**60 - 1, 2**60, 2**60 + 1, 2**60 + 2, 2**63 - 1, -(2**63), None]),
    "tinyint": (pa.int8(), ["-128", "-1", "5", "127"], [-128, -2, -1, 0, 4, 5, 127, None]),
    "date": (pa.date32(), ["2024-01-31", "2024-02-29", "2024-03-01", "2025-01-01"],
             [dt.date(1, 1, 1), dt.date(2024, 1, 30), dt.date(2024, 1, 31), dt.date(2024, 2, 28),
              dt.date(2024, 2, 29), dt.date(2024, 3, 1), dt.date(9999, 12, 31), None]),
    "timestamp": (pa.timestamp("us", tz="UTC"), [b + "+00:00" for b in TS_BOUNDS],
                  [ts(v).replace(tzinfo=UTC) for v in TS_VALUES] + [None]),
    "timestamp_ntz": (pa.timestamp("us"), TS_BOUNDS, [ts(v) for v in TS_VALUES] + [None]),
    "timestamp far bounds": (pa.timestamp("us", tz="UTC"),
                             ["0001-01-01 00:00:00+00:00", "1000-01-01 00:00:00.000001+00:00",
                              "9999-12-31 23:59:59.999999+00:00"],
                             [dt.datetime(1000, 1, 1, tzinfo=UTC), dt.datetime(1000, 1, 1, 0, 0, 0, 1, tzinfo=UTC),
                              dt.datetime(1, 1, 1, tzinfo=UTC), dt.datetime(9999, 12, 31, tzinfo=UTC)]),
    "string": (pa.string(), ["", "B", "a", "a\tb", "é", "\uffff", "😀"],
               [None, "", "\n", "A", "B", "Z", "a", "a\x00", "a\tb", "a\tc", "ab", "é", "éa", "\uffff", "\U0001F600",
                "\U0010FFFF", "ＡＢ", "a\nb"]),
}


def oracle(part: Partition, value: Any) -> int:
    """The fragment of ``value``: plain Python over the stored bounds, Spark's order written out."""
    if value is None:
        return 0
    if isinstance(value, float) and math.isnan(value):
        return part.fragments - 1
    return bisect.bisect_right(list(part.bounds[1:-1]), value)


def _partition(dtype: pa.DataType, bounds: list[str]) -> Partition:
    values, _ = parse_bounds(bounds, dtype, "t.x")
    return Partition("t", "x", values, kind_of(dtype), dtype)


def _spark_answers(spark, part: Partition, table: pa.Table) -> dict[str, list[Any]]:  # noqa: ANN001
    """One Spark job: Bucketizer/CASE ids, forced-CASE ids and each fragment's (and some unions') range filter."""
    df = spark.createDataFrame(table, schema=arrow_schema_to_spark(table.schema))  # TIMESTAMP_NTZ stays NTZ
    assert df.schema["x"].dataType == arrow_schema_to_spark(table.schema)["x"].dataType
    df = add_fragment(df, F.col("x"), part, 0, "frag")
    filters = {f"in{i}": range_filter(part, [i]) for i in range(part.fragments)}
    filters["in_first_last"] = range_filter(part, [0, part.fragments - 1])
    filters["in_middle"] = range_filter(part, list(range(1, max(2, part.fragments - 1))))
    cols = [F.col("id"), F.col("frag"), case_fragment(F.col("x"), part).alias("case")]
    cols += [F.coalesce(c, F.lit(False)).alias(name) for name, c in filters.items()]
    out = df.select(*cols).orderBy("id").toArrow()
    return {name: out.column(name).to_pylist() for name in out.column_names}


@pytest.mark.parametrize("name", list(CASES))
def test_fragment_ids_match_the_oracle(spark, name: str) -> None:  # noqa: ANN001
    dtype, bounds, values = CASES[name]
    part = _partition(dtype, bounds)
    table = pa.table({"id": pa.array(range(len(values)), pa.int64()), "x": pa.array(values, dtype)})
    expected = [oracle(part, v) for v in table.column("x").to_pylist()]
    assert len(set(expected)) >= min(3, part.fragments), "the values should spread over several fragments"

    got = _spark_answers(spark, part, table)
    assert got["frag"] == expected, f"add_fragment ({'Bucketizer' if exact_as_double(part) else 'CASE'})"
    assert got["case"] == expected, "nested CASE"
    for i in range(part.fragments):
        assert got[f"in{i}"] == [e == i for e in expected], f"range filter of fragment {i}"
    last = part.fragments - 1
    assert got["in_first_last"] == [e in (0, last) for e in expected]
    middle = set(range(1, max(2, last)))
    assert got["in_middle"] == [e in middle for e in expected]

    raw = pl.from_arrow(table.column("x").combine_chunks())
    assert part.fragment_of(raw).tolist() == expected, "engine, change rows in the column's own type"
    engine_typed = raw.cast(polars_type(dtype), strict=False)
    assert part.fragment_of(engine_typed).tolist() == expected, "engine, columns as the engine types them"


def test_bucketizer_is_used_only_where_doubles_are_exact() -> None:
    assert exact_as_double(_partition(*CASES["double"][:2]))
    assert exact_as_double(_partition(*CASES["float32"][:2]))
    assert exact_as_double(_partition(*CASES["decimal(15,4) unscaled"][:2]))
    assert not exact_as_double(_partition(*CASES["decimal(38,8) short bounds"][:2]))  # values of 24 digits
    assert exact_as_double(_partition(*CASES["bigint"][:2]))
    assert not exact_as_double(_partition(*CASES["bigint far bounds"][:2]))
    assert exact_as_double(_partition(*CASES["timestamp_ntz"][:2]))
    assert not exact_as_double(_partition(*CASES["timestamp far bounds"][:2]))
    assert not exact_as_double(_partition(*CASES["string"][:2]))


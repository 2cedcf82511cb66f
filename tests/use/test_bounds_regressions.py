"""One regression test per class of partition, bound and file-statistics errors fixed for issue 14.

Each test failed on the code before the fix (a4dc04a) and passes now. They use only interfaces that existed before
(the service, ``Partition(table, column, bounds, kind)``, ``add_fragment``, ``range_filter``, ``prune_files``,
``equi_depth_bounds``), so running this file against the old code shows the old behaviour, not an import error.
Truth is Spark (the query without the sketch, or Spark's own comparison in the range filter) or the data itself
(``tests/use/oracle.py`` reads every file).
"""

from __future__ import annotations

import datetime as dt
import logging
import math
from decimal import Decimal as D
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from pyspark.sql import functions as F

from imp_core.errors import UsageError
from imp_core.sketch.partition import Partition
from imp_core.sources.delta import DeltaSource, FileStats
from imp_core.spark.fragment import add_fragment
from imp_core.use.query import range_filter
from imp_core.use.rewrite import prune_files
from tests.use.oracle import needed_files

pytestmark = [pytest.mark.spark, pytest.mark.postgres]

UTC = dt.timezone.utc
CDF = {"delta.enableChangeDataFeed": "true"}


def _rows(result) -> list[tuple]:  # noqa: ANN001
    return sorted((repr(r[0]), repr(r[1])) for r in result.rows)


def _sketched_equals_plain(service, name: str, sql: str) -> None:  # noqa: ANN001
    with_sketch = service.query(sql)
    assert with_sketch.sketch is not None and with_sketch.sketch["name"] == name
    assert _rows(with_sketch) == _rows(service.query(sql, use_sketch=False))


def _table(service, tmp_path: Path, name: str, table: pa.Table) -> str:  # noqa: ANN001
    path = str(tmp_path / name)
    write_deltalake(path, table, configuration=CDF)
    service.register_table(name, path, replace=True)
    return path


# -- capture, maintenance and use agree on every value ---------------------------------------------------------


def test_regression_float32_bound_is_compared_in_the_columns_type(service, tmp_path) -> None:  # noqa: ANN001
    """FLOAT column, bound 0.7: the engine compared in float32 (0.7f >= 0.7f) and Spark in double (0.7f < 0.7)."""
    path = _table(service, tmp_path, "rf32", pa.table({"x": pa.array([1.5, 0.7], pa.float32()),
                                                       "v": pa.array([200, 1], pa.int64())}))
    sql = "SELECT x, v FROM rf32 WHERE v > 100"
    service.create_sketch("rf32", sql, ["rf32.x"], bounds=["0,0.7,2"])
    write_deltalake(path, pa.table({"x": pa.array([0.7], pa.float32()), "v": pa.array([300], pa.int64())}),
                    mode="append")  # maintained by the engine
    _sketched_equals_plain(service, "rf32", sql)


def test_regression_decimal_bound_finer_than_the_scale(service, tmp_path) -> None:  # noqa: ANN001
    """DECIMAL(10,2), bound 1.005: the engine truncated it to 1.00, Spark compared 1.00 < 1.005."""
    dec = pa.decimal128(10, 2)
    path = _table(service, tmp_path, "rdec", pa.table({"x": pa.array([D("1.50"), D("1.00")], dec),
                                                       "v": pa.array([200, 1], pa.int64())}))
    sql = "SELECT x, v FROM rdec WHERE v > 100"
    service.create_sketch("rdec", sql, ["rdec.x"], bounds=["0,1.005,2"])
    write_deltalake(path, pa.table({"x": pa.array([D("1.00")], dec), "v": pa.array([300], pa.int64())}),
                    mode="append")
    _sketched_equals_plain(service, "rdec", sql)


def test_regression_negative_zero_at_a_bound_goes_with_zero(spark) -> None:  # noqa: ANN001
    """Java's binary search (the Bucketizer) orders -0.0 below 0.0; Spark's comparisons, the truth, do not."""
    part = Partition("t", "x", (-1.0, 0.0, 1.0), "float")
    df = spark.createDataFrame([(-0.0,), (0.0,)], "x double")
    rows = add_fragment(df, F.col("x"), part, 0, "frag").select("frag", range_filter(part, [1]).alias("in1")).collect()
    assert [(r["frag"], r["in1"]) for r in rows] == [(1, True), (1, True)]


def test_regression_wide_decimal_values_are_not_compared_as_doubles(spark) -> None:  # noqa: ANN001
    """Bounds of one digit on a DECIMAL(38,20) column: 0.99999999999999999999 is 1.0 as a double."""
    part = Partition("t", "x", (D(0), D(1), D(2)), "decimal")
    df = spark.createDataFrame(pa.table({"x": pa.array([D("0.99999999999999999999")], pa.decimal128(38, 20))}))
    row = add_fragment(df, F.col("x"), part, 0, "frag").select("frag", range_filter(part, [0]).alias("in0")).first()
    assert (row["frag"], row["in0"]) == (0, True)


# -- bounds at registration ------------------------------------------------------------------------------------


def test_regression_sub_microsecond_bound_is_rounded_up_and_said(service, tmp_path, caplog) -> None:  # noqa: ANN001
    """``fromisoformat`` dropped the digits below the microsecond silently; the bound now rounds up, with a note."""
    stamps = pa.array([dt.datetime(2024, 1, 1, tzinfo=UTC), dt.datetime(2024, 1, 2, tzinfo=UTC)],
                      pa.timestamp("us", tz="UTC"))
    _table(service, tmp_path, "rsub", pa.table({"x": stamps, "v": pa.array([200, 1], pa.int64())}))
    with caplog.at_level(logging.INFO, logger="imp_core.maintenance.service"):
        record, _ = service.create_sketch("rsub", "SELECT x, v FROM rsub WHERE v > 100", ["rsub.x"],
                                          bounds=["2023-12-31T00:00:00Z,2024-01-01T00:00:00.0000001Z,"
                                                  "2024-01-03T00:00:00Z"])
    assert record.partitions[0]["bounds"][1] == "2024-01-01T00:00:00.000001+00:00"
    assert any("rounded up" in m and "rsub.x" in m for m in caplog.messages)


def test_regression_bound_beyond_bigint_is_refused(service, tmp_path) -> None:  # noqa: ANN001
    _table(service, tmp_path, "rbig", pa.table({"x": pa.array([1, 2], pa.int64()), "v": pa.array([200, 1])}))
    with pytest.raises(UsageError, match="outside the range of BIGINT"):
        service.create_sketch("rbig", "SELECT x, v FROM rbig WHERE v > 100", ["rbig.x"],
                              bounds=[f"0,5,{2**63}"])
    assert all(s.name != "rbig" for s in service.catalog.list_sketches())


def test_regression_mixed_naive_and_zoned_bounds_are_refused(service, tmp_path) -> None:  # noqa: ANN001
    stamps = pa.array([dt.datetime(2024, 1, 1, tzinfo=UTC)], pa.timestamp("us", tz="UTC"))
    _table(service, tmp_path, "rmix", pa.table({"x": stamps, "v": pa.array([200])}))
    with pytest.raises(UsageError, match="mix timestamps with and without a time zone"):
        service.create_sketch("rmix", "SELECT x, v FROM rmix WHERE v > 100", ["rmix.x"],
                              bounds=["2023-01-01T00:00:00+00:00,2024-01-01T00:00:00,2025-01-01T00:00:00+00:00"])


def test_regression_equi_depth_bounds_leave_nan_out(spark) -> None:  # noqa: ANN001
    """Spark's MAX is NaN when a NaN is present, and Python cannot sort a sample holding NaN."""
    from imp_core.spark.bounds import equi_depth_bounds

    values = [float(i) for i in range(40)] + [math.nan] * 10
    df = spark.createDataFrame([(v,) for v in values], "x double")
    bounds = equi_depth_bounds(df, "x", 4, "float")
    assert not any(math.isnan(b) for b in bounds)
    assert list(bounds) == sorted(bounds) and len(set(bounds)) == len(bounds)
    assert bounds[0] == 0.0 and bounds[-1] == 39.0


def test_regression_equi_depth_bounds_of_zoned_timestamps_without_statistics(spark) -> None:  # noqa: ANN001
    """Spark rows give naive local datetimes for min/max, the Arrow sample zoned ones: they could not be compared."""
    from imp_core.spark.bounds import equi_depth_bounds

    stamps = [dt.datetime(2024, 1, 1, tzinfo=UTC) + dt.timedelta(hours=i) for i in range(20)]
    df = spark.createDataFrame(pa.table({"x": pa.array(stamps, pa.timestamp("us", tz="UTC"))}))
    bounds = equi_depth_bounds(df, "x", 4, "timestamp")
    assert bounds[0] == stamps[0] and bounds[-1] == stamps[-1] and len(bounds) == 5


# -- pruning by Delta statistics -------------------------------------------------------------------------------


def _pruned_keeps_needed(path: str, part: Partition, fragments: list[int]) -> None:
    source = DeltaSource("t", path)
    version = source.current_version()
    kept = {f.uri for f in prune_files(source.files(version), part, fragments)}
    needed = needed_files(source, version, part, fragments)
    assert needed, "the test must put a row of the sketch's fragments in some file"
    assert needed <= kept


def test_regression_pruning_widens_millisecond_timestamp_statistics(tmp_path) -> None:  # noqa: ANN001
    """delta-rs writes timestamp statistics truncated to milliseconds: max 12:00:00.999999 is logged as .999."""
    path = str(tmp_path / "ts")
    write_deltalake(path, pa.table({"x": pa.array([dt.datetime(2024, 1, 1, 12, 0, 0, 999999, tzinfo=UTC)],
                                                  pa.timestamp("us", tz="UTC"))}))
    part = Partition("t", "x", (dt.datetime(2024, 1, 1, tzinfo=UTC), dt.datetime(2024, 1, 1, 12, 0, 0, 999500,
                                                                                 tzinfo=UTC),
                                dt.datetime(2024, 1, 2, tzinfo=UTC)), "timestamp")
    _pruned_keeps_needed(path, part, [1])


def test_regression_pruning_keeps_float_files_that_may_hold_nan(tmp_path) -> None:  # noqa: ANN001
    """Float statistics leave NaN out; NaN is in the last fragment, so min/max cannot prove a file NaN-free."""
    path = str(tmp_path / "nan")
    write_deltalake(path, pa.table({"x": pa.array([1.0, math.nan])}))
    part = Partition("t", "x", (0.0, 5.0, 10.0, 20.0), "float")
    _pruned_keeps_needed(path, part, [2])


def test_regression_pruning_compares_a_nan_partition_value_in_sparks_order(tmp_path) -> None:  # noqa: ANN001
    path = str(tmp_path / "nanpart")
    write_deltalake(path, pa.table({"p": pa.array([1.0, math.nan]), "v": [1, 2]}), partition_by=["p"])
    part = Partition("t", "p", (0.0, 5.0, 10.0), "float")
    _pruned_keeps_needed(path, part, [1])


def test_regression_pruning_widens_wide_decimal_statistics(tmp_path) -> None:  # noqa: ANN001
    """DECIMAL(18,2) statistics travel as JSON doubles: 1234567890123456.78 is logged as ...456.8."""
    path = str(tmp_path / "dec")
    write_deltalake(path, pa.table({"x": pa.array([D("1234567890123456.78")], pa.decimal128(18, 2))}))
    part = Partition("t", "x", (D("0.00"), D("1234567890123456.79"), D("9999999999999999.99")), "decimal")
    _pruned_keeps_needed(path, part, [0])


def test_regression_pruning_reads_a_string_maximum_as_a_prefix() -> None:
    """A writer may truncate a long maximum to a prefix; values above the prefix that start with it may exist."""
    stats = FileStats("u", 1, 1, {"s": "a" * 32}, {"s": "a" * 32}, {"s": 0}, {})  # true value: "a" * 40
    part = Partition("t", "s", ("", "a" * 33, "b"), "string")
    assert prune_files([stats], part, [1]) == [stats]

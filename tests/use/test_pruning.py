"""File pruning by Delta statistics, on real tables written by delta-rs whose statistics are truncated or missing.

What delta-rs writes (checked here, not assumed): timestamp min/max truncated to milliseconds; decimals through JSON
doubles (wrong in the last digits beyond 15, or left out); long strings cut to 64 bytes (the maximum with its last
character raised, or left whole when it cannot be raised); NaN left out of float min/max; min/max null when a file
holds an infinity; nothing at all with ``delta.dataSkippingNumIndexedCols = 0``; partition values as typed values.

The check for every table: for each fragment, the first and last together, and the middle ones, the files kept by
``prune_files`` include every file that holds a row of those fragments (``tests/use/oracle.py`` reads each file);
and pruning still skips files where the statistics do prove absence.
"""

from __future__ import annotations

import datetime as dt
import math
from decimal import Decimal as D
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake

from imp_core.sketch.bounds import kind_of, parse_bounds
from imp_core.sketch.partition import Partition
from imp_core.sources.delta import DeltaSource
from imp_core.use.rewrite import prune_files
from tests.use.oracle import needed_files

UTC = dt.timezone.utc


def _write(path: Path, files: list[pa.Table], **kw) -> str:  # noqa: ANN003
    for i, t in enumerate(files):
        write_deltalake(str(path), t, mode="overwrite" if i == 0 else "append", **kw)
    return str(path)


def _partition(column: str, dtype: pa.DataType, bounds: list) -> Partition:
    values, _ = parse_bounds(bounds, dtype, f"t.{column}")
    return Partition("t", column, values, kind_of(dtype), dtype)


def _check(path: str, part: Partition) -> int:
    """Assert kept ⊇ needed for every fragment set; return how many (fragment set, file) pairs were skipped."""
    source = DeltaSource("t", path)
    version = source.current_version()
    files = source.files(version)
    n = part.fragments
    sets = [[i] for i in range(n)] + [[0, n - 1], list(range(1, max(2, n - 1)))]
    skipped = 0
    for frags in sets:
        kept = {f.uri for f in prune_files(files, part, frags)}
        needed = needed_files(source, version, part, frags)
        assert needed <= kept, f"fragments {frags}: pruning dropped {sorted(needed - kept)}"
        skipped += len(files) - len(kept)
    return skipped


def test_microsecond_timestamps_with_millisecond_statistics(tmp_path) -> None:  # noqa: ANN001
    base = dt.datetime(2024, 1, 1, 12, tzinfo=UTC)
    us = dt.timedelta(microseconds=1)
    files = [pa.table({"x": pa.array([base + (k * 3000 + j) * us for j in (0, 1, 999)],
                                     pa.timestamp("us", tz="UTC"))}) for k in range(8)]
    path = _write(tmp_path / "ts", files)
    stats = DeltaSource("t", path).files(DeltaSource("t", path).current_version())
    assert any(f.max_values["x"] < max(pq.read_table(f.uri).column("x").to_pylist()) for f in stats)  # truncated
    bounds = [base - us, base + 500 * us, base + 3999 * us, base + 6001 * us, base + 12000 * us, base + 21999 * us]
    part = _partition("x", pa.timestamp("us", tz="UTC"), bounds)
    assert _check(path, part) > 0  # files milliseconds away from a range are still skipped
    ntz = [t.cast(pa.schema([pa.field("x", pa.timestamp("us"))])) for t in files]
    path = _write(tmp_path / "ntz", ntz)
    assert _check(path, _partition("x", pa.timestamp("us"), [b.replace(tzinfo=None) for b in bounds])) > 0


def test_floats_with_nan_negative_zero_and_infinities(tmp_path) -> None:  # noqa: ANN001
    files = [pa.table({"x": pa.array(v, pa.float32())}) for v in
             ([-0.0, 0.5], [1.0, math.nan], [2.5, 3.0], [math.nan, None], [math.inf, 4.0], [None, None],
              [5.5, 6.0])]
    path = _write(tmp_path / "f", files)
    part = _partition("x", pa.float32(), ["-1", "0", "0.7", "2.5", "5"])
    assert _check(path, part) > 0  # ranges short of the last fragment still prune by min/max


def test_wide_decimals_through_json_doubles(tmp_path) -> None:  # noqa: ANN001
    d18 = pa.decimal128(18, 2)
    files = [pa.table({"x": pa.array([D("1234567890123456.78") + D(k) / 100], d18)}) for k in range(-3, 4)]
    files.append(pa.table({"x": pa.array([D("1.00"), D("2.00")], d18)}))
    path = _write(tmp_path / "d", files)
    part = _partition("x", d18, ["0", "1234567890123456.76", "1234567890123456.79", "1234567890123456.80",
                                 "9999999999999999.99"])
    _check(path, part)
    assert _check(path, part) > 0  # the small file is far from the wide values' ranges
    d38 = pa.decimal128(38, 8)
    files = [pa.table({"x": pa.array([D("12345678901234567.12345678") + D(k) / 10**8], d38)}) for k in range(-2, 3)]
    files.append(pa.table({"x": pa.array([D("0.5")], d38)}))
    path = _write(tmp_path / "d38", files)
    _check(path, _partition("x", d38, ["0", "12345678901234567.12345677", "12345678901234567.12345679", "1e20"]))


def test_long_and_non_ascii_strings_with_truncated_statistics(tmp_path) -> None:  # noqa: ANN001
    words = ["a" * 70, "a" * 70 + "b", "é" * 40, "é" * 39 + "ê", "\U0010FFFF" * 20, "b" * 10, "", "a\t" * 40]
    files = [pa.table({"x": pa.array([w])}) for w in words] + [pa.table({"x": pa.array(["a" * 63 + "z"])})]
    path = _write(tmp_path / "s", files)
    part = _partition("x", pa.string(), ["", "a" * 64, "a" * 70 + "a", "b", "é" * 40, "\U0010FFFF"])
    assert _check(path, part) > 0


def test_missing_statistics_keep_every_file(tmp_path) -> None:  # noqa: ANN001
    files = [pa.table({"k": pa.array([i], pa.int64()), "x": pa.array([i * 10], pa.int64())}) for i in range(4)]
    path = _write(tmp_path / "none", files, configuration={"delta.dataSkippingNumIndexedCols": "0"})
    part = _partition("x", pa.int64(), ["0", "10", "20", "30"])
    source = DeltaSource("t", path)
    assert all(not f.min_values and not f.null_counts for f in source.files(source.current_version()))
    assert _check(path, part) == 0
    path = _write(tmp_path / "first", files, configuration={"delta.dataSkippingNumIndexedCols": "1"})  # k only
    assert _check(path, part) == 0
    path = _write(tmp_path / "all", files)
    assert _check(path, part) > 0


def test_files_of_nulls_only_live_in_fragment_zero(tmp_path) -> None:  # noqa: ANN001
    files = [pa.table({"x": pa.array([None, None], pa.int64())}), pa.table({"x": pa.array([5, None], pa.int64())}),
             pa.table({"x": pa.array([50, 60], pa.int64())})]
    path = _write(tmp_path / "nulls", files)
    assert _check(path, _partition("x", pa.int64(), ["0", "10", "40", "100"])) > 0


PARTITIONED = {
    "date": (pa.date32(), [dt.date(2024, 2, 28), dt.date(2024, 2, 29), dt.date(2024, 3, 1), None],
             ["2024-01-01", "2024-02-29", "2024-03-01", "2025-01-01"]),
    "timestamp": (pa.timestamp("us", tz="UTC"),
                  [dt.datetime(2024, 1, 1, 0, 0, 0, 1, tzinfo=UTC), dt.datetime(2024, 1, 1, tzinfo=UTC), None],
                  ["2023-01-01T00:00:00Z", "2024-01-01T00:00:00.000001Z", "2025-01-01T00:00:00Z"]),
    "decimal": (pa.decimal128(10, 2), [D("1.00"), D("1.01"), D("10.50"), None], ["0", "1.005", "10.5", "100"]),
    "float": (pa.float64(), [-0.0, 0.7, math.nan, 3.0, None], ["-1", "0", "0.7", "2", "5"]),
    "string": (pa.string(), ["a b", "é/x", "B", "", None], ["", "B", "a b", "z", "é"]),
}


@pytest.mark.parametrize("name", list(PARTITIONED))
def test_partition_values_compare_in_the_columns_type(tmp_path, name: str) -> None:  # noqa: ANN001
    dtype, values, bounds = PARTITIONED[name]
    table = pa.table({"p": pa.array(values, dtype), "v": pa.array(np.arange(len(values)), pa.int64())})
    path = _write(tmp_path / name, [table], partition_by=["p"])
    assert _check(path, _partition("p", dtype, bounds)) > 0


def test_partition_values_given_as_log_text_are_read_in_the_columns_type() -> None:
    """The log stores partition values as text; a reader that hands them over unparsed is compared the same way."""
    from imp_core.sources.delta import FileStats

    def part_file(value: str | None) -> FileStats:
        return FileStats(f"u{value}", 1, 1, {}, {}, {}, {"p": value})

    dates = _partition("p", pa.date32(), ["2024-01-01", "2024-02-29", "2024-03-01"])
    kept = prune_files([part_file("2024-02-28"), part_file("2024-02-29"), part_file(None)], dates, [1])
    assert [f.partition_values["p"] for f in kept] == ["2024-02-29"]
    floats = _partition("p", pa.float64(), ["0", "1", "2"])
    kept = prune_files([part_file("NaN"), part_file("-0"), part_file("1.5")], floats, [1])
    assert [f.partition_values["p"] for f in kept] == ["NaN", "1.5"]  # NaN is in the last fragment
    stamps = _partition("p", pa.timestamp("us", tz="UTC"), ["2024-01-01T00:00:00Z", "2024-01-01T00:00:00.000001Z",
                                                            "2024-01-02T00:00:00Z"])
    kept = prune_files([part_file("2024-01-01 00:00:00"), part_file("2024-01-01 00:00:00.000001")], stamps, [1])
    assert [f.partition_values["p"] for f in kept] == ["2024-01-01 00:00:00.000001"]
    assert prune_files([part_file("not a date")], dates, [1]) == [part_file("not a date")]  # unreadable: keep

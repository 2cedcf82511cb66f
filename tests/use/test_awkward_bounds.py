"""End to end through the real service: sketches whose bounds sit exactly on awkward values answer like Spark.

One Delta table (several files, so file pruning has work to do) with FLOAT, DOUBLE (-0.0, NaN, ±inf), DECIMAL(18,8),
microsecond TIMESTAMP and TIMESTAMP_NTZ, and STRING (tabs, non-ASCII, astral characters) columns. A sketch per column
with ``--bounds`` on the awkward values (and one with equi-depth bounds over data holding NaN and -0.0) is captured,
the table changes (rows at the bounds become interesting, so the engine adds fragments), and ``imp query`` with the
sketch must return exactly the rows Spark returns without it (``use_sketch=False``).
"""

from __future__ import annotations

import datetime as dt
import math
from decimal import Decimal as D

import numpy as np
import pyarrow as pa
import pytest
from deltalake import write_deltalake

pytestmark = [pytest.mark.spark, pytest.mark.postgres]

UTC = dt.timezone.utc
US = dt.timedelta(microseconds=1)
T0 = dt.datetime(2024, 1, 1, tzinfo=UTC)


def f32(x: float) -> float:
    return float(np.float32(x))


F32_ABOVE_07 = float(np.nextafter(np.float32(0.7), np.float32(1)))
T1 = T0 + 999_999 * US
# column -> (type, [boring values (v = 1) one per fragment or so, values that interest the query at capture,
#                   values that interest it after the change: at or next to the bounds, NaN, -0.0, NULL])
COLUMNS: dict[str, tuple[pa.DataType, list, list, list]] = {
    "f32": (pa.float32(), [-5.0, 0.0, 1.0, 7.0], [1.0, 1.25, 1.375, 0.8125],
            [f32(0.7), -0.0, F32_ABOVE_07, None]),
    "f64": (pa.float64(), [0.0, 5e-324, 0.5, math.nan], [math.nan, math.inf, 1.0, 1e300],
            [-0.0, -5e-324, -math.inf, None]),
    "d8": (pa.decimal128(18, 8), [D("0"), D("0.12345679"), D("1234567890.12345678"), None],
           [D("1234567890.12345679"), D("9999999999"), D("5000000000"), D("1234567890.12345678")],
           [D("0.12345678"), D("-0.00000001"), None, D("-9999999999.99999999")]),
    "ts": (pa.timestamp("us", tz="UTC"), [T0, T0 + US, T1, None], [T1, T1, T1, T1],  # one file: max logged as .999
           [T0, T0 - US, dt.datetime(1, 1, 1, tzinfo=UTC), None]),
    "s": (pa.string(), ["Z", "a", "a\tb", "é"], ["😀", "\U0010FFFF", "éa", "é"], ["a\x00", "a\ta", "a", ""]),
}
COLUMNS["ntz"] = (pa.timestamp("us"), *([v.replace(tzinfo=None) if v is not None else None for v in vals]
                                        for vals in COLUMNS["ts"][1:]))

BOUNDS = {
    "f32": "-1,0,0.7,1.5,3",  # 0.7 is rounded up to the next FLOAT value
    "f64": "-1e300,-0.0,5e-324,1,1e300",  # -0.0 is stored as 0.0
    "d8": "-1,0.123456785,1234567890.12345678,9999999999",  # 0.123456785 rounds up to 0.12345679
    "ts": "2023-12-31T00:00:00Z,2024-01-01T00:00:00.0000005Z,2024-01-01T00:00:00.999999Z,2024-01-02T00:00:00Z",
    "ntz": "2023-12-31T00:00:00,2024-01-01T00:00:00.000001,2024-01-01T00:00:00.999999,2024-01-02T00:00:00",
    "s": ",a,a\tb,é,😀",
}


def _batch(which: int, v: int) -> pa.Table:
    """Rows made of the ``which``-th value list of every column (0 boring, 1 first, 2 second)."""
    cols = {c: pa.array(lists[which + 1], lists[0]) for c, lists in COLUMNS.items()}
    cols["v"] = pa.array([v] * 4, pa.int64())
    return pa.table(cols)


def _rows(result) -> list[tuple]:  # noqa: ANN001
    return sorted(tuple(repr(v) for v in r) for r in result.rows)


@pytest.fixture(scope="module")
def awkward(service, tmp_path_factory):  # noqa: ANN001, ANN201
    path = str(tmp_path_factory.mktemp("awkward") / "awk")
    write_deltalake(path, _batch(0, 1), configuration={"delta.enableChangeDataFeed": "true"})
    write_deltalake(path, _batch(1, 300), mode="append")  # a second file
    service.register_table("awk", path, replace=True)
    for column, bounds in BOUNDS.items():
        service.create_sketch(f"awk_{column}", f"SELECT {column}, v FROM awk WHERE v > 100", [f"awk.{column}"],
                              bounds=[bounds])
    service.create_sketch("awk_f64_equi", "SELECT v, f64 FROM awk WHERE v > 100", ["awk.f64"], fragments=4)
    before = {name: service.describe(name)["partitions"][0]["fragments"] for name in _sketches()}
    write_deltalake(path, _batch(2, 300), mode="append")  # rows at the bounds become interesting
    return before


def _sketches() -> dict[str, str]:
    out = {f"awk_{c}": f"SELECT {c}, v FROM awk WHERE v > 100" for c in BOUNDS}
    out["awk_f64_equi"] = "SELECT v, f64 FROM awk WHERE v > 100"
    return out


@pytest.mark.parametrize("name", list(_sketches()))
def test_sketched_query_returns_sparks_rows(service, awkward, name: str) -> None:  # noqa: ANN001
    sql = _sketches()[name]
    with_sketch = service.query(sql)
    assert with_sketch.sketch is not None and with_sketch.sketch["name"] == name
    plain = service.query(sql, use_sketch=False)
    assert _rows(with_sketch) == _rows(plain)
    info = service.describe(name)["partitions"][0]
    assert len(info["fragments"]) < info["fragment_count"], "the sketch should leave some fragment out"
    assert awkward[name] != info["fragments"], "maintenance should have added fragments"


def test_stored_bounds_are_values_of_the_column_type(service, awkward) -> None:  # noqa: ANN001
    bounds = {c: service.describe(f"awk_{c}")["partitions"][0]["bounds"] for c in BOUNDS}
    assert bounds["f32"][2] == F32_ABOVE_07
    assert bounds["f64"][1] == 0.0 and math.copysign(1.0, bounds["f64"][1]) == 1.0
    assert bounds["d8"][1] == "0.12345679"
    assert bounds["ts"][1] == "2024-01-01T00:00:00.000001+00:00"
    assert bounds["ntz"][1] == "2024-01-01T00:00:00.000001"
    assert not any(isinstance(b, float) and math.isnan(b) for b in service.describe("awk_f64_equi")["partitions"][0]
                   ["bounds"])

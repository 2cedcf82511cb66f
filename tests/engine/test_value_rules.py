"""Spark's value rules for aggregates, grouping keys and ordering, one regression test per class.

Each expected value was read from Spark 4.2 (non-ANSI, as the engine's sessions run it); docs/SEMANTICS.md,
"Aggregates, grouping and ordering", states the rules. The engine runs here on in-memory tables (``LocalBackend``),
and every test also maintains the same state incrementally and compares it with a fresh capture.
"""

from __future__ import annotations

import math
import struct
from decimal import Decimal

import polars as pl
import pyarrow as pa
import pytest

from imp_core.engine.local import LocalBackend
from imp_core.engine.pipeline import Pipeline
from imp_core.engine.schema import MULT
from imp_core.plan.sql import parse_query
from imp_core.sketch.partition import Partition, PartitionSet

NAN, INF = float("nan"), float("inf")
# a NaN with another bit pattern (e.g. from 0 * inf on some platforms, or another writer): still the one NaN in Spark
OTHER_NAN = struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000123))[0]


def run(sql: str, schema: dict[str, pa.DataType], rows: list[dict], part: tuple[str, tuple],
        later: list[dict] | None = None, deleted: list[dict] | None = None) -> tuple[pl.DataFrame, set[int]]:
    """Capture over ``rows``, then (optionally) insert ``later`` and delete ``deleted`` incrementally; return the
    query's result (plain columns) and the sketch, after checking them against a fresh capture."""
    arrow = pa.schema(list(schema.items()))
    tables = {0: pa.Table.from_pylist(rows, schema=arrow)}
    plan = parse_query(sql, {"t": arrow}).plan
    parts = PartitionSet((Partition("t", part[0], part[1], "int"),))
    current = list(rows)
    changes = []
    if later:
        current += later
        changes += [(r, 1) for r in later]
    for r in deleted or []:
        current.remove(r)  # the same dict object (NaN equals itself only by identity)
        changes.append((r, -1))
    tables[1] = pa.Table.from_pylist(current, schema=arrow)
    backend = LocalBackend(lambda name, v: pl.from_arrow(tables[v]))  # type: ignore[arg-type, return-value]
    pipe = Pipeline(plan, parts)
    pipe.capture(backend, {"t": 0})
    version = 0
    if changes:
        delta = pl.from_arrow(pa.Table.from_pylist([r for r, _ in changes], schema=arrow)).with_columns(
            pl.Series(MULT, [m for _, m in changes], dtype=pl.Int64))
        pipe.maintain_pass("t", delta, backend, {"t": 1})  # type: ignore[arg-type]
        version = 1
    fresh = Pipeline(plan, parts)
    fresh.capture(backend, {"t": version})
    assert pipe.sketch() == fresh.sketch()
    for op, other in zip(pipe.stateful(), fresh.stateful()):
        for name, frame in op.canonical().items():
            assert frame.equals(other.canonical()[name]), f"{op.op_id}.{name} differs from a recapture"
    result = backend.relation(pipe.as_relation(plan), {"t": version})
    return result.select([f.name for f in plan.schema]), pipe.sketch()


def positive_zero(x: float) -> bool:
    return x == 0.0 and math.copysign(1.0, x) > 0


F = {"g": pa.float64(), "x": pa.float64(), "p": pa.int64()}
PART = ("p", (0, 1, 2, 3, 4, 5, 6))


def test_nan_keys_are_one_group() -> None:
    """Spark: every NaN is one GROUP BY / DISTINCT key, whatever its bits."""
    rows = [{"g": NAN, "x": 1.0, "p": 0}, {"g": OTHER_NAN, "x": 2.0, "p": 1}, {"g": 1.0, "x": 4.0, "p": 2}]
    out, _ = run("SELECT g, COUNT(*) AS n, SUM(x) AS s FROM t GROUP BY g", F, rows, PART,
                 later=[{"g": -NAN, "x": 8.0, "p": 3}])
    nan_rows = out.filter(pl.col("g").is_nan())
    assert nan_rows.height == 1 and nan_rows.row(0)[1:] == (3, 11.0)


def test_nan_join_keys_match_whatever_their_bits() -> None:
    """Spark: ``NaN = NaN`` in a join condition, for every NaN bit pattern (polars' join matches NaN only on some
    code paths: not between two one-row sides)."""
    rows = [{"g": NAN, "x": 1.0, "p": 0}, {"g": 2.0, "x": 2.0, "p": 1}]
    sql = ("SELECT a.p AS pa, b.p AS pb FROM (SELECT g, p FROM t WHERE p = 0) AS a "
           "JOIN (SELECT g, p FROM t WHERE p = 4) AS b ON a.g = b.g")
    out, sketch = run(sql, F, rows, PART, later=[{"g": OTHER_NAN, "x": 3.0, "p": 4}])
    assert out.rows() == [(0, 4)]
    assert sketch == {0, 4}


def test_negative_zero_keys_are_zero() -> None:
    """Spark normalizes -0.0 to 0.0 in grouping keys (one group, key 0.0), also when -0.0 arrives first."""
    rows = [{"g": -0.0, "x": 1.0, "p": 0}]
    out, _ = run("SELECT g, COUNT(*) AS n FROM t GROUP BY g", F, rows, PART, later=[{"g": 0.0, "x": 1.0, "p": 1}])
    assert out.height == 1 and positive_zero(out.item(0, "g")) and out.item(0, "n") == 2
    out, _ = run("SELECT DISTINCT g FROM t", F, rows, PART)
    assert out.height == 1 and positive_zero(out.item(0, "g"))


def test_nan_is_the_largest_value_in_min_max() -> None:
    """Spark: MAX is NaN when a NaN is present; MIN skips NaN unless every value is NaN."""
    rows = [{"g": 1.0, "x": 1.0, "p": 0}, {"g": 1.0, "x": INF, "p": 1}, {"g": 2.0, "x": NAN, "p": 2}]
    nan = {"g": 1.0, "x": NAN, "p": 3}
    out, _ = run("SELECT g, MIN(x) AS lo, MAX(x) AS hi FROM t GROUP BY g", F, rows, PART, later=[nan])
    g1 = out.filter(pl.col("g") == 1.0).row(0)
    g2 = out.filter(pl.col("g") == 2.0).row(0)
    assert g1[1] == 1.0 and math.isnan(g1[2])
    assert math.isnan(g2[1]) and math.isnan(g2[2])
    out, _ = run("SELECT g, MIN(x) AS lo, MAX(x) AS hi FROM t GROUP BY g", F, rows + [nan], PART, deleted=[nan])
    assert out.filter(pl.col("g") == 1.0).row(0)[1:] == (1.0, INF)


def test_infinities_inserted_and_deleted_leave_the_finite_sum() -> None:
    """+inf and -inf are counted apart: both present is NaN (Spark), deleting them restores the exact finite sum."""
    rows = [{"g": 1.0, "x": 1.5, "p": 0}, {"g": 1.0, "x": 0.25, "p": 1}]
    pos, neg, nan = {"g": 1.0, "x": INF, "p": 2}, {"g": 1.0, "x": -INF, "p": 3}, {"g": 1.0, "x": NAN, "p": 4}
    sql = "SELECT g, SUM(x) AS s, AVG(x) AS a FROM t GROUP BY g"
    out, _ = run(sql, F, rows, PART, later=[pos])
    assert out.row(0)[1:] == (INF, INF)
    out, _ = run(sql, F, rows + [pos], PART, later=[neg])
    assert math.isnan(out.item(0, "s")) and math.isnan(out.item(0, "a"))
    out, _ = run(sql, F, rows + [pos, neg, nan], PART, deleted=[pos, neg, nan])
    assert out.row(0)[1:] == (1.75, 0.875)


def test_float_sum_at_a_having_threshold_keeps_the_group() -> None:
    """0.1 + 0.2 + 0.3 is 0.6000000000000001 in Spark when added in that order and 0.6 in others (Spark 4.2,
    repartitioned); HAVING SUM(x) > 0.6 may pass, so the sketch keeps the group's fragments."""
    rows = [{"g": 1.0, "x": v, "p": i} for i, v in enumerate((0.3, 0.2, 0.1))] + [{"g": 2.0, "x": 0.5, "p": 5}]
    out, sketch = run("SELECT g, SUM(x) AS s FROM t GROUP BY g HAVING SUM(x) > 0.6", F, rows, PART)
    assert {0, 1, 2} <= sketch and 5 not in sketch
    assert out.get_column("s").to_list() == [math.fsum([0.3, 0.2, 0.1])]  # the value itself is unchanged


def test_float_sum_at_a_top_k_boundary_keeps_both_candidates() -> None:
    """Group 1's exact sum rounds to 0.6, below group 2's 0.6000000000000001; added in the order 0.1, 0.2, 0.3 (one of
    Spark's orders) it is 0.6000000000000001 too, and a top-1 may return either group: both are kept."""
    rows = [{"g": 1.0, "x": v, "p": i} for i, v in enumerate((0.1, 0.2, 0.3))] + \
        [{"g": 2.0, "x": 0.6000000000000001, "p": 4}]
    assert math.fsum([0.1, 0.2, 0.3]) < 0.6000000000000001 == (0.1 + 0.2) + 0.3
    _, sketch = run("SELECT g, SUM(x) AS s FROM t GROUP BY g ORDER BY s DESC LIMIT 1", F, rows, PART)
    assert sketch == {0, 1, 2, 4}


D = {"g": pa.int64(), "d": pa.decimal128(5, 2), "p": pa.int64()}


def test_decimal_avg_is_spark_decimal() -> None:
    """Spark: AVG(DECIMAL(5, 2)) is DECIMAL(9, 6), the exact quotient rounded HALF_UP: 1.00/3 = 0.333333,
    2.00/3 = 0.666667, 0.01/4000 = 0.000003 (a tie rounded away from zero)."""
    rows = [{"g": 1, "d": Decimal("1.00"), "p": 0}, {"g": 1, "d": Decimal("0.00"), "p": 1},
            {"g": 1, "d": Decimal("0.00"), "p": 2}, {"g": 2, "d": Decimal("-2.00"), "p": 3},
            {"g": 2, "d": Decimal("0.00"), "p": 4}, {"g": 2, "d": Decimal("0.00"), "p": 4}]
    rows += [{"g": 3, "d": Decimal("0.01"), "p": 5}] + [{"g": 3, "d": Decimal("0.00"), "p": 5} for _ in range(3999)]
    out, _ = run("SELECT g, AVG(d) AS a, SUM(d) AS s FROM t GROUP BY g", D, rows, PART)
    assert out.schema["a"] == pl.Decimal(38, 6)
    assert dict(zip(out["g"], out["a"])) == {1: Decimal("0.333333"), 2: Decimal("-0.666667"), 3: Decimal("0.000003")}
    plan = parse_query("SELECT AVG(d) AS a, SUM(d) AS s FROM t", {"t": pa.schema(list(D.items()))}).plan
    assert [f.dtype for f in plan.schema] == [pa.decimal128(9, 6), pa.decimal128(15, 2)]


def test_decimal_avg_decides_having_as_spark() -> None:
    """HAVING AVG(d) > 0.333333 is FALSE in Spark for 1.00/3 (0.333333, not 0.3333333333333333)."""
    rows = [{"g": 1, "d": Decimal("1.00"), "p": 0}, {"g": 1, "d": Decimal("0.00"), "p": 1},
            {"g": 1, "d": Decimal("0.00"), "p": 2}]
    _, sketch = run("SELECT g FROM t GROUP BY g HAVING AVG(d) > 0.333333", D, rows, PART)
    assert sketch == set()


INTS = {"g": pa.int64(), "i": pa.int64(), "p": pa.int64()}


def test_integer_avg_does_not_wrap_and_sum_wraps_like_spark() -> None:
    """Spark (non-ANSI): SUM(bigint) wraps (2^63-1 + 1 = -2^63); AVG adds in double (two 2^63-1 average to
    9.223372036854776e18, not the wrapped sum's -1.0)."""
    top = 2 ** 63 - 1
    rows = [{"g": 1, "i": top, "p": 0}]
    out, _ = run("SELECT g, SUM(i) AS s, AVG(i) AS a FROM t GROUP BY g", INTS, rows, PART,
                 later=[{"g": 1, "i": top, "p": 1}])
    assert out.row(0)[1:] == (-2, 9.223372036854776e18)
    out, _ = run("SELECT g, SUM(i) AS s FROM t GROUP BY g", INTS, rows, PART, later=[{"g": 1, "i": 1, "p": 1}])
    assert out.item(0, "s") == -(2 ** 63)


@pytest.mark.parametrize("desc", [False, True])
def test_nan_orders_above_every_number_in_top_k(desc: bool) -> None:
    """Spark: ORDER BY x puts NaN after +inf (ascending) and first (descending), NULLs where NULLS FIRST/LAST say."""
    rows = [{"g": 0.0, "x": v, "p": i} for i, v in enumerate((NAN, INF, 1.0, -INF))] + [{"g": 0.0, "x": None, "p": 5}]
    order = "DESC NULLS LAST" if desc else "ASC NULLS FIRST"
    out, sketch = run(f"SELECT x, p FROM t ORDER BY x {order} LIMIT 2", F, rows, PART)
    assert sorted(out.get_column("p").to_list()) == ([0, 1] if desc else [3, 5])
    assert sketch == ({0, 1} if desc else {3, 5})

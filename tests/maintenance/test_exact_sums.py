"""Sums whose captured value is not the exact sum, maintained job by job on both state paths (in memory, and in
Delta tables with ``IMP_STATE_MEMORY_BUDGET=0``): a float SUM that Spark rounded at capture keeps an error bound
that covers that rounding after its large terms are deleted, and a DECIMAL SUM that leaves 38 digits is NULL like
Spark's and comes back into range when rows are deleted. Each step is its own maintenance run (state saved and
loaded); after each, ``imp query`` with the sketch equals Spark's answer without it, and the maintained sketch
equals a recapture."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from tests.oracles import answers_with_and_without_sketch, canonical

pytestmark = [pytest.mark.spark, pytest.mark.postgres, pytest.mark.slow]

CDF = {"delta.enableChangeDataFeed": "true"}
FLOAT_SQL = "SELECT g, SUM(x) AS s FROM {t} GROUP BY g HAVING SUM(x) > 0.5"
DECIMAL_SQL = "SELECT g, SUM(m) AS s FROM {t} GROUP BY g HAVING SUM(m) > 0"


@pytest.fixture(params=["memory", "delta"])
def svc(request: pytest.FixtureRequest, service: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The service keeping state in memory (default budget) or in Delta tables (budget 0)."""
    from imp_core.maintenance.service import SketchService

    if request.param == "memory":
        monkeypatch.delenv("IMP_STATE_MEMORY_BUDGET", raising=False)
        return service
    monkeypatch.setenv("IMP_STATE_MEMORY_BUDGET", "0")
    return SketchService(replace(service.settings, state_budget=0), catalog=service.catalog, spark=service.spark)


def fragments(svc: Any, name: str) -> list[int]:
    return svc.describe(name)["partitions"][0]["fragments"]


def placed(svc: Any, name: str) -> set[str]:
    return {s["where"] for s in svc.describe(name)["state"] if s["operator"].startswith("aggregation")}


def check(svc: Any, name: str, sql: str) -> list[tuple[Any, ...]]:
    """The sketch's answer equals Spark's, and the maintained sketch a recapture's; Spark's rows."""
    with_sketch, without = answers_with_and_without_sketch(svc, sql)
    assert with_sketch.sketch is not None
    assert canonical(with_sketch.rows) == canonical(without.rows)
    maintained = fragments(svc, name)
    svc.recapture(name)
    assert fragments(svc, name) == maintained
    return canonical(without.rows)


def test_a_float_sum_rounded_at_capture_keeps_its_group_when_its_large_terms_go(svc: Any, tmp_path: Path) -> None:
    """Spark's capture sums 1e16 + 1.0 - 1e16 to 0.0; once both large terms are deleted the sum is 1.0, and the
    group (kept at capture, its interval covering 0.5) must stay in the sketch."""
    uri = str(tmp_path / "fsum")
    write_deltalake(
        uri,
        pa.table(
            {
                "id": pa.array([1, 2, 3, 4, 5], pa.int64()),
                "g": pa.array([1, 1, 1, 2, 3], pa.int64()),
                "x": pa.array([1e16, 1.0, -1e16, 2.0, 0.25], pa.float64()),
            }
        ),
        configuration=CDF,
    )
    svc.register_table("fsum", uri, replace=True)
    sql = FLOAT_SQL.format(t="fsum")
    svc.create_sketch("fsum_s", sql, ["fsum.g"], bounds=["1,2,3,4"], replace=True)
    if svc.settings.state_budget == 0:
        assert placed(svc, "fsum_s") == {"external"}
    DeltaTable(uri).delete("id = 1 OR id = 3")
    assert svc.maintain("fsum_s").recaptured is None
    assert fragments(svc, "fsum_s") == [0, 1]  # group 1 (sum 1.0) and group 2
    assert check(svc, "fsum_s", sql) == [(1, 1.0), (2, 2.0)]
    # the recapture starts a fresh bound; the next job's deletes keep the answer right too
    DeltaTable(uri).delete("id = 2")
    assert svc.maintain("fsum_s").recaptured is None
    assert check(svc, "fsum_s", sql) == [(2, 2.0)]


def test_a_decimal_sum_beyond_38_digits_is_null_and_comes_back_on_a_delete(svc: Any, tmp_path: Path) -> None:
    """Two values of 6e37 overflow DECIMAL(38, 0): Spark's sum is NULL (the HAVING drops the group); deleting one
    brings it back to 6e37. Create and every maintenance run succeed."""
    big = Decimal(6 * 10**37)
    uri = str(tmp_path / "dsum")
    dec = pa.decimal128(38, 0)
    write_deltalake(
        uri,
        pa.table(
            {
                "id": pa.array([1, 2, 3, 4, 5], pa.int64()),
                "g": pa.array([1, 1, 2, 3, 3], pa.int64()),
                "m": pa.array([big, big, Decimal(5), -big, -big], dec),
            }
        ),
        configuration=CDF,
    )
    svc.register_table("dsum", uri, replace=True)
    sql = DECIMAL_SQL.format(t="dsum")
    svc.create_sketch("dsum_s", sql, ["dsum.g"], bounds=["1,2,3,4"], replace=True)
    if svc.settings.state_budget == 0:
        assert placed(svc, "dsum_s") == {"external"}
    assert check(svc, "dsum_s", sql) == [(2, Decimal(5))]
    DeltaTable(uri).delete("id = 1")
    assert svc.maintain("dsum_s").recaptured is None
    assert check(svc, "dsum_s", sql) == [(1, big), (2, Decimal(5))]
    # back beyond 38 digits, and a negative group back into range
    write_deltalake(
        uri,
        pa.table({"id": pa.array([6], pa.int64()), "g": pa.array([1], pa.int64()), "m": pa.array([big], dec)}),
        mode="append",
    )
    assert svc.maintain("dsum_s").recaptured is None
    assert check(svc, "dsum_s", sql) == [(2, Decimal(5))]
    DeltaTable(uri).update(updates={"m": "7"}, predicate="id = 4")
    DeltaTable(uri).delete("id = 5")
    assert svc.maintain("dsum_s").recaptured is None
    assert check(svc, "dsum_s", sql) == [(2, Decimal(5)), (3, Decimal(7))]

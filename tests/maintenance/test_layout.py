"""Sketch-aware layout (``imp_core.maintenance.layout``) on real Spark, Delta and the catalog: small appends that
span the domain make sketched scans read outside the sketch; re-clustering brings it down, the sketch stays current
and answers with and without it stay equal."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from imp_core.errors import UsageError
from imp_core.maintenance.layout import OPEN_COST_BYTES, _clustered_cost, _file_counts, _rows_inside
from imp_core.sources.delta import FileStats
from tests.oracles import answers_with_and_without_sketch, canonical

pytestmark = [pytest.mark.spark, pytest.mark.postgres]

SQL = "SELECT g, SUM(v) AS s FROM {t} GROUP BY g HAVING SUM(v) > 1000"


def test_rows_inside_spread_evenly_over_a_files_range() -> None:
    f = FileStats("f", 1, 100, {"a": 0}, {"a": 99}, {"a": 0}, {})  # integers 0..99: 100 values
    assert _rows_inside(f, "a", [(0, 10, False)]) == pytest.approx(10.0)
    assert _rows_inside(f, "a", [(None, 10, False), (90, None, False)]) == pytest.approx(20.0)
    ints = FileStats("i", 1, 10, {"a": 15}, {"a": 24}, {"a": 0}, {})
    assert _rows_inside(ints, "a", [(10, 20, False)]) == pytest.approx(5.0)  # 15..19: 5 of 10 values
    days = FileStats("d", 1, 10, {"a": dt.date(2024, 1, 1)}, {"a": dt.date(2024, 1, 10)}, {"a": 0}, {})
    assert _rows_inside(days, "a", [(dt.date(2024, 1, 6), None, False)]) == pytest.approx(5.0)
    floats = FileStats("x", 1, 10, {"a": 0.0}, {"a": 10.0}, {"a": 0}, {})
    assert _rows_inside(floats, "a", [(5.0, None, False)]) == pytest.approx(5.0)
    # Delta truncates a timestamp maximum to the millisecond: the row at 00:00:01.0005 is still inside [.., +inf)
    t0 = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
    stamps = FileStats("t", 1, 2, {"a": t0}, {"a": t0 + dt.timedelta(seconds=1)}, {"a": 0}, {})
    assert _rows_inside(stamps, "a", [(t0 + dt.timedelta(seconds=1), None, False)]) > 0
    one = FileStats("g", 1, 5, {"a": 7}, {"a": 7}, {"a": 0}, {})
    assert _rows_inside(one, "a", [(5, 8, False)]) == 5 and _rows_inside(one, "a", [(8, 9, False)]) == 0
    unknown = FileStats("h", 1, 5, {}, {}, {}, {})
    assert _rows_inside(unknown, "a", [(0, 1, False)]) == 5  # no statistics: counted as needed


def test_the_clustered_cost_weighs_bytes_read_against_files_opened() -> None:
    mb, gb = 1 << 20, 1 << 30
    assert _file_counts(100 << 10) == [1]  # a small table: one file
    assert _file_counts(gb) == [4, 8, 16, 32, 64, 128, 256, 512, 1024]  # files of 256 MB down to 1 MB
    # one fragment of 1,000 (1 MB): its ends fall anywhere in a file, so it overlaps 1 + 1/1000 of the files on average
    narrow = {m: _clustered_cost(gb, m, 1000, [500]) for m in _file_counts(gb)}
    assert narrow[4] == pytest.approx(1.004 * (gb / 4 + OPEN_COST_BYTES), rel=1e-6)
    assert min(narrow, key=lambda m: narrow[m]) == 512  # files of 2 MB: opening and reading weigh about equal
    assert narrow[512] == pytest.approx(1.512 * (2 * mb + OPEN_COST_BYTES), rel=1e-6)
    assert _clustered_cost(gb, 4, 1000, list(range(100, 150))) == _clustered_cost(gb, 4, 1000, [149, 100, *range(
        101, 149)])  # a run of 50 fragments is one run whatever the order
    scattered = [_clustered_cost(gb, m, 1000, list(range(0, 1000, 10))) for m in _file_counts(gb)]
    assert min(scattered) > 100 * min(narrow.values())  # a scattered sketch reads much of any clustering
    assert _clustered_cost(gb, 4, 1000, list(range(0, 1000, 10))) == gb + 4 * OPEN_COST_BYTES  # never above all
    assert _clustered_cost(gb, 4, 1000, []) == 0


def test_small_appends_are_measured_and_reclustering_restores_pruning(service, tmp_path: Path) -> None:  # noqa: ANN001
    path = tmp_path / "lay"
    cdf = {"delta.enableChangeDataFeed": "true"}
    g = list(range(100)) * 200
    write_deltalake(str(path), pa.table({"g": g, "v": [10.0 if x >= 90 else 1.0 for x in g]}), configuration=cdf)
    service.register_table("lay", str(path), replace=True)
    service.create_sketch("lay_s", SQL.format(t="lay"), ["lay.g"], bounds=["0,10,20,30,40,50,60,70,80,90,100"])
    try:
        for _ in range(12):  # small appends, each spanning the whole domain
            write_deltalake(str(path), pa.table({"g": list(range(0, 100, 2)) * 6, "v": [1.0] * 300}), mode="append")
        service.maintain("lay_s")
        [before] = service.layout("lay")
        [cov] = before.sketches
        assert cov.sketch == "lay_s" and cov.files_read >= 12 and before.excess_share > 0.5

        [left] = service.relayout("lay", threshold=0.99)
        assert left.after is None and left.outcome.startswith("below the threshold")
        service.set_layout_maintenance("lay", False)  # switched off in the catalog: left alone above the threshold
        [off] = service.relayout("lay", threshold=0.3)
        assert off.after is None and off.outcome.startswith("switched off")
        assert not service.parts.catalog.get_table("lay").layout_maintenance
        service.set_layout_maintenance("lay", True)
        [done] = service.relayout("lay", threshold=0.3)
        measured, after = done.before, done.after
        assert after is not None and after.version == measured.version + 1 and done.outcome == "re-clustered"
        assert after.excess_share < before.excess_share and after.sketches[0].files_read < cov.files_read

        maintained = service.maintain("lay_s")  # through the rewrite: no change rows, the sketch stays exact
        assert maintained.delta_rows == 0
        with_sketch, without = answers_with_and_without_sketch(service, SQL.format(t="lay"))
        assert with_sketch.sketch is not None and canonical(with_sketch.rows) == canonical(without.rows)
        assert len(with_sketch.rows) == 10  # g = 90..99
    finally:
        service.drop_sketch("lay_s")


def test_a_failing_table_does_not_stop_the_others(service, tmp_path: Path) -> None:  # noqa: ANN001
    cdf = {"delta.enableChangeDataFeed": "true"}
    names = ("lay_ok", "lay_bad")
    for name in names:
        for _ in range(9):  # nine small files, each spanning the domain
            g = list(range(0, 100, 3))
            write_deltalake(str(tmp_path / name), pa.table({"g": g, "v": [200.0 if x >= 90 else 1.0 for x in g]}),
                            mode="append", configuration=cdf)
        service.register_table(name, str(tmp_path / name), replace=True)
        service.create_sketch(f"{name}_s", SQL.format(t=name), [f"{name}.g"],
                              bounds=["0,10,20,30,40,50,60,70,80,90,100"])
    try:
        for data in (tmp_path / "lay_bad").glob("*.parquet"):
            data.write_bytes(b"not parquet")  # the rewrite cannot read the table
        done = {d.before.table: d for d in service.relayout(threshold=0.0)}
        assert done["lay_bad"].failed and done["lay_bad"].outcome == "failed" and done["lay_bad"].error
        assert done["lay_ok"].after is not None and done["lay_ok"].outcome == "re-clustered"
    finally:
        for name in names:
            service.drop_sketch(f"{name}_s")


def test_bad_input(service) -> None:  # noqa: ANN001
    with pytest.raises(UsageError, match="not registered"):
        service.layout("nosuch")
    with pytest.raises(UsageError, match="between 0 and 1"):
        service.relayout(None, threshold=2.0)

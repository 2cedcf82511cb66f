"""Grouped maintenance: sketches grouped by the tables they read, and one job maintaining a group."""

from __future__ import annotations

import gc
import shutil
import weakref
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from imp_core.config import Settings
from imp_core.engine.pipeline import Pipeline
from imp_core.errors import GroupFailedError, UsageError
from imp_core.maintenance.groups import plan_groups
from imp_core.maintenance.service import SketchService


def test_sketches_on_one_table_share_a_group_and_groups_are_filled() -> None:
    tables = {"a1": ["a"], "a2": ["a"], "b1": ["b"], "ab": ["a", "c"], "d1": ["d"], "d2": ["d"]}
    groups = plan_groups(tables, 4)
    assert sorted(n for g in groups for n in g) == sorted(tables)  # every sketch exactly once
    assert all(len(g) <= 4 for g in groups)
    # a1, a2 and ab are connected through table a and land together; the rest fills the room left
    assert any({"a1", "a2", "ab"} <= set(g) for g in groups)
    assert len(groups) == 2  # 6 sketches in jobs of 4: two jobs, not one per component (four)


def test_a_component_larger_than_the_group_is_cut_with_equal_tables_adjacent() -> None:
    tables = {f"x{i}": ["x"] for i in range(5)} | {f"xy{i}": ["x", "y"] for i in range(3)}
    groups = plan_groups(tables, 3)
    assert [len(g) for g in groups] == [3, 3, 2]
    assert set(groups[0]) == {"x0", "x1", "x2"}  # same table set together, names in order
    assert plan_groups(tables, 3) == groups  # deterministic


def test_group_of_one_is_one_job_per_sketch_and_bad_sizes_are_refused() -> None:
    tables = {"s2": ["t"], "s1": ["t"], "s3": ["u"]}
    assert sorted(plan_groups(tables, 1)) == [("s1",), ("s2",), ("s3",)]
    assert plan_groups({}, 5) == []
    with pytest.raises(UsageError, match="at least 1"):
        plan_groups(tables, 0)


# -- maintaining a group ----------------------------------------------------------------------------------------------

CDF = {"delta.enableChangeDataFeed": "true"}


def _table(path: Path, rows: int, seed: int) -> None:
    write_deltalake(str(path), pa.table({"g": [(i * seed) % 10 for i in range(rows)], "v": [float(i % 13) for i in
                                                                                        range(rows)],
                                         "w": [i % 4 for i in range(rows)]}), configuration=CDF)


def _change(path: Path, seed: int) -> None:
    DeltaTable(str(path)).delete(f"v = {seed % 13}")
    write_deltalake(str(path), pa.table({"g": [seed % 10, (seed + 3) % 10], "v": [1.0 * seed, 2.0],
                                         "w": [1, 2]}), mode="append")


def _fragments(service: SketchService, name: str) -> list:
    return [p["fragments"] for p in service.describe(name)["partitions"]]


@pytest.fixture()
def grouped(imp_settings: Settings, tmp_path: Path) -> Iterator[tuple[SketchService, dict[str, str]]]:
    """Three sketches on table gt (different columns and filters), one on gu; both tables changed since."""
    service = SketchService(imp_settings)
    for t, seed in (("gt", 3), ("gu", 7)):
        _table(tmp_path / t, 60, seed)
        service.register_table(t, str(tmp_path / t), replace=True)
    sketches = {
        "grp_sum": "SELECT g, SUM(v) AS s FROM gt GROUP BY g HAVING SUM(v) > 40",
        "grp_cnt": "SELECT w, COUNT(*) AS n FROM gt WHERE v > 5 GROUP BY w HAVING COUNT(*) > 3",
        "grp_top": "SELECT g, v FROM gt ORDER BY v DESC, g LIMIT 3",
        "grp_u": "SELECT g, AVG(v) AS a FROM gu GROUP BY g HAVING AVG(v) < 6",
    }
    for name, sql in sketches.items():
        service.create_sketch(name, sql, [f"{sql.split('FROM ')[1].split()[0]}.g"], bounds=["0,3,6,9"])
    for t, seed in (("gt", 5), ("gu", 11)):
        _change(tmp_path / t, seed)
        _change(tmp_path / t, seed + 1)
    yield service, sketches
    for name in sketches:
        service.drop_sketch(name)
    service.close()


@pytest.mark.spark
def test_a_group_reads_each_change_feed_once_and_equals_recapture(grouped) -> None:  # noqa: ANN001
    service, sketches = grouped
    job = SketchService(service.settings)  # a job's own process: no Spark yet
    try:
        result = job.maintain_group(list(sketches), strategy="eager", batch_size=1, trigger="test:group")
    finally:
        job.close()
    assert not result.failed and set(result.results) == set(sketches)
    assert all(len(r.versions) == 4 for r in result.results.values())  # eager, batch size 1: one per commit
    assert result.feed_reads == {"gt": 1, "gu": 1}  # four sketches, two tables, two reads
    assert not result.spark_started  # single-table passes run in memory
    maintained = {n: _fragments(service, n) for n in sketches}
    for name in sketches:
        service.recapture(name)
        assert _fragments(service, name) == maintained[name], name
    report = service.run_report("test:group", list(sketches))
    assert report["failed"] == [] and report["succeeded"] == sorted(sketches)


@pytest.mark.spark
def test_one_failing_sketch_is_recorded_and_the_others_are_maintained(grouped, tmp_path: Path) -> None:  # noqa: ANN001
    service, sketches = grouped
    _table(tmp_path / "gone", 20, 1)
    service.register_table("gone", str(tmp_path / "gone"), replace=True)
    service.create_sketch("grp_gone", "SELECT g, SUM(v) AS s FROM gone GROUP BY g", ["gone.g"], bounds=["0,5"])
    shutil.rmtree(tmp_path / "gone")
    try:
        names = ["grp_sum", "grp_gone", "grp_u"]
        result = service.maintain_group(names, trigger="test:fail")
        assert set(result.results) == {"grp_sum", "grp_u"} and list(result.failed) == ["grp_gone"]
        assert all(r.versions for r in result.results.values())
        error = result.error()
        assert isinstance(error, GroupFailedError) and error.exit_code != 0
        assert "1 of 3 sketches failed" in str(error) and "grp_gone" in str(error)
        report = service.run_report("test:fail", names)
        assert report["failed"] == ["grp_gone"] and report["succeeded"] == ["grp_sum", "grp_u"]
        [failed_run] = [r for r in report["runs"] if r["sketch"] == "grp_gone"]
        assert failed_run["status"] == "failed" and "gone" in failed_run["error"]
    finally:
        service.drop_sketch("grp_gone")


@pytest.mark.spark
def test_a_dropped_table_does_not_hide_the_other_stale_sketches(grouped, tmp_path: Path) -> None:  # noqa: ANN001
    """The nightly listing observes every table: one whose directory is gone is listed with its sketches (their
    maintenance fails and is recorded), and every other stale sketch is still listed."""
    service, sketches = grouped
    _table(tmp_path / "gone", 20, 1)
    service.register_table("gone", str(tmp_path / "gone"), replace=True)
    service.create_sketch("grp_gone", "SELECT g, SUM(v) AS s FROM gone GROUP BY g", ["gone.g"], bounds=["0,5"])
    shutil.rmtree(tmp_path / "gone")
    try:
        listed = {name for group in service.stale_groups(25) for name in group}
        # The catalog is the test session's: other modules' stale sketches are listed too; only ours are judged.
        assert {name for name in listed if name.startswith("grp_")} == {*sketches, "grp_gone"}
        assert {name for group in service.stale_groups(25, "gu") for name in group} == {"grp_u"}
    finally:
        service.drop_sketch("grp_gone")
        service.unregister_table("gone")


@pytest.mark.spark
def test_a_failure_the_catalog_cannot_record_does_not_stop_the_group(grouped, tmp_path: Path,  # noqa: ANN001
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Recording a sketch's failed run can fail too (the catalog went away); the group still goes on and the job's
    error says the failure was not recorded."""
    service, _ = grouped
    _table(tmp_path / "gone2", 20, 1)
    service.register_table("gone2", str(tmp_path / "gone2"), replace=True)
    service.create_sketch("grp_gone2", "SELECT g, SUM(v) AS s FROM gone2 GROUP BY g", ["gone2.g"], bounds=["0,5"])
    shutil.rmtree(tmp_path / "gone2")

    def catalog_down(*args: object, **kwargs: object) -> None:
        raise ConnectionError("could not connect to the catalog")

    try:
        from imp_core.maintenance import groups
        monkeypatch.setattr(groups, "_record_failure", catalog_down)
        result = service.maintain_group(["grp_gone2", "grp_sum"], trigger="test:unrecorded")
        assert list(result.failed) == ["grp_gone2"] and "grp_sum" in result.results
        assert "(not recorded in the catalog: ConnectionError: could not connect" in result.failed["grp_gone2"]
        assert "grp_gone2" in str(result.error())
    finally:
        monkeypatch.undo()
        service.drop_sketch("grp_gone2")


@pytest.mark.spark
def test_a_group_job_frees_each_sketchs_pipeline(grouped, tmp_path: Path,  # noqa: ANN001
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A job maintaining many sketches holds one sketch's state at a time: every pipeline it built, operators
    included, is gone at the end without the cycle collector (a reference cycle once kept each join operator's state
    until a full collection, so a long job's memory grew with every sketch)."""
    service, sketches = grouped
    join = "SELECT t.g, COUNT(*) AS n FROM gt t JOIN gu u ON t.w = u.w GROUP BY t.g HAVING COUNT(*) > 50"
    built: list[weakref.ref] = []
    original = Pipeline.__init__

    def recording(self, *args, **kwargs) -> None:  # noqa: ANN001, ANN002, ANN003
        original(self, *args, **kwargs)
        built.extend([weakref.ref(self), *(weakref.ref(op) for op in self.operators.values())])

    # the join's sides as partner indexes (the tables are small enough to be kept whole otherwise)
    settings = replace(service.settings, optimizations=replace(service.settings.optimizations,
                                                               small_side_in_memory=False))
    creator = SketchService(settings)
    creator.create_sketch("grp_join", join, ["gt.g"], bounds=["0,3,6,9"])
    creator.close()
    try:
        _change(tmp_path / "gt", 17)
        monkeypatch.setattr(Pipeline, "__init__", recording)
        job = SketchService(settings)
        gc.collect()
        gc.disable()
        try:
            result = job.maintain_group([*sketches, "grp_join"], trigger="test:lifetime")
            assert not result.failed and len(result.results) == len(sketches) + 1
            assert len(built) > 2 * (len(sketches) + 1)
            alive = [type(r()).__name__ for r in built if r() is not None]
            assert not alive, f"still referenced after the job: {alive}"
        finally:
            gc.enable()
            job.close()
    finally:
        service.drop_sketch("grp_join")

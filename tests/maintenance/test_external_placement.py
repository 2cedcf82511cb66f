"""Operator state placed outside the process (IMP_STATE_MEMORY_BUDGET=0): every grouped aggregation's state lives in
Delta tables beside the data, maintained by Spark; the same sketch kept in memory is the oracle, and Spark answers
the query with and without the sketch alike. Also: where the placement is shown, a job killed between the state
write and the catalog commit, and state on the S3 server."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import TableNotFoundError

from tests.conftest import s3_write_options
from tests.oracles import answers_with_and_without_sketch

pytestmark = [pytest.mark.spark, pytest.mark.postgres, pytest.mark.slow]

SQL = "SELECT g, SUM(v) AS s, COUNT(*) AS n FROM {t} GROUP BY g HAVING SUM(v) > 20"
CDF = {"delta.enableChangeDataFeed": "true"}


@pytest.fixture
def outside(service):  # noqa: ANN001, ANN201
    """A service whose sketches keep every external-capable operator's state outside the process."""
    from imp_core.maintenance.service import SketchService

    return SketchService(replace(service.settings, state_budget=0), catalog=service.catalog, spark=service.spark)


def rows(start: int, n: int) -> pa.Table:
    return pa.table({"id": pa.array(range(start, start + n), pa.int64()),
                     "g": pa.array([i % 9 for i in range(start, start + n)], pa.int64()),
                     "v": pa.array([i % 7 for i in range(start, start + n)], pa.int64())})


def change(uri: str, step: int, options: dict[str, str] | None = None) -> None:
    dt = DeltaTable(uri, storage_options=options)
    if step % 3 == 0:
        write_deltalake(uri, rows(1000 + 10 * step, 6), mode="append", storage_options=options)
    elif step % 3 == 1:
        dt.delete(f"id % 11 = {step % 11}")
    else:
        dt.update(updates={"v": "v + 3"}, predicate=f"g = {step % 9}")


def twins(service, outside, uri: str, name: str) -> None:  # noqa: ANN001
    """The same query sketched twice on one table: in memory (the oracle) and outside."""
    service.register_table(name, uri, replace=True)
    service.create_sketch(f"{name}_mem", SQL.format(t=name), [f"{name}.id"], bounds=["0,10,20,30,1000,2000"])
    outside.create_sketch(f"{name}_ext", SQL.format(t=name), [f"{name}.id"], bounds=["0,10,20,30,1000,2000"])


def placed(service, name: str) -> dict[str, str]:  # noqa: ANN001
    return {s["operator"]: s["where"] for s in service.describe(name)["state"]}


def fragments(service, name: str) -> list[int]:  # noqa: ANN001
    return service.describe(name)["partitions"][0]["fragments"]


def test_state_outside_the_process_is_maintained_like_state_in_memory(service, outside, tmp_path: Path) -> None:  # noqa: ANN001
    uri = str(tmp_path / "ext")
    write_deltalake(uri, rows(0, 60), configuration=CDF)
    twins(service, outside, uri, "ext")
    assert placed(service, "ext_ext") == {"aggregation@r.0.0": "external", "merge@r": "memory"}
    assert placed(service, "ext_mem") == {"aggregation@r.0.0": "memory", "merge@r": "memory"}
    [agg] = [s for s in service.describe("ext_ext")["state"] if s["where"] == "external"]
    assert agg["rows"] >= 9 + 9 and agg["bytes"] > 0  # 9 groups and their F_g pairs, in Delta tables
    assert (tmp_path / "_imp_state").is_dir()  # beside the table
    assert fragments(service, "ext_ext") == fragments(service, "ext_mem")
    for step in range(4):
        change(uri, step)
        for name, svc in (("ext_mem", service), ("ext_ext", outside)):
            assert svc.maintain(name, strategy="lazy").recaptured is None
        assert fragments(service, "ext_ext") == fragments(service, "ext_mem"), step
    for step in range(4, 8):  # several versions at once, one batch each
        change(uri, step)
    for name, svc in (("ext_mem", service), ("ext_ext", outside)):
        result = svc.maintain(name, strategy="eager", batch_size=1)
        assert result.recaptured is None and len(result.versions) == 4
    assert fragments(service, "ext_ext") == fragments(service, "ext_mem")
    assert placed(service, "ext_ext")["aggregation@r.0.0"] == "external"
    with_sketch, without = answers_with_and_without_sketch(outside, SQL.format(t="ext"))
    assert with_sketch.sketch is not None and sorted(map(tuple, with_sketch.rows)) == sorted(map(tuple, without.rows))
    again = outside.recapture("ext_ext")  # full maintenance, again outside
    assert again.fragments == service.catalog.latest_version(service.catalog.get_sketch("ext_mem").id).fragments
    listed = {r["name"]: r for r in service.sketch_list()}
    assert listed["ext_ext"]["state_external_bytes"] > 0 and listed["ext_mem"]["state_external_bytes"] is None


def test_a_job_killed_between_the_state_write_and_the_commit_leaves_nothing_used(service, outside,  # noqa: ANN001
                                                                                tmp_path: Path) -> None:
    uri = str(tmp_path / "kext")
    write_deltalake(uri, rows(0, 60), configuration=CDF)
    twins(service, outside, uri, "kext")
    record = service.catalog.get_sketch("kext_ext")
    change(uri, 0)
    env = dict(os.environ, IMP_HOME=str(service.settings.home), IMP_SPARK_MASTER="local[1]",
               IMP_STATE_MEMORY_BUDGET="0", PYSPARK_PYTHON=sys.executable, IMP_FAULT="before_commit")
    env.pop("IMP_CATALOG_URL", None)
    out = subprocess.run([sys.executable, "-m", "imp_core.cli.main", "sketch", "maintain", "kext_ext"], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == -9, out.stderr[-2000:]
    assert [v.version for v in service.catalog.versions(record.id)] == [1]  # the state tables moved on, the catalog not
    change(uri, 1)
    assert outside.maintain("kext_ext").recaptured is None  # rolls the orphaned versions back, then writes
    assert service.maintain("kext_mem").recaptured is None
    assert fragments(service, "kext_ext") == fragments(service, "kext_mem")


def test_state_no_kept_version_reads_is_removed_after_a_run(service, outside, tmp_path: Path) -> None:  # noqa: ANN001
    """With ``IMP_STATE_RETENTION=1`` a recapture's run folder replaces the capture's, which goes after the run, with
    a dead job's folder; a folder a running run may be writing and another sketch's folder stay."""
    from imp_core.maintenance.service import SketchService

    kept_one = SketchService(replace(outside.settings, state_retention=1), catalog=service.catalog,
                             spark=service.spark)
    uri = str(tmp_path / "gc")
    write_deltalake(uri, rows(0, 60), configuration=CDF)
    twins(service, kept_one, uri, "gc")
    root = tmp_path / "_imp_state"
    first = f"gc_ext-r{_capture_run(service, 'gc_ext')}"
    running = service.catalog.start_run(service.catalog.get_sketch("gc_mem").id, "lazy", "test")
    for planted in ("gc_ext-r999999", f"gc_ext-r{running}", "gc_mem_other-r1", "gc_ext-r1-x"):
        (root / planted / "aggregation_r.0.0").mkdir(parents=True)
    assert (root / first).is_dir()
    again = kept_one.recapture("gc_ext")
    latest = f"gc_ext-r{again.run_id}"
    left = sorted(p.name for p in root.iterdir())
    assert latest in left and first not in left and "gc_ext-r999999" not in left, left
    assert {f"gc_ext-r{running}", "gc_mem_other-r1", "gc_ext-r1-x"} <= set(left), left
    placed_in = [p for p in service.catalog.latest_version(service.catalog.get_sketch("gc_ext").id)
                 .state_placement.values() if p["where"] == "external"]  # type: ignore[union-attr]
    assert [p["folder"] for p in placed_in] == [latest]
    change(uri, 0)
    assert kept_one.maintain("gc_ext").recaptured is None and service.maintain("gc_mem").recaptured is None
    assert fragments(service, "gc_ext") == fragments(service, "gc_mem")
    assert (root / latest).is_dir()
    with_sketch, without = answers_with_and_without_sketch(kept_one, SQL.format(t="gc"))
    assert with_sketch.sketch is not None and sorted(map(tuple, with_sketch.rows)) == sorted(map(tuple, without.rows))


def test_state_on_object_storage_beside_the_table(service, outside, s3_server: str) -> None:  # noqa: ANN001
    from imp_core.sources.storage import configure_spark

    configure_spark(service.spark)
    uri, options = "s3://lake/external/t", s3_write_options()
    write_deltalake(uri, rows(0, 60), configuration=CDF, storage_options=options)
    twins(service, outside, uri, "s3ext")
    change(uri, 0, options)
    change(uri, 1, options)
    for name, svc in (("s3ext_mem", service), ("s3ext_ext", outside)):
        assert svc.maintain(name).recaptured is None
    assert fragments(service, "s3ext_ext") == fragments(service, "s3ext_mem")
    reference_root = "s3://lake/external/_imp_state/"
    state = [s for s in service.describe("s3ext_ext")["state"] if s["where"] == "external"]
    assert state and state[0]["rows"] > 0
    listed = DeltaTable(f"{reference_root}{'s3ext_ext'}-r{_capture_run(service, 's3ext_ext')}/aggregation_r.0.0/state",
                        storage_options=options)
    assert listed.version() >= 1  # written at capture, appended to by maintenance
    orphan = f"{reference_root}s3ext_ext-r999999/aggregation_r.0.0/state"  # a dead job's state
    write_deltalake(orphan, rows(0, 3), storage_options=options)
    change(uri, 2, options)
    assert outside.maintain("s3ext_ext").recaptured is None  # then removes the folder no version reads
    with pytest.raises(TableNotFoundError):
        DeltaTable(orphan, storage_options=options)
    assert DeltaTable(listed.table_uri, storage_options=options).version() > listed.version()


NOT_IN = "SELECT g, SUM(v) AS s FROM {t} WHERE v NOT IN (SELECT k FROM {u}) GROUP BY g"


def test_a_not_in_outside_recaptures_when_its_subquery_gains_a_null(service, outside, tmp_path: Path) -> None:  # noqa: ANN001
    """A NOT IN's left rows live in Delta tables like a NOT EXISTS's. A change to the subquery that reaches one key
    is a pass; its first NULL (after which no row passes) changes every row's verdict, and maintenance recaptures,
    saying why. The sketch equals the in-memory twin's each time, and Spark answers alike with and without it."""
    t, u = str(tmp_path / "nin_t"), str(tmp_path / "nin_u")
    write_deltalake(t, rows(0, 60), configuration=CDF)
    write_deltalake(u, pa.table({"k": pa.array([1, 2], pa.int64())}), configuration=CDF)
    service.register_table("nin_t", t, replace=True)
    service.register_table("nin_u", u, replace=True)
    sql = NOT_IN.format(t="nin_t", u="nin_u")
    service.create_sketch("nin_mem", sql, ["nin_t.id"], bounds=["0,10,20,30,1000,2000"])
    outside.create_sketch("nin_ext", sql, ["nin_t.id"], bounds=["0,10,20,30,1000,2000"])
    anti = [op for op, where in placed(service, "nin_ext").items() if op.startswith("anti_join")]
    assert anti and placed(service, "nin_ext")[anti[0]] == "external"
    assert fragments(service, "nin_ext") == fragments(service, "nin_mem")
    steps = [("u", pa.table({"k": pa.array([5], pa.int64())}), None),  # key 5 blocks the rows with v = 5
             ("t", rows(2000, 6), None),
             ("u", pa.table({"k": pa.array([None], pa.int64())}), "gained its first NULL")]
    for table, added, moved in steps:
        write_deltalake(t if table == "t" else u, added, mode="append")
        assert service.maintain("nin_mem").recaptured is None
        result = outside.maintain("nin_ext")
        assert (result.recaptured is None) if moved is None else (moved in (result.recaptured or "")), \
            result.recaptured
        assert fragments(service, "nin_ext") == fragments(service, "nin_mem")
    with_sketch, without = answers_with_and_without_sketch(outside, sql)
    assert with_sketch.sketch is not None and sorted(map(tuple, with_sketch.rows)) == sorted(map(tuple, without.rows))
    assert placed(service, "nin_ext")[anti[0]] == "external"  # the recapture kept it outside


def _capture_run(service, name: str) -> int:  # noqa: ANN001
    record = service.catalog.get_sketch(name)
    return service.catalog.versions(record.id)[0].run_id

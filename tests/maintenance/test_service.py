"""The maintenance service on real Spark, Delta and Postgres: strategies, recapture fallbacks, concurrency, crashes.

Expected sketches come from DuckDB over the Delta snapshot and a binary search on the sketch's stored bounds
(``tests.oracles``), not from another capture by the same service; query answers with the sketch are compared with
Spark's answers without it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pyarrow as pa
import pytest
import sqlalchemy as sa
from deltalake import DeltaTable, write_deltalake

from imp_core.errors import SketchUnusableError
from imp_core.faults import POINTS
from tests.oracles import answers_with_and_without_sketch, canonical, duck, provenance_fragments, snapshot

pytestmark = [pytest.mark.spark, pytest.mark.postgres]

SQL = "SELECT g, SUM(v) AS s, COUNT(*) AS n FROM {t} GROUP BY g HAVING SUM(v) > 20"
# the partition-column values of the rows SQL's answer depends on (every row of a group that passes the HAVING)
PROVENANCE = "SELECT g FROM t WHERE g IN (SELECT g FROM t GROUP BY g HAVING SUM(v) > 20)"


def make_table(path: Path, rows: int = 40) -> None:
    g = [i % 8 for i in range(rows)]
    write_deltalake(str(path), pa.table({"id": list(range(rows)), "g": g, "v": [i % 5 for i in range(rows)]}),
                    mode="overwrite", configuration={"delta.enableChangeDataFeed": "true"})


def change(path: Path, step: int) -> None:
    """One commit: an insert, a delete or an update, depending on ``step``."""
    dt = DeltaTable(str(path))
    if step % 3 == 0:
        write_deltalake(str(path), pa.table({"id": [1000 + step, 2000 + step], "g": [step % 8, 3],
                                              "v": [4, step % 5]}), mode="append")
    elif step % 3 == 1:
        dt.delete(f"id = {step}")
    else:
        dt.update(updates={"v": "v + 3"}, predicate=f"g = {step % 8}")


def fragments(service, name: str):  # noqa: ANN001, ANN201
    return service.describe(name)["partitions"][0]["fragments"]


def register(service, tmp_path: Path, name: str, column: str = "g"):  # noqa: ANN001, ANN201
    path = tmp_path / name
    make_table(path)
    service.register_table(name, str(path), replace=True)
    service.create_sketch(name, SQL.format(t=name), [f"{name}.{column}"], bounds=["0,2,4,6,8"])
    return path


def cli_env(service) -> dict[str, str]:  # noqa: ANN001
    """Environment for an `imp` process that shares this service's embedded catalog."""
    env = dict(os.environ, IMP_HOME=str(service.settings.home), IMP_SPARK_MASTER="local[1]",
               PYSPARK_PYTHON=sys.executable)
    env.pop("IMP_CATALOG_URL", None)
    return env


def expected_fragments(service, name: str):  # noqa: ANN001, ANN201
    """The fragments the sketch must hold at the table's current version, computed by DuckDB over the Delta snapshot
    and a binary search on the sketch's stored bounds; also checks that the sketch reached that version."""
    shown = service.describe(name)
    [part] = shown["partitions"]
    path = service.catalog.get_table(part["table"]).path
    assert shown["table_versions"] == {part["table"]: DeltaTable(path).version()}
    return provenance_fragments(path, PROVENANCE, part["bounds"])


def cdf_rows(path: Path, after: int) -> int:
    """Change rows of versions (after, latest], read by delta-rs itself."""
    import pyarrow as pa_

    reader = DeltaTable(str(path)).load_cdf(starting_version=after + 1)
    return pa_.RecordBatchReader.from_stream(reader).read_all().num_rows


def test_lazy_and_eager_reach_the_recaptured_sketch(service, tmp_path: Path) -> None:  # noqa: ANN001
    path = register(service, tmp_path, "lz")
    service.create_sketch("lz_eager", SQL.format(t="lz"), ["lz.g"], bounds=["0,2,4,6,8"])
    for step in range(9):
        change(path, step)
    lazy = service.maintain("lz", strategy="lazy")
    assert len(lazy.versions) == 1 and lazy.versions[0].method == "incremental"
    eager = service.maintain("lz_eager", strategy="eager", batch_size=3)
    assert len(eager.versions) >= 3
    counts = [v.delta_rows for v in eager.versions]
    assert all(c >= 3 for c in counts[:-1]) and sum(counts) == lazy.delta_rows
    assert lazy.delta_rows == cdf_rows(path, 0)
    numbers = [v.version for v in eager.versions]
    assert numbers == list(range(2, 2 + len(numbers)))
    expected = expected_fragments(service, "lz")
    assert fragments(service, "lz") == fragments(service, "lz_eager") == expected
    assert expected not in ([], [0, 1, 2, 3])  # the changes leave a sketch that skips something
    assert service.maintain("lz").up_to_date
    with_sketch, without = answers_with_and_without_sketch(service, SQL.format(t="lz"))
    assert with_sketch.sketch is not None
    assert canonical(with_sketch.rows) == canonical(without.rows) == canonical(
        duck("SELECT g, SUM(v), COUNT(*) FROM t GROUP BY g HAVING SUM(v) > 20", t=snapshot(str(path))))


def test_optimize_between_runs_is_not_a_change(service, tmp_path: Path) -> None:  # noqa: ANN001
    """A compaction clustered on the sketch column (what fixes file pruning) is maintained through, not recaptured,
    and contributes no change rows: its commit rewrites files with ``dataChange = false``."""
    path = register(service, tmp_path, "opt")
    change(path, 0)  # +2 rows
    DeltaTable(str(path)).optimize.z_order(["g"])
    change(path, 1)  # -1 row
    DeltaTable(str(path)).optimize.compact()
    result = service.maintain("opt")
    assert [v.method for v in result.versions] == ["incremental"]
    assert result.delta_rows == 3
    assert fragments(service, "opt") == expected_fragments(service, "opt")


def test_recapture_when_change_feed_is_vacuumed(service, tmp_path: Path) -> None:  # noqa: ANN001
    path = register(service, tmp_path, "vac")
    for step in range(1, 3):
        change(path, step)
    shutil.rmtree(path / "_change_data")
    result = service.maintain("vac")
    assert result.recaptured and "change feed" in result.recaptured
    shown = service.describe("vac")
    assert shown["method"] == "recapture" and "change feed" in shown["reason"]
    assert fragments(service, "vac") == expected_fragments(service, "vac")


def test_recapture_when_state_is_corrupt(service, tmp_path: Path) -> None:  # noqa: ANN001
    path = register(service, tmp_path, "cor")
    change(path, 0)
    record = service.catalog.get_sketch("cor")
    with service.catalog.engine.begin() as conn:
        conn.execute(sa.text("SET LOCAL session_replication_role = replica"))  # bypass the immutability trigger
        conn.execute(sa.text("UPDATE operator_state SET payload = overlay(payload placing '\\x00'::bytea "
                             "from 40 for 1) WHERE sketch_id = :s"), {"s": record.id})
    result = service.maintain("cor")
    assert result.recaptured and "corrupt" in result.recaptured
    assert service.describe("cor")["method"] == "recapture"
    assert fragments(service, "cor") == expected_fragments(service, "cor")


def test_retention_keeps_every_version_but_only_recent_state(service, tmp_path: Path) -> None:  # noqa: ANN001
    from dataclasses import replace

    from imp_core.maintenance.service import SketchService

    short = SketchService(replace(service.settings, state_retention=2), catalog=service.catalog,
                          spark=service.spark)
    path = register(short, tmp_path, "ret")
    for step in range(3):
        change(path, step)
        short.maintain("ret")
    history = short.history("ret")
    assert [h["version"] for h in history] == [1, 2, 3, 4]
    assert [h["has_state"] for h in history] == [False, False, True, True]
    assert short.describe("ret", version=1)["version"] == 1


def test_concurrent_maintainers_serialize(service, tmp_path: Path) -> None:  # noqa: ANN001
    path = register(service, tmp_path, "conc")
    for step in range(4):
        change(path, step)
    results, errors = [], []

    def worker() -> None:
        try:
            results.append(service.maintain("conc"))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    made = sorted(v.version for r in results for v in r.versions)
    assert made == [2] and sum(r.up_to_date for r in results) == 2
    assert fragments(service, "conc") == expected_fragments(service, "conc")


@pytest.mark.slow
def test_six_maintainer_processes_make_each_version_once(service, tmp_path: Path) -> None:  # noqa: ANN001
    """Six `imp sketch maintain --strategy eager --batch-size 1` processes race over a backlog of five table
    versions: together they commit versions 2..6 exactly once each, in order, and end at a recapture's sketch."""
    path = register(service, tmp_path, "race")
    for step in range(5):
        change(path, step)
    record = service.catalog.get_sketch("race")
    env = cli_env(service)
    cmd = [sys.executable, "-m", "imp_core.cli.main", "sketch", "maintain", "race", "--strategy", "eager",
           "--batch-size", "1", "--json"]
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(6)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-500:] for o in outs]
    versions = service.catalog.versions(record.id)
    assert [v.version for v in versions] == [1, 2, 3, 4, 5, 6]
    assert versions[-1].table_versions == {"race": DeltaTable(str(path)).version()}
    made = sorted(v for out, _ in outs for v in json.loads(out)["versions"])
    assert made == [2, 3, 4, 5, 6]  # each version committed by exactly one process, none lost
    assert sum(json.loads(out)["up_to_date"] for out, _ in outs) >= 1  # the others found nothing left to do
    assert fragments(service, "race") == expected_fragments(service, "race")


def test_schema_change_of_a_used_column_makes_the_sketch_unusable_until_replaced(service,  # noqa: ANN001
                                                                                   tmp_path: Path) -> None:
    path = register(service, tmp_path, "sch")
    table = DeltaTable(str(path)).to_pyarrow_table()
    changed = table.set_column(2, "v", table.column("v").cast(pa.string()))
    write_deltalake(str(path), changed, mode="overwrite", schema_mode="overwrite")
    before = service.history("sch")
    with pytest.raises(SketchUnusableError, match=r"changed column v, which the sketch reads, from int64 to string "
                                                   r".*imp sketch create sch --replace") as info:
        service.maintain("sch")
    assert "\n" not in str(info.value)
    assert service.history("sch") == before
    assert not service.catalog.get_sketch("sch").usable  # queries run without it
    record = service.catalog.get_sketch("sch")
    service.create_sketch("sch", "SELECT g, COUNT(*) AS n FROM sch GROUP BY g HAVING COUNT(*) > 2", ["sch.g"],
                          bounds=["0,2,4,6,8"], replace=True)  # the same name, in one commit
    assert service.catalog.get_sketch("sch").usable and service.catalog.get_sketch("sch").id != record.id


@pytest.mark.slow
def test_killed_maintenance_leaves_nothing_half_written(service, tmp_path: Path) -> None:  # noqa: ANN001
    path = register(service, tmp_path, "kill")
    for step in range(5):
        change(path, step)
    record = service.catalog.get_sketch("kill")
    env = cli_env(service)
    for point in POINTS:
        out = subprocess.run([sys.executable, "-m", "imp_core.cli.main", "sketch", "maintain", "kill"],
                             env={**env, "IMP_FAULT": point}, capture_output=True, text=True, timeout=300)
        assert out.returncode == -9, (point, out.returncode, out.stderr)
        versions = service.catalog.versions(record.id)
        assert [v.version for v in versions] == [1], point  # no half-written version
        assert service.catalog.has_states(record.id, 1), point
    out = subprocess.run([sys.executable, "-m", "imp_core.cli.main", "sketch", "maintain", "kill"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert service.describe("kill")["version"] == 2
    assert fragments(service, "kill") == expected_fragments(service, "kill")
    runs = service.catalog.runs(record.id)
    assert sum(r.status == "failed" and "stopped before finishing" in (r.error or "") for r in runs) == len(POINTS)


def test_exhausted_topk_buffer_is_recaptured_and_recorded(service, tmp_path: Path) -> None:  # noqa: ANN001
    from dataclasses import replace

    from imp_core.config import Optimizations
    from imp_core.maintenance.service import SketchService

    buffered = SketchService(replace(service.settings, optimizations=Optimizations(topk_buffer=3)),
                             catalog=service.catalog, spark=service.spark)
    path = tmp_path / "tk"
    write_deltalake(str(path), pa.table({"id": list(range(12)), "g": list(range(12)), "v": [1] * 12}),
                    configuration={"delta.enableChangeDataFeed": "true"})
    buffered.register_table("tk", str(path), replace=True)
    buffered.create_sketch("tk", "SELECT g, SUM(v) AS s FROM tk GROUP BY g ORDER BY g LIMIT 2", ["tk.g"],
                           bounds=["0,3,6,9,12"])
    DeltaTable(str(path)).delete("g = 0")
    assert buffered.maintain("tk").recaptured is None  # the buffer (g 0..2) still holds the top 2
    DeltaTable(str(path)).delete("g < 3")
    result = buffered.maintain("tk")
    assert result.recaptured and "buffer" in result.recaptured
    shown = buffered.describe("tk")
    assert shown["method"] == "recapture" and "buffer" in shown["reason"]
    assert shown["partitions"][0]["fragments"] == [1]  # g 3 and 4
    assert provenance_fragments(str(path), "SELECT g FROM t ORDER BY g LIMIT 2", [0, 3, 6, 9, 12]) == [1]

"""Lifecycle guards on real Spark, Delta (delta-rs) tables and Postgres.

One named regression test per class found in issue 14 (each fails on the code before the guards):

* an unsafe recapture was committed and used (``test_regression_unsafe_recapture_is_not_committed``);
* a table re-registered elsewhere or re-created at the same path kept its sketches
  (``test_regression_table_replaced_by_another_path``, ``test_regression_table_recreated_at_the_same_path``);
* a table whose version went backwards kept its sketches (``test_regression_table_version_went_backwards``);
* buffer settings were read from the maintaining process's environment
  (``test_regression_buffer_settings_from_the_environment``).

Every expected answer comes from outside the code under test: DuckDB over the Delta snapshot for sketches, Spark
without the sketch (``query(use_sketch=False)``) for query answers.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from imp_core.errors import SketchUnusableError, UnsafeSketchError
from imp_core.maintenance.loading import load_state
from tests.oracles import answers_with_and_without_sketch, canonical, duck, provenance_fragments, snapshot

pytestmark = [pytest.mark.spark, pytest.mark.postgres]

CDF = {"delta.enableChangeDataFeed": "true"}

# Safe on `id` only while v >= 0: a partial group's SUM is then never above the full one.
SIGN_SQL = "SELECT g, SUM(v) AS s FROM {t} GROUP BY g HAVING SUM(v) > 20"
SIGN_BOUNDS = "0,10,20,30"


def sign_table(service, tmp_path: Path, name: str) -> Path:  # noqa: ANN001
    """Group 1 (ids 0, 15) sums to 25 and is in the answer; group 2 (ids 1, 25) sums to 19 and is not."""
    path = tmp_path / name
    write_deltalake(str(path), pa.table({"id": [0, 15, 1, 25], "g": [1, 1, 2, 2], "v": [15, 10, 18, 1]}),
                    configuration=CDF)
    service.register_table(name, str(path), replace=True)
    service.create_sketch(name, SIGN_SQL.format(t=name), [f"{name}.id"], bounds=[SIGN_BOUNDS])
    assert service.describe(name)["safety"]["assumptions"] == [f"{name}.v >= 0"]
    return path


def break_sign(path: Path) -> None:
    """Group 2 becomes 25 - 30 = -5 (not in the answer), but its row in fragment 0 alone sums to 25 > 20: over the
    sketch's fragments {0, 1} the query would return group 2."""
    DeltaTable(str(path)).update(updates={"v": "25"}, predicate="id = 1")
    DeltaTable(str(path)).update(updates={"v": "-30"}, predicate="id = 25")


def assert_ran_without_sketch(service, sql: str, name: str, truth: list[tuple]) -> None:  # noqa: ANN001
    with_sketch, without = answers_with_and_without_sketch(service, sql)
    assert canonical(with_sketch.rows) == canonical(without.rows) == canonical(truth)
    assert with_sketch.sketch is None, with_sketch.sketch
    assert any(f"sketch {name} is unusable" in n for n in with_sketch.notes), with_sketch.notes


def assert_unusable(service, name: str, *reason: str) -> None:  # noqa: ANN001
    shown = service.describe(name)
    assert shown["usable"] is False and shown["unusable_since"]
    for r in reason:
        assert r in shown["unusable_reason"], shown["unusable_reason"]
    [row] = [r for r in service.catalog.sketch_catalog() if r["name"] == name]
    assert row["usable"] is False and row["unusable_reason"] == shown["unusable_reason"]
    with pytest.raises(SketchUnusableError, match=f"sketch {name} is unusable: .*imp sketch create {name} --replace"):
        service.maintain(name)


# -- unsafe recaptures -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["requested", "vacuumed"])
def test_regression_unsafe_recapture_is_not_committed(service, tmp_path: Path, how: str) -> None:  # noqa: ANN001
    """A recapture (explicit, or automatic after the change feed was vacuumed) re-runs the safety check: the data
    now has a negative v, so the sketch on id is no longer safe; nothing is committed and the sketch is unusable."""
    name = f"unsafe_{how}"
    path = sign_table(service, tmp_path, name)
    break_sign(path)
    if how == "vacuumed":
        shutil.rmtree(path / "_change_data")
    with pytest.raises(SketchUnusableError, match=f"sketch {name} is unusable: a recapture .* no longer safe on "
                                                  f"{name}.id"):
        service.maintain(name, strategy="recapture" if how == "requested" else None)
    assert [h["version"] for h in service.history(name)] == [1]  # nothing committed
    record = service.catalog.get_sketch(name)
    assert service.catalog.runs(record.id)[0].status == "failed"
    assert_unusable(service, name, "no longer safe")
    truth = duck("SELECT g, SUM(v) FROM t GROUP BY g HAVING SUM(v) > 20", t=snapshot(path))
    assert canonical(truth) == [(1, 25)]
    assert_ran_without_sketch(service, SIGN_SQL.format(t=name), name, truth)


def test_incremental_batch_breaking_an_assumption_marks_the_sketch_unusable(service, tmp_path: Path) -> None:  # noqa: ANN001
    name = "unsafe_batch"
    path = sign_table(service, tmp_path, name)
    break_sign(path)
    with pytest.raises(SketchUnusableError, match=f"it is safe only while {name}.v >= 0, but new rows of {name} have "
                                                  f"v = -30"):
        service.maintain(name)
    assert [h["version"] for h in service.history(name)] == [1]
    assert_unusable(service, name, f"{name}.v >= 0")
    assert_ran_without_sketch(service, SIGN_SQL.format(t=name), name, [(1, 25)])


NAN_SQL = "SELECT g, SUM(v) AS s FROM {t} GROUP BY g HAVING SUM(v) < -2"


def test_assumption_broken_only_in_the_data_is_caught(service, tmp_path: Path) -> None:  # noqa: ANN001
    """Delta statistics leave NaN out of a float column's max, so they claim v <= 0 while Spark orders NaN above
    every number. A group with a NaN sums to NaN (not < -2) but its NaN-free part can pass: the sign assumption is
    checked against the data at registration and at every recapture, not only against statistics."""
    dirty = tmp_path / "nan_dirty"
    write_deltalake(str(dirty), pa.table({"id": [0, 15], "g": [1, 1], "v": [-3.0, float("nan")]}), configuration=CDF)
    service.register_table("nan_dirty", str(dirty), replace=True)
    with pytest.raises(UnsafeSketchError, match=r"a row of nan_dirty at version 0 with v = nan, which breaks the "
                                                r"assumption nan_dirty.v <= 0"):
        service.create_sketch("nan_dirty", NAN_SQL.format(t="nan_dirty"), ["nan_dirty.id"], bounds=[SIGN_BOUNDS])

    clean = tmp_path / "nan_clean"
    write_deltalake(str(clean), pa.table({"id": [0, 15, 1], "g": [1, 1, 2], "v": [-3.0, -1.0, -0.5]}),
                    configuration=CDF)
    service.register_table("nan_clean", str(clean), replace=True)
    service.create_sketch("nan_clean", NAN_SQL.format(t="nan_clean"), ["nan_clean.id"], bounds=[SIGN_BOUNDS])
    assert service.describe("nan_clean")["safety"]["assumptions"] == ["nan_clean.v <= 0"]
    # the new file's statistics say min = max = -1.0 (the NaN is left out)
    write_deltalake(str(clean), pa.table({"id": [25, 26], "g": [1, 2], "v": [float("nan"), -1.0]}), mode="append")
    assert max(f["max.v"] for f in pa.table(DeltaTable(str(clean)).get_add_actions(flatten=True)).to_pylist()) < 0
    with pytest.raises(SketchUnusableError, match="v = nan, which breaks the assumption nan_clean.v <= 0"):
        service.maintain("nan_clean", strategy="recapture")
    assert_unusable(service, "nan_clean", "breaks the assumption nan_clean.v <= 0")
    truth = duck("SELECT g, SUM(v) FROM t GROUP BY g HAVING SUM(v) < -2", t=snapshot(clean))
    assert truth == []  # DuckDB, like Spark, orders NaN above every number
    assert_ran_without_sketch(service, NAN_SQL.format(t="nan_clean"), "nan_clean", truth)


# -- table identity ------------------------------------------------------------------------------------------------


ID_SQL = "SELECT g, SUM(v) AS s FROM {t} GROUP BY g HAVING SUM(v) > 20"


def id_table(path: Path, hot_group: int) -> None:
    """Groups 1 (fragment 0) and 3 (fragment 1); only ``hot_group`` passes the HAVING."""
    hot = [15, 15] if hot_group == 1 else [0, 0]
    write_deltalake(str(path), pa.table({"g": [1, 1, 3, 3], "v": hot + ([0, 0] if hot_group == 1 else [15, 15])}),
                    mode="overwrite", configuration=CDF)


def id_sketch(service, tmp_path: Path, name: str) -> Path:  # noqa: ANN001
    path = tmp_path / name
    id_table(path, hot_group=1)
    service.register_table(name, str(path), replace=True)
    service.create_sketch(name, ID_SQL.format(t=name), [f"{name}.g"], bounds=["0,2,4"])
    assert service.describe(name)["partitions"][0]["fragments"] == \
        provenance_fragments(str(path), "SELECT g FROM t WHERE g IN (SELECT g FROM t GROUP BY g HAVING SUM(v) > 20)",
                             [0, 2, 4]) == [0]
    return path


def test_regression_table_replaced_by_another_path(service, tmp_path: Path) -> None:  # noqa: ANN001
    name = "ident_replace"
    path = id_sketch(service, tmp_path, name)
    other = tmp_path / "ident_replace_other"
    id_table(other, hot_group=3)  # version 0 like the sketch's: nothing looks stale
    service.register_table(name, str(other), replace=True)
    assert_ran_without_sketch(service, ID_SQL.format(t=name), name, [(3, 30)])
    assert_unusable(service, name, f"table {name} was re-registered from {path} to {other}")
    assert service.describe(name)["table_identities"] == {
        name: {"id": DeltaTable(str(path)).metadata().id, "path": str(path)}}

    # re-registering (drop + create) makes a usable sketch of the new table
    service.catalog.drop_sketch(name)
    service.create_sketch(name, ID_SQL.format(t=name), [f"{name}.g"], bounds=["0,2,4"])
    with_sketch, without = answers_with_and_without_sketch(service, ID_SQL.format(t=name))
    assert with_sketch.sketch == {"name": name, "version": 1}
    assert canonical(with_sketch.rows) == canonical(without.rows) == [(3, 30)]


def test_regression_table_recreated_at_the_same_path(service, tmp_path: Path) -> None:  # noqa: ANN001
    name = "ident_recreated"
    path = id_sketch(service, tmp_path, name)
    old_id = DeltaTable(str(path)).metadata().id
    shutil.rmtree(path)
    id_table(path, hot_group=3)  # a new table: version 0 again, a new metadata id
    assert DeltaTable(str(path)).version() == 0 and DeltaTable(str(path)).metadata().id != old_id
    assert_ran_without_sketch(service, ID_SQL.format(t=name), name, [(3, 30)])
    assert_unusable(service, name, f"table {name} at {path} was re-created", old_id)


def test_regression_table_version_went_backwards(service, tmp_path: Path) -> None:  # noqa: ANN001
    name = "ident_backwards"
    path = id_sketch(service, tmp_path, name)
    write_deltalake(str(path), pa.table({"g": [3], "v": [1]}), mode="append")
    write_deltalake(str(path), pa.table({"g": [5], "v": [1]}), mode="append")
    assert service.maintain(name).versions[-1].table_versions == {name: 2}
    for f in (path / "_delta_log").glob("00000000000000000002.*"):
        f.unlink()  # the log rolled back to version 1 (same table id)
    assert DeltaTable(str(path)).version() == 1
    assert_ran_without_sketch(service, ID_SQL.format(t=name), name, [(1, 30)])
    assert_unusable(service, name, f"table {name} is at version 1, older than version 2")


# -- engine options recorded with the state ----------------------------------------------------------------------


TOPK_SQL = "SELECT g, SUM(v) AS s FROM {t} GROUP BY g ORDER BY g LIMIT 2"


def topk_table(service, tmp_path: Path, name: str, svc=None) -> Path:  # noqa: ANN001
    path = tmp_path / name
    write_deltalake(str(path), pa.table({"g": list(range(12)), "v": [1] * 12}), configuration=CDF)
    (svc or service).register_table(name, str(path), replace=True)
    (svc or service).create_sketch(name, TOPK_SQL.format(t=name), [f"{name}.g"], bounds=["0,3,6,9,12"])
    return path


def topk_state(service, name: str):  # noqa: ANN001, ANN201
    """The top-k operator of the sketch's latest state, loaded with the options stored with it."""
    loaded = service.load(name)
    pipeline = load_state(service.parts, loaded, service.catalog.latest_version(loaded.record.id))
    [op] = [op for op in pipeline.stateful() if op.kind == "topk"]
    return op


def with_options(service, **opts):  # noqa: ANN001, ANN003, ANN201
    from imp_core.maintenance.service import SketchService

    settings = dataclasses.replace(service.settings,
                                   optimizations=dataclasses.replace(service.settings.optimizations, **opts))
    return SketchService(settings, catalog=service.catalog, spark=service.spark)


def test_regression_buffer_settings_from_the_environment(service, tmp_path: Path) -> None:  # noqa: ANN001
    """Captured with a top-k buffer of 3, maintained by a process without buffer setting: the state keeps its
    buffer, so deleting the three buffered groups is seen as an exhausted buffer (recapture), not as an empty
    top-k."""
    name = "opts_topk"
    path = topk_table(service, tmp_path, name, svc=with_options(service, topk_buffer=3))
    assert service.describe(name)["partitions"][0]["fragments"] == [0]
    assert service.settings.optimizations.topk_buffer == 0  # the maintaining process's own setting
    DeltaTable(str(path)).delete("g < 3")
    result = service.maintain(name)
    shown = service.describe(name)
    expected = provenance_fragments(str(path), "SELECT g FROM t ORDER BY g LIMIT 2", [0, 3, 6, 9, 12])
    assert shown["partitions"][0]["fragments"] == expected == [1]
    assert result.recaptured and "buffer" in result.recaptured
    assert shown["state_options"]["topk_buffer"] == 3
    op = topk_state(service, name)
    assert op.buffer == 3 and op.truncated and op.all_rows().height == 3  # g 3, 4, 5: the buffer, not every group
    with_sketch, without = answers_with_and_without_sketch(service, TOPK_SQL.format(t=name))
    assert with_sketch.sketch is not None and canonical(with_sketch.rows) == canonical(without.rows) == [(3, 1), (4, 1)]


def test_engine_options_of_another_process_do_not_change_the_state(service, tmp_path: Path) -> None:  # noqa: ANN001
    """Captured without buffers; an `imp sketch maintain` process whose environment sets IMP_OPTIMIZATIONS to a
    top-k buffer of 3 maintains it: the state still holds every group, as captured."""
    name = "opts_env"
    path = topk_table(service, tmp_path, name)
    write_deltalake(str(path), pa.table({"g": [20, 21], "v": [1, 1]}), mode="append")
    env = dict(os.environ, IMP_HOME=str(service.settings.home), IMP_OPTIMIZATIONS="topk_buffer=3",
               PYSPARK_PYTHON=sys.executable)
    env.pop("IMP_CATALOG_URL", None)
    out = subprocess.run([sys.executable, "-m", "imp_core.cli.main", "sketch", "maintain", name, "--json"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["versions"] == [2]
    op = topk_state(service, name)
    assert sorted(op.all_rows().get_column("g").to_list()) == [*range(12), 20, 21]  # every group, none cut
    assert op.buffer == 0 and not op.truncated
    assert service.describe(name)["state_options"] == {
        "topk_buffer": 0, "minmax_buffer": 0, "bloom_filters": True, "small_side_in_memory": True,
        "small_side_rows": 100_000, "partner_index": True, "partner_rows": 1_000_000}


def test_version_without_recorded_options_is_recaptured_once(service, tmp_path: Path) -> None:  # noqa: ANN001
    """A version committed before options were recorded (NULL after the 0002 migration) is not loaded with this
    process's options: it is recaptured, which records them."""
    import sqlalchemy as sa

    name = "opts_legacy"
    path = topk_table(service, tmp_path, name)
    record = service.catalog.get_sketch(name)
    with service.catalog.engine.begin() as conn:
        conn.execute(sa.text("SET LOCAL session_replication_role = replica"))  # bypass the immutability trigger
        conn.execute(sa.text("UPDATE sketch_version SET state_options = NULL, table_identities = NULL "
                             "WHERE sketch_id = :s"), {"s": record.id})
    write_deltalake(str(path), pa.table({"g": [-1], "v": [1]}), mode="append")
    result = service.maintain(name)
    assert result.recaptured and "did not record the engine options" in result.recaptured
    shown = service.describe(name)
    assert shown["state_options"]["topk_buffer"] == 0 and shown["table_identities"][name]["path"] == str(path)
    assert shown["partitions"][0]["fragments"] == \
        provenance_fragments(str(path), "SELECT g FROM t ORDER BY g LIMIT 2", [0, 3, 6, 9, 12]) == [0]


# -- what users see ------------------------------------------------------------------------------------------------


def test_cli_and_api_say_a_sketch_is_unusable(service, spark, tmp_path: Path, monkeypatch, capsys) -> None:  # noqa: ANN001
    """`imp sketch list` notices a table re-created at the same path by itself; `show`, `list`, `maintain`,
    `recapture` and `query` say so; the PySpark API computes without the sketch and warns."""
    from imp_core.cli.main import main
    from imp_core.use.api import SketchUnusableWarning, sketch_filter, sketched_sql

    name = "ident_cli"
    path = id_sketch(service, tmp_path, name)
    shutil.rmtree(path)
    id_table(path, hot_group=3)
    monkeypatch.setenv("IMP_HOME", str(service.settings.home))
    monkeypatch.delenv("IMP_CATALOG_URL", raising=False)
    capsys.readouterr()

    assert main(["sketch", "list", "--json"]) == 0
    [row] = [r for r in json.loads(capsys.readouterr().out) if r["name"] == name]
    assert row["usable"] is False and f"table {name} at {path} was re-created" in row["unusable_reason"]
    assert main(["sketch", "list"]) == 0
    out = capsys.readouterr().out
    assert "UNUSABLE" in out and f"sketch {name} is unusable: table {name} at {path} was re-created" in out
    assert main(["sketch", "show", name]) == 0
    assert "UNUSABLE since" in capsys.readouterr().out
    assert main(["sketch", "show", name, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["usable"] is False
    for action in (["sketch", "maintain", name], ["sketch", "recapture", name]):
        assert main(action) == 8
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("imp:")]
        assert len(err) == 1 and err[0].startswith(f"imp: error: sketch {name} is unusable: "), err
        assert f"imp sketch create {name} --replace" in err[0]
    assert main(["query", ID_SQL.format(t=name)]) == 0
    out = capsys.readouterr().out
    assert f"note: sketch {name} is unusable" in out and "no sketch;" in out

    with pytest.warns(SketchUnusableWarning, match=f"sketch {name} is unusable"):
        df = sketched_sql(spark, ID_SQL.format(t=name), settings=service.settings)
    assert canonical(df.collect()) == [(3, 30)]
    with pytest.warns(SketchUnusableWarning):
        pred = sketch_filter(spark, name, sketch=name, settings=service.settings)
    assert service.source(name).scan(spark, 0).filter(pred).count() == 4

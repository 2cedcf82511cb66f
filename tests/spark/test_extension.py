"""imp's Spark extension in a PySpark session started without imp (only the printed settings, in a subprocess):
the registered query, a BI tool's wrapping and a tightened constant get the sketch (fewer files read, Spark's rows),
and every case that must leave the plan unchanged does (rows as Spark computes them without the extension)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from imp_core.maintenance.service import SketchService
from imp_core.publish import manifest, publisher, signature, store
from imp_core.spark import connector
from tests.conftest import write_in_files

CLIENT = Path(__file__).with_name("extension_client.py")
SQL = "SELECT brand, SUM(price * numSold) AS rev FROM {t} GROUP BY brand HAVING SUM(price * numSold) > 300000"
ROWS = 2000


def run_client(queries: list[dict[str, Any]], tmp: Path, conf: dict[str, str] | None = None) -> list[dict[str, Any]]:
    spec = tmp / f"spec-{len(list(tmp.glob('spec-*')))}.json"
    spec.write_text(json.dumps({"conf": {**connector.session_conf(), **(conf or {})}, "queries": queries}))
    done = subprocess.run([sys.executable, str(CLIENT), str(spec)], capture_output=True, text=True, timeout=600,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def sales(service: SketchService, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A 10-file table clustered on price, registered with the sketch ``ext_top`` (published beside the table)."""
    lake = tmp_path_factory.mktemp("ext-lake")
    table = pa.table({"price": pa.array([i // 2 for i in range(ROWS)], pa.int32()),
                      "brand": pa.array([i // 200 for i in range(ROWS)], pa.int32()),
                      "numSold": pa.array([1 + i % 3 for i in range(ROWS)], pa.int32())})
    write_in_files(lake / "ext_sales", table, 10)
    service.register_table("ext_sales", str(lake / "ext_sales"))
    service.create_sketch("ext_top", SQL.format(t="ext_sales"), ["ext_sales.price"],
                          bounds=[",".join(str(b) for b in range(0, 1001, 100))])
    return lake, f"delta.`{lake / 'ext_sales'}`"


def _pair(sql: str, **extra: Any) -> list[dict[str, Any]]:
    """The query with the extension (first) and Spark's truth without it (second)."""
    return [{"sql": sql, **extra}, {"sql": sql, "off": True, **{k: v for k, v in extra.items() if k != "forget"}}]


def test_a_registered_query_is_published_with_its_signature(sales: tuple[Path, str],
                                                            service: SketchService) -> None:
    lake, _ = sales
    record = service.catalog.get_sketch("ext_top")
    assert record.signature["hash"] and record.published_version == 1
    assert [s["op"] for s in record.signature["slots"]] == [">="]  # the HAVING constant may be tightened
    files = store.names(str(lake / store.DEFAULT_DIR))
    assert files == [store.file_name(record.id, 1)]
    body = manifest.decode(store.read(str(lake / store.DEFAULT_DIR), files[0]))
    assert body is not None and body["usable"] and body["tables"][0]["version"] == 9


def test_queries_from_a_session_without_imp(sales: tuple[Path, str], tmp_path: Path) -> None:
    lake, t = sales
    query = SQL.format(t=t)
    wrapped = f"SELECT * FROM ({query}) q ORDER BY rev DESC LIMIT 1000"
    cte = f"WITH x AS ({query}) SELECT brand FROM x WHERE rev > 0"
    tighter = query.replace("> 300000", "> 340000")
    looser = query.replace("> 300000", "> 1000")
    twice = f"{query} UNION ALL SELECT brand, SUM(price) FROM {t} GROUP BY brand"
    cases = [query, wrapped, cte, tighter, looser, twice]
    queries = [q for sql in cases for q in _pair(sql)]
    queries += _pair(query, conf={"spark.sql.session.timeZone": "America/New_York"})
    queries += _pair(query, conf={"spark.sql.ansi.enabled": "true"})
    out = run_client(queries, tmp_path)
    results = {name: (out[2 * i], out[2 * i + 1]) for i, name in
               enumerate(["query", "wrapped", "cte", "tighter", "looser", "twice", "zone", "ansi"])}
    for name, (on, off) in results.items():
        assert on["rows"] == off["rows"], name
        assert off["applied"] == [], name
    for name in ("query", "wrapped", "cte", "tighter"):
        on, off = results[name]
        assert on["applied"] == [{"sketch": "ext_top", "version": 1}], name
        assert on["files"] < off["files"], name
    for name in ("looser", "twice", "zone", "ansi"):
        on, off = results[name]
        assert on["applied"] == [], name
        assert on["files"] == off["files"], name


def test_plans_left_unchanged(sales: tuple[Path, str], service: SketchService, tmp_path: Path) -> None:
    lake, t = sales
    query = SQL.format(t=t)
    where = str(lake / store.DEFAULT_DIR)
    record = service.catalog.get_sketch("ext_top")
    name = store.file_name(record.id, 1)
    good = store.read(where, name)
    # an unreadable location; a manifest whose bounds do not fit the column (an exception inside the rule)
    broken = manifest.decode(good)
    assert broken is not None
    broken["partitions"][0]["ranges"] = [{"lo": "not a number", "hi": None, "nulls": False}]
    elsewhere = tmp_path / "elsewhere"
    store.write(str(elsewhere), name, manifest.encode(broken))
    out = run_client([*_pair(query, conf={"spark.imp.sketches.location": "imp-nowhere://x/y"}),
                      *_pair(query, conf={"spark.imp.sketches.location": str(elsewhere)})], tmp_path)
    damaged = good.replace(b'fragments_kept', b'fragments_kepT')  # the body changed, the checksum did not
    assert damaged != good
    store.write(where, name, damaged)
    try:
        out += run_client(_pair(query, forget=True), tmp_path)
    finally:
        store.write(where, name, good)
    for on, off in zip(out[::2], out[1::2]):
        assert on["applied"] == [] and on["rows"] == off["rows"] and on["files"] == off["files"]


def test_explain_names_the_sketch_or_the_first_failed_check(sales: tuple[Path, str],
                                                           service: SketchService) -> None:
    _, t = sales
    query = SQL.format(t="ext_sales")
    applies = service.explain(query).sketches
    assert [(s["sketch"], s["applies"]) for s in applies] == [("ext_top", True)]
    assert "1 of 10 fragments" in applies[0]["detail"] or "2 of 10 fragments" in applies[0]["detail"]
    looser = service.explain(query.replace("> 300000", "> 1000")).sketches
    assert looser[0]["applies"] is False and "slot 0 value 1000 is outside its constraint (>= 300000)" in \
        looser[0]["reason"]
    other = service.explain("SELECT brand, COUNT(*) FROM ext_sales GROUP BY brand").sketches
    assert other[0]["applies"] is False and other[0]["reason"].startswith("signature differs")
    assert [p.version for p in service.publish("ext_top")] == [1]
    assert service.publish() == []  # nothing pending


def test_stale_and_unusable_sketches_are_not_applied(sales: tuple[Path, str], service: SketchService,
                                                     tmp_path: Path) -> None:
    lake, t = sales
    query = SQL.format(t=t)
    write_deltalake(str(lake / "ext_sales"), pa.table({"price": pa.array([5], pa.int32()),
                                                       "brand": pa.array([1], pa.int32()),
                                                       "numSold": pa.array([1], pa.int32())}), mode="append")
    stale = run_client(_pair(query), tmp_path)
    record = service.catalog.get_sketch("ext_top")
    service.catalog.mark_unusable(record.id, "a test marked it")
    publisher.publish_latest(service.catalog, service.settings, "ext_top")
    unusable = run_client(_pair(query.replace(t, f"{t} VERSION AS OF 9")), tmp_path)
    for on, off in (stale, unusable):
        assert on["applied"] == [] and on["rows"] == off["rows"]


def test_the_signature_does_not_depend_on_common_subexpression_ids(sales: tuple[Path, str],
                                                                   service: SketchService) -> None:
    lake, _ = sales
    tables = {"ext_sales": str(lake / "ext_sales")}
    sql = "SELECT brand FROM ext_sales WHERE price BETWEEN 3 AND 7 OR numSold NOT BETWEEN 1 AND 2"
    first, second = (signature.raw_signature(service.spark, sql, tables) for _ in range(2))
    assert "CommonExpressionId" not in json.dumps(first["tree"])
    assert first["hash"] == second["hash"] and not first.get("unmatchable")
    other = signature.raw_signature(service.spark, sql.replace("price BETWEEN", "brand BETWEEN"), tables)
    assert other["hash"] != first["hash"]


def test_a_window_frame_is_matchable_and_the_clock_is_not(sales: tuple[Path, str], service: SketchService) -> None:
    """A window's CURRENT ROW bound is part of the plan, not a reading of the present; CURRENT_DATE is."""
    lake, _ = sales
    tables = {"ext_sales": str(lake / "ext_sales")}
    ranked = ("SELECT x.brand, x.price FROM (SELECT brand, price, ROW_NUMBER() OVER (PARTITION BY brand ORDER BY "
              "price DESC) AS rn FROM ext_sales) x WHERE x.rn <= 1")
    framed = ("SELECT brand, SUM(price) OVER (PARTITION BY brand ORDER BY price ROWS BETWEEN UNBOUNDED PRECEDING AND "
              "CURRENT ROW) AS s FROM ext_sales")
    for sql in (ranked, framed):
        assert not signature.raw_signature(service.spark, sql, tables).get("unmatchable"), sql
    dated = signature.raw_signature(
        service.spark, "SELECT brand FROM ext_sales WHERE current_date() > DATE'2020-01-01'", tables
    )
    assert "time-dependent" in str(dated.get("unmatchable"))

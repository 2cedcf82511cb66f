"""Maintenance on commit against a running Airflow (api-server, scheduler, DAG processor and triggerer on
127.0.0.1, started once for this module): commits made with delta-rs and with Delta's Spark writer are maintained by
``imp_maintain_on_commit`` without any manual trigger; the asset events carry the versions; a burst coalesces; a
sketch of two tables is maintained once per run; a restarted triggerer loses no version; dropped and unregistered
tables stop their watch; the maintenance tasks' OpenLineage events name the tables and sketches at their versions.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.airflow.conftest import APPLE_ROW, AirflowServer, Imp, start_airflow, tail

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.postgres, pytest.mark.slow]

DAG = "imp_maintain_on_commit"
STACK = ("api-server", "scheduler", "dag-processor", "triggerer")
JOIN_SQL = ("SELECT o.brand, SUM(o.price * p.numSold) AS rev FROM {a} o JOIN {b} p ON o.id = p.id "
            "GROUP BY o.brand HAVING SUM(o.price * p.numSold) > 5000")


@pytest.fixture(scope="module")
def stack(imp: Imp, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AirflowServer]:
    home = tmp_path_factory.mktemp("airflow-on-commit")
    lineage = home / "openlineage.jsonl"
    server = start_airflow(imp, home, STACK, wanted=(DAG, "imp_register_sketch"), **{
        "IMP_WATCH_INTERVAL": "1",
        "IMP_MAINTENANCE_GROUP_SIZE": "25",
        "IMP_ON_COMMIT_BATCH_SIZE": "1",  # eager: one sketch version per table version
        "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps({"type": "file", "log_file_path": str(lineage),
                                                       "append": True}),
        "AIRFLOW__OPENLINEAGE__NAMESPACE": "imp-test",
    })
    server.lineage = lineage  # type: ignore[attr-defined]
    try:
        yield server
    finally:
        server.stop()


def watch(stack: AirflowServer, imp: Imp, *tables: str) -> list[str]:
    """Reparse the DAG (the catalog's tables become watched assets) and wait until each table's trigger runs."""
    from imp_core.airflow.assets import table_uri

    uris = [table_uri(str(imp.data / t)) for t in tables]
    stack.reparse(DAG)
    deadline = time.monotonic() + 120
    while not all(f"watching {uri} " in (stack.home / "triggerer.out").read_text() for uri in uris):
        stack.check_alive()
        assert time.monotonic() < deadline, f"no watch of {uris}:\n{tail(stack.home / 'triggerer.out')}"
        time.sleep(0.5)
    return uris


def asset(stack: AirflowServer, uri: str) -> dict[str, Any]:
    r = stack.api("GET", "/api/v2/assets", params={"uri_pattern": uri, "limit": 100})
    assert r.status_code == 200, r.text
    [found] = [a for a in r.json()["assets"] if a["uri"] == uri]
    return found


def events(stack: AirflowServer, uri: str) -> list[dict[str, Any]]:
    """The asset's events. Airflow's API answers 500 while a run an event created is queued and not started (its
    response model requires the run's start date), so a 500 is asked again until the run has started."""
    params = {"asset_id": asset(stack, uri)["id"], "limit": 1000}
    deadline = time.monotonic() + 60
    while (r := stack.api("GET", "/api/v2/assets/events", params=params)).status_code == 500:
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert r.status_code == 200, f"{r.text}\n{tail(stack.home / 'api-server.out')}"
    return sorted(r.json()["asset_events"], key=lambda e: e["id"])


def trigger_versions(stack: AirflowServer, uri: str) -> list[tuple[int, int]]:
    """``(previous_version, version)`` of the trigger's events on a table asset, in order."""
    return [(e["extra"]["payload"]["previous_version"], e["extra"]["payload"]["version"])
            for e in events(stack, uri) if e["extra"].get("from_trigger")]


def runs(stack: AirflowServer) -> list[dict[str, Any]]:
    r = stack.api("GET", f"/api/v2/dags/{DAG}/dagRuns", params={"limit": 1000, "order_by": "run_after"})
    assert r.status_code == 200, r.text
    return r.json()["dag_runs"]


def wait_covered(stack: AirflowServer, imp: Imp, sketch: str, versions: dict[str, int], timeout: float = 240) -> Any:
    """Wait for a sketch version at (or past) these table versions, then for the DAG runs to finish."""
    deadline = time.monotonic() + timeout
    while True:
        latest = imp.latest(sketch)
        if all(latest.table_versions.get(t, -1) >= v for t, v in versions.items()):
            break
        stack.check_alive()
        assert time.monotonic() < deadline, (f"{sketch} still at {latest.table_versions} (want {versions}); runs: "
                                             f"{[(r['dag_run_id'], r['state']) for r in runs(stack)]}\n"
                                             f"{tail(stack.home / 'scheduler.out')}")
        time.sleep(0.5)
    while any(r["state"] in ("queued", "running") for r in runs(stack)):
        assert time.monotonic() < deadline + 120, "on-commit runs do not finish"
        time.sleep(1)
    return latest


def test_delta_rs_and_spark_commits_are_maintained_without_a_manual_trigger(imp: Imp, stack: AirflowServer,
                                                                            spark: Any) -> None:
    from imp_core.airflow.assets import sketch_uri

    imp.table("oc_sales")
    imp.sketch("oc_top", "oc_sales")
    [uri] = watch(stack, imp, "oc_sales")
    runs_before = len(runs(stack))

    imp.append("oc_sales", APPLE_ROW)  # delta-rs: version 1
    latest = wait_covered(stack, imp, "oc_top", {"oc_sales": 1})
    assert latest.fragments == {"oc_sales": [0, 1, 2, 3]} and latest.method == "incremental"
    assert trigger_versions(stack, uri) == [(0, 1)]

    # Delta's own Spark writer: version 2
    spark.createDataFrame([(8, "HP", 700, 1)], "id long, brand string, price long, numSold long") \
        .write.format("delta").mode("append").save(str(imp.data / "oc_sales"))
    wait_covered(stack, imp, "oc_top", {"oc_sales": 2})
    assert trigger_versions(stack, uri) == [(0, 1), (1, 2)]
    imp.assert_equals_recapture("oc_top")

    made = runs(stack)[runs_before:]
    assert made and all(r["run_type"] == "asset_triggered" and r["state"] == "success" for r in made), made
    runs_of_sketch = [r for r in imp.runs("oc_top") if (r.trigger or "").startswith(f"airflow:{DAG}/")]
    assert {r.trigger.split("/", 1)[1] for r in runs_of_sketch} <= {r["dag_run_id"] for r in made}
    # the sketch's asset got an event per maintenance, with the version, table versions and method
    sketch_events = [e["extra"] for e in events(stack, sketch_uri("oc_top"))]
    assert sketch_events[-1]["version"] == imp.latest("oc_top").version - 1  # (the recapture above made one more)
    assert sketch_events[-1]["table_versions"] == {"oc_sales": 2} and sketch_events[-1]["method"] == "incremental"
    assert all(e["sketch"] == "oc_top" and e["trigger"].startswith(f"airflow:{DAG}/") for e in sketch_events)

    # OpenLineage: the maintenance task's COMPLETE event reads the table at its version and writes the sketch
    lineage = [json.loads(line) for line in stack.lineage.read_text().splitlines()]  # type: ignore[attr-defined]
    done = [e for e in lineage if e.get("eventType") == "COMPLETE" and e["job"]["name"].endswith("maintain_group")
            and any(o["name"] == "oc_top" for o in e.get("outputs", []))]
    assert done, [e["job"]["name"] for e in lineage]
    last = done[-1]
    assert [(i["namespace"], i["name"], i["facets"]["version"]["datasetVersion"]) for i in last["inputs"]] == \
        [("file", str(imp.data / "oc_sales"), "2")]
    [out] = [o for o in last["outputs"] if o["name"] == "oc_top"]
    assert out["namespace"] == "imp://imp" and out["facets"]["version"]["datasetVersion"] == str(
        sketch_events[-1]["version"])
    # spark-submit got the parent-job settings, so Spark-level events link to this task; no secret on its line
    task_log = stack.task_log(DAG, made[-1]["dag_run_id"], "maintain_group", map_index=0)
    [cmd] = [line for line in task_log.splitlines() if "Spark-Submit cmd:" in line][:1]
    assert "spark.openlineage.parentJobName=" in cmd and "spark.openlineage.parentRunId=" in cmd, cmd
    assert "password" not in cmd.lower() and "IMP_CATALOG_URL=" not in cmd


def test_a_burst_coalesces_and_a_restarted_triggerer_loses_no_version(imp: Imp, stack: AirflowServer) -> None:
    imp.table("burst_sales")
    imp.sketch("burst_top", "burst_sales")
    [uri] = watch(stack, imp, "burst_sales")
    before = len(runs(stack))
    for i in range(20):
        imp.append("burst_sales", {"id": [100 + i], "brand": ["Apple"], "price": [100 + i], "numSold": [1]})
    wait_covered(stack, imp, "burst_top", {"burst_sales": 20})
    made = runs(stack)[before:]
    assert 1 <= len(made) <= 2, [(r["dag_run_id"], r["state"]) for r in made]
    assert all(r["state"] == "success" for r in made)
    # one event per version, each chained to the one before
    assert trigger_versions(stack, uri) == [(v - 1, v) for v in range(1, 21)]
    # never two runs maintaining the sketch at once: each run's maintenance of it starts after the previous ended
    mine = sorted((r for r in imp.runs("burst_top") if (r.trigger or "").startswith(f"airflow:{DAG}/")),
                  key=lambda r: r.id)
    assert all(a.finished_at <= b.started_at for a, b in zip(mine, mine[1:]))

    # the triggerer stops; versions 21..23 are committed while nobody watches; it starts again
    time.sleep(4)  # a version is recorded as reported a few seconds after its event
    stack.stop_component("triggerer")
    for i in range(3):
        imp.append("burst_sales", {"id": [200 + i], "brand": ["HP"], "price": [11 + i], "numSold": [1]})
    stack.start("triggerer")
    wait_covered(stack, imp, "burst_top", {"burst_sales": 23})
    assert trigger_versions(stack, uri) == [(v - 1, v) for v in range(1, 24)]
    assert f"watching {uri} (tables burst_sales) from version 20" in (stack.home / "triggerer.out").read_text()
    imp.assert_equals_recapture("burst_top")


def test_a_sketch_of_two_tables_is_maintained_once_per_event_set(imp: Imp, stack: AirflowServer) -> None:
    imp.table("two_orders")
    imp.table("two_parts")
    record, _ = imp.service.create_sketch("two_join", JOIN_SQL.format(a="two_orders", b="two_parts"),
                                          ["two_orders.price"], bounds=["1,601,1001,1501,10001"],
                                          trigger="test-setup")
    assert record.name == "two_join"
    watch(stack, imp, "two_orders", "two_parts")
    before = len(runs(stack))
    imp.append("two_orders", APPLE_ROW)
    imp.append("two_parts", APPLE_ROW)
    wait_covered(stack, imp, "two_join", {"two_orders": 1, "two_parts": 1})
    made = {r["dag_run_id"] for r in runs(stack)[before:]}
    assert 1 <= len(made) <= 2
    per_run: dict[str, int] = {}
    for r in imp.runs("two_join"):
        if (r.trigger or "").startswith(f"airflow:{DAG}/"):
            per_run[r.trigger.split("/", 1)[1]] = per_run.get(r.trigger.split("/", 1)[1], 0) + 1
    assert set(per_run) <= made and all(n == 1 for n in per_run.values()), per_run
    imp.assert_equals_recapture("two_join")


@pytest.mark.browser
def test_the_page_shows_freshness_in_a_browser(imp: Imp, stack: AirflowServer, browser: Any,
                                               artifacts: Path) -> None:
    from playwright.sync_api import expect

    from tests.airflow.conftest import log_in

    imp.table("pg_sales")
    record = imp.sketch("pg_top", "pg_sales")
    [uri] = watch(stack, imp, "pg_sales")
    for i in range(3):  # three maintained versions for the plot (a batch size of 1: one per table version)
        imp.append("pg_sales", {"id": [300 + i], "brand": ["Apple"], "price": [500 * (i + 1)], "numSold": [1]})
    wait_covered(stack, imp, "pg_top", {"pg_sales": 3})
    page = browser.new_page(viewport={"width": 1600, "height": 900})
    page.set_default_timeout(30_000)
    try:
        log_in(page, stack)
        # a maintainer holds the sketch's lock: the on-commit run waits for it and the page shows the sketch behind
        with imp.catalog.sketch_lock(record.id):
            imp.append("pg_sales", {"id": [310], "brand": ["HP"], "price": [900], "numSold": [2]})
            deadline = time.monotonic() + 60
            while (4 not in [v for _, v in trigger_versions(stack, uri)]
                   or not any(r["state"] == "running" for r in runs(stack))):
                assert time.monotonic() < deadline, "no event or run for version 4"
                time.sleep(0.5)
            page.goto(f"{stack.base_url}/plugin/sketch-catalog")
            row = page.frame_locator("iframe").locator('tr[data-sketch="pg_top"]')
            expect(row.locator("td.freshness")).to_contain_text("stale")
            expect(row.locator("td.freshness")).to_contain_text("1 version behind")
            expect(row.locator("td.freshness")).to_contain_text("last missed commit")
            expect(row).to_contain_text("pg_sales: 3 / 4")
            expect(row.locator("td.maintenance")).to_contain_text("v4 incremental")
            expect(row.locator("td.optimizer")).to_contain_text("not reported")
            assert row.locator("td.history svg rect").count() == 4  # capture + three maintained versions
            row.scroll_into_view_if_needed()
            page.screenshot(path=str(artifacts / "10-freshness-stale.png"))
        wait_covered(stack, imp, "pg_top", {"pg_sales": 4})
        # a driver of the Spark extension reports applying the sketch: the page reads its file (default location)
        apps = imp.data / "_imp_sketches" / "_applications"
        apps.mkdir(parents=True, exist_ok=True)
        (apps / "drv-1.json").write_text(json.dumps({"driver": "drv-1", "sketches": {"pg_top": {
            "count": 3, "last_ms": int(time.time() * 1000), "version": 4}}}))
        page.reload()
        row = page.frame_locator("iframe").locator('tr[data-sketch="pg_top"]')
        expect(row.locator("td.freshness")).to_contain_text("fresh")
        expect(row.locator("td.maintenance")).to_contain_text("v5 incremental")
        expect(row.locator("td.optimizer")).to_contain_text("3 queries (v4 last)")
        assert row.locator("td.history svg rect").count() == 5
        assert row.locator("td.history svg polyline").count() == 1
        box = row.locator("td.history svg").bounding_box()
        assert box is not None and box["width"] >= 150 and box["height"] >= 30  # drawn, not just in the HTML
        page.screenshot(path=str(artifacts / "11-freshness-fresh.png"))
    except Exception:
        page.screenshot(path=str(artifacts / "19-freshness-failure.png"))
        raise
    finally:
        page.close()


def test_dropped_and_unregistered_tables_stop_their_watch(imp: Imp, stack: AirflowServer) -> None:
    import shutil

    imp.table("gone_sales")
    imp.table("unreg_sales")
    gone, unreg = watch(stack, imp, "gone_sales", "unreg_sales")
    assert asset(stack, unreg)["watchers"] and asset(stack, gone)["watchers"]

    shutil.rmtree(imp.data / "gone_sales")
    deadline = time.monotonic() + 60
    while f"the Delta log of {gone} is gone" not in (stack.home / "triggerer.out").read_text():
        assert time.monotonic() < deadline, tail(stack.home / "triggerer.out")
        time.sleep(0.5)

    imp.service.unregister_table("unreg_sales")
    stack.reparse(DAG)
    deadline = time.monotonic() + 120
    while True:
        r = stack.api("GET", "/api/v2/assets", params={"uri_pattern": unreg, "only_active": "false"})
        found = [a for a in r.json()["assets"] if a["uri"] == unreg]
        if not found or not found[0]["watchers"]:
            break
        assert time.monotonic() < deadline, found
        time.sleep(1)
    # the dropped table's watch reports nothing more
    assert trigger_versions(stack, gone) == []


def test_registration_emits_lineage_of_the_tables_and_the_new_sketch(imp: Imp, stack: AirflowServer) -> None:
    from tests.airflow.conftest import TOP_SQL

    imp.table("lin_sales")
    imp.append("lin_sales", APPLE_ROW)
    dag = "imp_register_sketch"
    r = stack.trigger(dag, {"name": "lin_top", "sql": TOP_SQL.format(t="lin_sales"), "on": "lin_sales.price",
                            "fragments": 2})
    assert r.status_code == 200, r.text
    run_id = r.json()["dag_run_id"]
    assert stack.wait_run(dag, run_id) == "success", stack.task_log(dag, run_id, "capture_sketch")
    lineage = [json.loads(line) for line in stack.lineage.read_text().splitlines()]  # type: ignore[attr-defined]
    [done] = [e for e in lineage if e.get("eventType") == "COMPLETE" and e["job"]["name"] ==
              f"{dag}.capture_sketch" and e["run"]["facets"].get("airflow", {}).get("dagRun", {}).get("run_id",
                                                                                                    run_id) == run_id]
    assert [(i["namespace"], i["name"], i["facets"]["version"]["datasetVersion"]) for i in done["inputs"]] == \
        [("file", str(imp.data / "lin_sales"), "1")]
    assert [(o["namespace"], o["name"], o["facets"]["version"]["datasetVersion"]) for o in done["outputs"]] == \
        [("imp://imp", "lin_top", "1")]
    assert "lin_top" in imp.catalog.get_sketch("lin_top").name

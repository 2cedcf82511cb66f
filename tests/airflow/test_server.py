"""Against a running Airflow (api-server + scheduler + dag-processor on 127.0.0.1): the REST trigger the UI uses,
the task log of a refused request, and the plugin's catalog page and API behind Airflow's login."""

from __future__ import annotations

import pytest
import requests

from tests.airflow.conftest import APPLE_ROW, AirflowServer, Imp

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.postgres, pytest.mark.slow]

DAG = "imp_maintain_on_demand"


def test_rest_trigger_runs_the_maintenance(imp: Imp, airflow_server: AirflowServer) -> None:
    imp.table("rest_sales")
    imp.sketch("rest_top", "rest_sales")
    imp.append("rest_sales", APPLE_ROW)

    r = airflow_server.trigger(DAG, {"sketch": "rest_top", "strategy": "lazy", "batch_size": 500})
    assert r.status_code == 200, r.text
    run_id = r.json()["dag_run_id"]
    assert airflow_server.wait_run(DAG, run_id) == "success", airflow_server.task_log(DAG, run_id, "maintain_sketch")
    assert airflow_server.task_states(DAG, run_id) == {"validate_request": "success", "maintain_sketch": "success"}
    log = airflow_server.task_log(DAG, run_id, "maintain_sketch")
    assert "maintaining sketch rest_top (strategy lazy" in log and '"job": "maintain"' in log

    latest = imp.latest("rest_top")
    assert latest.version == 2 and latest.fragments == {"rest_sales": [0, 1, 2, 3]}
    run = imp.runs("rest_top")[0]
    assert run.trigger == f"airflow:{DAG}/{run_id}" and run.strategy == "lazy" and run.status == "succeeded"
    imp.assert_equals_recapture("rest_top")


def test_rest_trigger_with_unknown_sketch_fails_in_validation(imp: Imp, airflow_server: AirflowServer) -> None:
    runs_before = len(imp.runs())
    r = airflow_server.trigger(DAG, {"sketch": "no_such_sketch"})
    assert r.status_code == 200, r.text
    run_id = r.json()["dag_run_id"]
    assert airflow_server.wait_run(DAG, run_id) == "failed"
    assert airflow_server.task_states(DAG, run_id) == {"validate_request": "failed",
                                                       "maintain_sketch": "upstream_failed"}
    log = airflow_server.task_log(DAG, run_id, "validate_request")
    assert "no sketch named 'no_such_sketch'" in log
    assert len(imp.runs()) == runs_before

    # a negative batch size is refused by the parameter schema: no run at all
    r = airflow_server.trigger(DAG, {"sketch": "rest_top", "batch_size": -1})
    assert r.status_code == 400 and "batch_size: -1 is less than the minimum of 1" in r.text


def test_plugin_serves_the_catalog_to_logged_in_users_only(imp: Imp, airflow_server: AirflowServer) -> None:
    imp.table("page_sales")
    imp.sketch("page_top", "page_sales")
    imp.append("page_sales", APPLE_ROW)  # stale until maintained
    base = airflow_server.base_url

    for path in ("/imp/catalog", "/imp/api/sketches", "/imp/"):
        anonymous = requests.get(f"{base}{path}", timeout=30, allow_redirects=False)
        assert anonymous.status_code in (401, 403), (path, anonymous.status_code)
        forged = requests.get(f"{base}{path}", headers={"Authorization": "Bearer not-a-token"}, timeout=30)
        assert forged.status_code in (401, 403), (path, forged.status_code)

    # GETs only read: the new table version is not observed (and so not shown) until someone refreshes
    r = airflow_server.api("GET", "/imp/api/sketches")
    assert r.status_code == 200, r.text
    before = {row["name"]: row for row in r.json()["sketches"]}["page_top"]
    assert before["stale"] is False and before["current_table_versions"] == {"page_sales": 0}
    refreshed = airflow_server.api("POST", "/imp/refresh", allow_redirects=False)
    assert refreshed.status_code == 303 and refreshed.headers["location"] == "catalog"

    r = airflow_server.api("GET", "/imp/api/sketches")
    assert r.status_code == 200, r.text
    rows = {row["name"]: row for row in r.json()["sketches"]}
    page = rows["page_top"]
    assert page["stale"] is True and page["latest_version"] == 1 and page["latest_method"] == "capture"
    assert page["table_versions"] == {"page_sales": 0} and page["current_table_versions"] == {"page_sales": 1}
    assert page["partitions"] == [{"table": "page_sales", "column": "price", "fragments": 2, "fragment_count": 4,
                                   "covered_share": 0.5}]
    assert page["last_run"]["status"] == "succeeded" and page["sketch_fragments"] == 2
    # every row of the sketch_catalog view is on the page
    assert set(rows) == {row["name"] for row in imp.catalog.sketch_catalog()}

    html = airflow_server.api("GET", "/imp/catalog")
    assert html.status_code == 200 and "text/html" in html.headers["content-type"]
    assert "Sketch catalog" in html.text and 'data-sketch="page_top"' in html.text and "stale" in html.text

    plugins = airflow_server.api("GET", "/api/v2/plugins").json()["plugins"]
    [imp_plugin] = [p for p in plugins if p["name"] == "imp"]
    assert [v["url_route"] for v in imp_plugin["external_views"]] == ["sketch-catalog"]

    imp.service.maintain("page_top", trigger="test-cleanup")  # leave nothing stale for the nightly test


def test_register_dag_checks_safety_then_captures(imp: Imp, airflow_server: AirflowServer) -> None:
    from tests.airflow.conftest import TOP_SQL, UNSAFE_SQL

    imp.table("reg_sales")
    dag = "imp_register_sketch"
    # an unsafe column is refused by the check_safety task, before the capture job
    r = airflow_server.trigger(dag, {"name": "reg_bad", "sql": UNSAFE_SQL.format(t="reg_sales"),
                                     "on": "reg_sales.price", "fragments": 2})
    assert r.status_code == 200, r.text
    bad_run = r.json()["dag_run_id"]
    r = airflow_server.trigger(dag, {"name": "reg_top", "sql": TOP_SQL.format(t="reg_sales"),
                                     "on": "reg_sales.price", "fragments": 2})
    assert r.status_code == 200, r.text
    good_run = r.json()["dag_run_id"]

    assert airflow_server.wait_run(dag, bad_run) == "failed"
    assert airflow_server.task_states(dag, bad_run) == {"check_safety": "failed", "capture_sketch": "upstream_failed"}
    assert "is not safe for this query" in airflow_server.task_log(dag, bad_run, "check_safety")

    assert airflow_server.wait_run(dag, good_run) == "success", airflow_server.task_log(dag, good_run,
                                                                                         "capture_sketch")
    record = imp.catalog.get_sketch("reg_top")
    assert record.sql == TOP_SQL.format(t="reg_sales") and len(record.partitions[0]["bounds"]) == 3
    assert record.safety["safe"] is True
    [run] = imp.runs("reg_top")
    assert run.trigger == f"airflow:{dag}/{good_run}" and run.strategy == "capture" and run.status == "succeeded"
    assert imp.latest("reg_top").method == "capture"

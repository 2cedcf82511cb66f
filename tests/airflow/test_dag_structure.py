"""The DAG folder imports cleanly and each DAG has the tasks, params and schedule other tools rely on (no Spark).

The on-commit DAG reads the catalog's tables and sketches when it is parsed: the module's catalog (an embedded
Postgres under a temporary ``IMP_HOME``) has two tables registered, one local and one ``s3://`` under two names."""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.airflow.conftest import DAGS, PLUGINS

pytestmark = [pytest.mark.airflow, pytest.mark.postgres]

DAG_IDS = {"imp_nightly_maintenance", "imp_maintain_on_demand", "imp_register_sketch", "imp_maintain_on_commit"}


@pytest.fixture(scope="module", autouse=True)
def catalog(imp_settings: Any) -> Iterator[Any]:
    """The catalog the DAG files read (``IMP_HOME``), with two tables registered."""
    from imp_core.catalog import Catalog

    saved = os.environ.get("IMP_HOME")
    os.environ["IMP_HOME"] = str(imp_settings.home)
    found = Catalog.connect(imp_settings)
    for name, path in (("st_local", "/data/st local"), ("st_s3", "s3a://lake/st/"), ("st_s3_alias", "s3://lake/st")):
        found.register_table(name, path)
    try:
        yield found
    finally:
        found.close()
        if saved is None:
            os.environ.pop("IMP_HOME")
        else:
            os.environ["IMP_HOME"] = saved


def _dagbag(folder: Path = DAGS):  # noqa: ANN202
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(folder))


@pytest.fixture(scope="module")
def dagbag(catalog: Any):  # noqa: ANN201
    return _dagbag()


def _schema(dag, name: str) -> dict:  # noqa: ANN001
    return dag.params.get_param(name).schema


def test_dag_folder_imports_without_errors(dagbag) -> None:  # noqa: ANN001
    assert dagbag.import_errors == {}
    assert set(dagbag.dag_ids) == DAG_IDS


def test_nightly_maintenance(dagbag, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    from imp_core.airflow.operators import ImpConnectJobOperator
    from imp_core.jobs import SUBMIT_PATH

    dag = dagbag.dags["imp_nightly_maintenance"]
    assert dag.schedule == "0 2 * * *"
    assert dag.catchup is False and dag.max_active_runs == 1
    assert {t.task_id for t in dag.tasks} == {"relayout_tables", "list_stale_groups", "maintain_group", "summarize",
                                              "list_skewed_sketches", "repartition_sketches", "check_layout"}
    # the layout pass first; a failed pass fails the run at its own leaf task
    assert dag.get_task("relayout_tables").downstream_task_ids == {"list_stale_groups", "check_layout"}
    assert dag.get_task("check_layout").trigger_rule == "one_failed"
    # a failed layout pass does not keep the sketches from being maintained
    assert dag.get_task("list_stale_groups").trigger_rule == "all_done"
    # range split and merge after maintenance (whatever it did), as a job of its own, skipped when nothing to do
    skewed, split = dag.get_task("list_skewed_sketches"), dag.get_task("repartition_sketches")
    assert skewed.trigger_rule == "all_done" and "maintain_group" in skewed.upstream_task_ids
    assert split.upstream_task_ids == {"list_skewed_sketches"} and isinstance(split, SparkSubmitOperator)

    listing, maintain, summary = (dag.get_task(t) for t in ("list_stale_groups", "maintain_group", "summarize"))
    # dynamic task mapping: one spark-submit per group of stale sketches, expanded over the listing task's result
    assert maintain.is_mapped
    assert issubclass(maintain.operator_class, SparkSubmitOperator)
    assert "application_args" in maintain.expand_input.value
    assert "group_label(sketches_of(task.application_args))" in maintain.partial_kwargs["map_index_template"]
    default = maintain.operator_class(task_id="probe")
    assert default.application == SUBMIT_PATH and default._conn_id == "spark_default"
    assert maintain.partial_kwargs["retries"] >= 1
    assert maintain.partial_kwargs["max_active_tis_per_dag"] >= 1
    assert maintain.upstream_task_ids == {"list_stale_groups"}
    assert "maintain_group" in summary.upstream_task_ids and summary.trigger_rule == "all_done"
    assert listing.downstream_task_ids == {"maintain_group", "summarize"}
    assert _schema(dag, "batch_size")["type"] == "integer" and _schema(dag, "batch_size")["minimum"] == 1
    assert _schema(dag, "group_size")["minimum"] == 1 and dag.params["group_size"] == 25
    for name in dag.params:
        assert dag.params.get_param(name).description, f"param {name} has no description"

    # the cron, the group size and the runner come from the environment
    monkeypatch.setenv("IMP_NIGHTLY_CRON", "30 3 * * 1-5")
    monkeypatch.setenv("IMP_MAINTENANCE_GROUP_SIZE", "1")
    monkeypatch.setenv("IMP_MAINTENANCE_RUNNER", "connect")
    dag = _dagbag().dags["imp_nightly_maintenance"]
    assert dag.schedule == "30 3 * * 1-5" and dag.params["group_size"] == 1
    assert dag.get_task("maintain_group").operator_class is ImpConnectJobOperator
    monkeypatch.setenv("IMP_MAINTENANCE_RUNNER", "yarn")
    assert "IMP_MAINTENANCE_RUNNER must be one of spark-submit, connect" in str(_dagbag().import_errors)


def test_maintain_on_demand(dagbag) -> None:  # noqa: ANN001
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    dag = dagbag.dags["imp_maintain_on_demand"]
    assert dag.schedule is None  # no schedule: triggered from the UI
    assert {t.task_id for t in dag.tasks} == {"validate_request", "maintain_sketch"}
    validate, maintain = dag.get_task("validate_request"), dag.get_task("maintain_sketch")
    assert maintain.upstream_task_ids == {"validate_request"}
    assert validate.retries == 0  # a bad request fails at once
    # the job's argv is built by the validating task (one job: one sketch, or a group) and rendered as a list
    assert isinstance(maintain, SparkSubmitOperator) and dag.render_template_as_native_obj
    assert maintain.application_args == "{{ ti.xcom_pull(task_ids='validate_request') }}"

    assert list(dag.params.keys()) == ["sketch", "table", "strategy", "batch_size"]
    # either may be left empty in the form (the UI sends null for an empty field)
    assert _schema(dag, "sketch")["type"] == _schema(dag, "table")["type"] == ["null", "string"]
    pattern = re.compile(_schema(dag, "sketch")["pattern"])
    for ok in ("top", "a, b", "a,b c", ""):
        assert pattern.match(ok), ok
    for bad in ("-x", "a;b", "a, -b"):
        assert not pattern.match(bad), bad
    assert _schema(dag, "strategy")["enum"] == ["lazy", "eager", "recapture"]
    assert dag.params["strategy"] == "lazy"
    assert _schema(dag, "batch_size")["type"] == "integer" and _schema(dag, "batch_size")["minimum"] == 1
    for name in dag.params:
        assert dag.params.get_param(name).description, f"param {name} has no description"


def test_maintain_on_commit(dagbag, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    from airflow.sdk import AssetAny

    from imp_core.airflow.operators import ImpSparkSubmitOperator
    from imp_core.airflow.triggers import DeltaCommitTrigger

    dag = dagbag.dags["imp_maintain_on_commit"]
    assert dag.max_active_runs == 1 and dag.catchup is False
    assert isinstance(dag.timetable.asset_condition, AssetAny)
    assets = dag.timetable.asset_condition.objects
    # one asset per location (the session's catalog also holds other tests' tables), named by its URI, with the
    # names registered for it
    assert len({a.uri for a in assets}) == len(assets)
    table_assets = {a.uri: a for a in assets if set(a.extra["tables"]) & {"st_local", "st_s3", "st_s3_alias"}}
    assert set(table_assets) == {"file:///data/st%20local", "s3://lake/st"}
    assert table_assets["file:///data/st%20local"].extra == {"tables": ["st_local"]}
    s3 = table_assets["s3://lake/st"]
    assert s3.name == s3.uri and s3.group == "imp-table" and s3.extra == {"tables": ["st_s3", "st_s3_alias"]}
    [watcher] = s3.watchers
    assert isinstance(watcher.trigger, DeltaCommitTrigger)
    assert watcher.trigger.serialize()[1] == {"table_uri": "s3://lake/st", "tables": ["st_s3", "st_s3_alias"],
                                              "poll_seconds": 5.0}
    listing, maintain = dag.get_task("list_changed_groups"), dag.get_task("maintain_group")
    assert listing.retries == 1 and listing.execution_timeout.total_seconds() == 15 * 60
    assert maintain.upstream_task_ids == {"list_changed_groups"} and maintain.operator_class is ImpSparkSubmitOperator
    assert maintain.partial_kwargs["retry_delay"].total_seconds() == 30

    monkeypatch.setenv("IMP_ON_COMMIT", "off")  # no watchers: nothing polls
    monkeypatch.setenv("IMP_WATCH_INTERVAL", "2")
    dag = _dagbag().dags["imp_maintain_on_commit"]
    assert all(a.watchers == [] for a in dag.timetable.asset_condition.objects)
    monkeypatch.setenv("IMP_ON_COMMIT", "on")
    dag = _dagbag().dags["imp_maintain_on_commit"]
    assert {a.watchers[0].trigger.poll_seconds for a in dag.timetable.asset_condition.objects} == {2.0}
    monkeypatch.setenv("IMP_WATCH_INTERVAL", "0")
    assert "IMP_WATCH_INTERVAL must be between 0.1 and 3600 seconds" in str(_dagbag().import_errors)


def test_register_sketch(dagbag) -> None:  # noqa: ANN001
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    dag = dagbag.dags["imp_register_sketch"]
    assert dag.schedule is None
    assert {t.task_id for t in dag.tasks} == {"check_safety", "capture_sketch"}
    capture = dag.get_task("capture_sketch")
    assert isinstance(capture, SparkSubmitOperator) and capture.upstream_task_ids == {"check_safety"}
    assert capture.application_args[0] == "register"
    assert "--sql={{ params.sql }}" in capture.application_args  # SQL may start with '--' (a comment)
    assert {"name", "sql", "on", "fragments"} <= set(dag.params.keys())
    assert _schema(dag, "fragments")["minimum"] == 1
    on = re.compile(_schema(dag, "on")["pattern"])
    assert on.match("auto") and on.match("sales.price") and not on.match("sales") and not on.match("auto.x;y")


@pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`")
def test_plugin_registers_page_and_protects_every_route() -> None:
    from airflow.api_fastapi.core_api.security import get_user
    from fastapi.routing import APIRoute
    from fastapi.testclient import TestClient

    spec = importlib.util.spec_from_file_location("imp_plugin_under_test", PLUGINS / "imp_plugin.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    plugin = module.ImpPlugin
    assert plugin.name == "imp"
    [app] = plugin.fastapi_apps
    assert app["url_prefix"] == "/imp"
    [view] = plugin.external_views
    # relative: the UI resolves it against its base URL
    assert view["url_route"] == "sketch-catalog" and view["href"] == "imp/catalog" and view["name"] == "Sketch catalog"

    def depends_on_login(dependant) -> bool:  # noqa: ANN001
        return any(d.call is get_user or depends_on_login(d) for d in dependant.dependencies)

    routes = [r for r in app["app"].routes if isinstance(r, APIRoute)]
    assert {r.path for r in routes} >= {"/catalog", "/api/sketches", "/refresh"}
    for route in routes:
        assert depends_on_login(route.dependant), f"{route.path} is not protected"
    assert {m for r in routes if r.path == "/refresh" for m in r.methods} == {"POST"}
    client = TestClient(app["app"])
    for path in ("/catalog", "/api/sketches", "/"):
        assert client.get(path).status_code == 401
    assert client.post("/refresh").status_code == 401
    assert client.get("/docs").status_code == 404  # no unauthenticated OpenAPI pages either

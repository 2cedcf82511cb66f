"""End to end with real Airflow: ``airflow dags test`` -> SparkSubmitOperator -> spark-submit -> job -> catalog."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.airflow.conftest import APPLE_ROW, APPLE_ROW_2, COUNT_SQL, AirflowCli, Imp

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.postgres, pytest.mark.slow]

SPARK_SUBMIT_STARTED = "Spark-Submit cmd:"  # what the provider's hook logs before it runs spark-submit


def run_id_of(output: str, dag_id: str) -> str:
    found = re.findall(rf"airflow:{dag_id}/(manual__[^\s\"',]+)", output)
    assert found, f"no trigger with a run id for {dag_id} in the output"
    return found[0]


def test_on_demand_maintenance_commits_a_version_equal_to_a_recapture(imp: Imp, airflow_cli: AirflowCli) -> None:
    imp.table("od_sales")
    imp.sketch("od_top", "od_sales")
    assert imp.latest("od_top").fragments == {"od_sales": [0, 1]}
    imp.append("od_sales", APPLE_ROW)
    imp.append("od_sales", APPLE_ROW_2)

    done = airflow_cli.dags_test("imp_maintain_on_demand", {"sketch": "od_top", "strategy": "eager",
                                                             "batch_size": 1})
    assert done.returncode == 0, done.stdout[-5000:]
    assert SPARK_SUBMIT_STARTED in done.stdout and "imp_core/jobs/submit.py maintain --sketch=od_top" in done.stdout
    summaries = [json.loads(m) for m in re.findall(r'(\{"job": "maintain".*?\}) \[airflow', done.stdout)]
    assert summaries and summaries[-1]["versions"] == [2, 3]

    latest = imp.latest("od_top")
    assert latest.version == 3 and latest.method == "incremental"
    assert dict(latest.table_versions) == {"od_sales": 2}
    assert latest.fragments == {"od_sales": [0, 1, 2, 3]}  # Apple's revenue passed 5000
    run = imp.runs("od_top")[0]
    assert run.status == "succeeded" and run.strategy == "eager"
    assert run.trigger == f"airflow:imp_maintain_on_demand/{run_id_of(done.stdout, 'imp_maintain_on_demand')}"
    imp.assert_equals_recapture("od_top")


def test_nightly_maintenance_maintains_every_stale_sketch(imp: Imp, airflow_cli: AirflowCli) -> None:
    imp.table("nt_sales")
    imp.sketch("nt_top", "nt_sales")
    imp.sketch("nt_count", "nt_sales", sql=COUNT_SQL)
    before = {name: imp.latest(name).version for name in ("nt_top", "nt_count")}
    assert imp.latest("nt_count").fragments == {"nt_sales": [0, 1, 2]}  # Lenovo and HP sold twice
    imp.append("nt_sales", APPLE_ROW)

    done = airflow_cli.dags_test("imp_nightly_maintenance")
    assert done.returncode == 0, done.stdout[-5000:]
    assert re.search(r"layout: table nt_sales: sketched scans cost \d+% more than clustered, "
                     r"(below the threshold \(50%\)|fewer than 8 files)", done.stdout), \
        "\n".join(line for line in done.stdout.splitlines() if "layout:" in line or "rror" in line)
    [listed] = re.findall(r"stale sketches: ([\w, ]+)", done.stdout)
    stale = {name.strip() for name in listed.split(",")}
    assert {"nt_top", "nt_count"} <= stale  # (other tests leave nothing stale, but do not rely on it)
    # one job for the group (every stale sketch fits in the default group of 25), its task named by its sketches
    # (a repartition job may follow for a skewed sketch another test left behind)
    submits = [line for line in done.stdout.splitlines() if SPARK_SUBMIT_STARTED in line]
    assert len([line for line in submits if "imp_core/jobs/submit.py maintain-group --sketch=" in line]) == 1, submits
    assert all("submit.py maintain-group" in line or "submit.py repartition" in line for line in submits), submits
    assert f"this job's sketches: {len(stale)} succeeded, 0 failed" in done.stdout
    trigger = f"airflow:imp_nightly_maintenance/{run_id_of(done.stdout, 'imp_nightly_maintenance')}"

    for name in ("nt_top", "nt_count"):
        latest = imp.latest(name)
        assert latest.version == before[name] + 1 and dict(latest.table_versions) == {"nt_sales": 1}
        run = imp.runs(name)[0]
        assert (run.trigger, run.strategy, run.status) == (trigger, "eager", "succeeded")
    assert imp.latest("nt_count").fragments == {"nt_sales": [0, 1, 2, 3]}  # now Apple too
    assert imp.latest("nt_top").fragments == {"nt_sales": [0, 1, 2, 3]}
    # the summary task reads the report back from the catalog
    report = imp.service.run_report(trigger, ["nt_top", "nt_count"])
    assert report["failed"] == [] and {"nt_top", "nt_count"} <= set(report["succeeded"])
    ours = [r for r in report["runs"] if r["sketch"] in ("nt_top", "nt_count")]
    assert [(r["versions_made"], r["delta_rows"]) for r in ours] == [(1, 1), (1, 1)]
    assert f"maintained {len(stale)} sketch(es)" in done.stdout
    # range split and merge comes last; these sketches' ranges hold within the factor (rows tracked since capture)
    assert "nt_top" not in imp.service.skewed_sketches() and "nt_count" not in imp.service.skewed_sketches()
    assert re.search(r"nothing to split or merge|sketch\(es\) to repartition", done.stdout), done.stdout[-3000:]
    for name in ("nt_top", "nt_count"):
        imp.assert_equals_recapture(name)


def test_bad_parameters_fail_before_any_spark_submit(imp: Imp, airflow_cli: AirflowCli) -> None:
    runs_before = len(imp.runs())

    done = airflow_cli.dags_test("imp_maintain_on_demand", {"sketch": "no_such_sketch"})
    assert done.returncode != 0
    # the validate_request task's log says what is wrong and which sketches exist
    assert "AirflowFailException: no sketch named 'no_such_sketch' (existing sketches:" in done.stdout
    assert SPARK_SUBMIT_STARTED not in done.stdout
    assert re.search(r"\[DAG TEST\] end task task_id=validate_request", done.stdout)
    assert "[DAG TEST] starting task_id=maintain_sketch" not in done.stdout

    # a negative batch size never makes a run: the parameter's schema (minimum 1) rejects it at trigger time
    done = airflow_cli.dags_test("imp_maintain_on_demand", {"sketch": "od_top", "batch_size": -1})
    assert done.returncode != 0
    assert "Invalid input for param batch_size: -1 is less than the minimum of 1" in done.stdout
    assert SPARK_SUBMIT_STARTED not in done.stdout and "[DAG TEST] starting task_id" not in done.stdout

    assert len(imp.runs()) == runs_before  # nothing reached the catalog


def test_validate_task_rejects_bad_batch_sizes_itself(imp: Imp) -> None:
    """Defence in depth for runs whose params bypass the form (the check the validate task makes)."""
    from imp_core.errors import NotFoundError, UsageError

    imp.table("val_sales")
    imp.sketch("val_top", "val_sales")
    for bad in (-1, 0, "10", 2.5, True):
        with pytest.raises(UsageError, match="batch size must be an integer of at least 1"):
            imp.service.check_maintenance_request("val_top", "eager", bad)
    with pytest.raises(UsageError, match="strategy must be one of lazy, eager, recapture"):
        imp.service.check_maintenance_request("val_top", "fast", 10)
    with pytest.raises(NotFoundError, match="no sketch named 'nope'"):
        imp.service.check_maintenance_request("nope", "eager", 10)
    ok = imp.service.check_maintenance_request("val_top", "eager", 10)
    assert ok == {"sketch": "val_top", "strategy": "eager", "batch_size": 10, "stale": False}


def test_on_demand_group_with_a_failing_sketch(imp: Imp, airflow_cli: AirflowCli) -> None:
    """Several sketches in one job: the failing one is recorded, the others commit, and the task fails at the end."""

    imp.table("grp_sales")
    bad_path = imp.table("grp_other")
    imp.sketch("grp_top", "grp_sales")
    imp.sketch("grp_count", "grp_sales", sql=COUNT_SQL)
    imp.sketch("grp_bad", "grp_other")
    imp.append("grp_sales", APPLE_ROW)
    imp.append("grp_other", APPLE_ROW)
    for f in Path(bad_path).glob("*.parquet"):  # files removed outside Delta: grp_bad cannot be maintained
        f.unlink()
    before = {name: imp.latest(name).version for name in ("grp_top", "grp_count", "grp_bad")}

    done = airflow_cli.dags_test("imp_maintain_on_demand", {"sketch": "grp_top, grp_bad grp_count"})
    assert done.returncode != 0
    assert "maintain-group --sketch=grp_top --sketch=grp_bad --sketch=grp_count" in done.stdout
    assert "1 of 3 sketches failed" in done.stdout and "a data file of a table is missing" in done.stdout
    assert "this job's sketches: 2 succeeded, 1 failed" in done.stdout
    for name in ("grp_top", "grp_count"):
        assert imp.latest(name).version == before[name] + 1
        imp.assert_equals_recapture(name)
    assert imp.latest("grp_bad").version == before["grp_bad"]
    [run] = imp.runs("grp_bad")[:1]
    assert run.status == "failed" and "a data file of a table is missing" in run.error
    assert run.trigger.startswith("airflow:imp_maintain_on_demand/")

    # a table instead of sketches: its stale sketches (none left here) make no job
    done = airflow_cli.dags_test("imp_maintain_on_demand", {"table": "grp_sales"})
    assert done.returncode == 0, done.stdout[-3000:]
    assert "table grp_sales has no stale sketch: nothing to maintain" in done.stdout
    assert SPARK_SUBMIT_STARTED not in done.stdout

"""Nothing waits without limit (finding 6 of issue 15).

The review found that ``imp query`` waited without limit on a maintainer's advisory lock, so a long recapture
stalled every query of its sketch, and that the DAGs' tasks had no ``execution_timeout``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator

import pytest

from imp_core.maintenance.service import SketchService
from tests.security.conftest import REPO, TOP_SQL, Lab

pytestmark = [pytest.mark.postgres, pytest.mark.spark]

SKETCH_LOCK_NAMESPACE = 0x696D7073  # the catalog's advisory lock namespace for sketches ("imps")
APPLE_ROW = {"id": [6], "brand": ["Apple"], "price": [1500], "numSold": [3]}


@pytest.fixture
def held_lock(lab: Lab) -> Iterator[callable]:
    """Hold a sketch's maintenance lock from another session, as a maintainer in the middle of a long run does."""
    conn = lab.catalog.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
    held: list[int] = []

    def hold(sketch_id: int) -> None:
        import sqlalchemy as sa

        conn.execute(sa.text("SELECT pg_advisory_lock(:ns, :s)"), {"ns": SKETCH_LOCK_NAMESPACE, "s": sketch_id})
        held.append(sketch_id)

    yield hold
    conn.invalidate()  # the server drops the session's locks with it
    conn.close()


def test_query_runs_without_waiting_for_a_busy_maintainer(lab: Lab, held_lock) -> None:  # noqa: ANN001
    lab.table("wait_sales")
    record = lab.sketch("wait_top", "wait_sales")
    sql = TOP_SQL.format(t="wait_sales")
    held_lock(record.id)
    patient = SketchService(
        dataclasses.replace(lab.service.settings, query_wait=1.0), catalog=lab.catalog, spark=lab.service.spark
    )

    # the sketch is fresh: its committed version is used as it is (had the query asked for the lock, it would
    # have given up after a second and run without the sketch)
    fresh = patient.query(sql)
    assert fresh.sketch == {"name": "wait_top", "version": 1}

    # the sketch is stale and its maintainer busy: after IMP_QUERY_WAIT the query runs without it, correctly
    lab.append("wait_sales", APPLE_ROW)
    stale = lab.imp_here("query", sql, "--json", env={"IMP_QUERY_WAIT": "2"})  # another catalog session waits
    assert stale.returncode == 0, stale.stderr
    out = json.loads(stale.stdout)
    assert out["sketch"] is None
    assert any("being maintained by another process" in n for n in out["notes"]), out["notes"]
    truth = lab.service.query(sql, use_sketch=False)
    assert sorted(map(tuple, out["rows"])) == sorted(map(tuple, truth.rows))
    assert sorted(r[0] for r in truth.rows) == ["Apple", "HP"]

    # the same from the Python API
    from imp_core.use.api import sketched_sql

    df = sketched_sql(lab.service.spark, sql, settings=patient.settings)
    assert sorted(r[0] for r in df.collect()) == ["Apple", "HP"]


@pytest.mark.airflow
def test_every_dag_task_has_an_execution_timeout() -> None:
    from airflow.dag_processing.dagbag import DagBag

    dags = DagBag(dag_folder=str(REPO / "dags")).dags
    assert set(dags) >= {"imp_nightly_maintenance", "imp_maintain_on_demand", "imp_register_sketch"}
    for dag in dags.values():
        for task in dag.tasks:
            timeout = getattr(task, "execution_timeout", None) or getattr(task, "partial_kwargs", {}).get(
                "execution_timeout"
            )
            assert timeout is not None, f"{dag.dag_id}.{task.task_id} can run forever"
            assert timeout.total_seconds() > 0

"""Operator state is a bag on both paths: rows identical in every kept column, a NOT IN over an aggregation.

Each change is followed by its own maintenance job (the state saved to the catalog and the Delta tables, then loaded
again), on the default budget and with every external-capable operator's state in Delta tables
(``IMP_STATE_MEMORY_BUDGET=0``). After every job Spark's answer with the sketch equals its answer without one; after
the last, the maintained sketch equals a recapture's (a recapture in between would start the state afresh). Also:
strings under a non-binary collation are refused at registration.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from tests.oracles import answers_with_and_without_sketch, canonical

pytestmark = [pytest.mark.spark, pytest.mark.postgres, pytest.mark.slow]

CDF = {"delta.enableChangeDataFeed": "true"}
BUDGETS = {"default": None, "outside": 0}


@pytest.fixture(params=sorted(BUDGETS))
def budgeted(request, service, monkeypatch):  # noqa: ANN001, ANN201
    """The service on the default state budget, and one that keeps external-capable state in Delta tables (as
    ``IMP_STATE_MEMORY_BUDGET=0`` does), with its budget's name."""
    from imp_core.config import ENV_STATE_BUDGET, Settings
    from imp_core.maintenance.service import SketchService

    if BUDGETS[request.param] is None:
        monkeypatch.delenv(ENV_STATE_BUDGET, raising=False)
        return service, request.param
    monkeypatch.setenv(ENV_STATE_BUDGET, str(BUDGETS[request.param]))
    budget = Settings.from_env().state_budget
    assert budget == 0
    return SketchService(
        replace(service.settings, state_budget=budget), catalog=service.catalog, spark=service.spark
    ), request.param


def _fragments(svc, name: str) -> list[list[int]]:  # noqa: ANN001
    return [p["fragments"] for p in svc.describe(name)["partitions"]]


def _placed(svc, name: str) -> dict[str, str]:  # noqa: ANN001
    return {s["operator"]: s["where"] for s in svc.describe(name)["state"]}


def _answers_alike(svc, sql: str, step: str) -> list[tuple[object, ...]]:  # noqa: ANN001
    """Spark's answer with the sketch equals its answer without one; that answer."""
    with_sketch, without = answers_with_and_without_sketch(svc, sql)
    assert with_sketch.sketch is not None, step
    assert canonical(with_sketch.rows) == canonical(without.rows), step
    return canonical(without.rows)


def _jobs(svc, name: str, sql: str, steps: list[tuple[str, Callable[[], None]]]) -> list[tuple[object, ...]]:  # noqa: ANN001
    """Each step's change, then its own maintenance job (incremental, not a recapture), then Spark's answers with
    and without the sketch; at the end a recapture reaches the maintained sketch (not before: a recapture starts
    the state afresh). The last answer."""
    answer = _answers_alike(svc, sql, "capture")
    for label, apply in steps:
        apply()
        result = svc.maintain(name, strategy="lazy", allow_recapture=False)
        assert result.recaptured is None, (label, result.recaptured)
        answer = _answers_alike(svc, sql, label)
    maintained = _fragments(svc, name)
    svc.recapture(name)
    assert _fragments(svc, name) == maintained
    return answer


RANKED = (
    "SELECT x.g, x.v FROM (SELECT g, v, ROW_NUMBER() OVER (PARTITION BY g ORDER BY v DESC) AS rn FROM {t}) x "
    "WHERE x.rn <= 1"
)


def test_a_ranking_keeps_both_copies_of_a_row_identical_in_every_kept_column(budgeted, tmp_path: Path) -> None:  # noqa: ANN001
    """Group 1 holds (g=1, v=10) twice (other ids): one job deletes one copy, the next the other and inserts
    (g=1, v=5), which then ranks first."""
    svc, budget = budgeted
    name = f"rank_{budget}"
    uri = str(tmp_path / name)
    write_deltalake(
        uri,
        pa.table(
            {
                "id": pa.array([1, 2, 3, 4], pa.int64()),
                "g": pa.array([1, 1, 2, 2], pa.int64()),
                "v": pa.array([10, 10, 30, 70], pa.int64()),
            }
        ),
        configuration=CDF,
    )
    svc.register_table(name, uri, replace=True)
    sql = RANKED.format(t=name)
    svc.create_sketch(name, sql, [f"{name}.v"], bounds=["0,4,8,12,100"])
    if budget == "outside":
        assert "external" in _placed(svc, name).values()

    def second() -> None:
        DeltaTable(uri).delete("id = 2")
        write_deltalake(
            uri,
            pa.table({"id": pa.array([5], pa.int64()), "g": pa.array([1], pa.int64()), "v": pa.array([5], pa.int64())}),
            mode="append",
        )

    answer = _jobs(
        svc,
        name,
        sql,
        [("delete one copy", lambda: DeltaTable(uri).delete("id = 1")), ("delete the other, insert v=5", second)],
    )
    assert answer == [(1, 5), (2, 70)]


NOT_EXISTS = (
    "SELECT {t}.g, COUNT(*) AS n FROM {t} WHERE NOT EXISTS (SELECT 1 FROM {s} WHERE {s}.k = {t}.k) "
    "GROUP BY {t}.g HAVING COUNT(*) <= 1"
)


def test_an_anti_join_keeps_both_copies_of_a_blocked_row(budgeted, tmp_path: Path) -> None:  # noqa: ANN001
    """Two left rows identical in every kept column, blocked by ``s.k = 7``: one job deletes one of them, the next
    the blocking row, after which group 1 has one row."""
    svc, budget = budgeted
    t, s = f"anti_t_{budget}", f"anti_s_{budget}"
    t_uri, s_uri = str(tmp_path / t), str(tmp_path / s)
    write_deltalake(
        t_uri,
        pa.table(
            {
                "id": pa.array([1, 2, 3], pa.int64()),
                "g": pa.array([1, 1, 2], pa.int64()),
                "k": pa.array([7, 7, 8], pa.int64()),
            }
        ),
        configuration=CDF,
    )
    write_deltalake(s_uri, pa.table({"k": pa.array([7, 9], pa.int64())}), configuration=CDF)
    svc.register_table(t, t_uri, replace=True)
    svc.register_table(s, s_uri, replace=True)
    sql = NOT_EXISTS.format(t=t, s=s)
    name = f"anti_{budget}"
    svc.create_sketch(name, sql, [f"{t}.g"], bounds=["0,1,2,3,100"])
    if budget == "outside":
        assert "external" in _placed(svc, name).values()
    answer = _jobs(
        svc,
        name,
        sql,
        [
            ("delete one copy", lambda: DeltaTable(t_uri).delete("id = 1")),
            ("delete the blocking row", lambda: DeltaTable(s_uri).delete("k = 7")),
        ],
    )
    assert answer == [(1, 1), (2, 1)]


NOT_IN_HAVING = (
    "SELECT {t}.g, COUNT(*) AS n FROM {t} WHERE {t}.k NOT IN (SELECT {s}.k FROM {s} GROUP BY {s}.k "
    "HAVING SUM({s}.x) > 1.5) GROUP BY {t}.g"
)


def test_a_not_in_over_an_aggregation_registers_and_is_maintained(budgeted, tmp_path: Path) -> None:  # noqa: ANN001
    """The subquery's rows come from an aggregation computed in the process: the NOT IN sees them at the capture
    (its gate is not moved by rows arriving later), and changes that move keys into and out of the subquery are
    maintained."""
    svc, budget = budgeted
    t, s = f"nih_t_{budget}", f"nih_s_{budget}"
    t_uri, s_uri = str(tmp_path / t), str(tmp_path / s)
    write_deltalake(
        t_uri,
        pa.table(
            {
                "id": pa.array(range(6), pa.int64()),
                "g": pa.array([1, 1, 2, 2, 3, 3], pa.int64()),
                "k": pa.array([1, 2, 3, 4, 5, 6], pa.int64()),
            }
        ),
        configuration=CDF,
    )
    write_deltalake(
        s_uri,
        pa.table({"k": pa.array([1, 1, 3, 5], pa.int64()), "x": pa.array([1.0, 1.0, 0.5, 2.5], pa.float64())}),
        configuration=CDF,
    )
    svc.register_table(t, t_uri, replace=True)
    svc.register_table(s, s_uri, replace=True)
    sql = NOT_IN_HAVING.format(t=t, s=s)
    name = f"nih_{budget}"
    svc.create_sketch(name, sql, [f"{t}.g"], bounds=["0,1,2,3,4,100"])

    def gain() -> None:  # key 3 reaches the subquery, key 1 leaves it
        write_deltalake(
            s_uri, pa.table({"k": pa.array([3], pa.int64()), "x": pa.array([1.5], pa.float64())}), mode="append"
        )
        DeltaTable(s_uri).delete("k = 1")

    answer = _jobs(
        svc,
        name,
        sql,
        [
            ("keys in and out", gain),
            ("key 5 leaves", lambda: DeltaTable(s_uri).update(updates={"x": "0.1"}, predicate="k = 5")),
        ],
    )
    assert answer == [(1, 2), (2, 1), (3, 2)]


def _collated_table(uri: str) -> None:
    """A Delta table whose column ``n`` holds strings under ``UTF8_LCASE`` as Delta records it (the field's
    ``__COLLATIONS`` metadata): written by delta-rs, the collation set in its log (the connector this project pins
    does not write collated columns yet)."""
    write_deltalake(
        uri,
        pa.table({"id": pa.array([1, 2, 3], pa.int64()), "n": ["a", "A", "b"], "v": pa.array([1, 2, 3], pa.int64())}),
        configuration=CDF,
    )
    log = Path(uri) / "_delta_log" / f"{0:020d}.json"
    actions = [json.loads(line) for line in log.read_text().splitlines()]
    for action in actions:
        if "metaData" in action:
            schema = json.loads(action["metaData"]["schemaString"])
            for f in schema["fields"]:
                if f["name"] == "n":
                    f["metadata"] = {"__COLLATIONS": {"n": "spark.UTF8_LCASE.75.1"}}
            action["metaData"]["schemaString"] = json.dumps(schema)
    log.write_text("".join(json.dumps(a) + "\n" for a in actions))


def test_a_key_under_a_non_binary_collation_is_refused_at_registration(service, tmp_path: Path) -> None:  # noqa: ANN001
    """Spark groups ``STRING COLLATE UTF8_LCASE`` values case-insensitively, the engine byte-wise: a sketch of a query
    reading such a column is refused with one line naming the collation (before any capture); one that does not read
    it passes the check. A ``COLLATE`` in the SQL is refused alike."""
    from imp_core.errors import UnsupportedError

    uri = str(tmp_path / "collated")
    _collated_table(uri)
    service.register_table("collated", uri, replace=True)
    sql = "SELECT n, SUM(v) AS s FROM collated GROUP BY n HAVING SUM(v) > 2"
    with pytest.raises(
        UnsupportedError, match=r"table collated: column collations are not supported \(n \(.*UTF8_LCASE"
    ) as e:
        service.create_sketch("collated_n", sql, ["collated.id"], bounds=["0,2,4"])
    assert "\n" not in str(e.value)
    assert all(r["name"] != "collated_n" for r in service.sketch_list())
    by_id = "SELECT id, SUM(v) AS s FROM collated GROUP BY id HAVING SUM(v) > 1"
    assert service.check_registration("collated_id", by_id, ["collated.id"], bounds=["0,2,4"])["name"] == "collated_id"
    with pytest.raises(UnsupportedError, match="collation UTF8_LCASE"):
        service.check_registration(
            "collated_c",
            "SELECT id, v FROM collated WHERE n COLLATE UTF8_LCASE = 'a'",
            ["collated.id"],
            bounds=["0,2,4"],
        )

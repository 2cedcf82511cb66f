"""UNION ALL below an aggregation with HAVING, end to end on real Spark, Delta (delta-rs) tables and the catalog:
captured on Spark, maintained incrementally through inserts and deletes into each input, and then equal to a
recapture and to the fragments DuckDB finds the answer depends on; the query over the sketch returns Spark's answer
without it. Two tables (a sketch on both), and a self-union of one table (one filter placed on both branches)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from tests.oracles import answers_with_and_without_sketch, canonical, duck, fragments_of, snapshot

pytestmark = [pytest.mark.spark, pytest.mark.postgres]

CDF = {"delta.enableChangeDataFeed": "true"}
BOUNDS = [0, 10, 20, 30, 40]


def _fragments(service, name: str) -> dict[str, list[int]]:  # noqa: ANN001
    return {p["table"]: p["fragments"] for p in service.describe(name)["partitions"]}


def _table(path: Path, ids: list[int], g: list[int], v: list[int]) -> None:
    write_deltalake(str(path), pa.table({"id": ids, "g": g, "v": v}), configuration=CDF)


def test_union_of_two_tables_under_having_is_maintained_like_a_recapture(service, tmp_path: Path) -> None:  # noqa: ANN001
    a, b = "union_a", "union_b"
    # g 1: 4 + 5 (a) + 3 (b) = 12 passes; g 2: 6 (a) does not; g 3: 20 (b) passes
    _table(tmp_path / a, [0, 1, 12], [1, 1, 2], [4, 5, 6])
    _table(tmp_path / b, [5, 25], [1, 3], [3, 20])
    for t in (a, b):
        service.register_table(t, str(tmp_path / t), replace=True)
    sql = f"SELECT g, SUM(v) AS s FROM (SELECT g, v FROM {a} UNION ALL SELECT g, v FROM {b}) u GROUP BY g " \
          f"HAVING SUM(v) > 10"
    service.create_sketch("union_two", sql, [f"{a}.id", f"{b}.id"], bounds=[",".join(map(str, BOUNDS))] * 2)
    assert _fragments(service, "union_two") == _truth(tmp_path, a, b) == {a: [0], b: [0, 2]}

    ta, tb = DeltaTable(str(tmp_path / a)), DeltaTable(str(tmp_path / b))
    changes = [
        # g 2 reaches 6 + 7 = 13 through b: a's row 12 (fragment 1) and b's new row 35 (fragment 3) enter
        lambda: write_deltalake(str(tmp_path / b), pa.table({"id": [35], "g": [2], "v": [7]}), mode="append"),
        # a's 5 leaves g 1: 4 + 3 = 7, g 1 leaves the answer (a's fragment 0, b's fragment 0)
        lambda: ta.delete("id = 1"),
        # g 1 is back in the answer through a new row of a: 4 + 3 + 9 = 16 (a's fragment 2 joins)
        lambda: write_deltalake(str(tmp_path / a), pa.table({"id": [22], "g": [1], "v": [9]}), mode="append"),
        # b's 20 goes: g 3 leaves the answer
        lambda: tb.delete("id = 25"),
    ]
    for change in changes:
        change()
    result = service.maintain("union_two", strategy="eager", batch_size=1)
    assert result.recaptured is None and len(result.versions) == len(changes)

    maintained = _fragments(service, "union_two")
    assert maintained == _truth(tmp_path, a, b) == {a: [0, 1, 2], b: [0, 3]}
    expected = duck("SELECT g, SUM(v) FROM (SELECT g, v FROM a UNION ALL SELECT g, v FROM b) GROUP BY g "
                    "HAVING SUM(v) > 10", a=snapshot(str(tmp_path / a)), b=snapshot(str(tmp_path / b)))
    with_sketch, without = answers_with_and_without_sketch(service, sql)
    assert with_sketch.sketch is not None
    assert canonical(with_sketch.rows) == canonical(without.rows) == canonical(expected) == [(1, 16), (2, 13)]

    service.recapture("union_two")
    assert _fragments(service, "union_two") == maintained
    service.drop_sketch("union_two")


def _truth(tmp_path: Path, a: str, b: str) -> dict[str, list[int]]:
    tables = {"a": snapshot(str(tmp_path / a)), "b": snapshot(str(tmp_path / b))}
    groups = "(SELECT g FROM (SELECT g, v FROM a UNION ALL SELECT g, v FROM b) GROUP BY g HAVING SUM(v) > 10)"
    return {a: fragments_of((r[0] for r in duck(f"SELECT id FROM a WHERE g IN {groups}", **tables)), BOUNDS),
            b: fragments_of((r[0] for r in duck(f"SELECT id FROM b WHERE g IN {groups}", **tables)), BOUNDS)}


def test_self_union_is_maintained_like_a_recapture(service, tmp_path: Path) -> None:  # noqa: ANN001
    name = "union_self"
    path = tmp_path / name
    # branch 1: v > 5, branch 2: v < 0; g 1: 8 - 9 = -1; g 2: 7 + 9 = 16 passes (fragments 1, 2); 3 is in neither
    _table(path, [0, 1, 12, 25, 30], [1, 1, 2, 2, 2], [8, -9, 7, 9, 3])
    service.register_table(name, str(path), replace=True)
    sql = f"SELECT g, SUM(v) AS s FROM (SELECT g, v FROM {name} WHERE v > 5 UNION ALL " \
          f"SELECT g, v FROM {name} WHERE v < 0) u GROUP BY g HAVING SUM(v) > 10"
    service.create_sketch(name, sql, [f"{name}.g"], bounds=["0,2,4"])
    assert _fragments(service, name) == {name: [1]}

    table = DeltaTable(str(path))
    write_deltalake(str(path), pa.table({"id": [2], "g": [1], "v": [20]}), mode="append")  # g 1: 19 enters
    table.delete("id = 12")  # g 2: 9 leaves
    result = service.maintain(name, strategy="eager", batch_size=1)
    assert result.recaptured is None and len(result.versions) == 2
    assert _fragments(service, name) == {name: [0]}
    with_sketch, without = answers_with_and_without_sketch(service, sql)
    assert with_sketch.sketch is not None
    assert canonical(with_sketch.rows) == canonical(without.rows) == [(1, 19)]
    service.recapture(name)
    assert _fragments(service, name) == {name: [0]}
    service.drop_sketch(name)

"""COUNT(DISTINCT) under a HAVING, end to end on real Spark, Delta (delta-rs) tables and the catalog: captured on
Spark, maintained incrementally through inserts and deletes, and at every version equal to a recapture and to the
fragments DuckDB finds the answer depends on; the query over the sketch returns Spark's answer without it."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from tests.oracles import answers_with_and_without_sketch, canonical, duck, provenance_fragments, snapshot

pytestmark = [pytest.mark.spark, pytest.mark.postgres]

CDF = {"delta.enableChangeDataFeed": "true"}
SQL = "SELECT g, COUNT(DISTINCT v) AS c FROM {t} GROUP BY g HAVING COUNT(DISTINCT v) > 2"
BOUNDS = [0, 10, 20, 30, 40]
PROVENANCE = "SELECT id FROM t WHERE g IN (SELECT g FROM t GROUP BY g HAVING COUNT(DISTINCT v) > 2)"


def _fragments(service, name: str) -> list[int]:  # noqa: ANN001
    [partition] = service.describe(name)["partitions"]
    return partition["fragments"]


def test_count_distinct_having_is_maintained_like_a_recapture(service, tmp_path: Path) -> None:  # noqa: ANN001
    name = "distinct_having"
    path = tmp_path / name
    # g 1: {1, 2, 3} passes; g 2: {5, 6} (5 twice) does not; g 3: {7, 8, 9} and a NULL passes
    write_deltalake(str(path), pa.table({"id": [0, 1, 2, 10, 11, 12, 20, 21, 22, 23],
                                         "g": [1, 1, 1, 2, 2, 2, 3, 3, 3, 3],
                                         "v": [1, 2, 3, 5, 5, 6, 7, 8, 9, None]}), configuration=CDF)
    service.register_table(name, str(path), replace=True)
    sql = SQL.format(t=name)
    service.create_sketch(name, sql, [f"{name}.id"], bounds=[",".join(map(str, BOUNDS))])
    assert _fragments(service, name) == provenance_fragments(str(path), PROVENANCE, BOUNDS) == [0, 2]

    table = DeltaTable(str(path))
    changes = [
        # a new value for g 2: {5, 6, 7}, it enters the answer (fragment 1, and 3 for the new row)
        lambda: write_deltalake(str(path), pa.table({"id": [35], "g": [2], "v": [7]}), mode="append"),
        # the last copy of 3 leaves g 1: {1, 2}, it leaves the answer
        lambda: table.delete("g = 1 AND v = 3"),
        # a duplicate value for g 3: COUNT(DISTINCT) stays 3, but the new row (fragment 3) is provenance too
        lambda: write_deltalake(str(path), pa.table({"id": [36], "g": [3], "v": [8]}), mode="append"),
        # one of the two 5s of g 2 goes: {5, 6, 7} stays
        lambda: table.delete("id = 10"),
    ]
    for change in changes:
        change()
    result = service.maintain(name, strategy="eager", batch_size=1)
    assert result.recaptured is None and len(result.versions) == len(changes)  # incremental, one per commit

    maintained = _fragments(service, name)
    truth = provenance_fragments(str(path), PROVENANCE, BOUNDS)
    assert maintained == truth == [1, 2, 3]
    expected = duck("SELECT g, COUNT(DISTINCT v) FROM t GROUP BY g HAVING COUNT(DISTINCT v) > 2", t=snapshot(str(path)))
    with_sketch, without = answers_with_and_without_sketch(service, sql)
    assert with_sketch.sketch is not None
    assert canonical(with_sketch.rows) == canonical(without.rows) == canonical(expected) == [(2, 3), (3, 3)]

    service.recapture(name)
    assert _fragments(service, name) == maintained
    service.drop_sketch(name)

"""Selection push-down into the change-feed read: fewer rows read, the same sketch."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from imp_core.config import Optimizations
from imp_core.engine.local import LocalBackend
from imp_core.engine.pipeline import Pipeline
from imp_core.maintenance.changes import read_changes
from imp_core.plan.pushdown import change_filter, to_datafusion
from imp_core.plan.sql import parse_query
from imp_core.sketch.partition import Partition, PartitionSet
from imp_core.sources.delta import VERSION, DeltaSource
from tests.oracles import provenance_fragments

SQL = "SELECT a, AVG(b) AS ab FROM t WHERE b < 50 AND s <> 'x' GROUP BY a HAVING AVG(b) < 24"


def test_change_filter_and_datafusion_translation() -> None:
    schema = {"t": pa.schema([("a", pa.int64()), ("b", pa.float64()), ("s", pa.string())])}
    plan = parse_query(SQL, schema).plan
    pred = change_filter(plan, "t")
    assert pred is not None and pred.columns() == {"b", "s"}
    assert to_datafusion(pred) == "((\"b\" < 50) AND (\"s\" != 'x'))"
    joined = parse_query("SELECT t1.a FROM t t1, t t2 WHERE t1.a = t2.a AND t1.b < 5", schema).plan
    assert change_filter(joined, "t") is None  # t2 has no selection: no row can be skipped
    assert to_datafusion(parse_query("SELECT a FROM t WHERE b + 1 < 5", schema).plan.child.predicate) is None  # type: ignore[attr-defined]


@pytest.fixture()
def table(tmp_path: Path) -> DeltaSource:
    path = tmp_path / "t"
    n = 200
    write_deltalake(str(path), pa.table({"a": [i % 10 for i in range(n)], "b": [float(i % 97) for i in range(n)],
                                         "s": ["x" if i % 7 == 0 else "y" for i in range(n)]}),
                    configuration={"delta.enableChangeDataFeed": "true"})
    DeltaTable(str(path)).delete("b > 60 OR a = 3")
    write_deltalake(str(path), pa.table({"a": [1, 2, 3], "b": [10.0, 70.0, 5.0], "s": ["y", "y", "x"]}),
                    mode="append")
    return DeltaSource("t", path)


def test_pushdown_reads_fewer_rows_and_keeps_the_sketch(table: DeltaSource) -> None:
    plan = parse_query(SQL, {"t": table.schema()}).plan
    on, off = Optimizations(), Optimizations(selection_pushdown=False)
    pushed = read_changes(table, plan, 0, 2, on)
    full = read_changes(table, plan, 0, 2, off)
    assert 0 < pushed.height < full.height
    assert pushed.filter((pushed["b"] >= 50) | (pushed["s"] == "x")).height == 0

    parts = PartitionSet((Partition("t", "a", (0, 3, 6, 10), "int"),))
    snapshots = {v: DeltaTable(table.path, version=v).to_pyarrow_table() for v in (0, 2)}
    import polars as pl

    backend = LocalBackend(lambda name, v: pl.from_arrow(snapshots[v]))
    sketches = []
    for changes in (pushed, full):
        pipe = Pipeline(plan, parts)
        pipe.capture(backend, {"t": 0})
        pipe.maintain_pass("t", changes.drop(VERSION), backend, {"t": 2})
        sketches.append(pipe.sketch())
    fresh = Pipeline(plan, parts)
    fresh.capture(backend, {"t": 2})
    # what the sketch must hold, from DuckDB over the snapshot (not from the engine that maintains it)
    where = "b < 50 AND s <> 'x'"
    expected = provenance_fragments(
        table.path, f"SELECT a FROM t WHERE {where} AND a IN (SELECT a FROM t WHERE {where} GROUP BY a "
                    f"HAVING AVG(b) < 24)", [0, 3, 6, 10], version=2)
    assert expected == [0, 2]  # groups 3..5 (fragment 1) fail the HAVING
    assert sorted(sketches[0]) == sorted(sketches[1]) == sorted(fresh.sketch()) == expected

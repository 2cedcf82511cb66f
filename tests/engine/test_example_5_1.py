"""The paper's Example 5.1 / Fig. 5, operator by operator, on the in-memory backend."""

from __future__ import annotations

from collections.abc import Callable

import polars as pl

from imp_core.engine.annotation import as_sets
from imp_core.engine.local import LocalBackend
from imp_core.engine.pipeline import Pipeline
from imp_core.engine.schema import MULT, SET
from imp_core.plan.expr import INT, AggCall, Binary, Col, Lit
from imp_core.plan.nodes import Aggregate, Field, Join, Project, Scan, Select
from imp_core.sketch.partition import Partition, PartitionSet

R0 = pl.DataFrame({"a": [1, 9], "b": [7, 9]})
S0 = pl.DataFrame({"c": [6, 7], "d": [9, 8]})
DELTA_R = pl.DataFrame({"a": [5], "b": [8], MULT: [1]})


def build() -> tuple[Pipeline, dict[str, object]]:
    r = Scan("R", "R", (Field("a", INT), Field("b", INT)))
    s = Scan("S", "S", (Field("c", INT), Field("d", INT)))
    sel = Select(r, Binary(">", Col("R.a", INT), Lit.of(3)))
    sub = Project(sel, (("tt.a", Col("R.a", INT)), ("tt.b", Col("R.b", INT))))
    join = Join(sub, s, Binary("=", Col("tt.b", INT), Col("S.d", INT)))
    agg = Aggregate(join, (("a", Col("tt.a", INT)),), (("sc", AggCall("sum", Col("S.c", INT))),))
    having = Select(agg, Binary(">", Col("sc", INT), Lit.of(5)))
    root = Project(having, (("a", Col("a", INT)), ("sc", Col("sc", INT))))
    # f1 = [1, 5], f2 = [6, 10]; g1 = [1, 6], g2 = [7, 15]  (inclusive integer ranges as half-open bounds)
    parts = PartitionSet((Partition("R", "a", (1, 6, 11), "int"), Partition("S", "c", (1, 7, 16), "int")))
    return Pipeline(root, parts), {"r": r, "sel": sel, "join": join, "agg": agg, "having": having}


def tables(versions: dict[str, pl.DataFrame]) -> Callable[[str, int], pl.DataFrame]:
    return lambda name, version: versions[f"{name}{version}"]


def test_example_5_1_operator_by_operator() -> None:
    pipe, nodes = build()
    backend = LocalBackend(tables({"R0": R0, "S0": S0, "R1": pl.concat([R0, DELTA_R.drop(MULT)]), "S1": S0}))
    # capture at version 0: sketch {f2, g1} (global ids: f1=0, f2=1, g1=2, g2=3)
    first = pipe.capture(backend, {"R": 0, "S": 0})
    assert set(first.added) == {1, 2} and pipe.sketch() == {1, 2}

    # table access annotates ΔR with f1
    delta = pipe.op(nodes["r"]).process(DELTA_R)
    assert as_sets(delta).get_column(SET).to_list() == [[0]]
    # selection a > 3 keeps it
    delta = pipe.op(nodes["sel"]).process(delta)
    assert delta.height == 1

    # the whole pass: sketch delta Δ+{f1, g2}
    out = pipe.maintain_pass("R", DELTA_R, backend, {"R": 1, "S": 0})
    assert set(out.added) == {0, 3} and out.removed == ()
    assert pipe.sketch() == {0, 1, 2, 3}

    # aggregation state: S'[5] = (SUM 7, CNT 1, P {f1, g2}); S'[9] unchanged
    agg = pipe.op(nodes["agg"])
    groups = agg.groups.sort("a")
    assert groups.get_column("a").to_list() == [5, 9]
    assert groups.get_column("__s0").to_list() == [7, 6]
    assert groups.get_column(SET).to_list() == [[0, 3], [1, 2]]
    # merge state: {f1:1, f2:1, g1:1, g2:1}
    assert pipe.merge.counts.tolist() == [1, 1, 1, 1]


def test_capture_equals_maintenance_state() -> None:
    pipe, nodes = build()
    r1 = pl.concat([R0, DELTA_R.drop(MULT)])
    backend = LocalBackend(tables({"R0": R0, "S0": S0, "R1": r1, "S1": S0}))
    pipe.capture(backend, {"R": 0, "S": 0})
    pipe.maintain_pass("R", DELTA_R, backend, {"R": 1, "S": 0})
    maintained = {op.op_id: op.canonical() for op in pipe.stateful()}

    fresh, _ = build()
    fresh.capture(LocalBackend(tables({"R1": r1, "S0": S0})), {"R": 1, "S": 0})
    captured = {op.op_id: op.canonical() for op in fresh.stateful()}
    assert maintained.keys() == captured.keys()
    for op_id, frames in maintained.items():
        for name, df in frames.items():
            assert df.equals(captured[op_id][name]), (op_id, name)

"""UNION ALL (bag union) on the in-memory backend: the operator rule, then whole passes against a recapture.

The rule (docs/SQL.md): a union's delta is the union of its inputs' deltas, every row keeping the annotation of the
row it came from; a branch's rows have no fragment of the other branches' scans (NULL, skipped when counting).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import polars as pl
import pyarrow as pa
import pytest

from imp_core.engine.annotation import as_sets, pairs, relabel
from imp_core.engine.local import LocalBackend
from imp_core.engine.pipeline import Pipeline
from imp_core.engine.schema import FRAG, MULT, SET
from imp_core.errors import UnsupportedError
from imp_core.plan.expr import INT, AggCall, Binary, Col, Lit
from imp_core.plan.nodes import Aggregate, Field, Plan, Project, Scan, Select, Union
from imp_core.plan.sql import parse_query
from imp_core.sketch.partition import Partition, PartitionSet
from tests.engine.two_tables import apply

COLS = (Field("g", INT), Field("v", INT))


def _branch(table: str, alias: str, where: Binary | None = None) -> Plan:
    scan: Plan = Scan(table, alias, COLS)
    if where is not None:
        scan = Select(scan, where)
    return Project(scan, (("g", Col(f"{alias}.g", INT)), ("v", Col(f"{alias}.v", INT))))


def _having(union: Plan) -> Plan:
    agg = Aggregate(union, (("g", Col("g", INT)),), (("s", AggCall("sum", Col("v", INT))),))
    return Select(agg, Binary(">", Col("s", INT), Lit.of(10)))


def two_tables() -> tuple[Pipeline, Union]:
    union = Union((_branch("T1", "T1"), _branch("T2", "T2")))
    # T1.g: [0, 5) -> 0, [5, 10) -> 1; T2.g: [0, 5) -> 2, [5, 10) -> 3
    parts = PartitionSet((Partition("T1", "g", (0, 5, 10), "int"), Partition("T2", "g", (0, 5, 10), "int")))
    return Pipeline(_having(union), parts), union


def self_union() -> tuple[Pipeline, Union]:
    union = Union((_branch("T1", "T1", Binary(">", Col("T1.v", INT), Lit.of(5))),
                   _branch("T1", "T1", Binary("<", Col("T1.v", INT), Lit.of(0)))))
    parts = PartitionSet((Partition("T1", "g", (0, 5, 10), "int"),))
    return Pipeline(_having(union), parts), union


def rows(g: list[int], v: list[int], mult: list[int] | None = None) -> pl.DataFrame:
    df = pl.DataFrame({"g": g, "v": v}, schema={"g": pl.Int64, "v": pl.Int64})
    return df if mult is None else df.with_columns(pl.Series(MULT, mult, dtype=pl.Int64))


def reader(tables: dict[str, pl.DataFrame]) -> Callable[[str, int], pl.DataFrame]:
    return lambda name, version: tables[name]


def test_an_insert_into_either_input_appears_and_a_delete_disappears_with_its_annotation() -> None:
    pipe, union = two_tables()
    op = pipe.op(union)
    left = pipe.op(union.inputs[0]).process(pipe.op(union.inputs[0].child).process(rows([1], [4], [1])))
    right = pipe.op(union.inputs[1]).process(pipe.op(union.inputs[1].child).process(rows([7], [3], [-1])))
    out = op.combine([op.process(left, 0), op.process(right, 1)])
    assert out.select("g", "v", MULT).rows() == [(1, 4, 1), (7, 3, -1)]
    # each row keeps its own scan's fragment and has none of the other branch's scan
    assert out.get_column("__f0").to_list() == [0, None] and out.get_column("__f1").to_list() == [None, 3]
    assert as_sets(out).get_column(SET).to_list() == [[0], [3]]
    assert pairs(out, ["g"]).sort("g").select("g", FRAG, MULT).rows() == [(1, 0, 1), (7, 3, -1)]
    # one input alone has the same layout
    alone = op.process(right, 1)
    assert alone.columns == out.columns and alone.get_column("__f0").null_count() == 1


def test_a_branch_with_fragment_sets_folds_every_input_into_sets() -> None:
    pipe, union = two_tables()
    op = pipe.op(union)
    plain = pl.DataFrame({"g": [1], "v": [2], MULT: [1], "__f0": pl.Series([0], dtype=pl.UInt32)})
    sets = pl.DataFrame({"g": [2], "v": [3], MULT: [1], SET: pl.Series([[2, 3]], dtype=pl.List(pl.UInt32))})
    out = op.combine([op.process(plain, 0), op.process(sets, 1)])
    assert out.columns == ["g", "v", MULT, SET] and out.get_column(SET).to_list() == [[0], [2, 3]]


def test_two_tables_maintained_equal_a_recapture() -> None:
    t1, t2 = rows([1, 1, 6], [4, 5, 20]), rows([1, 7], [3, 1])
    pipe, _ = two_tables()
    pipe.capture(LocalBackend(reader({"T1": t1, "T2": t2})), {"T1": 0, "T2": 0})
    # group 1: 4 + 5 + 3 = 12 (T1 fragment 0, T2 fragment 2); group 6: 20 (T1 fragment 1); group 7: 1
    assert pipe.sketch() == {0, 1, 2}
    steps = [("T2", rows([7], [30], [1])), ("T1", rows([1], [5], [-1])), ("T2", rows([1], [3], [-1])),
             ("T1", rows([3, 8], [50, 1], [1, 1]))]
    for table, change in steps:
        if table == "T1":
            t1 = apply(t1, change)
        else:
            t2 = apply(t2, change)
        backend = LocalBackend(reader({"T1": t1, "T2": t2}))
        pipe.maintain_pass(table, change, backend, {"T1": 0, "T2": 0})
        fresh, _ = two_tables()
        fresh.capture(backend, {"T1": 0, "T2": 0})
        assert pipe.sketch() == fresh.sketch()
        captured = {op.op_id: op.canonical() for op in fresh.stateful()}
        for op in pipe.stateful():
            for name, df in op.canonical().items():
                assert df.equals(captured[op.op_id][name]), (op.op_id, name)
    # group 1 fell to 4 (no longer > 10), group 3 holds 50 (T1 fragment 0), 7 holds 31 (T2 fragment 3), 6 holds 20
    assert pipe.sketch() == {0, 1, 3}


def test_self_union_gives_each_branch_its_own_scan() -> None:
    t1 = rows([1, 1, 6, 6], [8, -9, 7, -1])
    pipe, _ = self_union()
    assert [a.column for a in pipe.annotations.scans] == ["__f0", "__f1"]
    pipe.capture(LocalBackend(reader({"T1": t1})), {"T1": 0})
    assert pipe.sketch() == set()  # group 1: 8 + -9; group 6: 7 + -1
    change = rows([6, 1], [9, -9], [1, -1])
    t1 = apply(t1, change)
    backend = LocalBackend(reader({"T1": t1}))
    pipe.maintain_pass("T1", change, backend, {"T1": 0})
    fresh, _ = self_union()
    fresh.capture(backend, {"T1": 0})
    assert pipe.sketch() == fresh.sketch() == {1}  # group 1: 8; group 6: 7 + 9 - 1 = 15


@pytest.mark.parametrize("seed", [1, 2])
def test_random_changes_equal_a_recapture(seed: int) -> None:
    _random_changes_equal_a_recapture(lambda: two_tables()[0], np.random.default_rng(seed),
                                      {"T1": rows([], []), "T2": rows([], [])}, rounds=8, inserts=4)


def _random_changes_equal_a_recapture(build: Callable[[], Pipeline], rng: np.random.Generator,
                                      tables: dict[str, pl.DataFrame], rounds: int, inserts: int) -> None:
    """Random inserts and deletes into either table, each maintained incrementally, the sketch compared with a
    fresh capture of the tables after every pass."""
    pipe = build()
    pipe.capture(LocalBackend(reader(tables)), {"T1": 0, "T2": 0})
    for _ in range(rounds):
        table = str(rng.choice(["T1", "T2"]))
        current = tables[table]
        ins = rows(rng.integers(0, 10, inserts).tolist(), rng.integers(-5, 15, inserts).tolist(), [1] * inserts)
        dels = current.sample(min(2, current.height), seed=int(rng.integers(1 << 30))).with_columns(
            pl.lit(-1, dtype=pl.Int64).alias(MULT))
        change = pl.concat([ins, dels])
        tables[table] = apply(current, change)
        backend = LocalBackend(reader(tables))
        pipe.maintain_pass(table, change, backend, {"T1": 0, "T2": 0})
        fresh = build()
        fresh.capture(backend, {"T1": 0, "T2": 0})
        assert pipe.sketch() == fresh.sketch()


SHAPES = [
    # a top-level union: no stateful operator, the capture counts fragments on the backend
    "SELECT g, v FROM T1 WHERE v > 3 UNION ALL SELECT g, v FROM T2",
    # top-k over a union
    "SELECT g, v FROM (SELECT g, v FROM T1 UNION ALL SELECT g, v FROM T2) u ORDER BY v DESC, g LIMIT 3",
    # a branch with an aggregation (its rows carry fragment sets), three branches
    "SELECT g, SUM(v) AS s FROM (SELECT g, SUM(v) AS v FROM T1 GROUP BY g UNION ALL SELECT g, v FROM T2 "
    "UNION ALL SELECT g, v FROM T1 WHERE v < 0) u GROUP BY g HAVING SUM(v) > 5",
    # a join above a union
    "SELECT u.g, COUNT(*) AS n FROM (SELECT g, v FROM T1 UNION ALL SELECT g, v FROM T2) u JOIN T2 ON u.g = T2.g "
    "GROUP BY u.g",
    # a join above a union whose branch carries fragment sets
    "SELECT u.g, COUNT(*) AS n FROM (SELECT g, SUM(v) AS v FROM T1 GROUP BY g UNION ALL SELECT g, v FROM T2) u "
    "JOIN T2 ON u.g = T2.g GROUP BY u.g",
    # DISTINCT over a self-union
    "SELECT DISTINCT g FROM (SELECT g, v FROM T1 WHERE v > 2 UNION ALL SELECT g, v FROM T1 WHERE v < 8) u",
]


@pytest.mark.parametrize("sql", SHAPES)
def test_query_shapes_over_a_union_equal_a_recapture(sql: str) -> None:
    schema = pa.schema([("g", pa.int64()), ("v", pa.int64())])
    plan = parse_query(sql, {"T1": schema, "T2": schema}).plan
    parts = PartitionSet((Partition("T1", "g", (0, 5, 10), "int"), Partition("T2", "g", (0, 5, 10), "int")))
    rng = np.random.default_rng(7)
    tables = {"T1": rows(rng.integers(0, 10, 6).tolist(), rng.integers(-5, 15, 6).tolist()),
              "T2": rows(rng.integers(0, 10, 6).tolist(), rng.integers(-5, 15, 6).tolist())}
    _random_changes_equal_a_recapture(lambda: Pipeline(plan, parts), rng, tables, rounds=6, inserts=3)


def test_a_repartition_relabels_fragments_and_keeps_no_fragment_null() -> None:
    delta = pl.DataFrame({"g": [1, 2], MULT: [1, 1], "__f0": pl.Series([0, None], dtype=pl.UInt32),
                          "__f1": pl.Series([None, 3], dtype=pl.UInt32)})
    out = relabel(delta, np.array([0, 2, 3, 5]))
    assert out.get_column("__f0").to_list() == [0, None] and out.get_column("__f1").to_list() == [None, 5]
    assert out.schema["__f0"] == pl.UInt32


def test_a_float_sum_inside_a_branch_is_refused_with_the_fix() -> None:
    schema = pa.schema([("g", pa.int64()), ("v", pa.float64())])
    sql = ("SELECT g, COUNT(*) AS n FROM (SELECT g, SUM(v) AS v FROM T1 GROUP BY g UNION ALL SELECT g, v FROM T2) u "
           "WHERE v > 1 GROUP BY g")
    plan = parse_query(sql, {"T1": schema, "T2": schema}).plan
    with pytest.raises(UnsupportedError, match="UNION ALL branch holds a floating-point SUM/AVG.*DECIMAL"):
        Pipeline(plan, PartitionSet((Partition("T1", "g", (0, 5, 10), "int"),)))

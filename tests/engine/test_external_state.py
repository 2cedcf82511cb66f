"""External operator state against the in-memory engine (the oracle), with every aggregation and DISTINCT that has an
external form kept in a store (a memory budget of 0), on the property tests' random queries, tables and change
batches: after the capture and after every pass both pipelines give the same sketch deltas, sketches and
operator states (in canonical form). The stores here are ``MemoryGroupStore``s, the contract the Delta store
(``tests/spark/test_state_store.py``) is held to; a reload keeps the stores, as the Delta tables outlive a job."""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl
import pytest
from hypothesis import given

from imp_core.engine.external import MemoryGroupStore
from imp_core.engine.local import LocalBackend
from imp_core.engine.operators.aggregation_external import ExternalAggregation
from imp_core.engine.pipeline import Pipeline, external_candidates, node_paths
from imp_core.engine.schema import MULT
from imp_core.errors import UnsupportedError, WholeStateChangedError
from imp_core.plan.columns import narrowed
from imp_core.plan.nodes import AntiJoin, GroupTopK, Plan
from imp_core.plan.sql import parse_query
from imp_core.sketch.partition import PartitionSet
from tests.engine.generators import SCHEMAS, TABLES, Case, Store, cases, note, property_test
from tests.engine.rewritten_cases import grouping_set_cases, set_operation_cases
from tests.engine.test_group_topk import SHAPES as RANKING_SHAPES
from tests.engine.test_properties import assert_same_state
from tests.engine.two_tables import SCHEMA as TWO_SCHEMA
from tests.engine.two_tables import VERSIONS as TWO_VERSIONS
from tests.engine.two_tables import apply as two_apply
from tests.engine.two_tables import parts as two_parts
from tests.engine.two_tables import reader as two_reader
from tests.engine.two_tables import rows as two_rows


def recaptured(plan: Plan, parts: PartitionSet, external: frozenset[str], read: Any, versions: dict[str, int],
               stores: dict[str, MemoryGroupStore]) -> Pipeline:
    """What maintenance does when a pass raises ``WholeStateChangedError`` (a NOT IN's gate moved): a new capture at
    ``versions``, its external operators in new stores (``stores``, emptied)."""
    stores.clear()
    pipe = Pipeline(plan, parts, external=external)
    pipe.bind_stores(lambda op: stores.setdefault(op.op_id, MemoryGroupStore(op.key_names, op.component_schemas())))
    pipe.capture(LocalBackend(read), versions)
    return pipe


def run_external(case: Case) -> None:
    query = parse_query(case.sql, {t: SCHEMAS[t] for t in TABLES})
    plan = narrowed(query.plan, {p.table: {p.column} for p in case.parts.partitions})
    external = external_candidates(plan)
    if not external:
        note("no external operator")
        return
    try:
        memory = Pipeline(plan, case.parts)
    except UnsupportedError:
        note("refused")
        return
    outside = Pipeline(plan, case.parts, external=external)
    stores: dict[str, MemoryGroupStore] = {}

    def store_of(op: ExternalAggregation) -> MemoryGroupStore:
        return stores.setdefault(op.op_id, MemoryGroupStore(op.key_names, op.component_schemas()))

    outside.bind_stores(store_of)
    note(f"{len(outside.external_operators())} external operator(s)")
    store = Store({t: case.initial.get(t, []) for t in TABLES})
    versions = {t: 0 for t in case.initial}
    backend = LocalBackend(store.read)
    a, b = memory.capture(backend, versions), outside.capture(backend, versions)
    assert (sorted(a.added), sorted(a.removed)) == (sorted(b.added), sorted(b.removed)), "capture"
    assert_same_state(outside, memory, "capture")
    for i, batch in enumerate(case.batches):
        changes = store.apply(batch, case.merge_duplicates)
        reached = dict(versions)
        recapture = False
        for table in sorted(changes):
            reached[table] = store.latest()[table]
            backend = LocalBackend(store.read)
            a = memory.maintain_pass(table, changes[table], backend, dict(reached), netting=case.netting)
            if recapture:
                continue
            try:
                b = outside.maintain_pass(table, changes[table], backend, dict(reached), netting=case.netting)
            except WholeStateChangedError:
                note("a NOT IN's gate moved: recaptured")
                recapture = True
                continue
            assert (sorted(a.added), sorted(a.removed)) == (sorted(b.added), sorted(b.removed)), f"batch {i}"
        if recapture:
            outside = recaptured(plan, case.parts, external, store.read, dict(reached), stores)
        versions = reached
        assert outside.sketch() == memory.sketch(), f"after batch {i}"
        assert_same_state(outside, memory, f"after batch {i}")
        if case.reload_state[i]:  # the saved state names the store; the store outlives the job
            blobs = outside.state_blobs()
            outside = Pipeline(plan, case.parts, external=external)
            outside.load_state_blobs(blobs)
            outside.bind_stores(store_of)


@property_test(60)
@given(case=cases("agg"))
def test_aggregations_keep_the_same_state_outside(case: Case) -> None:
    run_external(case)


@property_test(40)
@given(case=cases("nested"))
def test_nested_queries_keep_the_same_state_outside(case: Case) -> None:
    run_external(case)


@property_test(30)
@given(case=set_operation_cases())
def test_set_operations_keep_the_same_state_outside(case: Case) -> None:
    run_external(case)


@property_test(20)
@given(case=grouping_set_cases())
def test_grouping_sets_keep_the_same_state_outside(case: Case) -> None:
    run_external(case)


def test_a_batch_reads_and_writes_only_its_groups() -> None:
    """The store sees the batch's groups only: 2 of 1,000 groups are fetched and rewritten."""
    from imp_core.sketch.partition import Partition, PartitionSet

    schemas = {"t": SCHEMAS["r"]}
    plan = parse_query("SELECT r.a, SUM(r.b) AS s, COUNT(*) AS n FROM r GROUP BY r.a", {"r": schemas["t"]}).plan
    parts = PartitionSet((Partition("r", "b", (0, 5, 10), "int"),))
    pipe = Pipeline(plan, parts, external=external_candidates(plan))
    [op] = pipe.external_operators()
    fetched: list[int] = []
    store = MemoryGroupStore(op.key_names, op.component_schemas())
    original = store.fetch
    store.fetch = lambda keys: (fetched.append(keys.unique().height), original(keys))[1]  # type: ignore[method-assign]
    pipe.bind_stores(lambda _: store)
    names = [c.name for c in TABLES["r"]]
    rows = pl.DataFrame({c: [i if c == "a" else (i % 7 if c == "b" else None) for i in range(1000)]
                         for c in names}, schema={c.name: c.polars for c in TABLES["r"]})
    pipe.capture(LocalBackend(lambda t, v: rows), {"r": 0})
    assert store.size()["groups"] == 1000
    change = rows.slice(10, 2).with_columns(pl.lit(1, dtype=pl.Int64).alias("__mult"))
    fetched.clear()
    pipe.maintain_pass("r", change, None, {"r": 1})
    assert fetched == [2] and store.size()["groups"] == 1000


def test_a_join_reads_only_the_groups_of_its_delta_keys() -> None:
    """A join above an external aggregation (Q18's IN over a grouped subquery, Q21's per-order summaries) reads the
    groups its delta's keys name, never the whole state; and answers as the in-memory engine does."""
    from imp_core.sketch.partition import Partition, PartitionSet

    sql = ("SELECT r1.a AS a, r1.n AS n, q.s AS s FROM r AS r1 JOIN (SELECT r2.a AS k, SUM(r2.b) AS s FROM r AS r2 "
           "GROUP BY r2.a HAVING SUM(r2.b) > 2) AS q ON r1.a = q.k")
    plan = parse_query(sql, {t: SCHEMAS[t] for t in TABLES}).plan
    parts = PartitionSet((Partition("r", "b", (0, 3, 6), "int"),))
    memory, outside = Pipeline(plan, parts), Pipeline(plan, parts, external=external_candidates(plan))
    [op] = outside.external_operators()
    store = MemoryGroupStore(op.key_names, op.component_schemas())
    whole_reads = []
    original = store.contents
    store.contents = lambda: (whole_reads.append(1), original())[1]  # type: ignore[method-assign]
    outside.bind_stores(lambda _: store)
    rows = [(i % 5, i % 4, 0.5, "abc"[i % 3], None) for i in range(30)]
    data = Store({"r": rows})
    for p in (memory, outside):
        p.capture(LocalBackend(data.read), {"r": 0})
    assert outside.sketch() == memory.sketch()
    capture_reads = len(whole_reads)
    changes = data.apply([("insert", "r", [(2, 5, 0.5, "z", None), (7, 3, 0.5, "y", None)]),
                          ("delete", "r", [3, 8])], merge_duplicates=False)
    for p in (memory, outside):
        p.maintain_pass("r", changes["r"], LocalBackend(data.read), {"r": 1})
    assert outside.sketch() == memory.sketch()
    assert len(whole_reads) == capture_reads  # the pass read the touched groups only
    assert_same_state(outside, memory, "after the pass")


@property_test(25)
@given(case=cases("agg"))
def test_state_moves_between_memory_and_a_store_without_changing(case: Case) -> None:
    """A load that finds state over (or back under) the budget moves it (``Pipeline.placed``): the state and every
    later pass are as if it had stayed."""
    plan = narrowed(parse_query(case.sql, {t: SCHEMAS[t] for t in TABLES}).plan,
                    {p.table: {p.column} for p in case.parts.partitions})
    external = external_candidates(plan)
    try:
        memory = Pipeline(plan, case.parts)
    except UnsupportedError:
        return
    store = Store({t: case.initial.get(t, []) for t in TABLES})
    versions = {t: 0 for t in case.initial}
    memory.capture(LocalBackend(store.read), versions)
    moving = memory.placed(external, lambda op: MemoryGroupStore(op.key_names, op.component_schemas()))
    assert_same_state(moving, memory, "moved out")
    for i, batch in enumerate(case.batches):
        changes = store.apply(batch, case.merge_duplicates)
        reached = dict(versions)
        recapture = False
        for table in sorted(changes):
            reached[table] = store.latest()[table]
            memory.maintain_pass(table, changes[table], LocalBackend(store.read), dict(reached))
            try:
                if not recapture:
                    moving.maintain_pass(table, changes[table], LocalBackend(store.read), dict(reached))
            except WholeStateChangedError:
                recapture = True
        versions = reached
        if recapture:
            moving = recaptured(plan, case.parts, external, store.read, dict(reached), {})
        moving = moving.placed(external if i % 2 else frozenset(),
                               lambda op: MemoryGroupStore(op.key_names, op.component_schemas()))
        assert moving.sketch() == memory.sketch(), f"after batch {i}"
        assert_same_state(moving, memory, f"after batch {i}")


ANTI_JOIN_SHAPES = [
    "SELECT g, v FROM T1 WHERE NOT EXISTS (SELECT 1 FROM T2 WHERE T2.g = T1.g)",
    "SELECT g, SUM(v) AS s FROM T1 WHERE NOT EXISTS (SELECT 1 FROM T2 WHERE T2.g = T1.g AND T2.v > 3) GROUP BY g",
    "SELECT T1.g, T1.v FROM T1 JOIN (SELECT g, COUNT(*) AS n FROM T2 GROUP BY g) c ON c.g = T1.g "
    "WHERE NOT EXISTS (SELECT 1 FROM T2 WHERE T2.g = T1.v)",
    "SELECT g, n FROM (SELECT g, COUNT(*) AS n FROM T1 GROUP BY g) a "
    "WHERE NOT EXISTS (SELECT 1 FROM T2 WHERE T2.g = a.g AND T2.v = a.n)",
    "SELECT g, v FROM T1 WHERE v NOT IN (SELECT g FROM T2)",
    "SELECT g, SUM(v) AS s FROM T1 WHERE g NOT IN (SELECT v FROM T2 WHERE T2.g > 2) GROUP BY g",
]


@pytest.mark.parametrize("sql", [sql for sql, _ in RANKING_SHAPES] + ANTI_JOIN_SHAPES)
def test_rankings_and_anti_joins_keep_the_same_state_outside(sql: str) -> None:
    """A top-k per group or a NOT EXISTS (and the aggregations around it) kept in stores gives the in-memory engine's
    sketch deltas and states under random changes to both tables, through a reload, a move back into memory and out
    again, and a repartition-free reload of its saved reference."""
    plan = parse_query(sql, {"T1": TWO_SCHEMA, "T2": TWO_SCHEMA}).plan
    partition = two_parts()
    external = external_candidates(plan)
    rankings = [p for p, node in node_paths(plan) if isinstance(node, (GroupTopK, AntiJoin)) and p in external]
    memory, outside = Pipeline(plan, partition), Pipeline(plan, partition, external=external)
    stores: dict[str, MemoryGroupStore] = {}
    outside.bind_stores(lambda op: stores.setdefault(op.op_id, MemoryGroupStore(op.key_names,
                                                                                 op.component_schemas())))
    rng = np.random.default_rng(3)
    tables = {t: two_rows(rng.integers(0, 10, 12).tolist(), rng.integers(-5, 15, 12).tolist()) for t in ("T1", "T2")}
    a = memory.capture(LocalBackend(two_reader(tables)), TWO_VERSIONS)
    b = outside.capture(LocalBackend(two_reader(tables)), TWO_VERSIONS)
    assert sorted(a.added) == sorted(b.added)
    assert_same_state(outside, memory, "capture")
    for i in range(10):
        table = str(rng.choice(["T1", "T2"]))
        ins = two_rows(rng.integers(0, 10, 3).tolist(), rng.integers(-5, 15, 3).tolist(), [1] * 3)
        dels = tables[table].sample(min(2, tables[table].height), seed=int(rng.integers(1 << 30))).with_columns(
            pl.lit(-1, dtype=pl.Int64).alias(MULT))
        change = pl.concat([ins, dels])
        tables[table] = two_apply(tables[table], change)
        backend = LocalBackend(two_reader(tables))
        a = memory.maintain_pass(table, change, backend, TWO_VERSIONS)
        b = outside.maintain_pass(table, change, backend, TWO_VERSIONS)
        assert (sorted(a.added), sorted(a.removed)) == (sorted(b.added), sorted(b.removed)), f"pass {i}"
        assert_same_state(outside, memory, f"pass {i}")
        if i % 3 == 1:  # a reload keeps the stores; a move into memory and back out keeps the state
            blobs = outside.state_blobs()
            outside = Pipeline(plan, partition, external=external)
            outside.load_state_blobs(blobs)
            outside.bind_stores(lambda op: stores[op.op_id])
        if i % 3 == 2:
            outside = outside.placed(frozenset(), lambda op: stores[op.op_id])
            assert_same_state(outside, memory, f"moved in after pass {i}")
            stores.clear()
            outside = outside.placed(external, lambda op: stores.setdefault(
                op.op_id, MemoryGroupStore(op.key_names, op.component_schemas())))
            assert_same_state(outside, memory, f"moved out after pass {i}")
    assert outside.sketch() == memory.sketch()
    # every partitioned ranking and every anti join here was kept outside
    assert bool(rankings) == ("PARTITION BY" in sql or "NOT EXISTS" in sql or "NOT IN" in sql)


TWO_SCHEMA_PL = {f.name: pl.Int64 for f in TWO_SCHEMA}


def _contents(stores: dict[str, MemoryGroupStore]) -> dict[str, list[dict[str, pl.DataFrame]]]:
    return {op_id: list(store.contents()) for op_id, store in stores.items()}


def test_a_not_in_kept_outside_is_recaptured_when_its_gate_moves() -> None:
    """A NOT IN in a store follows the in-memory engine while its subquery keeps rows and no NULL (rows with a NULL
    key dropped), and while it holds a NULL (nothing passes) or nothing (everything passes). A batch that moves
    between those (the first NULL, the last NULL gone, the last row gone, the first row) changes every stored row's
    verdict: the pass refuses it before writing to the store, and a recapture equals the in-memory engine."""
    sql = "SELECT g, v FROM T1 WHERE v NOT IN (SELECT v FROM T2 WHERE T2.g > 2)"
    plan = parse_query(sql, {"T1": TWO_SCHEMA, "T2": TWO_SCHEMA}).plan
    partition = two_parts()
    external = external_candidates(plan)
    assert any(isinstance(node, AntiJoin) and p in external for p, node in node_paths(plan))
    stores: dict[str, MemoryGroupStore] = {}
    tables = {"T1": pl.DataFrame({"g": [0, 1, 2, 6, 7, 8], "v": [1, 2, 3, 4, None, 5]}, schema=dict(TWO_SCHEMA_PL)),
              "T2": pl.DataFrame({"g": [3, 6], "v": [1, 3]}, schema=dict(TWO_SCHEMA_PL))}
    memory = Pipeline(plan, partition)
    memory.capture(LocalBackend(two_reader(tables)), TWO_VERSIONS)
    outside = recaptured(plan, partition, external, two_reader(tables), TWO_VERSIONS, stores)
    assert outside.sketch() == memory.sketch()
    assert_same_state(outside, memory, "capture")
    steps = [("T2", [(7, 2)], [], None),  # a key gains a right row: keyed, as in memory
             ("T1", [(9, None), (4, 9)], [], None),  # a NULL key never passes a keyed NOT IN
             ("T2", [(8, None)], [], "gained its first NULL"),
             ("T1", [(1, 7)], [], None),  # nothing passes while the NULL is there
             ("T2", [], [(8, None)], "lost its last NULL"),
             ("T2", [], [(3, 1), (6, 3), (7, 2)], "lost its last row"),
             ("T1", [(2, None)], [(0, 1)], None),  # over an empty subquery every row passes, a NULL key too
             ("T2", [(4, 9)], [], "gained its first row")]
    for i, (table, ins, dels, moved) in enumerate(steps):
        change = pl.concat([pl.DataFrame({"g": [g for g, _ in rows], "v": [v for _, v in rows], MULT: [m] * len(rows)},
                                         schema={**TWO_SCHEMA_PL, MULT: pl.Int64})
                            for rows, m in ((ins, 1), (dels, -1))])
        for g, v in dels:
            at = tables[table].with_row_index("i").filter((pl.col("g") == g) & pl.col("v").eq_missing(v))
            tables[table] = tables[table].with_row_index("i").filter(pl.col("i") != at.item(0, "i")).drop("i")
        tables[table] = pl.concat([tables[table], change.filter(pl.col(MULT) > 0).drop(MULT)])
        backend = LocalBackend(two_reader(tables))
        a = memory.maintain_pass(table, change, backend, TWO_VERSIONS)
        before = _contents(stores)
        if moved is None:
            b = outside.maintain_pass(table, change, backend, TWO_VERSIONS)
            assert (sorted(a.added), sorted(a.removed)) == (sorted(b.added), sorted(b.removed)), f"step {i}"
        else:
            with pytest.raises(WholeStateChangedError, match=moved):
                outside.maintain_pass(table, change, backend, TWO_VERSIONS)
            after = _contents(stores)
            assert after.keys() == before.keys() and all(
                len(after[k]) == len(before[k]) and all(x[n].equals(y[n]) for x, y in zip(after[k], before[k])
                                                        for n in x) for k in before), f"step {i}: the store changed"
            outside = recaptured(plan, partition, external, two_reader(tables), TWO_VERSIONS, stores)
        assert outside.sketch() == memory.sketch(), f"step {i}"
        assert_same_state(outside, memory, f"step {i}")


def counted_fetches(sql: str) -> tuple[Pipeline, Pipeline, MemoryGroupStore, list[int]]:
    """``sql`` (one external operator, T1 partitioned) in memory and outside, and the store's fetched key counts."""
    plan = parse_query(sql, {"T1": TWO_SCHEMA, "T2": TWO_SCHEMA}).plan
    partition = two_parts(("T1",))
    memory, outside = Pipeline(plan, partition), Pipeline(plan, partition, external=external_candidates(plan))
    [op] = outside.external_operators()
    store = MemoryGroupStore(op.key_names, op.component_schemas())
    fetched: list[int] = []
    original = store.fetch
    store.fetch = lambda keys: (fetched.append(keys.height), original(keys))[1]  # type: ignore[method-assign]
    outside.bind_stores(lambda _: store)
    return memory, outside, store, fetched


def test_a_ranking_batch_reads_and_writes_only_its_groups() -> None:
    """The store sees the touched partitions only: 2 of 500 groups are fetched and rewritten, and the pass answers as
    the in-memory engine does."""
    sql = ("SELECT g, v, rn FROM (SELECT g, v, ROW_NUMBER() OVER (PARTITION BY g ORDER BY v DESC) AS rn FROM T1) x "
           "WHERE rn <= 2")
    memory, outside, store, fetched = counted_fetches(sql)
    table = two_rows([i // 3 for i in range(1500)], [i % 7 for i in range(1500)])
    for p in (memory, outside):
        p.capture(LocalBackend(lambda t, v: table), {"T1": 0})
    assert store.size()["rows"] == 1500
    fetched.clear()
    change = two_rows([4, 7], [100, -1], [1, 1])
    a = memory.maintain_pass("T1", change, None, {"T1": 1})
    b = outside.maintain_pass("T1", change, None, {"T1": 1})
    assert fetched == [2] and store.size()["rows"] == 1502
    assert (a.added, a.removed) == (b.added, b.removed)
    assert_same_state(outside, memory, "after the pass")


def test_an_anti_join_batch_reads_and_writes_only_its_keys() -> None:
    """The store sees the keys a batch touches only: a right delta of one key and a left delta of another fetch and
    rewrite those 2 of 300 keys, and the pass answers as the in-memory engine does (the key whose right count goes
    0 -> 1 retracts its left rows)."""
    sql = "SELECT g, v FROM T1 WHERE NOT EXISTS (SELECT 1 FROM T2 WHERE T2.g = T1.g)"
    memory, outside, store, fetched = counted_fetches(sql)
    tables = {"T1": two_rows([i // 3 for i in range(900)], [i % 7 for i in range(900)]),
              "T2": two_rows(list(range(0, 300, 2)), [0] * 150)}
    for p in (memory, outside):
        p.capture(LocalBackend(two_reader(tables)), TWO_VERSIONS)
    assert store.size() == {"left": 900, "right": 150}
    fetched.clear()
    for table, change in (("T2", two_rows([7], [1], [1])), ("T1", two_rows([9], [5], [1]))):
        a = memory.maintain_pass(table, change, None, TWO_VERSIONS)
        b = outside.maintain_pass(table, change, None, TWO_VERSIONS)
        assert (sorted(a.added), sorted(a.removed)) == (sorted(b.added), sorted(b.removed)), table
        assert_same_state(outside, memory, f"after the pass on {table}")
    assert fetched == [1, 1] and store.size() == {"left": 901, "right": 151}


@pytest.mark.parametrize("outward", [True, False])
def test_an_aggregation_with_a_minmax_buffer_refuses_to_move(outward: bool) -> None:
    """A bounded MIN/MAX buffer (``minmax_buffer=N``) keeps the best N values per group, a store every value: a move
    either way would lose values or bounds, so it is refused with a one-line error (the service then recaptures),
    and a move of an aggregation without MIN/MAX, or without a buffer, goes ahead."""
    from imp_core.errors import StateError
    from imp_core.sketch.partition import Partition

    parts = PartitionSet((Partition("r", "b", (0, 3, 6), "int"),))

    def pipe(sql: str, buffer: int, outside: bool) -> Pipeline:
        plan = parse_query(sql, {t: SCHEMAS[t] for t in TABLES}).plan
        external = external_candidates(plan) if outside else frozenset()
        p = Pipeline(plan, parts, external=external, minmax_buffer=buffer)
        p.bind_stores(lambda op: MemoryGroupStore(op.key_names, op.component_schemas()))
        p.capture(LocalBackend(Store({"r": [(i % 5, i % 4, 0.5, "abc"[i % 3], None) for i in range(30)]}).read),
                  {"r": 0})
        return p

    def move(p: Pipeline, sql: str) -> Pipeline:
        plan = parse_query(sql, {t: SCHEMAS[t] for t in TABLES}).plan
        return p.placed(external_candidates(plan) if outward else frozenset(),
                        lambda op: MemoryGroupStore(op.key_names, op.component_schemas()))

    extreme = "SELECT r.a AS a, MAX(r.b) AS m FROM r GROUP BY r.a"
    with pytest.raises(StateError, match=r"\(m\) keeps the best 2 values per group \(minmax_buffer=2\) and cannot "
                                         r"move between memory and Delta tables; recapture the sketch") as e:
        move(pipe(extreme, 2, not outward), extreme)
    assert "\n" not in str(e.value)
    assert move(pipe(extreme, 0, not outward), extreme).external == (external_candidates(
        parse_query(extreme, {t: SCHEMAS[t] for t in TABLES}).plan) if outward else frozenset())
    summed = "SELECT r.a AS a, SUM(r.b) AS s FROM r GROUP BY r.a"
    assert move(pipe(summed, 2, not outward), summed).external != pipe(summed, 2, not outward).external

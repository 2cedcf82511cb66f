"""The pipeline's stages: a subtree that a rewrite places twice (TPC-H Q21's per-order summaries feed its EXISTS join
and its NOT EXISTS) is one stage, with one operator, one state and one delta per pass, also when the plan was read
back from the catalog, where the copies are distinct objects."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import numpy as np
import polars as pl

from imp_core.engine.local import LocalBackend
from imp_core.engine.operators.aggregation import Aggregation
from imp_core.engine.pipeline import Pipeline, node_paths
from imp_core.engine.schema import MULT
from imp_core.plan.nodes import Aggregate, Plan
from imp_core.plan.serialize import plan_from_json, plan_to_json
from imp_core.plan.sql import parse_query
from tests.engine.test_properties import assert_same_state
from tests.engine.two_tables import SCHEMA, VERSIONS, apply, parts, reader, rows

# Q21's shape: EXISTS and NOT EXISTS, each correlated by the key and an inequality, become per-key summaries that
# the rewrite joins into both the rows that pass and those the NOT EXISTS keeps
Q21_SHAPE = ("SELECT g, COUNT(*) AS n FROM T1 WHERE EXISTS (SELECT * FROM T2 WHERE T2.g = T1.g AND T2.v <> T1.v) "
             "AND NOT EXISTS (SELECT * FROM T2 AS T3 WHERE T3.g = T1.g AND T3.v <> T1.v AND T3.v > 3) GROUP BY g")


def plans() -> tuple[Plan, Plan]:
    plan = parse_query(Q21_SHAPE, {"T1": SCHEMA, "T2": SCHEMA}).plan
    return plan, plan_from_json(plan_to_json(plan))


def aggregates(plan: Plan) -> list[str]:
    return [p for p, node in node_paths(plan) if isinstance(node, Aggregate)]


def test_a_subtree_placed_twice_is_one_stage_also_after_the_catalog() -> None:
    fresh, stored = plans()
    assert stored == fresh
    places = aggregates(stored)
    assert len({id(n) for p, n in node_paths(stored) if p in places}) == len(places), "stored copies are distinct"
    built = [Pipeline(p, parts()) for p in (fresh, stored)]
    for pipe in built:
        held = [op.op_id for op in pipe.stateful() if isinstance(op, Aggregation)]
        assert len(held) < len(places), (held, places)  # the summaries placed twice are held once
        assert len(list(pipe.stages())) < len(list(node_paths(stored)))
        for path, node in node_paths(stored):  # every place names its stage
            assert pipe.stage_at(path).node == node
            assert pipe.stage(node).path == pipe.stage_at(path).path
    assert built[0].fingerprint == built[1].fingerprint
    assert [op.op_id for op in built[0].stateful()] == [op.op_id for op in built[1].stateful()]


def test_a_later_place_names_the_shared_operator_for_placement_and_loading() -> None:
    _, stored = plans()
    pipe = Pipeline(stored, parts())
    later = [p for p in aggregates(stored) if pipe.stage_at(p).path != p]
    assert later, "the shape places a summary twice"
    outside = Pipeline(stored, parts(), external=frozenset(later))
    assert outside.external == frozenset(pipe.stage_at(p).path for p in later)
    assert {op.op_id.split("@", 1)[1] for op in outside.external_operators()} == outside.external
    # state saved with one operator per place (before the places shared a stage): the first place's is loaded
    pipe.capture(LocalBackend(reader(tables(np.random.default_rng(5)))), VERSIONS)
    blobs = pipe.state_blobs()
    old = {**blobs, **{f"aggregation@{p}": blobs[f"aggregation@{pipe.stage_at(p).path}"] for p in later}}
    loaded = Pipeline(stored, parts())
    loaded.load_state_blobs(old)
    assert loaded.sketch() == pipe.sketch()
    assert_same_state(loaded, pipe, "loaded")


def tables(rng: np.random.Generator) -> dict[str, pl.DataFrame]:
    return {t: rows(rng.integers(0, 10, 10).tolist(), rng.integers(-5, 15, 10).tolist()) for t in ("T1", "T2")}


def changed(data: dict[str, pl.DataFrame], table: str, rng: np.random.Generator, seed: int) -> pl.DataFrame:
    """Three random inserts and two deletes of ``table``, applied to ``data``; the change rows."""
    ins = rows(rng.integers(0, 10, 3).tolist(), rng.integers(-5, 15, 3).tolist(), [1] * 3)
    dels = data[table].sample(2, seed=seed).with_columns(pl.lit(-1, dtype=pl.Int64).alias(MULT))
    change = pl.concat([ins, dels])
    data[table] = apply(data[table], change)
    return change


def test_a_shared_stage_folds_each_batch_once_and_stays_exact() -> None:
    """Maintained from the stored plan, each summary's operator processes every batch once, and the sketch and the
    states equal a capture's after every pass."""
    fresh, stored = plans()
    rng = np.random.default_rng(8)
    data = tables(rng)
    pipe = Pipeline(stored, parts())
    pipe.capture(LocalBackend(reader(data)), VERSIONS)
    calls: Counter[str] = Counter()

    def counting(op: Aggregation) -> Callable[[pl.DataFrame], pl.DataFrame]:
        process = op.process

        def counted(delta: pl.DataFrame) -> pl.DataFrame:
            calls[op.op_id] += 1
            return process(delta)
        return counted

    for op in pipe.stateful():
        if isinstance(op, Aggregation):
            op.process = counting(op)  # type: ignore[method-assign]
    for i in range(10):
        table = "T2" if i % 3 else "T1"
        change = changed(data, table, rng, i)
        calls.clear()
        pipe.maintain_pass(table, change, LocalBackend(reader(data)), VERSIONS)
        assert calls and set(calls.values()) == {1}, calls
        recaptured = Pipeline(fresh, parts())
        recaptured.capture(LocalBackend(reader(data)), VERSIONS)
        assert pipe.sketch() == recaptured.sketch(), i
        assert_same_state(pipe, recaptured, f"pass {i}")


def test_a_join_read_by_its_own_keys_is_read_as_its_two_sides() -> None:
    """With external state, a join above another join reads that join's rows by key: its two sides' rows for those
    keys joined in memory (the summaries from their stores), not recomputed by the backend over the stores; the
    sketch and the states stay the in-memory engine's."""
    from imp_core.engine.external import MemoryGroupStore
    from imp_core.engine.pipeline import external_candidates
    from imp_core.plan.nodes import Join

    plan, _ = plans()
    memory, outside = Pipeline(plan, parts()), Pipeline(plan, parts(), external=external_candidates(plan))
    outside.bind_stores(lambda op: MemoryGroupStore(op.key_names, op.component_schemas()))
    asked: list[Plan] = []

    class Recording(LocalBackend):
        def rows_with_keys(self, side, keys, values, max_rows, versions):  # type: ignore[no-untyped-def]  # noqa: ANN001, ANN202
            asked.append(side.node)
            return super().rows_with_keys(side, keys, values, max_rows, versions)

    rng = np.random.default_rng(2)
    data = tables(rng)
    for p in (memory, outside):
        p.capture(Recording(reader(data)), VERSIONS)
    for i in range(8):
        table = "T1" if i % 2 else "T2"
        change = changed(data, table, rng, i)
        for p in (memory, outside):
            p.maintain_pass(table, change, Recording(reader(data)), VERSIONS)
        assert outside.sketch() == memory.sketch(), i
        assert_same_state(outside, memory, f"pass {i}")
    assert asked, "the joins read their sides by key"
    over_state = [n for n in asked if isinstance(n, Join) and not n.is_stateless()]
    assert not over_state, "a join over external results was computed by the backend"


def test_state_saved_with_a_place_per_copy_is_recaptured_and_stateless_copies_stay_apart() -> None:
    """The fingerprint state is tied to says when stateful subtrees share a stage (state saved while each place had
    its own stage does not load: the sketch is recaptured); a plan without such copies keeps its fingerprint. Equal
    stateless subtrees are not merged: a scan's annotation columns follow its object, and the subquery's T2 and the
    outer T2 here meet at a join."""
    from imp_core.engine.pipeline import plan_fingerprint
    from imp_core.plan.nodes import Scan, shares_state

    fresh, stored = plans()
    assert shares_state(fresh) and shares_state(stored)
    single = parse_query("SELECT g, SUM(v) AS s FROM T1 GROUP BY g", {"T1": SCHEMA, "T2": SCHEMA}).plan
    assert not shares_state(single)
    assert Pipeline(single, parts()).fingerprint == plan_fingerprint(single, parts())
    union = parse_query("SELECT u.g, COUNT(*) AS n FROM (SELECT g, SUM(v) AS v FROM T1 GROUP BY g UNION ALL "
                        "SELECT g, v FROM T2) u JOIN T2 ON u.g = T2.g GROUP BY u.g", {"T1": SCHEMA, "T2": SCHEMA}).plan
    scans = [n for n in Pipeline(union, parts()).plan.walk() if isinstance(n, Scan) and n.table == "T2"]
    assert len(scans) == 2 and scans[0] == scans[1] and scans[0] is not scans[1]

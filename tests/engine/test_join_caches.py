"""Join side caches (small sides kept whole, partner indexes, counting Bloom filters): same sketches as without
them, fewer joins."""

from __future__ import annotations

import random

import numpy as np
import polars as pl
import pytest

from imp_core.engine import state as codec
from imp_core.engine.bloom import CountingBloom
from imp_core.engine.local import LocalBackend
from imp_core.engine.operators.context import JoinCaching
from imp_core.engine.pipeline import Pipeline
from imp_core.engine.schema import MULT
from imp_core.plan.sql import parse_query
from imp_core.sketch.partition import Partition, PartitionSet

SQL = ("SELECT r.g AS g, SUM(s.w) AS total FROM r JOIN s ON r.k = s.k WHERE r.v < 8 "
       "GROUP BY r.g HAVING SUM(s.w) > 5")


class Store:
    """Tables as lists of rows per version (a tiny stand-in for Delta)."""

    def __init__(self, r: list[tuple], s: list[tuple]) -> None:
        self.versions = {"r": [list(r)], "s": [list(s)]}

    def frame(self, table: str, version: int) -> pl.DataFrame:
        cols = ("g", "k", "v") if table == "r" else ("k", "w")
        rows = self.versions[table][version]
        return pl.DataFrame({c: [row[i] for row in rows] for i, c in enumerate(cols)},
                            schema={c: pl.Int64 for c in cols})

    def change(self, table: str, deletes: list[int], inserts: list[tuple]) -> pl.DataFrame:
        current = list(self.versions[table][-1])
        gone = [current[i] for i in sorted(set(deletes), reverse=True)]
        for i in sorted(set(deletes), reverse=True):
            current.pop(i)
        current += inserts
        self.versions[table].append(current)
        cols = ("g", "k", "v") if table == "r" else ("k", "w")
        rows = [(*row, -1) for row in gone] + [(*row, 1) for row in inserts]
        return pl.DataFrame({c: [row[i] for row in rows] for i, c in enumerate([*cols, MULT])},
                            schema={c: pl.Int64 for c in [*cols, MULT]})


class CountingBackend(LocalBackend):
    def __init__(self, store: Store) -> None:
        super().__init__(store.frame)
        self.joins = 0
        self.lookups = 0

    def rows_with_keys(self, side, keys, values, max_rows, versions):  # noqa: ANN001, ANN201
        self.lookups += 1
        return super().rows_with_keys(side, keys, values, max_rows, versions)

    def join_delta(self, join, delta, delta_is_left, other, versions):  # noqa: ANN001, ANN201
        self.joins += 1
        return super().join_delta(join, delta, delta_is_left, other, versions)


def pipelines(plan, parts):  # noqa: ANN001, ANN201
    return {"plain": Pipeline(plan, parts),
            "bloom": Pipeline(plan, parts, join_caching=JoinCaching(bloom=True, small_rows=0)),
            "small": Pipeline(plan, parts, join_caching=JoinCaching(bloom=True, small_rows=1000)),
            "partners": Pipeline(plan, parts, join_caching=JoinCaching(bloom=True, small_rows=0, partner_rows=1000)),
            "partners, no Bloom": Pipeline(plan, parts, join_caching=JoinCaching(bloom=False, partner_rows=1000)),
            "partners, frames": Pipeline(plan, parts, join_caching=JoinCaching(bloom=True, partner_rows=1000,
                                                                              keyed=False)),
            "partners, tight": Pipeline(plan, parts, join_caching=JoinCaching(bloom=True, partner_rows=3))}


@pytest.mark.parametrize("seed", range(12))
def test_caches_give_the_same_sketches_as_plain_joins(seed: int) -> None:
    rng = random.Random(seed)
    store = Store([(rng.randint(0, 5), rng.randint(0, 9), rng.randint(0, 10)) for _ in range(30)],
                  [(rng.randint(0, 12), rng.randint(0, 4)) for _ in range(15)])
    schemas = {t: store.frame(t, 0).to_arrow().schema for t in ("r", "s")}
    plan = parse_query(SQL, schemas).plan
    parts = PartitionSet((Partition("r", "g", (0, 2, 4, 6), "int"), Partition("s", "w", (0, 2, 5), "int")))
    backend = CountingBackend(store)
    pipes = pipelines(plan, parts)
    versions = {"r": 0, "s": 0}
    for p in pipes.values():
        p.capture(backend, versions)
    for _ in range(12):
        table = rng.choice(["r", "s"])
        size = len(store.versions[table][-1])
        deletes = rng.sample(range(size), rng.randint(0, min(3, size)))
        inserts = ([(rng.randint(0, 5), rng.randint(0, 14), rng.randint(0, 10)) for _ in range(rng.randint(0, 3))]
                   if table == "r" else [(rng.randint(0, 14), rng.randint(0, 4)) for _ in range(rng.randint(0, 3))])
        changes = store.change(table, deletes, inserts)
        versions = {**versions, table: len(store.versions[table]) - 1}
        for p in pipes.values():
            p.maintain_pass(table, changes, backend, dict(versions))
            if seed % 2:  # caches survive a reload from the catalog (even seeds keep them in memory throughout)
                p.load_state_blobs(p.state_blobs())
        fresh = Pipeline(plan, parts)
        fresh.capture(backend, versions)
        for name, p in pipes.items():
            assert p.sketch() == fresh.sketch(), name


def test_a_small_side_never_goes_back_to_the_backend() -> None:
    store = Store([(1, 1, 1)], [(1, 10)])
    schemas = {t: store.frame(t, 0).to_arrow().schema for t in ("r", "s")}
    plan = parse_query(SQL, schemas).plan
    parts = PartitionSet((Partition("r", "g", (0, 2, 4), "int"),))
    backend = CountingBackend(store)
    p = Pipeline(plan, parts, join_caching=JoinCaching(bloom=True, small_rows=100))
    p.capture(backend, {"r": 0, "s": 0})
    before = backend.joins
    for i in range(5):
        changes = store.change("r", [], [(1, 1, i)])
        p.maintain_pass("r", changes, backend, {"r": i + 1, "s": 0})
    assert backend.joins == before  # joined in memory against the cached side


def test_bloom_filter_forgets_deleted_keys_and_skips_the_join() -> None:
    bloom = CountingBloom.for_keys(100)
    keys = pl.DataFrame({"k0": list(range(100))})
    bloom.add(keys, np.ones(100, dtype=np.int64))
    assert bloom.may_contain(keys).all()
    bloom.add(keys, -np.ones(100, dtype=np.int64))
    assert not bloom.may_contain(keys).any()  # every key deleted: none admitted any more

    store = Store([(1, 1, 1)], [(100 + i, 1) for i in range(50)])  # no s key joins r's keys 0..9
    schemas = {t: store.frame(t, 0).to_arrow().schema for t in ("r", "s")}
    plan = parse_query(SQL, schemas).plan
    backend = CountingBackend(store)
    p = Pipeline(plan, PartitionSet((Partition("r", "g", (0, 2, 4), "int"),)),
                 join_caching=JoinCaching(bloom=True, small_rows=0))
    p.capture(backend, {"r": 0, "s": 0})
    changes = store.change("r", [], [(1, k, 1) for k in range(10)])
    joins = backend.joins
    p.maintain_pass("r", changes, backend, {"r": 1, "s": 0})
    assert backend.joins == joins  # the filter proved no partner exists: the join with s was skipped


def test_a_partner_index_joins_known_keys_in_memory_and_looks_up_new_ones_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # s is "large" (no small-side cache); r's keys 0..2 have partners in s, key 7 none; key 5 arrives later
    store = Store([(1, k, 1) for k in (0, 1, 2, 7)], [(k, 1) for k in range(40)])
    schemas = {t: store.frame(t, 0).to_arrow().schema for t in ("r", "s")}
    plan = parse_query(SQL, schemas).plan
    parts = PartitionSet((Partition("r", "g", (0, 2, 4), "int"),))
    backend = CountingBackend(store)
    p = Pipeline(plan, parts, join_caching=JoinCaching(bloom=True, small_rows=0, partner_rows=100))
    p.capture(backend, {"r": 0, "s": 0})
    versions = {"r": 0, "s": 0}

    def step(table: str, deletes: list[int], inserts: list[tuple]) -> None:
        changes = store.change(table, deletes, inserts)
        versions[table] = len(store.versions[table]) - 1
        p.maintain_pass(table, changes, backend, dict(versions))
        p.load_state_blobs(p.state_blobs())  # the index survives a reload from the catalog
        with monkeypatch.context() as m:  # ... and one from frames stored as parts of a few rows each
            m.setattr(codec, "PART_FROM", 0)
            m.setattr(codec, "PART_BYTES", 40)
            stored: dict[str, bytes] = {}
            blobs = p.saved_states(lambda digest, data: stored.__setitem__(digest, data))
            p.load_state_blobs({op_id: blob for op_id, (blob, _) in blobs.items()}, stored.__getitem__)
            assert len(stored) > 3
        fresh = Pipeline(plan, parts)
        fresh.capture(backend, versions)
        assert p.sketch() == fresh.sketch()

    step("r", [], [(1, 1, 2)])  # first delta builds the index (one lookup of r's keys in s)
    joins, lookups = backend.joins, backend.lookups
    step("r", [], [(1, 2, 3), (3, 0, 4)])  # known keys: joined in memory
    step("r", [0], [])
    assert (backend.joins, backend.lookups) == (joins, lookups)
    step("r", [], [(3, 5, 1)])  # key 5 is new to r: its partners are looked up once...
    assert backend.lookups == lookups + 1
    step("r", [], [(3, 5, 2)])  # ... and then known
    assert backend.lookups == lookups + 1
    step("s", [5], [(5, 9), (2, 3)])  # s changes: r's side builds its own index (one lookup), s's index follows
    assert backend.lookups == lookups + 2
    step("r", [], [(3, 5, 3), (1, 2, 1)])  # the changed partners of keys 2 and 5 came from the index
    assert backend.lookups == lookups + 2 and backend.joins == joins
    join = next(op for op in p.stateful() if op.kind == "join")
    _, frames = join.saved_frames()
    lazy = [n for n, f in frames.items() if isinstance(f, codec.Rows)]
    assert lazy and all(n.endswith("_keys") for n in lazy)  # a keyed index's keys are built slice by slice
    assert all(frames[n].frame().equals(join.state_frames()[1][n]) for n in lazy)

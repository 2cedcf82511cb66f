"""The memory store (imp_core/engine/keyed_state/memory.py) against a model of the contract in plain Python: random
batches of replaces (duplicates, cancelling and zero counts, NULL keys), loads, commits, aborts and reopened
checkpoints, with so few tombstones allowed that the bags rebuild their entries often; after every step every read
(fetch, lookup, scan, size) equals the model."""

from __future__ import annotations

from collections import Counter
from typing import Any

import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st

from imp_core.engine.keyed_state import memory
from imp_core.engine.keyed_state.contract import Component, Kind, StateSpec
from imp_core.engine.keyed_state.memory import MemoryStore
from tests.engine.generators import property_test

SPEC = StateSpec("anti_join@r", (("k", pl.Int64), ("s", pl.String)), (
    Component("groups", Kind.MAP, (("x", pl.Float64), ("n", pl.Int64)), count="n"),
    Component("rows", Kind.BAG, (("v", pl.String), ("c", pl.Int64)), count="c"),
))
KEYS = [(k, s) for k in (1, 2, 3) for s in ("a", None)]

Model = dict[tuple, dict[str, Any]]  # key -> {"groups": (x, n) | None, "rows": Counter(v -> count)}

key = st.sampled_from(KEYS)
map_row = st.tuples(st.sampled_from([0.5, -1.0, 2.25]), st.sampled_from([0, 1, 3]))
bag_rows = st.lists(st.tuples(st.sampled_from(["p", "q", None]), st.sampled_from([-2, -1, 0, 1, 2])), max_size=4)
replace_step = st.tuples(st.just("replace"), st.lists(key, min_size=1, max_size=4),
                         st.dictionaries(key, st.tuples(st.none() | map_row, bag_rows)))
step = st.one_of(replace_step, st.tuples(st.just("load"), st.dictionaries(key, st.tuples(st.none() | map_row,
                                                                                            bag_rows))),
                 st.just(("commit",)), st.just(("abort",)), st.just(("reopen",)))


def frames(given_rows: dict[tuple, tuple]) -> dict[str, pl.DataFrame]:
    groups = [(*k, *m) for k, (m, _) in given_rows.items() if m is not None]
    rows = [(*k, v, c) for k, (_, bag) in given_rows.items() for v, c in bag]
    return {"groups": pl.DataFrame(groups, schema=SPEC.schema("groups"), orient="row"),
            "rows": pl.DataFrame(rows, schema=SPEC.schema("rows"), orient="row")}


def modeled(given_rows: dict[tuple, tuple]) -> Model:
    """What replacing (or loading) ``given_rows`` leaves per key: the live map row, the netted bag."""
    out: Model = {}
    for k, (m, bag) in given_rows.items():
        counts: Counter = Counter()
        for v, c in bag:
            counts[v] += c
        out[k] = {"groups": m if m is not None and m[1] != 0 else None,
                  "rows": Counter({v: c for v, c in counts.items() if c != 0})}
    return out


def expected(model: Model, keys: list[tuple]) -> dict[str, set]:
    groups = {(*k, *model[k]["groups"]) for k in keys if k in model and model[k]["groups"] is not None}
    rows = {(*k, v, c) for k in keys if k in model for v, c in model[k]["rows"].items()}
    return {"groups": groups, "rows": rows}


def rows_of(frames_read: dict[str, pl.DataFrame]) -> dict[str, set]:
    got = {name: set(df.iter_rows()) for name, df in frames_read.items()}
    for name, df in frames_read.items():
        assert len(got[name]) == df.height, f"{name}: a row repeated"  # the normal form: one row per identity
    return got


def fetched(store: MemoryStore, keys: list[tuple]) -> dict[str, pl.DataFrame]:
    batch = store.fetch(pl.DataFrame(keys, schema=SPEC.key_types, orient="row"))
    return {c.name: batch.rows(c.name) for c in SPEC.components}


def check(store: MemoryStore, model: Model) -> None:
    want = expected(model, KEYS)
    assert rows_of(fetched(store, KEYS)) == want
    chunks = list(store.scan())
    assert rows_of({c.name: pl.concat([ch[c.name] for ch in chunks]) for c in SPEC.components}) == want
    assert rows_of(store.lookup(pl.DataFrame({"s": [None]}))) == expected(model, [k for k in KEYS if k[1] is None])
    assert store.size() == {name: len(rows) for name, rows in want.items()}


def copied(model: Model) -> Model:
    return {k: {"groups": v["groups"], "rows": Counter(v["rows"])} for k, v in model.items()}


@property_test(150)
@given(steps=st.lists(step, min_size=1, max_size=12))
def test_every_read_equals_the_model_after_every_step(steps: list[tuple]) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(memory, "MIN_TOMBSTONES", 0)  # a bag rebuilds its entries once its tombstones outnumber them
        run(steps)


def run(steps: list[tuple]) -> None:
    store = MemoryStore(SPEC, chunk_keys=3)
    store.open()
    model: Model = {}
    committed: tuple[Any, Model] = (store.checkpoint(), {})
    for s in steps:
        if s[0] == "replace":
            _, keys, given_rows = s
            given_rows = {k: v for k, v in given_rows.items() if k in keys}
            batch = store.fetch(pl.DataFrame(keys, schema=SPEC.key_types, orient="row"))
            assert batch.present.tolist() == [bool(expected(model, [k])["groups"] or expected(model, [k])["rows"])
                                              for k in dict.fromkeys(keys)]
            store.replace(batch, frames(given_rows))
            for k in keys:
                model.pop(k, None)
            model.update(modeled(given_rows))
        elif s[0] == "load":
            store.load(frames(s[1]))
            model = modeled(s[1])
        elif s[0] == "commit":
            store.commit()
            committed = (store.checkpoint(), copied(model))
        elif s[0] == "abort":
            store.abort()
            store.open(committed[0])
            model = copied(committed[1])
        else:  # the next job: a new store opened at what was committed
            store.commit()
            committed = (store.checkpoint(), copied(model))
            store = MemoryStore(SPEC, chunk_keys=3)
            store.open(committed[0])
        check(store, model)


def test_a_bag_rebuilds_its_entries_once_tombstones_outnumber_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "MIN_TOMBSTONES", 0)
    store = MemoryStore(SPEC)
    store.open()
    many = {k: (None, [(v, 1) for v in ("p", "q", None)]) for k in KEYS}
    store.replace(store.fetch(pl.DataFrame(KEYS, schema=SPEC.key_types, orient="row")), frames(many))
    bag = store._parts["rows"]  # the entries are what is tested
    assert bag.entries.size == 18 and bag.zeros == 0
    kept = {(1, "a"): (None, [("q", 2)])}  # one key keeps one row, the others lose theirs: 17 tombstones, one rebuild
    store.replace(store.fetch(pl.DataFrame(KEYS, schema=SPEC.key_types, orient="row")), frames(kept))
    assert bag.entries.size == 1 and bag.zeros == 0
    check(store, modeled(kept))
    again = {(1, "a"): (None, [("q", 1), ("p", 1)]), (3, None): (None, [(None, 4)])}
    store.replace(store.fetch(pl.DataFrame(list(again), schema=SPEC.key_types, orient="row")), frames(again))
    check(store, {**modeled(kept), **modeled(again)})

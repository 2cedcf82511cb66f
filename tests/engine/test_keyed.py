"""Keyed operator state (``imp_core.engine.keyed``) against plain Python models, and the aggregation on keyed state
against the aggregation on whole frames (the first engine's state, ``keyed=False``): same output on every batch,
same canonical state (MIN/MAX multisets included: keyed ones in the first case, frames in the second), state saved
by one loads into the other.

Hash collisions are forced with an index whose row hash keeps 2 bits, so every lookup and insert goes through the
collision path; compaction of emptied (slot, fragment) counts is forced with a low threshold.
"""

from __future__ import annotations

import datetime as dt
import random

import numpy as np
import polars as pl
import pyarrow as pa
import pytest

from imp_core.engine.annotation import SMALL_BATCH, consolidate
from imp_core.engine.keyed import KeyIndex, PairCounts, SortedMap, _search, integer_hashes, lists_by_slot
from imp_core.engine.operators import small_batch
from imp_core.engine.operators.aggregation import Aggregation
from imp_core.engine.operators.partials import PartialLayout, group_ids
from imp_core.engine.schema import MULT, frag_col
from imp_core.engine.slot_columns import SlotColumns
from imp_core.errors import StateError
from imp_core.plan.expr import FLOAT, INT, STRING, AggCall, Col


class WeakIndex(KeyIndex):
    """A KeyIndex whose hashes collide all the time (4 distinct values)."""

    def hashes(self, frame: pl.DataFrame) -> np.ndarray:
        return super().hashes(frame) & np.uint64(3)


@pytest.mark.parametrize("directory_min", [1 << 16, 64])
def test_sorted_map_matches_a_dict_across_merges(directory_min: int) -> None:
    """With and without the main run's bucket directory (a low threshold gives the map one after its first
    merge)."""
    rng = np.random.default_rng(1)
    m, model = SortedMap(), {}
    m.directory_min = directory_min
    for _ in range(40):  # 40 x 500 inserts: the pending run is merged into the main run several times
        keys = np.setdiff1d(rng.integers(0, 2 ** 40, 600).astype(np.uint64), np.fromiter(model, np.uint64))[:500]
        rng.shuffle(keys)
        vals = rng.integers(0, 10 ** 9, keys.size)
        m.put(keys, vals)
        model.update(zip(keys.tolist(), vals.tolist()))
        probe = np.concatenate([keys[:50], rng.integers(0, 2 ** 40, 50).astype(np.uint64)])
        assert m.get(probe).tolist() == [model.get(int(k), -1) for k in probe]
    assert len(m) == len(model) and m.pkeys.size < len(model)
    assert bool(m.starts.size) == (directory_min == 64)
    lo = np.array([0, 2 ** 38, 2 ** 39 + 5], dtype=np.uint64)
    hi = np.array([2 ** 30, 2 ** 38 + 2 ** 34, 2 ** 40], dtype=np.uint64)
    got, vals = m.in_ranges(lo, hi)
    want = sorted(k for k in model if any(a <= k < b for a, b in zip(lo.tolist(), hi.tolist())))
    assert sorted(got.tolist()) == want and sorted(vals.tolist()) == sorted(model[k] for k in want)


def test_slot_buckets_list_each_slots_entries() -> None:
    """``slot << 32 | fragment`` keys: a slot's entries are its bucket, found from the directory a fixed-shift map
    keeps at any size, or by range search while every key is still in the pending run."""
    rng = np.random.default_rng(2)
    model: dict[int, int] = {}
    for pending_min in (1 << 16, 64):
        m = SortedMap(shift=32)
        m.pending_min = pending_min
        for _ in range(30):
            slots = rng.integers(0, 300, 40).astype(np.uint64)
            keys = np.setdiff1d((slots << np.uint64(32)) | rng.integers(0, 9, 40).astype(np.uint64),
                                np.fromiter(m.items()[0], np.uint64))
            m.put(keys, np.arange(keys.size, dtype=np.int64))
            model = dict(zip(*[a.tolist() for a in m.items()]))
            probe = np.unique(rng.integers(0, 320, 25))
            got, _ = m.in_buckets(probe)
            assert sorted(got.tolist()) == sorted(k for k in model if (k >> 32) in set(probe.tolist()))
            assert m.get(probe.astype(np.uint64) << np.uint64(32)).tolist() == \
                [model.get(int(k) << 32, -1) for k in probe]
        assert bool(m.starts.size) == (pending_min == 64) == bool(m.keys.size)


@pytest.fixture(params=["no directory", "directory"])
def directory(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run a test with the sorted maps' bucket directory from 16 keys on, or never."""
    monkeypatch.setattr(SortedMap, "directory_min", 16 if request.param == "directory" else 1 << 40)
    monkeypatch.setattr(SortedMap, "pending_min", 32)


@pytest.mark.usefixtures("directory")
@pytest.mark.parametrize("index_type", [KeyIndex, WeakIndex])
def test_key_index_finds_every_key_and_only_those(index_type: type[KeyIndex]) -> None:
    """Keys with NULLs, strings and floats; inserted in batches; probes mix present and absent keys."""
    rng = random.Random(3)
    schema = {"k": pl.Int64, "s": pl.String, "x": pl.Float64}
    store, index, model = SlotColumns(schema), index_type(list(schema)), {}
    universe = [(rng.choice([None, *range(30)]), rng.choice([None, "a", "b", "é"]), rng.choice([None, 0.5, -1.0]))
                for _ in range(800)]
    universe = list(dict.fromkeys(universe))
    for start in range(0, len(universe), 97):
        batch = pl.DataFrame(universe[start:start + 97], schema=schema, orient="row")
        probe = pl.DataFrame(rng.sample(universe, 60), schema=schema, orient="row")
        assert index.lookup(probe, store).tolist() == [model.get(r, -1) for r in probe.rows()]
        slots = store.append(batch)
        index.insert(batch, slots, store)
        model.update(zip(batch.rows(), slots.tolist()))
    everything = pl.DataFrame(universe, schema=schema, orient="row")
    assert index.lookup(everything, store).tolist() == [model[r] for r in everything.rows()]
    assert store.gather(np.array([model[universe[5]], -1])).rows() == [universe[5], (None, None, None)]
    rebuilt = index_type(list(schema))
    rebuilt.build(everything, store)  # slots 0.. in the frame's order: the same as appended
    assert rebuilt.lookup(everything, store).tolist() == list(range(len(universe)))
    if index_type is WeakIndex:
        assert rebuilt.collided and index.collided


def test_slot_columns_scatter_in_place_and_grow() -> None:
    store = SlotColumns({"a": pl.Int64, "s": pl.String})
    slots = store.append(pl.DataFrame({"a": range(3000), "s": [str(i) for i in range(3000)]}))
    assert slots.tolist() == list(range(3000)) and store.size == 3000
    store.scatter(np.array([5, 2999]), pl.DataFrame({"a": [-5, -1], "s": ["x", None]}, schema=store.schema))
    assert store.rows(np.array([5, 2999, 6])).rows() == [(-5, "x"), (-1, None), (6, "6")]


def test_pair_counts_follow_a_dict_through_compaction() -> None:
    rng = np.random.default_rng(5)
    pairs, model = PairCounts(), {}
    pairs.compact_at = 50
    compacted = False
    for _ in range(60):
        slots = rng.integers(0, 40, 300)
        frags = rng.integers(0, 8, 300).astype(np.uint32)
        keys = sorted(set(zip(slots.tolist(), frags.tolist())))
        s = np.array([k[0] for k in keys], dtype=np.int64)
        f = np.array([k[1] for k in keys], dtype=np.uint32)
        pos, before = pairs.of_slots(np.unique(s)).find(PairCounts.key(s, f), np.ones(s.size, dtype=bool))
        assert before.tolist() == [model.get(k, 0) for k in keys]
        after = np.where(rng.random(len(keys)) < 0.6, 0, before + rng.integers(0, 3, len(keys)))  # many fall to 0
        size = pairs.size
        pairs.commit(pos, after, s, f)
        compacted |= pairs.size < size
        model.update(zip(keys, after.tolist()))
        got_s, got_f, got_c = pairs.items()
        assert list(zip(got_s.tolist(), got_f.tolist(), got_c.tolist())) == sorted(
            (k[0], k[1], c) for k, c in model.items() if c > 0)
        probe = np.array([3, 7, 39])
        es, ef = pairs.of_slots(probe).live()
        want = sorted(k for k, c in model.items() if c > 0 and k[0] in (3, 7, 39))
        assert sorted(zip(es.tolist(), ef.tolist())) == want
    assert compacted


# -- the aggregation on keyed state against the aggregation on frames ---------------------------------------------

KEYS = {"g": pl.Int64, "s": pl.String}
NUMERIC_KEYS = {"g": pl.Int64, "d": pl.Date}  # keys NumPy folds (``PartialLayout._folded``)


def _aggregation(keyed: bool, weak: bool = False, keys: dict[str, pl.DataType] = KEYS) -> Aggregation:
    aggs = (("n", AggCall("count", None, pa.int64())), ("si", AggCall("sum", Col("i", INT), pa.int64())),
            ("sx", AggCall("sum", Col("x", FLOAT), pa.float64())),
            ("mx", AggCall("max", Col("x", FLOAT), pa.float64())), ("mi", AggCall("min", Col("i", INT), pa.int64())))
    types = {pl.Int64: INT, pl.String: STRING, pl.Date: pa.date32()}
    op = Aggregation("aggregation@r", tuple((k, Col(k, types[t])) for k, t in keys.items()), aggs, keys, keyed=keyed)
    if weak:
        op._index = WeakIndex(op.key_names)
    return op


def _batches(seed: int, count: int) -> list[pl.DataFrame]:
    """Insert/delete batches over few groups (groups empty out and come back), with NULL keys and values and NaN,
    each row in 1 or 2 fragment columns."""
    rng = random.Random(seed)
    live: list[tuple] = []
    out = []
    for _ in range(count):
        rows = []
        for _ in range(rng.randrange(1, 40)):
            if live and rng.random() < 0.45:
                r = live.pop(rng.randrange(len(live)))
                rows.append((*r, -1))
            else:
                r = (rng.choice([None, *range(12)]), rng.choice([None, "a", "b"]), rng.choice([None, *range(-3, 9)]),
                     rng.choice([None, float("nan"), -0.0, 0.25, 1e16, -2.5]), rng.randrange(6), rng.randrange(6),
                     rng.choice([None, dt.date(2024, 2, 28), dt.date(1969, 12, 31)]))
                live.append(r)
                rows.append((*r, 1))
        out.append(pl.DataFrame(rows, orient="row", schema={"g": pl.Int64, "s": pl.String, "i": pl.Int64,
                                                             "x": pl.Float64, frag_col(0): pl.UInt32,
                                                             frag_col(1): pl.UInt32, "d": pl.Date, MULT: pl.Int64}))
    return out


def _same_state(a: Aggregation, b: Aggregation) -> None:
    ca, cb = a.canonical(), b.canonical()
    assert ca.keys() == cb.keys()
    for name in ca:
        assert ca[name].equals(cb[name], null_equal=True), name


@pytest.mark.parametrize(("seed", "weak", "directory_min", "keys"),
                         [(1, False, 1 << 40, KEYS), (2, True, 16, KEYS), (3, False, 16, NUMERIC_KEYS),
                          (4, True, 1 << 40, NUMERIC_KEYS)])
def test_keyed_aggregation_matches_frames_batch_by_batch(seed: int, weak: bool, directory_min: int,
                                                         keys: dict[str, pl.DataType],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Colliding hashes or not, sorted runs with a bucket directory or not (16: from the first merge on), a batch
    folded by polars (a string key) or by NumPy (integer and date keys, NULL among them)."""
    monkeypatch.setattr(SortedMap, "directory_min", directory_min)
    monkeypatch.setattr(SortedMap, "pending_min", 32)
    folded = []
    real = PartialLayout._folded
    monkeypatch.setattr(PartialLayout, "_folded",
                        lambda self, d, sort=True: folded.append(real(self, d, sort)) or folded[-1])
    frames, keyed = _aggregation(False, keys=keys), _aggregation(True, weak, keys=keys)
    order = [*keys, MULT]
    for i, batch in enumerate(_batches(seed, 120)):
        want, got = frames.process(batch), keyed.process(batch)
        assert got.sort(order, nulls_last=True).equals(want.sort(order, nulls_last=True), null_equal=True), i
        if i % 30 == 29:
            _same_state(frames, keyed)
    _same_state(frames, keyed)
    assert keyed.output_relation().height == frames.output_relation().height
    assert folded and all((f is not None) == (keys is NUMERIC_KEYS) for f in folded)
    if directory_min == 16:  # the directories were in use
        assert keyed._pairs.map.starts.size and (weak or keyed._index.map.starts.size)  # weak: 4 hashes at most


def test_state_saved_by_either_loads_into_the_other() -> None:
    frames, keyed = _aggregation(False), _aggregation(True)
    batches = _batches(4, 60)
    for batch in batches[:40]:
        frames.process(batch)
        keyed.process(batch)
    from_keyed, from_frames = _aggregation(False), _aggregation(True)
    from_keyed.load_state(keyed.state_to_bytes())
    from_frames.load_state(frames.state_to_bytes())
    _same_state(from_keyed, from_frames)
    for batch in batches[40:]:
        assert from_frames.process(batch).sort(["g", "s", MULT], nulls_last=True).equals(
            from_keyed.process(batch).sort(["g", "s", MULT], nulls_last=True), null_equal=True)


def test_keyed_global_aggregation_keeps_its_one_row() -> None:
    op = Aggregation("aggregation@r", (), (("n", AggCall("count", None, pa.int64())),), {})
    batch = pl.DataFrame({"i": [1, 2], MULT: [1, 1], frag_col(0): [0, 1]},
                         schema={"i": pl.Int64, MULT: pl.Int64, frag_col(0): pl.UInt32})
    op.process(batch)
    op.process(batch.with_columns(pl.lit(-1, dtype=pl.Int64).alias(MULT)))
    assert op.output_relation().select("n", "__sk").rows() == [(0, [])]


def test_a_deletion_the_keyed_state_never_saw_is_refused_and_changes_nothing() -> None:
    op = _aggregation(True)
    batch = _batches(6, 1)[0].with_columns(pl.lit(1, dtype=pl.Int64).alias(MULT))
    op.process(batch)
    before = op.canonical()
    with pytest.raises(StateError, match="recapture"):
        op.process(batch.head(1).with_columns(pl.lit(-1000, dtype=pl.Int64).alias(MULT)))
    after = op.canonical()
    assert all(before[k].equals(after[k], null_equal=True) for k in before)


def test_group_ids_match_a_polars_group_by() -> None:
    """NumPy's grouping (one key: ``unique``; several: ``lexsort``) groups exactly as polars does, NULL included."""
    rng = np.random.default_rng(5)
    frame = pl.DataFrame({"a": rng.integers(0, 4, 300), "b": rng.integers(0, 3, 300).astype(bool),
                          "d": rng.integers(-2, 2, 300)}).with_columns(
        pl.when(pl.col("a") == 3).then(None).otherwise(pl.col("a")).alias("a"), pl.col("d").cast(pl.Date))
    frame = frame.with_columns(wide=pl.Series(rng.integers(0, 4, 300) * (1 << 40) - (1 << 41)))
    for keys in (["a"], ["a", "b", "d"], ["d"], ["b"], ["wide"]):  # sorts; counts ("d", "b"); a wide range sorts
        inv, first = group_ids([frame.get_column(k) for k in keys])  # type: ignore[misc]
        want = frame.with_row_index("r").group_by(keys).agg(pl.col("r"))
        assert len(first) == want.height
        got = {tuple(sorted(np.flatnonzero(inv == g).tolist())) for g in range(len(first))}
        assert got == {tuple(sorted(r)) for r in want.get_column("r").to_list()}
        assert all(inv[f] == g for g, f in enumerate(first))
        if keys != ["a", "b", "d"]:  # groups are numbered in key order, NULL last
            assert frame.get_column(keys[0]).gather(first).to_list() == sorted(
                set(frame.get_column(keys[0]).to_list()), key=lambda v: (v is None, v or 0))
    assert group_ids([frame.get_column("wide")], sort=False) is None  # a wide range needs the sort
    assert group_ids([frame.get_column("d")], sort=False) is not None


def test_netting_without_duplicates_keeps_the_rows_and_drops_zeros() -> None:
    rows = pl.DataFrame({"k": [1, 2, 3, 1], "x": [0.5, 0.5, 0.5, 0.5], MULT: [1, 0, -1, 1]})
    assert consolidate(rows.head(3)).rows() == [(1, 0.5, 1), (3, 0.5, -1)]  # no two rows alike: no group-by
    assert sorted(consolidate(rows).rows()) == [(1, 0.5, 2), (3, 0.5, -1)]  # duplicates summed


@pytest.mark.parametrize("keys", [KEYS, NUMERIC_KEYS])
def test_output_values_in_numpy_match_the_expressions(keys: dict[str, pl.DataType],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """COUNT, integer SUM, float SUM and AVG with the intervals of order-dependent sums: the keyed aggregation's
    output values computed in NumPy (``small_batch.emit``) equal the polars expressions' (the frames engine), NULL,
    NaN, ±0.0 and 1e16 among the values, batch by batch."""
    aggs = (("n", AggCall("count", None, pa.int64())), ("si", AggCall("sum", Col("i", INT), pa.int64())),
            ("sx", AggCall("sum", Col("x", FLOAT), pa.float64())),
            ("ax", AggCall("avg", Col("x", FLOAT), pa.float64())),
            ("cx", AggCall("count", Col("x", FLOAT), pa.int64())))
    types = {pl.Int64: INT, pl.String: STRING, pl.Date: pa.date32()}
    key_exprs = tuple((k, Col(k, types[t])) for k, t in keys.items())

    def build(keyed: bool) -> Aggregation:
        return Aggregation("aggregation@r", key_exprs, aggs, keys, bounds={"sx", "ax"}, keyed=keyed)

    emitted = []
    real = small_batch.emit
    monkeypatch.setattr(small_batch, "emit", lambda *a: emitted.append(real(*a)) or emitted[-1])
    frames, keyed = build(False), build(True)
    order = [*keys, MULT]
    for i, batch in enumerate(_batches(7, 80)):
        want, got = frames.process(batch), keyed.process(batch)
        assert got.sort(order, nulls_last=True).equals(want.sort(order, nulls_last=True), null_equal=True), i
    _same_state(frames, keyed)
    assert emitted and all(e is not None for e in emitted)


@pytest.mark.parametrize(("rows", "spread"), [(1_000, 1), (1_000, 10_000), (70_000, 1)])
def test_lists_by_slot_gives_each_slot_its_sorted_values(rows: int, spread: int) -> None:
    """Slots few enough are counted (a batch over a small state, a whole state's save); slots spread far apart are
    searched per row. Rows of -1 (no slot) get an empty list either way."""
    rng = np.random.default_rng(rows)
    slots = rng.integers(0, rows, 3 * rows) * spread
    values = rng.integers(0, 50, slots.size).astype(np.uint32)
    keep = np.unique((slots << 32) | values.astype(np.int64), return_index=True)[1]  # (slot, value) pairs distinct
    slots, values = slots[keep], values[keep]
    wanted = rng.choice(rows + 10, rows, replace=False) * spread  # some slots without values, some beyond
    wanted[::7] = -1
    got = lists_by_slot(wanted, slots, values, "v").to_list()
    model: dict[int, list[int]] = {}
    for s_, v_ in zip(slots.tolist(), values.tolist()):
        model.setdefault(s_, []).append(v_)
    assert got == [sorted(model.get(w, [])) for w in wanted.tolist()]


def test_netting_a_batch_above_the_numpy_size() -> None:
    """Above SMALL_BATCH rows the distinct-rows check is a sort of an integer column (distinct values: distinct
    rows), else a count of row hashes: distinct rows come back as they are (zeros dropped), duplicates, cancelling
    pairs and NaN copies still go through the group-by."""
    n = SMALL_BATCH + 5
    rows = pl.DataFrame({"k": np.arange(n), "x": np.full(n, 0.5), MULT: np.ones(n, dtype=np.int64)})
    assert consolidate(rows) is rows
    mixed = rows.with_columns(pl.col("k") % 2, pl.col("k").cast(pl.Float64).alias("x"))
    assert consolidate(mixed) is mixed  # the integer column repeats, the rows do not: their hashes tell
    assert consolidate(rows.with_columns(pl.Series(MULT, [0] * 3 + [1] * (n - 3)))).height == n - 3
    twice = pl.concat([rows, rows.head(4).with_columns(pl.lit(-1, dtype=pl.Int64).alias(MULT)),
                       rows.tail(2).with_columns(pl.lit(1, dtype=pl.Int64).alias(MULT))])
    got = consolidate(twice)
    assert got.height == n - 4 and got.get_column(MULT).sum() == n - 4 + 2
    assert got.filter(pl.col("k") >= n - 2).get_column(MULT).to_list() == [2, 2]
    nan = consolidate(rows.with_columns(pl.lit(float("nan")).alias("x"), (pl.col("k") % 2).alias("k")))
    assert nan.height == 2 and nan.get_column(MULT).sum() == n  # NaN copies are one row, as in a group-by


@pytest.mark.parametrize("side", ["left", "right"])
def test_searching_many_keys_sorts_the_probes_and_finds_the_same_positions(side: str) -> None:
    rng = np.random.default_rng(11)
    keys = np.sort(rng.integers(0, 1 << 20, 200_000)).astype(np.int64)  # large enough to sort the probes
    for q in (rng.integers(-5, (1 << 20) + 5, 3000), keys[::50].copy(), rng.integers(0, 10, 300), np.array([7])):
        assert np.array_equal(_search(keys, q, side), np.searchsorted(keys, q, side))


@pytest.mark.parametrize("values,absent", [
    ([3, None, 7, 3, -1, None], 0),
    ([dt.date(2020, 1, 1), None, dt.date(1969, 12, 31), dt.date(2020, 1, 1)], dt.date(2001, 1, 1)),
    ([True, None, True], False),
    ([2 ** 64 - 1, 0, 2 ** 63, 0], 5),
])
def test_integer_keys_hash_in_numpy_and_find_their_slots(values: list[object], absent: object) -> None:
    """A single integer-like key is hashed in NumPy: equal values (NULL included) hash alike, and an index built from
    distinct keys finds every one of them again (and nothing for a key it does not hold)."""
    dtype = pl.UInt64 if isinstance(values[0], int) and max(v for v in values if v is not None) >= 2 ** 63 else None
    s = pl.Series("k", values, dtype=dtype)
    h = integer_hashes(s)
    same = [[h[i] == h[j] for j in range(len(values))] for i in range(len(values))]
    assert same == [[values[i] == values[j] for j in range(len(values))] for i in range(len(values))]
    distinct = s.unique(maintain_order=True).to_frame()
    stored = SlotColumns({"k": s.dtype})
    stored.append(distinct)
    index = KeyIndex(["k"])
    index.build(distinct, stored)
    assert index.lookup(s.to_frame(), stored).tolist() == [distinct.get_column("k").to_list().index(v) for v in values]
    assert index.lookup(pl.Series("k", [absent], dtype=s.dtype).to_frame(), stored).tolist() == [-1]


def test_integer_hashes_agree_across_integer_widths() -> None:
    wide, narrow = pl.Series([1, -5, None], dtype=pl.Int64), pl.Series([1, -5, None], dtype=pl.Int16)
    assert integer_hashes(wide).tolist() == integer_hashes(narrow).tolist()

"""The dense key table beside the hash index (``imp_core.engine.dense_keys``): the same slots as a dict, and dropped,
never wrong, when a key does not fit it."""

from __future__ import annotations

import datetime as dt

import numpy as np
import polars as pl
import pytest

from imp_core.engine.dense_keys import MIN_SPAN, DenseKeys, key_values
from imp_core.engine.keyed import KeyIndex
from imp_core.engine.schema import MULT
from imp_core.engine.slot_columns import SlotColumns
from tests.engine.test_keyed import WeakIndex, _aggregation, _batches, _same_state


def test_dense_keys_match_a_dict_while_the_range_grows_both_ways() -> None:
    rng = np.random.default_rng(7)
    table, model = DenseKeys(), {}
    for step in range(40):
        centre = 100 * (step % 2 * 2 - 1) * step  # alternately below and above: the table grows on both sides
        keys = np.setdiff1d(rng.integers(centre - 500, centre + 500, 60), np.fromiter(model, np.int64))
        slots = np.arange(len(model), len(model) + keys.size, dtype=np.int64)
        assert table.put(keys, slots)
        model.update(zip(keys.tolist(), slots.tolist()))
        probe = rng.integers(-6_000, 6_000, 500)
        assert table.get(probe).tolist() == [model.get(k, -1) for k in probe.tolist()]
    assert table.count == len(model) and table.get(np.array([2**62, -2**62])).tolist() == [-1, -1]


def test_a_range_too_wide_or_a_slot_beyond_31_bits_is_refused_unchanged() -> None:
    table = DenseKeys()
    assert table.put(np.array([0, 5]), np.array([0, 1]))
    before = (table.base, table.table.copy(), table.count)
    assert not table.put(np.array([MIN_SPAN + 10]), np.array([2]))  # 2 keys + 1 cannot span 65K values
    assert not table.put(np.array([7]), np.array([2**31]))
    assert (table.base, table.count) == before[::2] and np.array_equal(table.table, before[1])
    assert table.put(np.array([MIN_SPAN - 10]), np.array([2]))  # within the smallest span a table always gets


@pytest.mark.parametrize(("series", "want"), [
    (pl.Series([3, -1], dtype=pl.Int16), [3, -1]),
    (pl.Series([True, False]), [1, 0]),
    (pl.Series([dt.date(1970, 1, 2)]), [1]),
    (pl.Series([2**63], dtype=pl.UInt64), None),
    (pl.Series([1, None], dtype=pl.Int64), None),
    (pl.Series([1.0]), None),
    (pl.Series(["1"]), None),
])
def test_key_values_are_physical_integers_or_none(series: pl.Series, want: list[int] | None) -> None:
    got = key_values(series)
    assert (got if got is None else got.tolist()) == want


@pytest.mark.parametrize("index_type", [KeyIndex, WeakIndex])
def test_key_index_keeps_its_slots_when_the_table_drops_out(index_type: type[KeyIndex]) -> None:
    """Compact integer keys use the table (no hashes on a probe); a key far away, then a NULL, drop it, and the hash
    index (colliding on every key with ``WeakIndex``) answers the same from then on."""
    store, index, model = SlotColumns({"k": pl.Int64}), index_type(["k"]), {}
    batches = [list(range(0, 300, 3)), list(range(-200, 0, 7)), [10**12, 301], [None, 302]]
    for i, keys in enumerate(batches):
        frame = pl.DataFrame({"k": keys}, schema={"k": pl.Int64})
        slots = store.append(frame)
        found, hashes, _ = index.probe(frame, store)
        assert found.tolist() == [-1] * len(keys)
        assert (hashes is None) == (i <= 2)  # the table answers until a key that does not fit it is inserted
        index.insert(frame, slots, store, hashes)
        model.update(zip(keys, slots.tolist()))
        assert (index.dense is not None) == (i < 2)
        everything = pl.DataFrame({"k": [*model, 100, -1]}, schema={"k": pl.Int64})
        assert index.lookup(everything, store).tolist() == [*model.values(), -1, -1]
    rebuilt = index_type(["k"])
    rebuilt.build(pl.DataFrame({"k": [k for k in model if k is not None and k < 10**12]}), store)
    assert rebuilt.dense is not None and rebuilt.dense.count == len(model) - 2


def test_keyed_aggregation_on_one_integer_key_matches_frames() -> None:
    """The keyed aggregation over one integer key without NULL (the table in use) gives the first engine's output
    batch by batch; a late key far outside the range drops the table and nothing changes."""
    frames_op, keyed_op = _aggregation(False, keys={"g": pl.Int64}), _aggregation(True, keys={"g": pl.Int64})
    batches = [b.with_columns(pl.col("g").fill_null(7)) for b in _batches(9, 80)]
    far = batches[60].head(1).with_columns(pl.lit(5 * 10**9, dtype=pl.Int64).alias("g"),
                                           pl.lit(1, dtype=pl.Int64).alias(MULT))
    batches.insert(61, far)
    for i, batch in enumerate(batches):
        want, got = frames_op.process(batch), keyed_op.process(batch)
        order = ["g", MULT]
        assert got.sort(order).equals(want.sort(order), null_equal=True), i
        assert (keyed_op._index.dense is not None) == (i <= 60), i
    _same_state(frames_op, keyed_op)

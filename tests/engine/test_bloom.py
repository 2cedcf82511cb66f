"""The counting Bloom filter: sparse updates equal a dense recount, saturation sticks, no false negatives."""

from __future__ import annotations

import numpy as np
import polars as pl

from imp_core.engine.bloom import MAX, CountingBloom


def dense_reference(bloom: CountingBloom, counters: np.ndarray, keys: pl.DataFrame, counts: np.ndarray) -> np.ndarray:
    """The filter's rule applied to every counter at once."""
    pos = bloom._positions(keys)
    delta = np.zeros(bloom.size, dtype=np.int64)
    for j in range(pos.shape[1]):
        np.add.at(delta, pos[:, j], counts.astype(np.int64))
    current = counters.astype(np.int64)
    updated = np.clip(current + delta, 0, MAX)
    updated[current >= MAX] = MAX
    return updated.astype(np.uint8)


def test_sparse_add_equals_dense_recount_with_duplicates_deletes_and_saturation() -> None:
    rng = np.random.default_rng(3)
    bloom = CountingBloom(1 << 10)
    expected = bloom.counters.copy()
    for step in range(60):
        n = int(rng.integers(1, 300))
        keys = pl.DataFrame({"k0": rng.integers(0, 50, n)})  # few keys: duplicates in a batch, counters saturate
        counts = rng.integers(-3, 12, n)
        expected = dense_reference(bloom, expected, keys, counts)
        bloom.add(keys, counts)
        assert np.array_equal(bloom.counters, expected), step
    assert (bloom.counters == MAX).any()  # saturation was exercised


def test_a_deleted_key_is_forgotten_and_a_present_key_always_admitted() -> None:
    bloom = CountingBloom.for_keys(1000)
    keys = pl.DataFrame({"k0": np.arange(1000)})
    bloom.add(keys, np.ones(1000, dtype=np.int64))
    assert bloom.may_contain(keys).all()
    bloom.add(keys[:500], -np.ones(500, dtype=np.int64))
    assert bloom.may_contain(keys[500:]).all()  # no false negatives
    assert bloom.may_contain(keys[:500]).mean() < 0.1  # the deleted ones are (mostly) refused


def test_serialized_counters_do_not_follow_later_changes() -> None:
    bloom = CountingBloom(1 << 10)
    keys = pl.DataFrame({"k0": [1, 2, 3]})
    bloom.add(keys, np.ones(3, dtype=np.int64))
    frame = bloom.to_frame()
    bloom.add(keys, np.ones(3, dtype=np.int64))
    saved = CountingBloom.from_frame(frame).counters
    assert saved.max() >= 1
    assert np.array_equal(bloom.counters, saved * 2)  # the saved copy kept the first count only

"""Exact per-group float sums by splitting contributions (``imp_core.engine.exact_sum``)."""

from __future__ import annotations

import numpy as np

from imp_core.engine.exact_sum import fold_levels, split_contributions


def _group_sums(values: np.ndarray, mult: np.ndarray, groups: np.ndarray, dense: bool) -> np.ndarray:
    ids = groups if dense else np.unique(groups, return_inverse=True)[1]
    n = int(ids.max()) + 1
    [[head, mid, low]] = split_contributions([values], mult, groups, dense=dense)
    total, err = fold_levels(*(np.bincount(ids, weights=x, minlength=n) for x in (head, mid + low)))
    return total + err


def test_parts_sum_exactly_where_a_plain_sum_cancels() -> None:
    values = np.array([1e16, 1.0, -1e16, 3.0, 2.5])
    mult = np.array([1, 1, 1, -1, 2])
    hashes = np.array([7, 7, 7, -3, -3], dtype=np.int64)
    assert float(np.sum(values[:3])) == 0.0
    assert _group_sums(values, mult, hashes, dense=False).tolist() == [2.0, 1.0]  # groups -3 and 7, sorted


def test_dense_group_ids_split_like_hashes_of_the_same_groups() -> None:
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 50, 2000)
    hashes = (ids * 7919) ^ 0x5555  # one distinct hash per id, in another order
    values = rng.standard_normal(2000) * 10.0 ** rng.integers(-8, 16, 2000)
    mult = rng.choice([-1, 1, 3], 2000)
    by_hash = split_contributions([values], mult, hashes)
    by_id = split_contributions([values], mult, ids, dense=True)
    assert all(np.array_equal(a, b) for a, b in zip(by_hash[0], by_id[0]))

"""Exact per-group float sums by splitting contributions (``imp_core.engine.exact_sum``)."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from imp_core.engine.exact_sum import fold_levels, split_contributions
from imp_core.engine.operators import partials
from imp_core.engine.schema import MULT
from tests.engine.test_keyed import _aggregation


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


def test_a_large_batch_numbers_its_groups_by_key_or_by_hash_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    """Above the NumPy batch size the partials are summed by polars; a compact integer key numbers the groups by
    its value instead of sorting their hashes, and every accumulator comes out the same."""
    rng = np.random.default_rng(11)
    n = 40_000
    x = rng.choice([1e16, -1e16, 1.0, 0.5, -3.25, 1e-8], n) * rng.integers(1, 9, n)
    batch = pl.DataFrame({"g": rng.integers(0, 700, n), "s": ["a"] * n, "i": rng.integers(-5, 5, n), "x": x,
                          "__f0": np.zeros(n, dtype=np.uint32), "__f1": np.zeros(n, dtype=np.uint32),
                          "d": [None] * n, MULT: rng.choice([-1, 1], n)},
                         schema_overrides={"d": pl.Date, "__f0": pl.UInt32, "__f1": pl.UInt32})
    layout = _aggregation(True, keys={"g": pl.Int64}).layout
    d = layout._input_exprs.with_columns(batch)
    by_key = layout._groups_of(d).sort("g")
    assert partials._compact_ids(d, ["g"]) is not None
    monkeypatch.setattr(partials, "_compact_ids", lambda d, keys: None)
    by_hash = layout._groups_of(d).sort("g")
    assert by_key.equals(by_hash) and by_key.height == 700


@pytest.mark.parametrize("spread", [1, 1 << 40])
def test_a_large_batch_folds_in_numpy_only_when_its_key_is_compact(spread: int) -> None:
    """Above the NumPy batch size a compact integer key is folded in NumPy (groups numbered by counting their
    values, pairs by one sort): the same groups, sums and ``F_g`` changes as polars' group-by; a key over a wide
    range keeps the group-by (numbering it would take a sort)."""
    rng = np.random.default_rng(12)
    n = 40_000
    x = rng.choice([1e16, -1e16, 1.0, 0.5, -3.25, 1e-8, np.nan], n) * rng.integers(1, 9, n)
    batch = pl.DataFrame({"g": rng.integers(0, 700, n) * spread, "s": ["a"] * n, "i": rng.integers(-5, 5, n),
                          "x": x, "__f0": rng.integers(0, 1000, n).astype(np.uint32),
                          "__f1": rng.integers(0, 3, n).astype(np.uint32), "d": [None] * n,
                          MULT: rng.choice([-1, 1, 2], n)}, schema_overrides={"d": pl.Date})
    layout = _aggregation(True, keys={"g": pl.Int64}).layout
    numpy, polars = layout.of_delta(batch, numpy=True), layout.of_delta(batch, numpy=False)
    assert (numpy.fragment_rows is not None) == (spread == 1)  # only the NumPy fold knows each change's group row
    groups = [p.groups.lazy().collect().sort("g") for p in (numpy, polars)]
    pairs = [p.fragments.lazy().collect().sort("g", "__frag") for p in (numpy, polars)]
    assert groups[0].equals(groups[1]) and groups[0].height == 700
    assert pairs[0].equals(pairs[1]) and pairs[0].height > 700

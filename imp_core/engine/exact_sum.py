"""Float sums that do not drift: error-free splitting of a batch's contributions, and Neumaier compensation.

A float SUM/AVG's finite part must not drift from a recapture over long insert/delete sequences (a drift could flip
a HAVING or ORDER BY decision). Within a batch, each row's contribution ``value * multiplicity`` is split exactly
(Dekker's TwoProduct, then Rump-Ogita-Oishi's ExtractVector) into parts whose per-group sums are exact up to a
negligible remainder, and each group's partial sum arrives as a pair (sum, error). Across batches the aggregation's
state keeps a Neumaier compensation term next to each running sum. See docs/ARCHITECTURE.md, "Operators".
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl

_SPLIT = 134217729.0  # 2^27 + 1, Dekker's splitter
_ULP = 2.0 ** -53  # what ExtractVector leaves below σ: |v − q| ≤ 2^-53 σ


def two_product(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``a * b`` as ``p + e``, both doubles, exactly (Dekker); ``e`` is 0 where ``p`` is not finite."""
    p = a * b
    ca, cb = a * _SPLIT, b * _SPLIT
    ah, bh = ca - (ca - a), cb - (cb - b)
    al, bl = a - ah, b - bh
    e = ((ah * bh - p) + ah * bl + al * bh) + al * bl
    return p, np.where(np.isfinite(p), e, 0.0)


def extract(v: np.ndarray, sigma: np.ndarray, ok: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """ExtractVector (Rump, Ogita, Oishi, "Accurate floating-point summation", Lemma 3.3): ``v = q + r`` exactly.

    With σ a power of two ≥ 2^⌈log2(n+2)⌉ · max|v| over n values, every ``q = (σ + v) − σ`` is a multiple of
    2^-53 σ and any partial sum of the q's stays within σ, so the q's add up *exactly in any order*, and
    ``|r| ≤ 2^-53 σ``. Where ``ok`` is False (nothing finite to extract) ``q = v``, ``r = 0``; None: ok everywhere.
    """
    q = sigma + v
    q -= sigma
    if ok is None:
        return q, v - q
    q = np.where(ok, q, v)
    return q, np.where(ok, v - q, 0.0)


def split_contributions(values: list[np.ndarray], mult: np.ndarray, group_hash: np.ndarray,
                        dense: bool = False) -> list[list[np.ndarray]]:
    """For each array of ``values`` (0 for NULL, NaN, ±inf), the contributions ``value * mult`` of the batch's rows
    split into three parts: the per-group sums of the first two are exact, the third is below 2^-67 of the
    group's largest contribution for batches up to 10^5 rows (summing it plainly errs by less than 2^-84 of that).

    A plain sum of a batch holding 1e16, 1.0 and -1e16 is 0.0; summed by parts it is 1.0. Groups are told apart by
    ``group_hash`` (64-bit hashes of the group keys; two groups sharing a hash share the larger σ, still a valid
    bound), or, when ``dense``, by group ids ``0 .. n-1`` as they are (no sort to number them). Elementwise NumPy:
    the same steps as polars expressions cost several times more on a small batch.
    """
    # Bounds instead of exact counts and maxima: 2 values (product, error) per row, a factor 2 for a rounded log2,
    # one σ per group for all values, and level 2's σ from level 1's (everything it splits is ≤ 2^-53 σ1).
    n = mult.size
    grow = 2.0 ** (math.ceil(math.log2(2 * n + 2)) + 1)
    mult = mult.astype(np.float64)
    # value * multiplicity is exact when every multiplicity is ±1 (the usual case): no product errors then
    exact_products = n == 0 or float(np.abs(mult).max()) <= 1.0
    prods: list[np.ndarray] = []
    errs: list[np.ndarray] = []
    with np.errstate(all="ignore"):
        for v in values:
            if exact_products:
                prods.append(v * mult)
            else:
                p, e = two_product(v, mult)
                prods.append(p)
                errs.append(e)
        gid = group_hash if dense else np.unique(group_hash, return_inverse=True)[1].reshape(-1)
        largest = np.zeros(int(gid.max()) + 1 if n else 0)
        for p in prods:
            np.maximum.at(largest, gid, np.abs(p))
        sigma = (np.exp2(np.ceil(np.log2(largest))) * grow)[gid]
        finite = np.isfinite(sigma) & (sigma > 0)
        ok: np.ndarray | None = None if finite.all() else finite
        s1 = sigma if ok is None else np.where(ok, sigma, 0.0)
        s2 = s1 * (_ULP * grow)
        out = []
        for i, p in enumerate(prods):
            q0, r0 = extract(p, s1, ok)
            q1, r1 = extract(r0, s2, ok)
            if not exact_products:
                qe, re = extract(errs[i], s2, ok)
                q1, r1 = q1 + qe, r1 + re
            out.append([q0, q1, r1])
    return out


def fold_levels(head: np.ndarray, rest: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The exact level sums of a group, largest first, as one (sum, error) pair by TwoSum."""
    with np.errstate(all="ignore"):
        total = head + rest
        back = total - head
        err = np.where(np.isfinite(total), (head - (total - back)) + (rest - back), 0.0)
    return total, err


def neumaier(total: str, compensation: str, old: str, carried: bool) -> list[pl.Expr]:
    """A running sum ``total`` and its compensation after adding the batch's partial sum: the state's values are in
    columns ending in ``old``, the batch's in the plain columns. The rounding error of the addition goes into the
    compensation, with the batch's own error term when ``carried`` (a backend that sums plainly has none)."""
    s0, d0 = pl.col(f"{total}{old}").fill_null(0.0), pl.col(total).fill_null(0.0)
    dc = pl.col(compensation).fill_null(0.0) if carried else pl.lit(0.0)
    t = s0 + d0
    err = pl.when(s0.abs() >= d0.abs()).then((s0 - t) + d0).otherwise((d0 - t) + s0)
    err = pl.when(t.is_finite()).then(err).otherwise(0.0)
    return [t.alias(total), (pl.col(f"{compensation}{old}").fill_null(0.0) + err + dc).alias(compensation)]


__all__ = ["extract", "fold_levels", "neumaier", "split_contributions", "two_product"]

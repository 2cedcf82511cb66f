"""A counting Bloom filter over join keys (IMP paper 7.2): "may this key have a partner on the other side?", with no
false negatives and exact under deletions (a saturated counter only over-admits).

Keys are hashed with polars' hash, which is stable for one polars version only: the version is stored with the
filter and a filter written by another version is rebuilt. See docs/ARCHITECTURE.md, "Optimizations".
"""

from __future__ import annotations

import numpy as np
import polars as pl

SEEDS = (0x9E3779B9, 0x85EBCA6B, 0xC2B2AE35)
MAX = np.iinfo(np.uint8).max
MIN_SIZE = 1 << 10
MAX_SIZE = 1 << 24  # 16M one-byte counters: 16 MB (less once compressed in the state blob)


class CountingBloom:
    def __init__(self, size: int, counters: np.ndarray | None = None) -> None:
        self.size = int(size)
        self.counters = counters if counters is not None else np.zeros(self.size, dtype=np.uint8)

    @classmethod
    def for_keys(cls, expected: int) -> CountingBloom:
        size = MIN_SIZE
        while size < 8 * max(expected, 1) and size < MAX_SIZE:
            size <<= 1
        return cls(size)

    def _positions(self, keys: pl.DataFrame) -> np.ndarray:
        """(rows, 3) counter positions for each key row."""
        cols = []
        struct = pl.struct(keys.columns)
        for seed in SEEDS:
            h = keys.select(struct.hash(seed).alias("h")).get_column("h").to_numpy()
            cols.append((h % np.uint64(self.size)).astype(np.int64))
        return np.stack(cols, axis=1) if cols else np.zeros((0, 3), dtype=np.int64)

    def add(self, keys: pl.DataFrame, counts: np.ndarray) -> None:
        """Add (positive counts) or remove (negative counts) keys.

        Touches only the counters the keys hash to: a filter sized for millions of keys must not cost a pass over
        all its counters for a delta of ten rows (that made a 10-row TPC-H SF1 delta take 0.4 s).
        """
        if keys.height == 0:
            return
        pos = self._positions(keys)
        flat = pos.reshape(-1)  # row-major: each key's positions side by side
        weights = np.repeat(np.asarray(counts, dtype=np.int64), pos.shape[1])
        touched, inverse = np.unique(flat, return_inverse=True)
        delta = np.zeros(touched.size, dtype=np.int64)
        np.add.at(delta, inverse, weights)
        current = self.counters[touched].astype(np.int64)
        updated = np.clip(current + delta, 0, MAX)
        updated[current >= MAX] = MAX  # a saturated counter lost count: it must keep admitting
        self.counters[touched] = updated.astype(np.uint8)

    def may_contain(self, keys: pl.DataFrame) -> np.ndarray:
        """Boolean mask: False means the key certainly has no partner."""
        if keys.height == 0:
            return np.zeros(0, dtype=bool)
        pos = self._positions(keys)
        return (self.counters[pos] > 0).all(axis=1)

    def to_frame(self) -> pl.DataFrame:
        return pl.DataFrame({"c": self.counters.copy()})  # the counters change in place later

    @classmethod
    def from_frame(cls, df: pl.DataFrame) -> CountingBloom:
        counters = df.get_column("c").to_numpy().astype(np.uint8).copy()
        return cls(len(counters), counters)

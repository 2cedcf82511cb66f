"""A direct-address table from one integer-like group key to its slot, beside the keyed aggregation's hash index.

Group keys are often integers over a range not much wider than their number (ids, dates, small codes). For those a
lookup is a subtraction and a take, where the hash index hashes the key, binary-searches the hashes (~80-110 ns per
key: random probes mispredict) and then checks the stored key. The hash index stays complete beside the table, so the
table is only a shortcut: it is dropped, never wrong, when a key does not fit it (NULL, or a key that would make the
range wider than ``max(MIN_SPAN, 2 x keys)``). See docs/ARCHITECTURE.md, "Cost of a batch".
"""

from __future__ import annotations

import numpy as np
import polars as pl

MIN_SPAN = 1 << 16  # a range this wide always gets a table (256 KB), however few its keys
_INT64_MAX = np.iinfo(np.int64).max
_SLOT_LIMIT = np.iinfo(np.int32).max


def compact(lo: int, hi: int, count: int) -> bool:
    """Whether ``count`` distinct keys from ``lo`` to ``hi`` are compact enough for a table indexed by value."""
    return hi - lo + 1 <= max(MIN_SPAN, 2 * count)


def key_values(s: pl.Series) -> np.ndarray | None:
    """A key column's values as int64, or None when they cannot index a table: NULL, a type whose values are not
    integers (floats, strings), or unsigned values beyond int64."""
    dtype = s.dtype
    if s.null_count() or not (dtype.is_integer() or dtype in (pl.Boolean, pl.Date) or
                              isinstance(dtype, (pl.Datetime, pl.Duration))):
        return None
    v = s.to_numpy()  # (not ``to_physical``: a query run of ~50 us)
    if v.dtype.kind in "mM":
        v = v.view(np.int64)
    if v.dtype == np.uint64 and v.size and int(v.max()) > _INT64_MAX:
        return None
    return v.astype(np.int64, copy=False)


class DenseKeys:
    """Slots of keys ``base .. base + len(table) - 1`` (-1: not indexed), with spare room on both sides."""

    def __init__(self) -> None:
        self.base = 0
        self.table = np.empty(0, dtype=np.int32)  # slots fit 31 bits (``put`` refuses others): half the memory
        self.count = 0

    def nbytes(self) -> int:
        return int(self.table.nbytes)

    def get(self, keys: np.ndarray) -> np.ndarray:
        """The slot of every key (int64), -1 where it is not indexed."""
        n = self.table.size
        if not n:
            return np.full(keys.size, -1, dtype=np.int64)
        inside = (keys >= self.base) & (keys < self.base + n)
        return np.where(inside, self.table[np.where(inside, keys - self.base, 0)], -1).astype(np.int64)

    def put(self, keys: np.ndarray, slots: np.ndarray) -> bool:
        """Index distinct keys not indexed yet; False (nothing changed) when the range would grow too wide."""
        if not keys.size:
            return True
        if int(slots.max()) >= _SLOT_LIMIT:
            return False
        lo, hi = int(keys.min()), int(keys.max())
        if self.table.size:
            lo, hi = min(lo, self.base), max(hi, self.base + self.table.size - 1)
        count = self.count + keys.size
        if not compact(lo, hi, count):
            return False
        if not self.table.size or lo < self.base or hi >= self.base + self.table.size:
            self._grow(lo, hi)
        self.table[keys - self.base] = slots
        self.count = count
        return True

    def _grow(self, lo: int, hi: int) -> None:
        """Make room for ``lo .. hi`` with a quarter of the width spare on the side that grew (keys that keep
        growing, such as ids, then move the table rarely)."""
        spare = (hi - lo + 1) // 4
        old_lo, old_hi = (self.base, self.base + self.table.size - 1) if self.table.size else (lo, hi)
        new_lo = lo - spare if lo < old_lo else lo
        new_hi = hi + spare if hi > old_hi or not self.table.size else hi
        new_lo = max(new_lo, -_INT64_MAX)
        new_hi = min(new_hi, _INT64_MAX - 1)
        table = np.full(new_hi - new_lo + 1, -1, dtype=np.int32)
        if self.table.size:
            table[self.base - new_lo:self.base - new_lo + self.table.size] = self.table
        self.base, self.table = new_lo, table


__all__ = ["MIN_SPAN", "DenseKeys", "compact", "key_values"]

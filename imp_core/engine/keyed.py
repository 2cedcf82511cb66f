"""Operator state addressable by key and updated in place, so that a batch costs its own size, not the state's.

* ``SortedMap``: uint64 keys to int64 values in two sorted runs, the whole and a pending run of recent inserts that
  is merged in when it outgrows an eighth of the whole (an insert costs the batch plus, amortized, a constant).
* ``KeyIndex``: rows of key columns to their slot (of ``slot_columns.SlotColumns``), through 64-bit row hashes in a
  ``SortedMap``. A hash match is checked against the stored key; the rare keys whose hashes collide are kept in a
  dict by their values.
* ``PairCounts``: counts keyed by (slot, fragment), the paper's ``F_g``; keys are ``slot << 32 | fragment`` so a
  group's fragments are one key range.

See docs/ARCHITECTURE.md, "Keyed state".
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from imp_core.engine import frames
from imp_core.engine.dense_keys import DenseKeys, key_values
from imp_core.engine.slot_columns import SlotColumns, numpy_layout

SEED = 0x1DB  # row hashes live in memory only (rebuilt when state loads): any fixed seed
MIN_PENDING = 4096
WINDOW = 8  # keys scanned after a range's start before searching for its end
_U64 = np.uint64
_MASK = np.uint64(0xFFFFFFFF)
_EMPTY_U = np.empty(0, dtype=np.uint64)
_EMPTY_I = np.empty(0, dtype=np.int64)


def _find(keys: np.ndarray, vals: np.ndarray, q: np.ndarray) -> np.ndarray:
    """The value of each of ``q`` in the sorted run (``keys``, ``vals``), -1 where absent."""
    if not keys.size or not q.size:
        return np.full(q.size, -1, dtype=np.int64)
    i = _search(keys, q)
    i[i == keys.size] = 0
    return np.where(keys[i] == q, vals[i], -1)


def argsort(a: np.ndarray) -> np.ndarray:
    """The order of ``a`` (int64 positions); polars' parallel sort for large arrays (3x NumPy's on 10M keys), none
    for an array already in order. Ties keep no particular order: callers sort unique keys."""
    if a.size > 1 and bool((a[1:] >= a[:-1]).all()):
        return np.arange(a.size, dtype=np.int64)
    if a.size < 100_000:
        return np.argsort(a, kind="stable")
    return pl.Series(a).arg_sort().to_numpy().astype(np.int64)


def _search(keys: np.ndarray, q: np.ndarray, side: str = "left") -> np.ndarray:
    """``np.searchsorted``; queries into a large run are sorted first (random probes miss the cache on every step,
    sorted ones walk it in order: 1,000 probes into 500K keys 257 -> 171 us, into 5M keys 584 -> 366 us, sort
    included; into 5K keys it makes no difference)."""
    if q.size < 256 or keys.size < 65_536 or bool((q[1:] >= q[:-1]).all()):
        return np.searchsorted(keys, q, side)  # type: ignore[call-overload]
    order = argsort(q)
    out = np.empty(q.size, dtype=np.int64)
    out[order] = np.searchsorted(keys, q[order], side)  # type: ignore[call-overload]
    return out


def _expand(starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """The positions ``starts[i] .. starts[i] + lens[i] - 1`` for every i, in order."""
    total = int(lens.sum())
    if not total:
        return _EMPTY_I
    return np.repeat(starts - (np.cumsum(lens) - lens), lens) + np.arange(total)


def _in_ranges(keys: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Positions in the sorted ``keys`` of every key within one of the disjoint ranges ``[lo[i], hi[i])``. A range's
    end is found by scanning the ``WINDOW`` keys after its start (neighbours in memory: no second binary search over
    the whole run), and by a search only for the ranges longer than that."""
    if not keys.size or not lo.size:
        return _EMPTY_I
    a = _search(keys, lo)
    window = a[:, None] + np.arange(WINDOW)
    inside = (window < keys.size) & (keys[np.minimum(window, keys.size - 1)] < hi[:, None])
    lens = inside.sum(axis=1)
    long = lens == WINDOW
    if long.any():
        lens[long] = _search(keys, hi[long]) - a[long]
    return _expand(a, lens)


def lists_by_slot(rows: np.ndarray, slots: np.ndarray, values: np.ndarray, name: str) -> pl.Series:
    """Per entry of ``rows`` (a slot, or -1), the sorted ``values`` (uint32) paired with that slot in ``slots``:
    a list column built with NumPy and one Arrow array (cheaper than a group-by and a join on a batch)."""
    pairs = (slots.astype(np.int64) << 32) | values.astype(np.int64)
    if pairs.size > 1 and (np.diff(pairs) < 0).any():
        order = argsort(pairs)
        slots, values = slots[order], values[order]
    s, v = slots.astype(np.int64), values
    top = int(max(s[-1], rows.max())) + 1 if s.size and rows.size else 0
    if s.size and (top <= 16 * (rows.size + s.size) or top <= 1 << 16):
        # slots few enough to count (a whole state at a save, or a batch over a small state): counting beats two
        # binary searches of every row (each ~80 ns, mispredicted)
        counts = np.bincount(s, minlength=top)
        inside = rows >= 0
        safe = np.where(inside, rows, 0)
        lens = np.where(inside, counts[safe], 0)
        a = (np.cumsum(counts) - counts)[safe]
    else:
        a = _search(s, rows, "left")
        lens = np.where(rows >= 0, _search(s, rows, "right") - a, 0)
    offsets = np.zeros(rows.size + 1, dtype=np.int32)
    np.cumsum(lens, out=offsets[1:])
    items = pa.array(v[_expand(a, lens)].astype(np.uint32), pa.uint32())
    return pl.Series(name, pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), items))


class SortedMap:
    """uint64 to int64 in a sorted run and a sorted pending run; keys are unique (callers insert absent keys).

    A long main run has a *directory*: the start of every bucket ``key >> shift``, so a probe reads its bucket's few
    keys (one or two cache lines) instead of binary-searching the whole run (a cache miss per level on tens of
    megabytes). ``shift`` None suits uniform keys (hashes: about 8 keys per bucket); ``shift=32`` makes each slot
    of ``slot << 32 | fragment`` keys one bucket.
    """

    directory_min = 1 << 16  # shortest main run with a directory
    pending_min = MIN_PENDING  # the pending run is merged when longer than this and than an eighth of the main run

    def __init__(self, keys: np.ndarray = _EMPTY_U, vals: np.ndarray = _EMPTY_I, shift: int | None = None) -> None:
        self.shift = shift
        self.keys, self.vals = keys, vals
        self.pkeys, self.pvals = _EMPTY_U, _EMPTY_I
        self._index_main()

    @classmethod
    def build(cls, keys: np.ndarray, vals: np.ndarray, shift: int | None = None) -> SortedMap:
        order = argsort(keys)
        return cls(keys[order], vals[order], shift)

    def _index_main(self) -> None:
        self.dir_shift, self.starts = 64, _EMPTY_I
        n = self.keys.size
        if not n or n < self.directory_min and self.shift is None:  # a fixed shift's buckets are cheap to count
            return
        self.dir_shift = self.shift if self.shift is not None else 64 - max(1, int(np.log2(n)) - 3)
        buckets = (self.keys >> _U64(self.dir_shift)).astype(np.int64)
        self.starts = np.zeros(int(buckets[-1]) + 2, dtype=np.int64)
        np.cumsum(np.bincount(buckets), out=self.starts[1:])

    def _buckets(self, buckets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The main run's positions ``[lo, hi)`` of each bucket (empty beyond the last)."""
        last = self.starts.size - 1
        inside = buckets < last
        lo = self.starts[np.where(inside, buckets, last)]
        return lo, np.where(inside, self.starts[np.minimum(buckets + 1, last)], lo)

    def _find_main(self, q: np.ndarray) -> np.ndarray:
        if not self.starts.size or not q.size:
            return _find(self.keys, self.vals, q)
        lo, hi = self._buckets((q >> _U64(self.dir_shift)).astype(np.int64))
        width = int((hi - lo).max())
        if width > 64:  # a crowded bucket: binary search instead
            return _find(self.keys, self.vals, q)
        at = lo[:, None] + np.arange(max(width, 1))
        match = (at < hi[:, None]) & (self.keys[np.minimum(at, self.keys.size - 1)] == q[:, None])
        found = match.any(axis=1)
        pos = np.minimum(lo + match.argmax(axis=1), self.keys.size - 1)
        return np.where(found, self.vals[pos], -1)

    def __len__(self) -> int:
        return int(self.keys.size + self.pkeys.size)

    def get(self, q: np.ndarray) -> np.ndarray:
        out = self._find_main(q)
        if self.pkeys.size:
            miss = out < 0
            if miss.any():
                out[miss] = _find(self.pkeys, self.pvals, q[miss])
        return out

    def put(self, keys: np.ndarray, vals: np.ndarray) -> None:
        if not keys.size:
            return
        pk, pv = np.concatenate([self.pkeys, keys]), np.concatenate([self.pvals, vals])
        order = argsort(pk)
        self.pkeys, self.pvals = pk[order], pv[order]
        if self.pkeys.size > max(self.pending_min, self.keys.size // 8):
            at = np.searchsorted(self.keys, self.pkeys)
            self.keys, self.vals = np.insert(self.keys, at, self.pkeys), np.insert(self.vals, at, self.pvals)
            self.pkeys, self.pvals = _EMPTY_U, _EMPTY_I
            self._index_main()

    def in_ranges(self, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Keys and values of every entry whose key lies in one of the disjoint ranges ``[lo[i], hi[i])``."""
        a, b = _in_ranges(self.keys, lo, hi), _in_ranges(self.pkeys, lo, hi)
        return np.concatenate([self.keys[a], self.pkeys[b]]), np.concatenate([self.vals[a], self.pvals[b]])

    def in_buckets(self, buckets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Keys and values of every entry of the given distinct buckets (``key >> shift``; a fixed ``shift``)."""
        assert self.shift is not None
        lo_keys = buckets.astype(_U64) << _U64(self.shift)
        hi_keys = (buckets.astype(_U64) + _U64(1)) << _U64(self.shift)
        if not self.starts.size:
            return self.in_ranges(lo_keys, hi_keys)
        lo, hi = self._buckets(buckets.astype(np.int64))
        a, b = _expand(lo, hi - lo), _in_ranges(self.pkeys, lo_keys, hi_keys)
        return np.concatenate([self.keys[a], self.pkeys[b]]), np.concatenate([self.vals[a], self.pvals[b]])

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        return np.concatenate([self.keys, self.pkeys]), np.concatenate([self.vals, self.pvals])

    def nbytes(self) -> int:
        return int(self.keys.nbytes + self.vals.nbytes + self.pkeys.nbytes + self.pvals.nbytes + self.starts.nbytes)


def integer_like(dtype: pl.DataType) -> bool:
    """Whether equal values of the type are equal bits in NumPy (integers, booleans, dates and times; not floats,
    where 0.0 equals -0.0)."""
    return dtype.is_integer() or dtype in (pl.Boolean, pl.Date) or isinstance(dtype, (pl.Datetime, pl.Duration))


def integer_hashes(s: pl.Series) -> np.ndarray:
    """64-bit hashes of an ``integer_like`` Series in NumPy (SplitMix64's finalizer over the value's bits; NULL has
    a hash of its own): ~5 us for 1,000 values, where a polars row hash is a query run of ~100 us."""
    nulls = s.null_count()
    values = s if s.dtype.is_integer() else s.to_physical()  # to_physical is a query run (~50 us)
    if nulls:
        values = values.fill_null(False if values.dtype == pl.Boolean else 0)
    z = values.to_numpy().astype(np.int64).view(_U64) + _U64(SEED)
    z = (z ^ (z >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> _U64(27))) * _U64(0x94D049BB133111EB)
    z ^= z >> _U64(31)
    if nulls:
        z[s.is_null().to_numpy()] = _U64(0x6A09E667F3BCC909)
    return z


class KeyIndex:
    """Key rows (of the ``names`` columns of a ``SlotColumns``) to slots."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.map = SortedMap()
        self.collided: dict[int, dict[tuple[Any, ...], int]] = {}  # hash -> key values -> slot
        self.dense = DenseKeys() if len(names) == 1 else None  # a shortcut for one integer key in a compact range

    def hashes(self, frame: pl.DataFrame) -> np.ndarray:
        if len(self.names) == 1 and integer_like((key := frame.get_column(self.names[0])).dtype):
            return integer_hashes(key)
        return frame.select(self.names).hash_rows(seed=SEED).to_numpy()

    def lookup(self, frame: pl.DataFrame, stored: SlotColumns) -> np.ndarray:
        """The slot of each key row of ``frame``, -1 where the key is not indexed."""
        return self.probe(frame, stored)[0]

    def probe(self, frame: pl.DataFrame, stored: SlotColumns) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
        """Per key row of ``frame``: its slot (-1 where not indexed), its hash, and whether that hash is indexed
        already (for a key not indexed: a collision, which ``insert`` then resolves). With the dense table and keys
        that fit it, the hashes are not computed (None): ``insert`` computes those of the new keys."""
        if self.dense is not None and (values := key_values(frame.get_column(self.names[0]))) is not None:
            slots = self.dense.get(values)
            return slots, None, slots >= 0
        h = self.hashes(frame)
        slots = self.map.get(h)
        taken = slots >= 0
        if self.collided:
            keys = frame.select(self.names)
            for i in np.flatnonzero(np.isin(h, np.fromiter(self.collided, dtype=_U64))):
                slots[i] = self.collided[int(h[i])].get(keys.row(int(i)), -1)
                taken[i] = True
        hit = np.flatnonzero(slots >= 0)
        if hit.size:  # a hash match of a key never indexed (a collision with an indexed key) is a new key
            slots[hit[~self._same_keys(frame, hit, stored, slots[hit])]] = -1
        return slots, h, taken

    def _same_keys(self, frame: pl.DataFrame, rows: np.ndarray, stored: SlotColumns, slots: np.ndarray) -> np.ndarray:
        """Whether the key of each of ``frame``'s ``rows`` equals the stored key at ``slots`` (NULL equals NULL);
        compared in NumPy where both sides are plain numbers without NULL."""
        same = np.ones(rows.size, dtype=bool)
        for n in self.names:
            got, have = frame.get_column(n), stored.cols[n][:stored.size]
            if got.null_count() or have.null_count() or not numpy_layout(got.dtype) or got.dtype != have.dtype:
                return self._same_keys_polars(frame, rows, stored, slots)
            a, b = got.to_numpy()[rows], have.to_numpy()[slots]
            if a.dtype.kind in "mM":
                same &= a.view(np.int64) == b.view(np.int64)
            elif a.dtype.kind == "f":  # as polars compares: NaN equals NaN
                same &= (a == b) | (np.isnan(a) & np.isnan(b))
            else:
                same &= a == b
        return same

    def _same_keys_polars(self, frame: pl.DataFrame, rows: np.ndarray, stored: SlotColumns,
                          slots: np.ndarray) -> np.ndarray:
        got = frame.select(self.names)[rows]
        have = stored.gather(slots, self.names)
        same = pl.DataFrame([*got.get_columns(), *[s.alias(f"{s.name}__s") for s in have.get_columns()]]).select(
            pl.all_horizontal([pl.col(n).eq_missing(pl.col(f"{n}__s")) for n in self.names])).to_series()
        return same.to_numpy()

    def insert(self, frame: pl.DataFrame, slots: np.ndarray, stored: SlotColumns, hashes: np.ndarray | None = None,
               taken: np.ndarray | None = None) -> None:
        """Index the key rows of ``frame`` (absent from the index and distinct) at ``slots``; ``hashes`` and
        ``taken`` from ``probe`` save hashing and searching again."""
        if not frame.height:
            return
        if self.dense is not None:
            values = key_values(frame.get_column(self.names[0]))
            if values is None or not self.dense.put(values, slots):
                self.dense = None  # a key the table cannot hold: the hash index alone from now on
        h, taken = (self.hashes(frame), None) if hashes is None else (hashes, taken)
        ordered = np.sort(h)
        repeated = ordered[1:][ordered[1:] == ordered[:-1]]
        clash = self.map.get(h) >= 0 if taken is None else taken.copy()
        if repeated.size:
            clash |= np.isin(h, repeated)
        if self.collided:
            clash |= np.isin(h, np.fromiter(self.collided, dtype=_U64))
        keys = frames.columns(frame, self.names)
        for i in np.flatnonzero(clash):
            hv = int(h[i])
            bucket = self.collided.setdefault(hv, {})
            if not bucket:
                s0 = int(self.map.get(np.array([hv], dtype=_U64))[0])
                if s0 >= 0:
                    bucket[stored.gather(np.array([s0]), self.names).row(0)] = s0
            bucket[keys.row(int(i))] = int(slots[i])
        self.map.put(h[~clash], slots[~clash])

    def nbytes(self) -> int:
        return self.map.nbytes() + (self.dense.nbytes() if self.dense is not None else 0)

    def build(self, frame: pl.DataFrame, stored: SlotColumns) -> None:
        """Index every key row of ``frame`` at slots ``0 .. height-1`` (distinct keys): one sort, and a dense table."""
        h = self.hashes(frame)
        order = argsort(h)
        hs = h[order]
        repeated = hs[1:][hs[1:] == hs[:-1]]
        self.map, self.collided, self.dense = SortedMap(), {}, None  # (``insert`` below leaves the table alone)
        if not repeated.size:
            self.map = SortedMap(hs, order.astype(np.int64))
        else:
            self.insert(frame, np.arange(frame.height, dtype=np.int64), stored, h)
            self.map = SortedMap.build(*self.map.items())
        if len(self.names) == 1 and (values := key_values(frame.get_column(self.names[0]))) is not None:
            self.dense = DenseKeys()
            self.dense = self.dense if self.dense.put(values, np.arange(values.size, dtype=np.int64)) else None


class SlotEntries:
    """The (slot, fragment) entries of a batch's groups, sorted by key: a small set the batch's pairs are found in
    (one range query on the whole state instead of a probe per pair)."""

    def __init__(self, keys: np.ndarray, pos: np.ndarray, counts: np.ndarray) -> None:
        self.keys, self.pos, self.counts = keys, pos, counts

    def find(self, keys: np.ndarray, valid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per key (where ``valid``): its position in the counts (-1 when absent) and its count (0 when absent)."""
        if not self.keys.size:
            return np.full(keys.size, -1, dtype=np.int64), np.zeros(keys.size, dtype=np.int64)
        at = np.minimum(np.searchsorted(self.keys, keys), self.keys.size - 1)
        hit = valid & (self.keys[at] == keys)
        return np.where(hit, self.pos[at], -1), np.where(hit, self.counts[at], 0)

    def live(self) -> tuple[np.ndarray, np.ndarray]:
        """(slot, fragment) of the positive counts."""
        keys = self.keys[self.counts > 0]
        return (keys >> _U64(32)).astype(np.int64), (keys & _MASK).astype(np.uint32)


class PairCounts:
    """Counts keyed by (slot, fragment); entries that fall to 0 stay until they outnumber the live ones (and at
    least ``compact_at`` of them)."""

    compact_at = 65_536

    def __init__(self) -> None:
        self.map = SortedMap(shift=32)
        self.counts = _EMPTY_I
        self.size = 0
        self.zeros = 0

    @staticmethod
    def key(slots: np.ndarray, frags: np.ndarray) -> np.ndarray:
        return (slots.astype(_U64) << _U64(32)) | frags.astype(_U64)

    def of_slots(self, slots: np.ndarray) -> SlotEntries:
        """Every entry of the given distinct slots, zero counts included."""
        keys, pos = self.map.in_buckets(np.sort(slots))  # slots in order: entries in order, unless pending ones
        order = argsort(keys)
        return SlotEntries(keys[order], pos[order], self.counts[pos[order]])

    def commit(self, pos: np.ndarray, after: np.ndarray, slots: np.ndarray, frags: np.ndarray) -> None:
        """Set the counts at ``pos`` (>= 0) to ``after``; add the pairs at ``pos`` -1 whose ``after`` is positive."""
        found = pos >= 0
        p, a = pos[found], after[found]
        before = self.counts[p]
        self.zeros += int(((before > 0) & (a == 0)).sum()) - int(((before == 0) & (a > 0)).sum())
        self.counts[p] = a
        new = ~found & (after > 0)
        k = int(new.sum())
        if k:
            if self.size + k > self.counts.size:
                grown = np.zeros(max(self.size + k, 2 * self.counts.size, 1024), dtype=np.int64)
                grown[:self.size] = self.counts[:self.size]
                self.counts = grown
            at = np.arange(self.size, self.size + k, dtype=np.int64)
            self.counts[at] = after[new]
            self.map.put(self.key(slots[new], frags[new]), at)
            self.size += k
        if self.zeros > max(self.compact_at, self.size - self.zeros):
            self.build(*self.items())

    def nbytes(self) -> int:
        return self.map.nbytes() + int(self.counts.nbytes)

    def items(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every positive count: slots, fragments, counts (sorted by slot, then fragment)."""
        keys, pos = self.map.items()
        order = argsort(keys)
        keys, counts = keys[order], self.counts[pos[order]]
        live = counts > 0
        keys = keys[live]
        return (keys >> _U64(32)).astype(np.int64), (keys & _MASK).astype(np.uint32), counts[live]

    def build(self, slots: np.ndarray, frags: np.ndarray, counts: np.ndarray) -> None:
        live = counts > 0
        self.load(self.key(slots[live], frags[live]), counts[live].astype(np.int64))

    def load(self, keys: np.ndarray, counts: np.ndarray) -> None:
        """Pairs by :meth:`key` with their counts (int64, taken over) as the state; zero counts are dropped."""
        live = counts > 0
        if not live.all():
            keys, counts = keys[live], counts[live]
        at = np.arange(keys.size, dtype=np.int64)
        ordered = keys.size < 2 or bool((keys[1:] > keys[:-1]).all())  # saved state comes sorted
        self.map = SortedMap(keys, at, 32) if ordered else SortedMap.build(keys, at, 32)
        self.counts = counts
        self.size = self.counts.size
        self.zeros = 0


__all__ = ["KeyIndex", "PairCounts", "SlotEntries", "SortedMap", "integer_hashes", "integer_like", "lists_by_slot"]

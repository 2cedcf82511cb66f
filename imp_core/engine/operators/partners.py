"""A join side's partner index (docs/ARCHITECTURE.md, "Optimizations"): the side's rows whose join key the other
side has, and the other side's row count per key, so a delta of the other side whose keys are listed joins in
memory instead of on Spark.

Invariant: for every listed key (count > 0), the index holds *all* of the side's current rows with that key. Keys
the other side gains are added with their partners (fetched by the join); keys it loses are dropped with theirs.

Two layouts with one interface, the same saved frames (``rows``, and ``keys``: ``k0..kn`` and ``__n``):

* ``FramePartners`` (the first engine, ``IMP_OPTIMIZATIONS=-joinindex``): both as frames, joined and rewritten per
  batch, so a batch costs the index's size (a group-by over every key: ~70 ms of a TPC-H Q3 batch at SF1).
* ``KeyedPartners``: keys to slots (``keyed.KeyIndex``) with their counts in an array, rows found by slot through a
  ``SortedMap`` of ``slot << 32 | row``; rows are appended (a change of the side's own rows too, signed: the join is
  bilinear) and dropped by tombstone, and consolidated when the appended or dropped rows outgrow an eighth of the
  live ones. A batch costs its own keys.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np
import polars as pl

from imp_core.engine import frames
from imp_core.engine.annotation import consolidate
from imp_core.engine.bloom import CountingBloom
from imp_core.engine.keyed import KeyIndex, SortedMap
from imp_core.engine.schema import COUNT
from imp_core.engine.slot_columns import SlotColumns, take
from imp_core.engine.state import Rows
from imp_core.errors import StateError

N_KEY = COUNT  # rows of the other side per join key
_U64 = np.uint64
_ROW_BITS = 32

Canon = Callable[[pl.DataFrame], pl.DataFrame]  # a frame of the side's rows -> its canonical key columns k0..kn


class Partners(Protocol):
    """What a join asks of a partner index. Keys are canonical key frames (``k0..kn``); ``rows`` frames are the
    side's annotated rows."""

    bloom: CountingBloom | None
    fresh: bool  # built during this pass: its counts already include the pass's delta

    def listed(self, keys: pl.DataFrame) -> np.ndarray:
        """Per key row, whether the key is listed (its partners are all in the index)."""

    def partners(self, keys: pl.DataFrame) -> pl.DataFrame:
        """The index's rows with one of the (listed) ``keys``, or a superset of them."""

    def count(self, keys: pl.DataFrame, mult: np.ndarray) -> None:
        """Count a delta of the other side (its keys and signed multiplicities) into the keys; keys whose count
        reaches 0 leave with their rows."""

    def add_fetched(self, fetched: pl.DataFrame) -> None:
        """Keep the fetched partners of keys listed now (keys that were not listed before this pass)."""

    def apply(self, delta: pl.DataFrame) -> None:
        """Bring the rows of listed keys to the side's contents after its own ``delta``."""

    def saved(self, lazy: bool = False) -> tuple[pl.DataFrame, pl.DataFrame | Rows]:
        """The frames saved with the state: the rows, and the keys with their counts (with ``lazy``, possibly as
        :class:`~imp_core.engine.state.Rows` that a save streaming parts builds a slice at a time)."""


class FramePartners:
    """The index as two frames, joined and rewritten per batch."""

    def __init__(self, rows: pl.DataFrame, keys: pl.DataFrame, bloom: CountingBloom | None, canon: Canon,
                 names: list[str]) -> None:
        self.rows, self.keys, self.bloom, self.fresh = rows, keys, bloom, False
        self.canon, self.names = canon, names
        self.kcols = [c for c in keys.columns if c != N_KEY]

    def _named(self, keys: pl.DataFrame) -> pl.DataFrame:
        return keys.select([pl.col(k).alias(n) for k, n in zip(self.kcols, self.names)])

    def listed(self, keys: pl.DataFrame) -> np.ndarray:
        known = np.zeros(keys.height, dtype=bool)
        hit = keys.with_row_index("__i").join(self.keys.select(self.kcols), on=self.kcols, how="semi")
        known[hit.get_column("__i").to_numpy()] = True
        return known

    def partners(self, keys: pl.DataFrame) -> pl.DataFrame:
        return self.rows

    def count(self, keys: pl.DataFrame, mult: np.ndarray) -> None:
        kcols = self.kcols
        change = keys.with_columns(pl.Series(N_KEY, mult, dtype=pl.Int64)).drop_nulls(kcols) \
            .group_by(kcols).agg(pl.col(N_KEY).sum())
        merged = pl.concat([self.keys, change.select(self.keys.columns)], how="vertical_relaxed")
        merged = merged.group_by(kcols).agg(pl.col(N_KEY).sum())
        gone = merged.filter(pl.col(N_KEY) <= 0).select(kcols)
        self.keys = merged.filter(pl.col(N_KEY) > 0)
        if gone.height:
            self.rows = self.rows.join(self._named(gone), on=self.names, how="anti")

    def add_fetched(self, fetched: pl.DataFrame) -> None:
        kept = fetched.join(self._named(self.keys.select(self.kcols)), on=self.names, how="semi")
        self.rows = pl.concat([self.rows, kept.select(self.rows.columns)], how="vertical_relaxed")

    def apply(self, delta: pl.DataFrame) -> None:
        listed = self.canon(delta).join(self.keys.select(self.kcols), on=self.kcols, how="semi").unique()
        if listed.height:
            listed = self._named(listed)
            changed = delta.join(listed, on=self.names, how="semi")
            touched = self.rows.join(listed, on=self.names, how="semi")
            rest = self.rows.join(listed, on=self.names, how="anti")
            merged = consolidate(pl.concat([touched, changed.select(self.rows.columns)], how="vertical_relaxed"))
            self.rows = pl.concat([rest, merged.select(rest.columns)], how="vertical_relaxed")

    def saved(self, lazy: bool = False) -> tuple[pl.DataFrame, pl.DataFrame | Rows]:
        return self.rows, self.keys


class KeyedPartners:
    """The index keyed: a batch looks up, counts and fetches its own keys only."""

    churn_min = 1024  # appended or dropped rows consolidated at the earliest

    def __init__(self, rows: pl.DataFrame, keys: pl.DataFrame, bloom: CountingBloom | None, canon: Canon) -> None:
        self.bloom, self.fresh, self.canon = bloom, False, canon
        self.kcols = [c for c in keys.columns if c != N_KEY]
        self.store = SlotColumns({**{c: keys.schema[c] for c in self.kcols}, N_KEY: pl.Int64()},
                                 dense=frozenset({N_KEY}))
        self.index = KeyIndex(self.kcols)
        keys = keys.select([*self.kcols, pl.col(N_KEY).cast(pl.Int64)])
        if keys.height:
            self.store.append(keys)
            self.index.build(keys.select(self.kcols), self.store)
        self._set_rows(rows)

    @property
    def counts(self) -> np.ndarray:
        return self.store.arrays[N_KEY]

    def _set_rows(self, rows: pl.DataFrame) -> None:
        """Index ``rows`` (consolidated) afresh: every row alive, found by its key's slot."""
        self.rows = rows.rechunk()
        slots = self._listed_slots(self.canon(rows)) if rows.height else np.zeros(0, dtype=np.int64)
        self.alive = slots >= 0  # a row of a key not listed (never in a consistent index) is dropped
        pos = np.arange(rows.height, dtype=np.int64)
        self.entries = SortedMap.build(self._entry_keys(slots[self.alive], pos[self.alive]), pos[self.alive],
                                       shift=_ROW_BITS)
        self.live = int(self.alive.sum())
        self.churn = 0  # rows appended or dropped since the last consolidation

    @staticmethod
    def _entry_keys(slots: np.ndarray, pos: np.ndarray) -> np.ndarray:
        return (slots.astype(_U64) << _U64(_ROW_BITS)) | pos.astype(_U64)

    def _slots(self, keys: pl.DataFrame) -> np.ndarray:
        """Each key row's slot, -1 where the key was never indexed."""
        if not keys.height or not self.store.size:
            return np.full(keys.height, -1, dtype=np.int64)
        return self.index.lookup(keys, self.store)

    def _listed_slots(self, keys: pl.DataFrame) -> np.ndarray:
        """Each key row's slot where the key is listed, else -1."""
        slots = self._slots(keys)
        hit = slots >= 0
        slots[hit] = np.where(self.counts[slots[hit]] > 0, slots[hit], -1)
        return slots

    def listed(self, keys: pl.DataFrame) -> np.ndarray:
        return self._listed_slots(keys) >= 0

    def _rows_of(self, slots: np.ndarray) -> np.ndarray:
        """Positions of the live rows of the distinct ``slots``."""
        _, pos = self.entries.in_buckets(slots)
        return pos[self.alive[pos]]

    def partners(self, keys: pl.DataFrame) -> pl.DataFrame:
        slots = self._listed_slots(keys)
        pos = np.sort(self._rows_of(np.unique(slots[slots >= 0])))
        return frames.frame([take(c, pos) for c in self.rows.get_columns()])

    def count(self, keys: pl.DataFrame, mult: np.ndarray) -> None:
        has_key = np.ones(keys.height, dtype=bool)
        for c in keys.get_columns():
            if c.null_count():
                has_key &= c.is_not_null().to_numpy()
        if not has_key.all():
            keys, mult = keys.filter(pl.Series(has_key)), mult[has_key]
        if not keys.height:
            return
        slots = self._slots(keys)
        new = slots < 0
        touched = np.unique(slots[~new])
        was = self.counts[touched] > 0
        np.add.at(self.counts, slots[~new], mult[~new])
        if new.any():
            added = keys.filter(pl.Series(new)).with_columns(pl.Series(N_KEY, mult[new], dtype=pl.Int64)) \
                .group_by(self.kcols).agg(pl.col(N_KEY).sum()).filter(pl.col(N_KEY) > 0)
            if added.height:
                added = added.select([*self.kcols, N_KEY])
                at = self.store.append(added)
                self.index.insert(added.select(self.kcols), at, self.store)
        now = self.counts[touched]
        self.counts[touched] = np.maximum(now, 0)  # a key whose count reaches 0 (or below) is no longer listed
        gone = touched[was & (now <= 0)]
        if gone.size:
            pos = self._rows_of(gone)
            self.alive[pos] = False
            self.live -= pos.size
            self.churn += pos.size
            self._maybe_consolidate()

    def _append(self, rows: pl.DataFrame, slots: np.ndarray) -> None:
        keep = slots >= 0
        if not keep.any():
            return
        if not keep.all():
            rows, slots = rows.filter(pl.Series(keep)), slots[keep]
        start = self.rows.height
        pos = np.arange(start, start + rows.height, dtype=np.int64)
        if start + rows.height >= 1 << _ROW_BITS:
            raise StateError("a join's partner index reached 2^32 rows; lower it with IMP_OPTIMIZATIONS="
                             "partner_rows=N and recapture the sketch")
        self.rows = pl.concat([self.rows, rows.select(self.rows.columns)], how="vertical_relaxed", rechunk=False)
        if self.rows.n_chunks() > 32:
            self.rows = self.rows.rechunk()
        self.alive = np.concatenate([self.alive, np.ones(rows.height, dtype=bool)])
        self.entries.put(self._entry_keys(slots, pos), pos)
        self.live += rows.height
        self.churn += rows.height
        self._maybe_consolidate()

    def add_fetched(self, fetched: pl.DataFrame) -> None:
        if fetched.height:
            self._append(fetched, self._listed_slots(self.canon(fetched)))

    def apply(self, delta: pl.DataFrame) -> None:
        if delta.height:
            self._append(delta, self._listed_slots(self.canon(delta)))

    def _maybe_consolidate(self) -> None:
        if self.churn > self.churn_min and self.churn * 8 > self.live:
            self._consolidate()

    def _live(self) -> pl.DataFrame:
        """The live rows, consolidated."""
        live = self.rows if self.alive.all() else self.rows.filter(pl.Series(self.alive))
        return consolidate(live) if live.height else live

    def _consolidate(self) -> None:
        self._set_rows(self._live())

    def saved(self, lazy: bool = False) -> tuple[pl.DataFrame, pl.DataFrame | Rows]:
        """The live rows consolidated (the index in memory stays as it is), and the listed keys in the order of
        their hashes, so that loading them finds the hashes sorted and skips the sort (``keyed.argsort``)."""
        slots = self._slots_by_hash()
        listed = slots[self.counts[slots] > 0]
        keys = Rows(listed.size, lambda start, n: self.store.rows(listed[start:start + n]))
        return self._live() if self.churn else self.rows, keys if lazy else keys.frame()

    def _slots_by_hash(self) -> np.ndarray:
        """Every indexed slot, in the order of its key's hash (keys whose hashes collide last)."""
        m = self.index.map
        vals = m.vals
        if m.pkeys.size:  # the pending run merged in (both runs are sorted): no sort
            vals = np.insert(m.vals, np.searchsorted(m.keys, m.pkeys), m.pvals)
        if self.index.collided:  # a bucket also holds the slot its hash maps to
            slots = [s for b in self.index.collided.values() for s in b.values()]
            collided = np.unique(np.array(slots, dtype=np.int64))
            vals = np.concatenate([vals, collided[~np.isin(collided, vals)]])
        return vals.astype(np.int64, copy=False)


def partner_index(rows: pl.DataFrame, keys: pl.DataFrame, bloom: CountingBloom | None, canon: Canon,
                  names: list[str], keyed: bool) -> Partners:
    """A partner index over ``rows`` (the side's rows with a listed key) and ``keys`` (``k0..kn``, ``__n``)."""
    return KeyedPartners(rows, keys, bloom, canon) if keyed else FramePartners(rows, keys, bloom, canon, names)


__all__ = ["N_KEY", "FramePartners", "KeyedPartners", "Partners", "partner_index"]

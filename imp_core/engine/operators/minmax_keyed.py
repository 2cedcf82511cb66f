"""The value multiset behind one MIN or MAX aggregate (paper 5.2.6) on keyed state: a batch costs its own values.

Per (group slot, value) a count, addressed through a ``KeyIndex``; a group's entries are one bucket of a
``SortedMap`` keyed ``slot << 32 | entry``. A group's new extreme is the best of its old extreme (when the batch left
it a positive count) and of the values the batch inserted; only a group whose extreme was deleted entirely is
scanned (its entries). Without a buffer only: bounded buffers (paper 7.2) keep the frame multiset
(``operators/minmax.py``). See docs/ARCHITECTURE.md, "Cost of a batch".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import polars as pl

from imp_core.engine.float_keys import float_from_order_key, float_order_key
from imp_core.engine.keyed import KeyIndex, PairCounts, SortedMap
from imp_core.engine.schema import COUNT, VALUE
from imp_core.engine.slot_columns import SlotColumns
from imp_core.engine.state import Parts, Rows, slices
from imp_core.errors import StateError

SLOT = "__slot"
_MASK = np.int64(0xFFFFFFFF)


class KeyedValueMultiset:
    """MIN/MAX ``j`` of an aggregation on keyed state; ``keys_of`` gives the state keys of group slots (for saving)."""

    def __init__(self, op_id: str, j: int, func: str, value_type: pl.DataType, float_values: bool,
                 keys_of: Callable[[np.ndarray], pl.DataFrame]) -> None:
        self.op_id, self.j, self.func = op_id, j, func
        self.label = "MIN/MAX"  # for messages
        self.value_type = value_type
        self.float_values = float_values  # values are doubles as order keys (``float_order_key``)
        self.keys_of = keys_of
        self.owner: KeyedValueMultiset | None = None  # the multiset whose counts this one reads (``share``)
        self._held = _Counts()
        self.reset()

    def share(self, owner: KeyedValueMultiset) -> None:
        """Read ``owner``'s counts (an earlier aggregate over the same argument) instead of keeping a copy. Every
        multiset of a batch probes before any commits, so this one sees the counts before the batch as ``owner``
        does; only ``owner`` commits them."""
        assert owner.value_type == self.value_type
        self.owner, self._held = owner, owner._held

    @property
    def entries(self) -> SlotColumns:
        return self._held.entries

    @property
    def index(self) -> KeyIndex:
        return self._held.index

    @property
    def by_slot(self) -> SortedMap:
        return self._held.by_slot

    def reset(self) -> None:
        self._held.entries = SlotColumns({SLOT: pl.Int64(), VALUE: self.value_type, COUNT: pl.Int64()})
        self._held.index = KeyIndex([SLOT, VALUE])
        self._held.by_slot = SortedMap(shift=32)

    @property
    def values(self) -> pl.DataFrame:
        """The positive counts as the frame multiset saves them: state keys, ``__v``, ``__n``."""
        return self.saved_rows().frame()

    def saved_rows(self) -> Rows:
        """:attr:`values` as :class:`~imp_core.engine.state.Rows`: a save streaming parts gathers a slice of entries
        at a time, never the whole frame."""
        live = np.flatnonzero(self.entries.column(COUNT, np.arange(self.entries.size)) > 0)

        def take(start: int, length: int) -> pl.DataFrame:
            rows = self.entries.rows(live[start:start + length])
            return self.keys_of(rows.get_column(SLOT).to_numpy()).hstack(rows.select(VALUE, COUNT).get_columns())

        return Rows(live.size, take)

    def load(self, values: pl.DataFrame | Parts, slots_in: Callable[[pl.DataFrame], np.ndarray]) -> None:
        """Saved counts (state keys, ``__v``, ``__n``, positive) as the state, a part at a time: ``slots_in`` gives
        the group slot of each row's keys, and each part is copied into the entries (allocated once) and dropped."""
        self.reset()
        rows, parts = slices(values)
        self.entries.fill((pl.DataFrame([pl.Series(SLOT, slots_in(part), dtype=pl.Int64),
                                         part.get_column(VALUE).cast(self.value_type),
                                         part.get_column(COUNT).cast(pl.Int64)]) for part in parts), rows)
        self.index.build(self.entries.keys([SLOT, VALUE]), self.entries)
        at = np.arange(self.entries.size, dtype=np.int64)
        self._held.by_slot = SortedMap.build(_slot_keys(self.entries.column(SLOT, at), at), at, 32)

    def nbytes(self) -> int:
        if self.owner is not None:
            return 0  # counted by the owner
        return self.entries.nbytes() + self.index.nbytes() + self.by_slot.nbytes()

    def prepare(self, changes: pl.DataFrame | None, slots: np.ndarray, old: pl.Series,
                non_null: np.ndarray) -> tuple[pl.Series, Callable[[], None]]:
        """The new extreme of each touched group (``slots``: its slot, -1 for a new group left empty; ``old``: its
        extreme before, ``non_null``: its count of non-NULL values after) and the commit of ``changes`` (``__slot``,
        ``__v``, ``__n`` signed), which the caller runs once every check of the batch passed.

        Raises:
            StateError: A count would become negative, or a group with values has none left in the state.
        """
        best_of = pl.col(VALUE).min() if self.func == "min" else pl.col(VALUE).max()
        empty = pl.DataFrame(schema={SLOT: pl.Int64, VALUE: self.value_type})
        batch = self.probe(changes)
        changed = batch.changes.select(SLOT, VALUE).with_columns(pl.Series("__after", batch.after, dtype=pl.Int64))

        # each group's old extreme, if the batch left it a positive count
        encoded = _encode(old, self.float_values).cast(self.value_type)
        olds = pl.DataFrame([pl.Series(SLOT, slots, dtype=pl.Int64), encoded.alias(VALUE)]).filter(
            (pl.col(SLOT) >= 0) & pl.col(VALUE).is_not_null())
        at = self.index.lookup(olds, self.entries)
        olds = olds.with_columns(pl.Series("__now", np.where(at >= 0, self.entries.column(COUNT, at), 0)))
        olds = olds.join(changed, on=[SLOT, VALUE], how="left", nulls_equal=True).with_columns(
            pl.coalesce("__after", "__now").alias("__now"))
        kept = olds.filter(pl.col("__now") > 0).select(SLOT, VALUE)

        # a group whose extreme is gone: every value it still holds
        lost = olds.filter(pl.col("__now") <= 0).get_column(SLOT).unique().to_numpy()
        scanned = self.held(lost, batch) if lost.size else empty
        inserted = changed.filter(pl.col("__after") > 0).select(SLOT, VALUE)
        best = pl.concat([kept, scanned, inserted]).group_by(SLOT).agg(best_of.alias("__best"))
        rows = pl.DataFrame([pl.Series(SLOT, slots, dtype=pl.Int64)]).join(best, on=SLOT, how="left",
                                                                             maintain_order="left")
        value = rows.get_column("__best")
        missing = (non_null > 0) & value.is_null().to_numpy()
        if missing.any():
            raise StateError(f"operator {self.op_id}: a group has values but its MIN/MAX state holds none; "
                             f"recapture the sketch")
        value = value.set(pl.Series(non_null <= 0), None)
        if self.float_values:
            decoded = float_from_order_key(value.fill_null(0).to_numpy())
            value = pl.Series(value.name, decoded, dtype=pl.Float64).set(value.is_null(), None)

        return value, lambda: self.commit(batch)

    def probe(self, changes: pl.DataFrame | None) -> Probe:
        """Where the batch's value-count ``changes`` (``__slot``, ``__v``, ``__n`` signed) are in the state, and
        the counts before and after them.

        Raises:
            StateError: A count would become negative.
        """
        none = np.empty(0, dtype=np.int64)
        if changes is None or not changes.height:
            chg = pl.DataFrame(schema={SLOT: pl.Int64, VALUE: self.value_type, COUNT: pl.Int64})
            return Probe(chg, none, none, none, none, none)
        chg = changes.select(pl.col(SLOT).cast(pl.Int64), pl.col(VALUE).cast(self.value_type),
                             pl.col(COUNT).cast(pl.Int64))
        pos, hashes, taken = self.index.probe(chg.select(SLOT, VALUE), self.entries)
        assert hashes is not None  # a key of two columns is always hashed (only a one-column key has a dense table)
        before = np.where(pos >= 0, self.entries.column(COUNT, pos), 0)
        after = before + chg.get_column(COUNT).to_numpy()
        if after.min() < 0:
            raise StateError(f"operator {self.op_id}: {self.label} state lost a value the change feed deletes; "
                             f"recapture the sketch")
        return Probe(chg, pos, hashes, taken, before, after)

    def held(self, slots: np.ndarray, batch: Probe) -> pl.DataFrame:
        """(``__slot``, ``__v``) of every value the groups ``slots`` held before the batch and still hold after it
        (the values it inserts anew are not among them)."""
        _, entry = self.by_slot.in_buckets(slots)
        counts = self.entries.column(COUNT, entry)
        hit = batch.pos >= 0
        if hit.any():  # this batch's counts where it changed them
            order = np.argsort(batch.pos[hit])
            changed_pos, changed_after = batch.pos[hit][order], batch.after[hit][order]
            k = np.minimum(np.searchsorted(changed_pos, entry), changed_pos.size - 1)
            counts = np.where(changed_pos[k] == entry, changed_after[k], counts)
        return self.entries.rows(entry[counts > 0]).select(SLOT, VALUE)

    def commit(self, batch: Probe) -> None:
        """Write the batch's counts: changed entries in place, new values appended and indexed (by the owner of
        shared counts only)."""
        chg, pos, after = batch.changes, batch.pos, batch.after
        if not pos.size or self.owner is not None:
            return
        found = pos >= 0
        self.entries.scatter(pos[found], pl.DataFrame({SLOT: chg.get_column(SLOT).filter(pl.Series(found)),
                                                       VALUE: chg.get_column(VALUE).filter(pl.Series(found)),
                                                       COUNT: after[found]}))
        new = ~found & (after > 0)
        if new.any():
            added = chg.filter(pl.Series(new)).select(SLOT, VALUE)
            at = self.entries.append(added.with_columns(pl.Series(COUNT, after[new], dtype=pl.Int64)))
            self.index.insert(added, at, self.entries, batch.hashes[new], batch.taken[new])
            self.by_slot.put(_slot_keys(added.get_column(SLOT).to_numpy(), at), at)


class _Counts:
    """The arrays of a keyed multiset's counts, held apart so that multisets over one argument share them."""

    entries: SlotColumns
    index: KeyIndex
    by_slot: SortedMap


class Probe(NamedTuple):
    """A batch's value-count changes against the state: ``pos`` (entry, -1 for a new value), the index's ``hashes``
    and ``taken`` for inserting new values, and the counts ``before`` and ``after``."""

    changes: pl.DataFrame
    pos: np.ndarray
    hashes: np.ndarray
    taken: np.ndarray
    before: np.ndarray
    after: np.ndarray


def _slot_keys(slots: np.ndarray, entries: np.ndarray) -> np.ndarray:
    """``slot << 32 | entry`` (entries below 2^32): a slot's entries are one bucket of a shift-32 ``SortedMap``."""
    return PairCounts.key(slots.astype(np.int64), (entries.astype(np.int64) & _MASK).astype(np.uint32))


def _encode(values: pl.Series, float_values: bool) -> pl.Series:
    """Extremes as the multiset stores its values (doubles as order keys)."""
    if not float_values:
        return values
    nulls = values.is_null()
    keys = float_order_key(values.cast(pl.Float64).fill_null(0.0).to_numpy())
    return pl.Series(values.name, keys, dtype=pl.Int64).set(nulls, None)


__all__ = ["SLOT", "KeyedValueMultiset", "Probe"]

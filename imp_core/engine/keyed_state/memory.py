"""The memory store of the keyed-state contract (``contract.py``), built from the keyed aggregation's structures.

Keys: a :class:`~imp_core.engine.keyed.KeyIndex` from the state keys to a *key slot*, the keys themselves in a
:class:`~imp_core.engine.slot_columns.SlotColumns` at that slot. A map component is a ``SlotColumns`` at the key slot
with a presence mask (a map row whose count is 0 is not present). A bag component is the keyed MIN/MAX multiset's
layout made general: its entries (key slot, identity columns, count) in a ``SlotColumns``, and a
:class:`~imp_core.engine.keyed.SortedMap` keyed ``slot << 32 | entry`` whose bucket per key slot holds every entry of
that key. A batch's fetch is one probe of the key index and its rows are gathers; a replace nets the new rows, matches
them with the batch keys' entries by one join (a key's entries are all in its bucket, so no index of entries is
needed), sets the matched counts, appends the rest, and sets the unmatched old entries to 0: tombstones, rebuilt away
once they outnumber the live ones. So a batch costs its keys' rows, not the state.

A version lives only in this process: :meth:`MemoryStore.checkpoint` hands the committed rows over (what the catalog
saves with the sketch version) and :meth:`MemoryStore.open` starts from such rows again. :meth:`MemoryStore.abort`
drops the state (nothing keeps a copy of the last commit) and closes the store until it is opened again.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np
import polars as pl

from imp_core.engine.keyed import KeyIndex, SortedMap
from imp_core.engine.keyed_state.contract import (
    KEY_SLOT,
    ROW,
    Batch,
    Checkpoint,
    Component,
    Kind,
    StateSpec,
    StoreTraits,
    conform,
)
from imp_core.engine.keyed_state.versions import MemoryVersion, StateVersion
from imp_core.engine.slot_columns import SlotColumns
from imp_core.engine.state import Rows
from imp_core.errors import StateError

CHUNK_KEYS = 1 << 20  # keys per chunk of a scan
MIN_TOMBSTONES = 4096  # a bag rebuilds its entries when more than this many (and than live ones) have count 0
_EMPTY = np.empty(0, dtype=np.int64)
_SHIFT = np.uint64(32)


def _entry_keys(slots: np.ndarray, entries: np.ndarray) -> np.ndarray:
    """``slot << 32 | entry``: a key slot's entries are one bucket of a shift-32 ``SortedMap``."""
    return (slots.astype(np.uint64) << _SHIFT) | entries.astype(np.uint64)


class _Map:
    """A map component: its columns at the key slot, and which key slots hold a row."""

    def __init__(self, component: Component) -> None:
        self.component = component
        self.columns = SlotColumns(component.schema)
        self.present = np.zeros(0, dtype=bool)

    def cover(self, size: int) -> None:
        """Room for ``size`` key slots (a slot no row was written to holds none)."""
        grow = size - self.columns.size
        if grow > 0:
            self.columns.append(pl.DataFrame(schema=self.component.schema).clear(grow))
            self.present = np.concatenate([self.present, np.zeros(grow, dtype=bool)])

    def live(self, slots: np.ndarray) -> np.ndarray:
        """Per slot (-1: none), whether it holds a row."""
        out = np.zeros(slots.size, dtype=bool)
        inside = slots >= 0
        out[inside] = self.present[slots[inside]]
        return out

    def rows(self, slots: np.ndarray) -> tuple[np.ndarray, pl.DataFrame]:
        """The key slots among ``slots`` that hold a row, and those rows (the component's columns)."""
        held = slots[self.live(slots)]
        return held, self.columns.rows(held)

    def prepare(self, owner: str, slots: np.ndarray, rows: pl.DataFrame) -> pl.DataFrame:
        """``rows`` (at key ``slots``) as :meth:`write` takes them.

        Raises:
            StateError: Two rows of one key.
        """
        if np.unique(slots).size != slots.size:
            raise StateError(f"operator {owner}: state component {self.component.name} got two rows of one key")
        return rows

    def write(self, cleared: np.ndarray, slots: np.ndarray, rows: pl.DataFrame) -> None:
        """Drop the rows of key slots ``cleared``, then write ``rows`` at ``slots`` (distinct)."""
        self.present[cleared] = False
        if not slots.size:
            return
        self.columns.scatter(slots, rows.select(list(self.component.schema)))
        count = self.component.count
        self.present[slots] = True if count is None else rows.get_column(count).fill_null(1).to_numpy() != 0

    def size(self) -> int:
        return int(self.present.sum())


class _Bag:
    """A bag component: entries (key slot, identity, count), found per key slot through ``by_key``."""

    def __init__(self, component: Component) -> None:
        assert component.count is not None
        self.component = component
        self.count = component.count
        self.identity = list(component.identity)
        self._clear()

    def _clear(self) -> None:
        types = self.component.schema
        schema: dict[str, pl.DataType] = {KEY_SLOT: pl.Int64(), **{c: types[c] for c in self.identity},
                                          self.count: pl.Int64()}
        self.entries = SlotColumns(schema, frozenset({self.count}))
        self.by_key = SortedMap(shift=32)
        self.zeros = 0  # entries whose count is 0

    def _counts(self) -> np.ndarray:
        return self.entries.arrays[self.count]

    def positions(self, slots: np.ndarray) -> np.ndarray:
        """The entries of the distinct key slots ``slots`` (>= 0), zero counts included."""
        if not slots.size or not len(self.by_key):
            return _EMPTY
        _, pos = self.by_key.in_buckets(np.sort(slots).astype(np.int64))
        return pos

    def live(self, slots: np.ndarray) -> np.ndarray:
        """Per slot (-1: none), whether it holds a row with a nonzero count."""
        out = np.zeros(slots.size, dtype=bool)
        inside = slots >= 0
        pos = self.positions(slots[inside])
        held = self.entries.column(KEY_SLOT, pos[self._counts()[pos] != 0]) if pos.size else _EMPTY
        out[inside] = np.isin(slots[inside], held)
        return out

    def rows(self, slots: np.ndarray) -> tuple[np.ndarray, pl.DataFrame]:
        """The rows of the key slots ``slots`` (>= 0, distinct): each row's key slot, and its identity and count."""
        pos = self.positions(slots)
        pos = pos[self._counts()[pos] != 0] if pos.size else pos
        rows = self.entries.rows(pos)
        return rows.get_column(KEY_SLOT).to_numpy(), rows.drop(KEY_SLOT)

    def prepare(self, owner: str, slots: np.ndarray, rows: pl.DataFrame) -> pl.DataFrame:
        """``rows`` (identity and count columns, at key ``slots``) netted as :meth:`write` takes them: rows equal in
        key and identity are one entry with the sum of their counts; those that sum to 0 are gone.

        Raises:
            StateError: An unsigned bag would hold a negative count.
        """
        if not slots.size:
            return pl.DataFrame(schema=self.entries.schema)
        rows = pl.DataFrame([pl.Series(KEY_SLOT, slots, dtype=pl.Int64), *[rows.get_column(c) for c in self.identity],
                             rows.get_column(self.count).cast(pl.Int64)])
        netted = rows.group_by([KEY_SLOT, *self.identity]).agg(pl.col(self.count).sum())
        netted = netted.filter(pl.col(self.count) != 0)
        if not self.component.signed and netted.height and int(netted.get_column(self.count).min()) < 0:  # type: ignore[arg-type]
            raise StateError(f"state component {self.component.name} of operator {owner}: a count became negative — "
                             f"the change feed deleted rows the state never saw; recapture the sketch")
        return netted

    def write(self, cleared: np.ndarray, slots: np.ndarray, netted: pl.DataFrame) -> None:
        """Make the entries ``netted`` (from :meth:`prepare`, ``slots`` not read again) the rows of the key slots
        ``cleared``: their other entries fall to 0. Every entry of a key slot is in its bucket of ``by_key``, so a new
        row is matched with the key slots' entries by one join, never probed in the index; only rows no entry has
        are appended (and indexed)."""
        counts = self._counts()
        old = self.positions(cleared)
        before = counts[old].copy() if old.size else _EMPTY
        if old.size:
            counts[old] = 0
        fresh = netted
        if netted.height and old.size:
            held = self.entries.gather(old, [KEY_SLOT, *self.identity]).with_columns(pl.Series(ROW, old))
            matched = netted.join(held, on=[KEY_SLOT, *self.identity], how="left", nulls_equal=True)
            entry = matched.get_column(ROW)
            hit = entry.is_not_null().to_numpy()
            counts[entry.to_numpy()[hit].astype(np.int64)] = matched.get_column(self.count).to_numpy()[hit]
            fresh = matched.filter(pl.Series(~hit)).drop(ROW)
        if old.size:
            after = counts[old]
            self.zeros += int(((before != 0) & (after == 0)).sum()) - int(((before == 0) & (after != 0)).sum())
        if fresh.height:
            if self.entries.size + fresh.height >= 1 << 32:
                raise StateError(f"state component {self.component.name}: more than 2^32 entries in memory; place "
                                 f"the state in Delta tables (IMP_STATE_MEMORY_BUDGET)")
            at = self.entries.append(fresh)
            self.by_key.put(_entry_keys(fresh.get_column(KEY_SLOT).to_numpy(), at), at)
        self._maybe_rebuild()

    def _maybe_rebuild(self) -> None:
        """Rebuild the entries from the live ones once the tombstones outnumber them."""
        if self.zeros <= max(MIN_TOMBSTONES, self.entries.size - self.zeros):
            return
        live = np.flatnonzero(self._counts()[:self.entries.size] != 0)
        rows = self.entries.rows(live)
        self._clear()
        if rows.height:
            at = self.entries.append(rows)
            self.by_key = SortedMap.build(_entry_keys(rows.get_column(KEY_SLOT).to_numpy(), at), at, 32)

    def size(self) -> int:
        return self.entries.size - self.zeros


class MemoryStore:
    """The :class:`~imp_core.engine.keyed_state.contract.KeyedStore` held in this process (``resident``)."""

    traits = StoreTraits(resident=True)

    def __init__(self, spec: StateSpec, chunk_keys: int = CHUNK_KEYS) -> None:
        self.spec = spec
        self._chunk = max(1, chunk_keys)
        self._version: StateVersion = MemoryVersion(rows=self._zero_rows())
        self._ticket = 0
        self._open: tuple[int, pl.DataFrame, np.ndarray] | None = None  # the latest fetch: ticket, keys, slots
        self._dirty = False
        self._closed = False
        self._empty()

    def _zero_rows(self) -> tuple[tuple[str, int], ...]:
        return tuple((c.name, 0) for c in self.spec.components)

    def _empty(self) -> None:
        self._keys = SlotColumns(self.spec.key_types)
        self._index = KeyIndex(self.spec.key_names)
        self._parts: dict[str, _Map | _Bag] = {
            c.name: _Map(c) if c.kind is Kind.MAP else _Bag(c) for c in self.spec.components}
        self._open = None

    # -- versions ------------------------------------------------------------------------------------------------

    @property
    def version(self) -> StateVersion:
        return self._version

    def open(self, at: Checkpoint | None = None) -> None:
        self._empty()
        self._closed = False
        self._dirty = False
        if at is None:
            self._version = MemoryVersion(rows=self._zero_rows())
            return
        if not isinstance(at.version, MemoryVersion):
            raise StateError(f"operator {self.spec.owner}: a memory store opens memory checkpoints, not a "
                             f"{at.version.store} one (move state between stores with load and scan)")
        self.load({name: f.frame() if isinstance(f, Rows) else f for name, f in at.frames.items()})
        if self.size() != at.version.row_counts:
            self._closed = True
            raise StateError(f"operator {self.spec.owner}: saved state holds {self.size()} rows, its version records "
                             f"{at.version.row_counts}; recapture the sketch")
        self._dirty = False
        self._version = at.version

    def commit(self) -> StateVersion:
        self._usable()
        if self._dirty:
            assert isinstance(self._version, MemoryVersion)
            self._version = MemoryVersion(rows=tuple(self.size().items()), serial=self._version.serial + 1)
            self._dirty = False
        return self._version

    def abort(self) -> None:
        self._empty()
        self._closed = True
        self._dirty = False

    def checkpoint(self) -> Checkpoint:
        self._usable()
        if self._dirty:
            raise StateError(f"operator {self.spec.owner}: a checkpoint of state with changes not committed; commit "
                             f"first (this is a bug in imp)")
        frames = {c.name: self._rows_at(c.name, np.arange(self._keys.size, dtype=np.int64))
                  for c in self.spec.components}
        return Checkpoint(self._version, frames)

    # -- reads ---------------------------------------------------------------------------------------------------

    def fetch(self, keys: pl.DataFrame) -> Batch:
        self._usable()
        wanted = self._typed_keys(keys)
        slots = self._slots(wanted)
        present = np.zeros(wanted.height, dtype=bool)
        for part in self._parts.values():
            present |= part.live(slots)
        self._ticket += 1
        self._open = (self._ticket, wanted, slots)
        return Batch(wanted, present, lambda name: self._rows_at(name, slots), self, self._ticket)

    def lookup(self, keys: pl.DataFrame) -> dict[str, pl.DataFrame]:
        self._usable()
        names = self.spec.key_names
        if not set(keys.columns) <= set(names) or not keys.width:
            raise StateError(f"operator {self.spec.owner}: a lookup by {keys.columns} names no state keys {names}")
        if set(keys.columns) == set(names):
            slots = self._slots(self._typed_keys(keys))
            slots = np.unique(slots[slots >= 0])
        else:
            types = self.spec.key_types
            wanted = keys.cast({k: types[k] for k in keys.columns}).unique()
            stored = self._keys.keys(list(keys.columns)).with_row_index(ROW)
            slots = stored.join(wanted, on=list(keys.columns), how="semi", nulls_equal=True).get_column(
                ROW).to_numpy().astype(np.int64)
        return {c.name: self._rows_at(c.name, slots) for c in self.spec.components}

    def scan(self) -> Iterator[dict[str, pl.DataFrame]]:
        self._usable()
        size = self._keys.size
        for start in range(0, max(size, 1), self._chunk):
            slots = np.arange(start, min(size, start + self._chunk), dtype=np.int64)
            yield {c.name: self._rows_at(c.name, slots) for c in self.spec.components}

    def size(self) -> dict[str, int]:
        return {name: part.size() for name, part in self._parts.items()}

    # -- writes --------------------------------------------------------------------------------------------------

    def replace(self, batch: Batch, rows: Mapping[str, pl.DataFrame]) -> None:
        self._usable()
        batch.take_back(self, self._ticket)
        assert self._open is not None and self._open[0] == self._ticket
        _, wanted, slots = self._open
        self._open = None
        frames = self._conformed(rows)
        located = {name: self._positions(name, wanted, frame) for name, frame in frames.items()}
        # every check before any write, so that a refused replace changes nothing; a new key gets a slot of its own
        # (placeholder slots past the end) only once they all passed
        needed = np.zeros(wanted.height, dtype=bool)
        for at in located.values():
            needed[at] = True
        fresh = needed & (slots < 0)
        planned = slots.copy()
        planned[fresh] = self._keys.size + np.arange(int(fresh.sum()), dtype=np.int64)
        prepared = {name: self._parts[name].prepare(self.spec.owner, planned[located[name]], frame)
                    for name, frame in frames.items()}
        if fresh.any():
            self._add_keys(wanted.filter(pl.Series(fresh)))
        cleared = planned[planned >= 0]
        for name, ready in prepared.items():
            self._parts[name].write(cleared, planned[located[name]], ready)
        self._dirty = True

    def load(self, frames: Mapping[str, pl.DataFrame]) -> None:
        self._usable()
        conformed = self._conformed(frames)
        names = self.spec.key_names
        keys = pl.concat([f.select(names) for f in conformed.values()]).unique(maintain_order=True)
        # the slot of a key is its row in ``keys``; every check passes before the state is emptied
        at = {name: self._positions(name, keys, frame) for name, frame in conformed.items()}
        prepared = {name: self._parts[name].prepare(self.spec.owner, at[name], frame) for name, frame in
                    conformed.items()}
        self._empty()
        if keys.height:
            self._keys.append(keys)
            self._index.build(keys, self._keys)
        for name, ready in prepared.items():
            part = self._parts[name]
            if isinstance(part, _Map):
                part.cover(self._keys.size)
            part.write(_EMPTY, at[name], ready)
        self._dirty = True

    # -- inside --------------------------------------------------------------------------------------------------

    def _usable(self) -> None:
        if self._closed:
            raise StateError(f"operator {self.spec.owner}: its state store was aborted; open a checkpoint first "
                             f"(this is a bug in imp)")

    def _typed_keys(self, keys: pl.DataFrame) -> pl.DataFrame:
        names = self.spec.key_names
        missing = [k for k in names if k not in keys.columns]
        if missing:
            raise StateError(f"operator {self.spec.owner}: keys lack the state key column(s) {', '.join(missing)}")
        return keys.select(names).cast(self.spec.key_types).unique(maintain_order=True)  # type: ignore[arg-type]

    def _slots(self, keys: pl.DataFrame) -> np.ndarray:
        if not self._keys.size or not keys.height:
            return np.full(keys.height, -1, dtype=np.int64)
        return self._index.lookup(keys, self._keys).astype(np.int64, copy=False)

    def _add_keys(self, keys: pl.DataFrame) -> np.ndarray:
        """Index new (absent, distinct) keys at new key slots; the maps get room for them."""
        slots = self._keys.append(keys)
        self._index.insert(keys, slots, self._keys)
        for part in self._parts.values():
            if isinstance(part, _Map):
                part.cover(self._keys.size)
        return slots

    def _conformed(self, frames: Mapping[str, pl.DataFrame]) -> dict[str, pl.DataFrame]:
        unknown = sorted(set(frames) - {c.name for c in self.spec.components})
        if unknown:
            raise StateError(f"operator {self.spec.owner}: its state has no component {', '.join(unknown)}")
        return {c.name: conform(self.spec, c.name, frames.get(c.name)) for c in self.spec.components}

    def _positions(self, name: str, wanted: pl.DataFrame, frame: pl.DataFrame) -> np.ndarray:
        """The position in ``wanted`` (distinct keys) of each row's key.

        Raises:
            StateError: A row's key is not one of them (a replace of keys its batch did not fetch).
        """
        if not frame.height:
            return _EMPTY
        names = self.spec.key_names
        at = frame.select(names).join(wanted.with_row_index(ROW), on=names, how="left", nulls_equal=True,
                                      maintain_order="left").get_column(ROW)
        if at.null_count():
            raise StateError(f"operator {self.spec.owner}: a replace gives state component {name} rows of keys its "
                             f"batch did not fetch; this is a bug in imp")
        return at.to_numpy().astype(np.int64)

    def _rows_at(self, name: str, slots: np.ndarray) -> pl.DataFrame:
        """Component ``name``'s rows of the distinct key slots ``slots`` (-1: none), with their keys."""
        part = self._parts[name]
        held, rows = part.rows(slots[slots >= 0])
        keys = self._keys.gather(held) if held.size else pl.DataFrame(schema=self.spec.key_types)
        out = pl.concat([keys, rows], how="horizontal") if rows.width else keys
        schema = self.spec.schema(name)
        return out.select(list(schema)).cast(schema)  # type: ignore[arg-type]


__all__ = ["CHUNK_KEYS", "MemoryStore"]

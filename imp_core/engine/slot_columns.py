"""State columns addressed by slot (``SlotColumns``), and the NumPy shortcuts that read and write them.

A keyed operator keeps one row per group at a slot ``0 .. size-1`` of columns with spare capacity: a batch gathers and
scatters the slots it touches only (a polars Series owned by nothing else is scattered into in place; counts and sums
that are never NULL are NumPy arrays), and a load fills them a part at a time into columns allocated once
(``SlotColumns.fill``). The index from keys to slots is ``keyed.KeyIndex``. See docs/ARCHITECTURE.md, "Keyed state".
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import polars as pl
import pyarrow as pa

from imp_core.engine import frames
from imp_core.errors import StateError


def numpy_layout(dtype: pl.DataType) -> bool:
    """Whether a column's values travel through NumPy unchanged: numbers, booleans, and dates and times as their
    physical integers."""
    return dtype.is_numeric() and not dtype.is_decimal() or dtype in (pl.Boolean, pl.Date) or isinstance(
        dtype, (pl.Datetime, pl.Duration))


def take(s: pl.Series, rows: np.ndarray, missing: np.ndarray | None = None) -> pl.Series:
    """``s.gather(rows)`` (NULL at ``missing`` rows, whose ``rows`` entry is ignored). Through NumPy when ``s`` has no
    NULL and a NumPy layout: a polars gather is an expression run (~40 us whatever the size), this is ~5 us."""
    if s.null_count() or not s.len() or not numpy_layout(s.dtype):
        idx = pl.Series("__i", rows, dtype=pl.Int64)
        if missing is not None and missing.any():
            idx = idx.set(pl.Series(missing), None)
        return s.gather(idx)
    values = s.to_numpy()
    if values.dtype.kind in "mM":
        values = values.view(np.int64)
    if missing is not None and missing.any():
        out = pl.Series(s.name, pa.array(values[np.where(missing, 0, rows)], mask=missing))
    else:
        out = frames.series(s.name, values[rows])
    return out if out.dtype == s.dtype else out.cast(s.dtype)


def nullable_index(slots: np.ndarray) -> pl.Series:
    """Slots as a polars gather index; -1 becomes NULL (a gather yields a NULL row there)."""
    idx = pl.Series("__i", slots, dtype=pl.Int64)
    missing = slots < 0
    return idx.set(pl.Series(missing), None) if missing.any() else idx


class Gather:
    """Slots to read state columns at (-1: a group the state lacks, read as 0), with the masks every column read
    shares: a batch reads a dozen columns at the same slots."""

    __slots__ = ("missing", "safe", "slots", "some")

    def __init__(self, slots: np.ndarray) -> None:
        self.slots = slots
        self.missing = slots < 0
        self.some = bool(self.missing.any())
        self.safe = np.where(self.missing, 0, slots) if self.some else slots


class SlotColumns:
    """State columns addressed by slot ``0 .. size-1``, each with spare capacity: a polars Series, or for the
    ``dense`` columns (numbers that are never NULL: counts and sums) a NumPy array, read and written without a polars
    run (the accumulators of a batch are gathered, updated and scattered back in a few microseconds each)."""

    def __init__(self, schema: dict[str, pl.DataType], dense: frozenset[str] = frozenset()) -> None:
        self.schema = dict(schema)
        self.dense = frozenset(n for n in dense if n in self.schema)
        self.size = 0
        self.capacity = 0
        self.cols = {n: pl.Series(n, [], dtype=t) for n, t in self.schema.items() if n not in self.dense}
        self.arrays: dict[str, np.ndarray] = {n: np.zeros(0, dtype=_numpy_type(self.schema[n])) for n in self.dense}

    def gather(self, slots: np.ndarray, names: list[str] | None = None) -> pl.DataFrame:
        """The rows at ``slots``; NULL rows where a slot is -1."""
        missing = slots < 0
        return frames.frame([self._take(n, slots, missing) for n in (names or list(self.schema))])

    def _take(self, name: str, slots: np.ndarray, missing: np.ndarray) -> pl.Series:
        if name not in self.dense:
            return take(self.cols[name][:self.size], slots, missing)
        values = self.arrays[name][np.where(missing, 0, slots)] if self.size else np.zeros(slots.size,
                                                                                          self.arrays[name].dtype)
        out = pl.Series(name, pa.array(values, mask=missing)) if missing.any() else frames.series(name, values)
        return out if out.dtype == self.schema[name] else out.cast(self.schema[name])

    def zero_filled(self, name: str, slots: np.ndarray | Gather) -> np.ndarray | None:
        """Column ``name`` at ``slots`` as a NumPy array with 0 where a slot is -1; None when the column holds NULL or
        has no NumPy layout."""
        at = slots if isinstance(slots, Gather) else Gather(slots)
        if name in self.dense:
            if not self.size:
                return np.zeros(at.slots.size, dtype=self.arrays[name].dtype)
            values = self.arrays[name][at.safe]
        else:
            live = self.cols[name][:self.size]
            if live.null_count() or not numpy_layout(live.dtype) or live.dtype.is_temporal():
                return None
            if not self.size:
                return np.zeros(at.slots.size, dtype=live.to_numpy().dtype)
            values = live.to_numpy()[at.safe]
        if at.some:
            values[at.missing] = 0
        return values

    def column(self, name: str, slots: np.ndarray) -> np.ndarray:
        """Column ``name`` at ``slots`` (-1: NULL, or 0 for a dense column)."""
        if name in self.dense:
            return self.zero_filled(name, slots)  # type: ignore[return-value]
        return take(self.cols[name][:self.size], slots, slots < 0).to_numpy()

    def scatter(self, slots: np.ndarray, frame: pl.DataFrame) -> None:
        if not slots.size:
            return
        for n, dtype in self.schema.items():
            values = frame.get_column(n)
            values = values if values.dtype == dtype else values.cast(dtype)
            if n in self.dense:
                self.arrays[n][slots] = _dense_values(values)
            else:
                self.cols[n].scatter(slots, values)

    def append(self, frame: pl.DataFrame) -> np.ndarray:
        """Rows at new slots (returned, in the frame's order)."""
        slots = np.arange(self.size, self.size + frame.height, dtype=np.int64)
        if not slots.size:
            return slots
        if self.size == 0 and frame.height > self.capacity:  # a load or a capture: the columns are the frame's (copied)
            spare = max(1024, frame.height // 8)
            self.cols = {n: _own(frame.get_column(n).cast(t), spare) for n, t in self.schema.items()
                         if n not in self.dense}
            for n in self.dense:
                array = np.zeros(frame.height + spare, dtype=self.arrays[n].dtype)
                array[:frame.height] = _dense_values(frame.get_column(n).cast(self.schema[n]))
                self.arrays[n] = array
            self.size, self.capacity = frame.height, frame.height + spare
            return slots
        if self.size + frame.height > self.capacity:
            grow = max(self.size + frame.height, 2 * self.capacity, 1024) - self.capacity
            self.cols = {n: s.extend_constant(None, grow).rechunk() for n, s in self.cols.items()}
            for n, array in self.arrays.items():
                self.arrays[n] = np.concatenate([array, np.zeros(grow, dtype=array.dtype)])
            self.capacity += grow
        self.scatter(slots, frame)
        self.size += frame.height
        return slots

    def fill(self, parts: Iterable[pl.DataFrame], rows: int) -> None:
        """``rows`` rows from ``parts`` (frames with the store's columns, in slot order) as the contents of this empty
        store: every column is allocated once, and each part is copied in and can be dropped before the next one is
        made (a streamed load). Columns polars cannot write in place (text, binary) are gathered and joined once.

        Raises:
            StateError: The parts hold other than ``rows`` rows, or NULL in a count or sum.
        """
        assert self.size == 0, "fill is for an empty store"
        spare = max(1024, rows // 8)
        capacity = rows + spare
        self.arrays = {n: np.zeros(capacity, dtype=a.dtype) for n, a in self.arrays.items()}
        inplace = {n for n, t in self.schema.items() if n not in self.dense and _scatters(t)}
        self.cols = {n: pl.repeat(None, capacity, dtype=self.schema[n], eager=True).rechunk().alias(n) for n in inplace}
        gathered: dict[str, list[pl.Series]] = {n: [] for n in self.schema if n not in self.dense and n not in inplace}
        at = 0
        for part in parts:
            if at + part.height > rows:
                raise StateError(f"saved state holds more than the {rows} rows its header records; recapture the "
                                 f"sketch")
            slots = np.arange(at, at + part.height, dtype=np.int64)
            for n, dtype in self.schema.items():
                values = part.get_column(n)
                values = values if values.dtype == dtype else values.cast(dtype)
                if n in self.dense:
                    self.arrays[n][at:at + part.height] = _dense_values(values)
                elif n in inplace:
                    self.cols[n].scatter(slots, values)
                else:
                    gathered[n].append(values)
            at += part.height
        if at != rows:
            raise StateError(f"saved state holds {at} rows, its header records {rows}; recapture the sketch")
        for n, pieces in gathered.items():
            whole = pl.concat(pieces, rechunk=False) if pieces else pl.Series(n, [], dtype=self.schema[n])
            self.cols[n] = _own(whole, spare)
        self.size, self.capacity = rows, capacity

    def keys(self, names: list[str]) -> pl.DataFrame:
        """The ``names`` columns of slots ``0 .. size-1`` (views of the state, not copies)."""
        return pl.DataFrame([self.cols[n][:self.size] for n in names])

    def nbytes(self) -> int:
        return int(sum(s.estimated_size() for s in self.cols.values()) + sum(a.nbytes for a in self.arrays.values()))

    def rows(self, slots: np.ndarray) -> pl.DataFrame:
        """The rows at ``slots`` in fresh buffers (a frame that shares none with the state)."""
        idx = pl.Series("__i", slots, dtype=pl.Int64)
        return pl.DataFrame([pl.Series(n, self.arrays[n][slots]).cast(t) if n in self.dense else
                             self.cols[n].gather(idx) for n, t in self.schema.items()])


def _numpy_type(dtype: pl.DataType) -> type:
    if dtype == pl.Int64:
        return np.int64
    if dtype == pl.Float64:
        return np.float64
    raise StateError(f"a dense state column must be BIGINT or DOUBLE, not {dtype}")


def _dense_values(values: pl.Series) -> np.ndarray:
    if values.null_count():
        raise StateError(f"state column {values.name} got a NULL where a count or sum belongs; recapture the sketch")
    return values.to_numpy()


def _scatters(dtype: pl.DataType) -> bool:
    """Whether polars writes a column of ``dtype`` in place at given rows (numbers, booleans, dates and times)."""
    return bool(dtype.is_numeric() or dtype.is_temporal() or dtype == pl.Boolean)


def _own(series: pl.Series, spare: int) -> pl.Series:
    """``series`` plus ``spare`` NULL slots, in one fresh buffer no other Series shares."""
    return series.extend_constant(None, spare).rechunk()


__all__ = ["Gather", "SlotColumns", "nullable_index", "numpy_layout", "take"]

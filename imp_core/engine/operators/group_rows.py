"""The keyed aggregation's ``groups`` and ``F_g`` frames, saved and loaded a slice at a time.

Building either frame whole gathers every live slot's row (and every pair's keys) into fresh buffers, a second copy
of the state at the moment it is saved. Handed over as :class:`~imp_core.engine.state.Rows` made a slice of slots (or
pairs) at a time, a save that streams parts (``imp_core.engine.state``) holds one slice besides the state; the slices
read back as exactly the frames ``Aggregation.state_frames`` builds. A load (:func:`load`) is the mirror image: each
decoded part is copied into the state's columns, allocated once, and dropped before the next part is read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from imp_core.engine.annotation import FRAG_DTYPE
from imp_core.engine.keyed import PairCounts, lists_by_slot
from imp_core.engine.operators.distinct_values import stored
from imp_core.engine.operators.minmax_keyed import KeyedValueMultiset
from imp_core.engine.schema import COUNT, FRAG, GROUP_ROWS, SET
from imp_core.engine.slot_columns import SlotColumns
from imp_core.engine.state import Parts, Rows, slices
from imp_core.errors import StateError

if TYPE_CHECKING:
    from imp_core.engine.operators.aggregation import Aggregation


def saved_rows(op: Aggregation) -> dict[str, Rows]:
    """``groups`` (live slots in slot order, each with its sorted fragment list), ``fcounts`` (positive pairs by
    slot, then fragment) and the value counts ``mm{j}`` of the keyed multisets of a keyed aggregation."""
    store = op._store  # noqa: SLF001 - the operator's own state, read for its save
    every = np.arange(store.size)
    live = every if op.global_agg else np.flatnonzero(store.column(GROUP_ROWS, every) > 0)
    s, f, c = op._pairs.items()  # noqa: SLF001
    columns, keys = op._groups.columns, op.key_names  # noqa: SLF001

    def groups(start: int, length: int) -> pl.DataFrame:
        at = live[start:start + length]
        base = int(at[0]) if at.size else 0
        lo, hi = np.searchsorted(s, base), np.searchsorted(s, int(at[-1]) if at.size else -1, "right")
        fragments = lists_by_slot(at - base, s[lo:hi] - base, f[lo:hi], SET)
        return store.rows(at).with_columns(fragments).select(columns)

    def fcounts(start: int, length: int) -> pl.DataFrame:
        end = start + length
        return store.rows(s[start:end]).select(keys).with_columns(
            pl.Series(FRAG, f[start:end], dtype=FRAG_DTYPE), pl.Series(COUNT, c[start:end], dtype=pl.Int64))

    values = {f"mm{j}": m.saved_rows() for j, m in stored(op.multisets).items() if isinstance(m, KeyedValueMultiset)}
    return {"groups": Rows(live.size, groups), "fcounts": Rows(s.size, fcounts), **values}


def load(op: Aggregation, groups: pl.DataFrame | Parts, fcounts: pl.DataFrame | Parts) -> None:
    """Saved ``groups`` (slots in order) and ``F_g`` pairs as the keyed state of ``op``, part by part: the groups'
    columns are filled into a store allocated once and indexed from it; each pair's group is looked up in that index
    as its part is read, and only the pairs' keys and counts are kept until the pair map is built.

    Raises:
        StateError: A pair names a group the saved groups lack, or the parts hold other rows than their header says.
    """
    store = op._store = SlotColumns(op._store.schema, op._store.dense)  # noqa: SLF001 - the operator's own state
    columns = list(store.schema)
    rows, parts = slices(groups)
    store.fill((part.select(columns) for part in parts), rows)
    op._index.build(store.keys(op.key_names), store)  # noqa: SLF001
    rows, parts = slices(fcounts)
    keys, counts = np.empty(rows, dtype=np.uint64), np.empty(rows, dtype=np.int64)
    at = 0
    for part in parts:
        end = at + part.height
        if end > rows:
            raise StateError(f"operator {op.op_id}: saved F_g holds more rows than its header records; recapture "
                             f"the sketch")
        frags, n = part.get_column(FRAG), part.get_column(COUNT)
        if frags.null_count() or n.null_count():
            raise StateError(f"operator {op.op_id}: saved F_g has a NULL fragment or count; recapture the sketch")
        keys[at:end] = PairCounts.key(op._slots_in(part), frags.cast(FRAG_DTYPE).to_numpy())  # noqa: SLF001
        counts[at:end] = n.cast(pl.Int64).to_numpy()
        at = end
    if at != rows:
        raise StateError(f"operator {op.op_id}: saved F_g holds {at} rows, its header records {rows}; recapture "
                         f"the sketch")
    op._pairs.load(keys, counts)  # noqa: SLF001


__all__ = ["load", "saved_rows"]

"""The keyed aggregation's ``groups`` and ``F_g`` frames as :class:`~imp_core.engine.state.Rows` for a save.

Building either frame whole gathers every live slot's row (and every pair's keys) into fresh buffers, a second copy
of the state at the moment it is saved. Handed over as rows made a slice of slots (or pairs) at a time, a save that
streams parts (``imp_core.engine.state``) holds one slice besides the state; the slices read back as exactly the
frames ``Aggregation.state_frames`` builds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from imp_core.engine.annotation import FRAG_DTYPE
from imp_core.engine.keyed import lists_by_slot
from imp_core.engine.schema import COUNT, FRAG, GROUP_ROWS, SET
from imp_core.engine.state import Rows

if TYPE_CHECKING:
    from imp_core.engine.operators.aggregation import Aggregation


def saved_rows(op: Aggregation) -> dict[str, Rows]:
    """``groups`` (live slots in slot order, each with its sorted fragment list) and ``fcounts`` (positive pairs by
    slot, then fragment) of a keyed aggregation."""
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

    return {"groups": Rows(live.size, groups), "fcounts": Rows(s.size, fcounts)}


__all__ = ["saved_rows"]

"""Merge μ (paper 5.1), the sink: per-fragment counts over the query result, emitting the sketch delta.

State ``S[ρ]`` = number of result rows (with multiplicity) whose annotation contains ρ. A fragment enters the sketch
when its count goes 0 → non-zero (``Δ+ ρ``) and leaves it when it goes non-zero → 0 (``Δ− ρ``). See
docs/ARCHITECTURE.md, "Operators".
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl
import pyarrow.compute as pc

from imp_core.engine.annotation import ann_cols
from imp_core.engine.operators.base import SinkOperator, SketchDelta, StatefulOperator
from imp_core.engine.schema import MULT, SET
from imp_core.errors import StateError


class Merge(SinkOperator, StatefulOperator):
    kind = "merge"

    def __init__(self, op_id: str, total_fragments: int, fingerprint: str = "") -> None:
        super().__init__(op_id)
        self.total = total_fragments
        self.fingerprint = fingerprint
        self.reset()

    def reset(self) -> None:
        self.counts = np.zeros(self.total, dtype=np.int64)

    def process(self, delta: pl.DataFrame) -> SketchDelta:
        if delta.height == 0 or self.total == 0:
            return SketchDelta((), ())
        mult = delta.get_column(MULT).to_numpy().astype(np.int64, copy=False)
        change = np.zeros(self.total, dtype=np.int64)
        for col in ann_cols(delta):
            # (row, fragment) pairs straight from the Arrow buffers: a set row counts once per fragment in its set
            if col == SET:
                sets = delta.get_column(SET).to_arrow()
                frag = pc.list_flatten(sets).to_numpy(zero_copy_only=False).astype(np.int64)
                m = np.repeat(mult, pc.list_value_length(sets).fill_null(0).to_numpy(zero_copy_only=False))
            else:
                column = delta.get_column(col)
                valid = column.is_not_null().to_numpy() if column.null_count() else None  # NULL: no fragment
                frag = (column.to_numpy() if valid is None else column.drop_nulls().to_numpy()).astype(np.int64)
                m = mult if valid is None else mult[valid]
            if frag.size and (frag.min() < 0 or frag.max() >= self.total):
                raise StateError(f"operator {self.op_id}: fragment id outside the partition; recapture the sketch")
            change += np.bincount(frag, weights=m, minlength=self.total).astype(np.int64)
        return self.apply_counts(change)

    def apply_counts(self, change: np.ndarray) -> SketchDelta:
        """Add per-fragment count changes (a capture of a query without stateful operators counts on the backend)."""
        before = self.counts
        after = before + change
        if (after < 0).any():
            raise StateError(f"operator {self.op_id}: a fragment count became negative — the change feed deleted "
                             f"result rows the state never saw; recapture the sketch")
        added = np.flatnonzero((before == 0) & (after != 0))
        removed = np.flatnonzero((before != 0) & (after == 0))
        self.counts = after
        return SketchDelta(tuple(int(i) for i in added), tuple(int(i) for i in removed))

    def sketch(self) -> set[int]:
        return {int(i) for i in np.flatnonzero(self.counts)}

    def state_frames(self) -> tuple[dict[str, Any], dict[str, pl.DataFrame]]:
        return {"total": self.total}, {"counts": pl.DataFrame({"count": self.counts})}

    def relabeled_state(self, mapping: np.ndarray, total: int) -> tuple[dict[str, Any], dict[str, pl.DataFrame]]:
        """Counts under renamed fragment ids; ids that map to one (a merge of ranges) add up."""
        counts = np.zeros(total, dtype=np.int64)
        np.add.at(counts, mapping[:self.total], self.counts)
        return {"total": total}, {"counts": pl.DataFrame({"count": counts})}

    def set_state_frames(self, meta: dict[str, Any], frames: dict[str, pl.DataFrame]) -> None:
        if int(meta.get("total", -1)) != self.total or "counts" not in frames:
            raise StateError(f"operator {self.op_id}: saved merge state is for a different partition; recapture")
        self.counts = frames["counts"].get_column("count").to_numpy().astype(np.int64).copy()

    def canonical(self) -> dict[str, pl.DataFrame]:
        return {"counts": pl.DataFrame({"count": self.counts})}


__all__ = ["Merge", "SketchDelta"]

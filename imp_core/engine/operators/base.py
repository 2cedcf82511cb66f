"""The operator interface of the incremental engine (paper Section 5).

An operator turns an annotated delta of its input into an annotated delta of its output (``process``). Stateless
operators (table access, selection, projection) have nothing else. Stateful ones (aggregation, distinct, top-k,
merge) keep explicit state that the maintenance driver persists with the sketch version it belongs to
(``state_to_bytes`` / ``load_state``); operators never do I/O and never commit anything themselves.
"""

from __future__ import annotations

from typing import Any, ClassVar

import polars as pl

from imp_core.engine import state as state_codec
from imp_core.errors import StateError


class Operator:
    """Base of all incremental operators; ``op_id`` is stable for a given plan (derived from its position)."""

    kind: ClassVar[str] = "operator"
    stateful: ClassVar[bool] = False

    def __init__(self, op_id: str) -> None:
        self.op_id = op_id

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.op_id})"


class StatefulOperator(Operator):
    """An operator with state; subclasses expose it as named DataFrames plus JSON metadata."""

    stateful = True
    fingerprint: str = ""

    def state_frames(self) -> tuple[dict[str, Any], dict[str, pl.DataFrame]]:
        raise NotImplementedError

    def set_state_frames(self, meta: dict[str, Any], frames: dict[str, pl.DataFrame]) -> None:
        raise NotImplementedError

    def reset(self) -> None:
        """Forget all state (the empty database)."""
        raise NotImplementedError

    def state_to_bytes(self) -> bytes:
        meta, frames = self.state_frames()
        return state_codec.encode(self.kind, self.op_id, self.fingerprint, meta, frames)

    def load_state(self, blob: bytes) -> None:
        """Load a blob of :meth:`state_to_bytes`; anything malformed is a ``StateError`` (which leads to a recapture).

        The frames must have the columns and types of this operator's own (empty) state: a blob that decodes but
        has another shape, even under a valid checksum, is refused here instead of failing later inside a pass.
        """
        payload = state_codec.decode(blob, kind=self.kind, op_id=self.op_id, fingerprint=self.fingerprint)
        try:
            self.reset()
            _, expected = self.state_frames()
            frames = state_codec.conform(payload.frames, expected, where=f"operator {self.op_id}")
            self.set_state_frames(payload.meta, frames)
        except StateError:
            self.reset()
            raise
        except Exception as e:  # noqa: BLE001 - any other failure on a decoded blob means it has the wrong shape
            self.reset()
            raise StateError(f"operator {self.op_id}: saved state has the wrong shape for a {self.kind} operator "
                             f"({type(e).__name__}); recapture the sketch") from e

    def state_size_bytes(self) -> int:
        _, frames = self.state_frames()
        return sum(int(df.estimated_size()) for df in frames.values())

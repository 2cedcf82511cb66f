"""The operator interface of the incremental engine, by arity: unary, binary and the sink, each with ``process``.

Stateful operators also expose their state as named frames, which the maintenance driver persists with the sketch
version it belongs to; operators never do I/O. See docs/ARCHITECTURE.md, "Operators" and "How to add an operator".
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import numpy as np
import polars as pl

from imp_core.engine import state as state_codec
from imp_core.engine.annotation import relabel
from imp_core.engine.operators.context import BuildContext
from imp_core.engine.state import Chunk, Fetch, Frame, Parts, Rows, Sink
from imp_core.errors import StateError, UnsupportedError
from imp_core.plan.nodes import Plan


@dataclass(frozen=True)
class SketchDelta:
    """Global fragment ids entering (``added``) and leaving (``removed``) the sketch: what the sink emits."""

    added: tuple[int, ...]
    removed: tuple[int, ...]

    @property
    def empty(self) -> bool:
        return not self.added and not self.removed


class Operator:
    """Base of all incremental operators; ``op_id`` is ``<kind>@<node path>``, stable for a given plan."""

    kind: ClassVar[str] = "operator"

    def __init__(self, op_id: str) -> None:
        self.op_id = op_id

    @classmethod
    def from_node(cls, node: Plan, ctx: BuildContext) -> Operator:
        """The operator maintaining plan node ``node`` (the classes in ``registry.OPERATORS`` define this)."""
        raise UnsupportedError(f"{cls.__name__} is not built from a plan node")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.op_id})"


class UnaryOperator(Operator, ABC):
    """One input: a delta of the input in, a delta of the output out."""

    @abstractmethod
    def process(self, delta: pl.DataFrame) -> pl.DataFrame:
        """The output delta for the input ``delta`` (folding it into the state, if the operator keeps one)."""


class InputSide(Protocol):
    """One input of a binary operator as of after the pass (``R'``), which the operator never reads itself: it asks
    the side to join a delta of the other input with the side's current contents. The look-ups that build side
    caches answer None when the side cannot or need not be cached (for instance when it is in memory anyway)."""

    def join_delta(self, delta: pl.DataFrame, delta_is_left: bool) -> pl.DataFrame:
        """``delta ⋈ contents`` (or ``contents ⋈ delta``): the join's output columns, ``__mult`` the product."""
        ...

    def summary(self, keys: list[str], max_rows: int) -> tuple[pl.DataFrame | None, pl.DataFrame | None]:
        """The side's annotated rows if there are at most ``max_rows``, else its join-key counts (``__n``)."""
        ...

    def rows_with_keys(self, keys: list[str], values: pl.DataFrame, max_rows: int) -> pl.DataFrame | None:
        """The side's annotated rows whose ``keys`` equal a row of ``values``; None beyond ``max_rows`` (0: no
        limit)."""
        ...

    def key_counts(self, keys: list[str], max_keys: int) -> pl.DataFrame | None:
        """The side's rows per join key (key columns, ``__n``); None beyond ``max_keys`` distinct keys."""
        ...


class BinaryOperator(Operator, ABC):
    """Two inputs: their deltas of this pass (None or empty where an input did not change) and access to both
    inputs' contents after the pass."""

    @abstractmethod
    def process(self, left: pl.DataFrame | None, right: pl.DataFrame | None, left_side: InputSide,
                right_side: InputSide) -> pl.DataFrame:
        """The output delta."""


class SinkOperator(Operator, ABC):
    """The root: a delta of the query result in, the change of the sketch out."""

    @abstractmethod
    def process(self, delta: pl.DataFrame) -> SketchDelta:
        """The sketch's change for the result ``delta``."""


class StatefulOperator(Operator, ABC):
    """State exposed as named frames plus JSON metadata (frame names and ``op_id`` are part of the saved format,
    ``imp_core.engine.state``)."""

    fingerprint: str = ""

    @property
    def streamed_frames(self) -> frozenset[str]:
        """Frames ``set_state_frames`` takes as :class:`~imp_core.engine.state.Parts` when they were stored as parts
        (read slice by slice into the operator's own state); any other frame stored as parts comes whole."""
        return frozenset()

    @abstractmethod
    def state_frames(self) -> tuple[dict[str, Any], Mapping[str, Frame]]:
        """(metadata, frames) of the current state; a frame the operator keeps unchanged for many versions may be a
        :class:`~imp_core.engine.state.Chunk` (stored once when large)."""

    @abstractmethod
    def set_state_frames(self, meta: dict[str, Any], frames: dict[str, Any]) -> None:
        """Take over state saved by ``state_frames`` (a saved chunk comes back as a chunk, fetched on first use; a
        frame of ``streamed_frames`` stored as parts comes as its :class:`~imp_core.engine.state.Parts`).

        ``frames`` is typed ``Any`` per frame: each operator gets back the kinds it hands out (``Frame``, or
        ``Parts`` for its streamed frames), which this signature cannot say per operator; the keyed-state contract
        (issue 55) replaces it."""

    @abstractmethod
    def reset(self) -> None:
        """Forget all state (the empty database)."""

    @abstractmethod
    def canonical(self) -> dict[str, pl.DataFrame]:
        """State in a canonical order, to compare the states reached by two routes (capture and maintenance)."""

    def relabeled_state(self, mapping: np.ndarray, total: int) -> tuple[dict[str, Any], dict[str, pl.DataFrame]]:
        """The state with every fragment id ``i`` renamed ``mapping[i]`` (``annotation.relabel``; ``total`` ids
        after), for the same operator of a pipeline under repartitioned bounds (its ``set_state_frames``)."""
        meta, frames = self.state_frames()
        return meta, {name: relabel(df.frame() if isinstance(df, Chunk) else df, mapping)
                      for name, df in frames.items()}

    def state_to_bytes(self) -> bytes:
        """The state as one self-contained blob (every frame inline)."""
        meta, frames = self.state_frames()
        return state_codec.encode(self.kind, self.op_id, self.fingerprint, meta, frames)

    def saved_frames(self) -> tuple[dict[str, Any], Mapping[str, Frame | Rows]]:
        """:meth:`state_frames` for a save: an operator whose large frames are views it would have to build may hand
        them over as :class:`~imp_core.engine.state.Rows`, built slice by slice when written as parts."""
        return self.state_frames()

    def saved_state(self, sink: Sink | None = None) -> tuple[bytes, dict[str, Chunk]]:
        """The state as the catalog stores it: the blob, and the large chunks it names by digest (each written once
        and shared by the versions that keep it); large frames go to ``sink`` as parts, when given."""
        meta, frames = self.saved_frames()
        return state_codec.encode_parts(self.kind, self.op_id, self.fingerprint, meta, frames,
                                        detach_from=state_codec.DETACH_FROM, sink=sink)

    def load_state(self, blob: bytes, fetch: Fetch | None = None) -> None:
        """Load a blob of :meth:`state_to_bytes` or :meth:`saved_state` (its chunks read with ``fetch`` when the
        operator first needs them); anything malformed is a ``StateError`` (which leads to a recapture).

        The frames must have the columns and types of this operator's own (empty) state: a blob that decodes but
        has another shape, even under a valid checksum, is refused here instead of failing later inside a pass.
        """
        payload = state_codec.decode(blob, kind=self.kind, op_id=self.op_id, fingerprint=self.fingerprint,
                                     fetch=fetch)
        try:
            self.reset()
            _, expected = self.state_frames()
            frames = state_codec.check_frames(payload.frames, expected, where=f"operator {self.op_id}")
            streamed = self.streamed_frames
            self.set_state_frames(payload.meta, {n: f.frame() if isinstance(f, Parts) and n not in streamed else f
                                                 for n, f in frames.items()})
        except StateError:
            self.reset()
            raise
        except Exception as e:  # noqa: BLE001 - any other failure on a decoded blob means it has the wrong shape
            self.reset()
            raise StateError(f"operator {self.op_id}: saved state has the wrong shape for a {self.kind} operator "
                             f"({type(e).__name__}); recapture the sketch") from e

    def state_size_bytes(self) -> int:
        _, frames = self.state_frames()
        return sum(df.size_bytes() if isinstance(df, Chunk) else int(df.estimated_size()) for df in frames.values())



class OutputStateOperator(UnaryOperator, StatefulOperator):
    """A unary operator whose state holds its whole output (aggregation, distinct, top-k): its current contents never
    need the tables, and a capture starts it from its whole input."""

    @abstractmethod
    def output_relation(self) -> pl.DataFrame:
        """The operator's current output as a whole relation (all-insert, annotated)."""

__all__ = ["BinaryOperator", "InputSide", "Operator", "OutputStateOperator", "SinkOperator", "SketchDelta",
           "StatefulOperator", "UnaryOperator"]

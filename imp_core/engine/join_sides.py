"""One input of a join during a pass (``engine/pipeline.py``): what a :class:`~imp_core.engine.operators.join.JoinOp`
reads of its other side for a delta, and the backend look-ups its side caches are built from.

See docs/ARCHITECTURE.md, "Passes and backends".
"""

from __future__ import annotations

from typing import Any, Protocol

import polars as pl

from imp_core.engine.backend import JoinBackend, JoinCacheBackend, Relation, Versions
from imp_core.engine.operators.join import JoinOp
from imp_core.engine.stages import Stage, contents_for, external_below
from imp_core.plan.nodes import Join


class Pass(Protocol):
    """What a side reads of the pass it is in."""

    backend: Any
    versions: Versions

    def relation(self, stage: Stage) -> Relation: ...

    def state_contents(self, stage: Stage) -> pl.DataFrame: ...

    def rows_for(self, stage: Stage, wanted: pl.DataFrame) -> pl.DataFrame | None: ...


class StageSide:
    """One input of a join during a pass: joined in memory when it follows from operator state, otherwise by the
    backend, one call per delta."""

    def __init__(self, run: Pass, join: Stage, stage: Stage) -> None:
        self.run, self.join, self.stage = run, join, stage

    def join_delta(self, delta: pl.DataFrame, delta_is_left: bool) -> pl.DataFrame:
        op = self.join.op
        assert isinstance(op, JoinOp)
        if self.stage.from_state:
            rows = self._rows_for(delta, delta_is_left)
            if rows is None:
                rows = self.run.state_contents(self.stage)
            return op.join_frames(delta, rows) if delta_is_left else op.join_frames(rows, delta)
        wanted = self._wanted(delta, delta_is_left)
        rows = self.run.rows_for(self.stage, wanted) if wanted is not None else None
        if rows is not None:  # read by key for this pass (joined here)
            return op.join_frames(delta, rows) if delta_is_left else op.join_frames(rows, delta)
        backend: JoinBackend = self.run.backend
        return backend.join_delta(op.node, delta, delta_is_left, self.run.relation(self.stage), self.run.versions)

    def _wanted(self, delta: pl.DataFrame, delta_is_left: bool) -> pl.DataFrame | None:
        """The side's join key values ``delta`` has, named as the side's columns; None for a join without keys."""
        join = self.join.op
        assert isinstance(join, JoinOp)
        mine, theirs = (join.right_keys, join.left_keys) if delta_is_left else (join.left_keys, join.right_keys)
        if not mine:
            return None
        return delta.select([pl.col(t).alias(m) for m, t in zip(mine, theirs)])

    def _rows_for(self, delta: pl.DataFrame, delta_is_left: bool) -> pl.DataFrame | None:
        """The side's rows whose join keys a row of ``delta`` has, when the side's contents come from external state
        (read for those keys only); None otherwise (the whole contents are joined)."""
        join = self.join.node
        assert isinstance(join, Join)
        left_keys, right_keys, _ = join.equi_keys()
        mine, theirs = (right_keys, left_keys) if delta_is_left else (left_keys, right_keys)
        if not mine or not external_below(self.stage):
            return None
        wanted = delta.select([pl.col(t).alias(m) for m, t in zip(mine, theirs)]).unique()
        return contents_for(self.stage, wanted)

    def _cache_backend(self) -> JoinCacheBackend | None:
        """The backend's cache look-ups, unless the side is in memory anyway or the backend has none."""
        backend = self.run.backend
        return backend if not self.stage.from_state and isinstance(backend, JoinCacheBackend) else None

    def summary(self, keys: list[str], max_rows: int) -> tuple[pl.DataFrame | None, pl.DataFrame | None]:
        backend = self._cache_backend()
        if backend is None:
            return None, None
        return backend.side_summary(self.run.relation(self.stage), keys, max_rows, self.run.versions)

    def rows_with_keys(self, keys: list[str], values: pl.DataFrame, max_rows: int) -> pl.DataFrame | None:
        backend = self._cache_backend()
        if backend is None:
            return None
        return backend.rows_with_keys(self.run.relation(self.stage), keys, values, max_rows, self.run.versions)

    def key_counts(self, keys: list[str], max_keys: int) -> pl.DataFrame | None:
        backend = self._cache_backend()
        if backend is None:
            return None
        return backend.key_counts(self.run.relation(self.stage), keys, max_keys, self.run.versions)


__all__ = ["Pass", "StageSide"]

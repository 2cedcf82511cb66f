"""Aggregation whose state lives outside the process (``engine/external.py``): a grouped aggregation placed
*external* because its state outgrew the memory budget.

A batch asks the store for the rows of the groups it touches (groups, ``F_g``, value multisets), folds itself into
them with the frame engine's rules of :class:`~imp_core.engine.operators.aggregation.Aggregation` (the same code,
so the same values and output deltas as in memory), and hands the touched groups' new rows back; the store writes
them (an append to its Delta table, on Spark). The saved state is the store's reference, not frames. See
docs/ARCHITECTURE.md, "Where state lives".
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import polars as pl

from imp_core.engine.annotation import relabel
from imp_core.engine.external import FCOUNTS, GROUPS, ExternalOperator, MemoryGroupStore
from imp_core.engine.operators.aggregation import LAYOUT, Aggregation
from imp_core.engine.operators.context import BuildContext
from imp_core.engine.operators.distinct import DistinctOp
from imp_core.engine.operators.distinct_values import state_names, stored
from imp_core.engine.operators.partials import Partials
from imp_core.engine.operators.sum_state import check_layout
from imp_core.engine.schema import GROUP_ROWS, MULT, SET
from imp_core.errors import StateError
from imp_core.plan.nodes import Distinct, Plan


class _External(ExternalOperator):
    """What makes an aggregation external; mixed into :class:`Aggregation` and :class:`DistinctOp`."""

    def _init_external(self: Any) -> None:
        self.store = MemoryGroupStore(self.key_names, self.component_schemas())
        self._cleared = True

    def component_schemas(self: Any) -> dict[str, dict[str, pl.DataType]]:
        """The frames the in-memory engine saves."""
        schemas = {GROUPS: self._groups_schema(), FCOUNTS: dict(self._fcounts.schema)}
        for j, multiset in stored(self.multisets).items():
            schemas[f"mm{j}"] = dict(multiset.values.schema)
        return schemas

    def reset(self: Any) -> None:
        Aggregation.reset(self)  # empty frames in memory; the store is emptied at the next write
        self._cleared = False

    def _apply_frames(self: Any, partials: Partials, partial: pl.DataFrame, fp: pl.DataFrame) -> pl.DataFrame:
        keys = partial.select(self.key_names)
        if not self._cleared:
            self.store.load({})
            self._cleared = True
        old = self.store.fetch(keys)
        self._groups, self._fcounts = old[GROUPS], old[FCOUNTS]
        for j, multiset in stored(self.multisets).items():
            multiset.values = old[f"mm{j}"]  # type: ignore[misc]
        try:
            out = Aggregation._apply_frames(self, partials, partial, fp)
            rows = {GROUPS: self._groups, FCOUNTS: self._fcounts,
                    **{f"mm{j}": m.values for j, m in stored(self.multisets).items()}}
            self.store.replace(keys, rows)
        finally:
            Aggregation.reset(self)  # only the store holds state between batches
        return out

    # -- the whole state, for the operators above a capture and for tests

    def output_chunks(self: Any) -> Iterator[pl.DataFrame]:
        for frames in self.store.contents():
            groups = frames[GROUPS].filter(pl.col(GROUP_ROWS) > 0)
            yield groups.select([*self.output_exprs(), pl.lit(1, dtype=pl.Int64).alias(MULT), pl.col(SET)])

    def output_for(self: Any, wanted: pl.DataFrame) -> pl.DataFrame:
        """The current result rows of the groups whose keys (a subset of the group keys, by output name) equal a row
        of ``wanted``: only those groups are read from the store."""
        keys = [n for n in self.key_names if n in wanted.columns]
        frames = self.store.fetch_where(wanted.select(keys).cast({k: self.key_types[k] for k in keys}))
        groups = frames[GROUPS].filter(pl.col(GROUP_ROWS) > 0)
        return groups.select([*self.output_exprs(), pl.lit(1, dtype=pl.Int64).alias(MULT), pl.col(SET)])

    def state_frames(self: Any) -> tuple[dict[str, Any], dict[str, pl.DataFrame]]:
        meta = {"keys": self.key_names, "aggs": state_names(self.layout.aggs), "layout": LAYOUT,
                "external": self.store.reference()}
        return meta, {}

    def whole_frames(self: Any) -> dict[str, pl.DataFrame]:
        parts: dict[str, list[pl.DataFrame]] = {}
        for frames in self.store.contents():
            for name, df in frames.items():
                parts.setdefault(name, []).append(df)
        schemas = self.component_schemas()
        return {name: pl.concat(parts[name]) if parts.get(name) else pl.DataFrame(schema=schema)
                for name, schema in schemas.items()}

    def set_state_frames(self: Any, meta: dict[str, Any], frames: dict[str, pl.DataFrame]) -> None:
        if meta.get("keys") != self.key_names or meta.get("aggs") != state_names(self.layout.aggs):
            raise StateError(f"operator {self.op_id}: saved state is for a different aggregation; recapture")
        check_layout(self.op_id, self.layout, meta.get("layout"))
        self.take_state(meta, frames or None)

    def relabeled_state(self: Any, mapping: Any, total: int) -> tuple[dict[str, Any], dict[str, pl.DataFrame]]:
        meta, _ = self.state_frames()
        return meta, {name: relabel(df, mapping) for name, df in self.whole_frames().items()}

    def canonical(self: Any) -> dict[str, pl.DataFrame]:
        """The store's contents in the in-memory engine's canonical form (frames saved the same way)."""
        memory = Aggregation(self.op_id, self.keys, self.aggs, self.key_types, self.fingerprint,
                             bounds={self.aggs[j][0] for j in self.bounded}, keyed=False,
                             guarded={self.aggs[j][0] for j in self.guarded})
        frames = self.whole_frames()
        memory._load(frames[GROUPS], frames[FCOUNTS], {j: frames[f"mm{j}"] for j in stored(self.multisets)})
        return memory.canonical()


class ExternalAggregation(_External, Aggregation):
    """A grouped aggregation keeping its state in a :class:`GroupStore`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["keyed"] = False
        kwargs["minmax_buffer"] = 0  # the store keeps every value
        Aggregation.__init__(self, *args, **kwargs)
        self._init_external()

    @classmethod
    def from_node(cls, node: Plan, ctx: BuildContext) -> ExternalAggregation:
        base = Aggregation.from_node(node, ctx)
        return cls(base.op_id, base.keys, base.aggs, base.key_types, base.fingerprint,
                   bounds={base.aggs[j][0] for j in base.bounded}, guarded={base.aggs[j][0] for j in base.guarded})


class ExternalDistinct(_External, DistinctOp):
    """DISTINCT (an aggregation without aggregates) keeping its state in a :class:`GroupStore`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        DistinctOp.__init__(self, *args, **kwargs)
        self.keyed = False
        Aggregation.reset(self)
        self._init_external()

    @classmethod
    def from_node(cls, node: Plan, ctx: BuildContext) -> ExternalDistinct:
        assert isinstance(node, Distinct)
        return cls(ctx.op_id(cls.kind), node.child.schema, ctx.fingerprint)


__all__ = ["ExternalAggregation", "ExternalDistinct"]

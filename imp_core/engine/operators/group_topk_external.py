"""Top-k per group whose state lives outside the process (``engine/external.py``): a :class:`GroupTopKOp` placed
*external* because its input rows outgrew the memory budget (SF10's "three most expensive line items per order"
keeps tens of millions).

The store holds one component, ``rows``: the input rows as the in-memory operator keeps them (plan columns, the
annotation as text ``__skey``, the multiplicity ``__n``), keyed by the partition key's values ``__p0``, ``__p1``, ...
A batch asks the store for the rows of the groups it touches, ranks them before and after the change with the
in-memory operator's code (so the same ranks, ties and output delta), and hands the touched groups' netted rows back.
The rows a capture on Spark writes are the input rows netted as here (one per row and annotation, ``__n`` their
multiplicity): the store compares a group's rows as bags, so the stored rows must be the bag the operator holds.
Partition keys that are floats stay in memory (their NaN-free form is two columns, and Spark and polars order NaN
alike only there). See docs/ARCHITECTURE.md, "Where state lives".
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import polars as pl

from imp_core.engine.annotation import as_sets, relabel
from imp_core.engine.evaluate import polars_type
from imp_core.engine.external import ExternalOperator, MemoryGroupStore
from imp_core.engine.operators.context import BuildContext
from imp_core.engine.operators.group_topk import SKEY, GroupTopKOp, N, skey_expr, skey_set
from imp_core.engine.schema import MULT, SET
from imp_core.errors import StateError
from imp_core.plan.expr import Col
from imp_core.plan.nodes import GroupTopK, Plan

ROWS = "rows"


def has_external_form(node: GroupTopK) -> bool:
    """Whether a top-k per group can keep its rows in a store: it has a partition key (else its one group is the
    whole state, read whole by every batch), none of it a float."""
    return bool(node.partition) and not any(polars_type(e.dtype).is_float() for e in node.partition)


class ExternalGroupTopK(ExternalOperator, GroupTopKOp):
    """A top-k per group keeping its input rows in a :class:`GroupStore` keyed by the partition key."""

    def __init__(self, op_id: str, node: GroupTopK, fingerprint: str = "") -> None:
        GroupTopKOp.__init__(self, op_id, node, fingerprint)
        self.key_names = list(self.pcols)
        self.store = MemoryGroupStore(self.key_names, self.component_schemas())
        self._cleared = True

    @classmethod
    def from_node(cls, node: Plan, ctx: BuildContext) -> ExternalGroupTopK:
        assert isinstance(node, GroupTopK)
        return cls(ctx.op_id(cls.kind), node, ctx.fingerprint)

    def component_schemas(self) -> dict[str, dict[str, pl.DataType]]:
        keys = pl.DataFrame(schema=self.schema).select(self._part).schema
        return {ROWS: {**dict(keys), **self.schema, SKEY: pl.String(), N: pl.Int64()}}

    def reset(self) -> None:
        GroupTopKOp.reset(self)  # nothing in memory; the store is emptied at the next write
        self._cleared = False

    # -- the rule ------------------------------------------------------------------------------------------------

    def process(self, delta: pl.DataFrame) -> pl.DataFrame:
        """Fold ``delta`` into the touched groups' rows read from the store; the change of those groups' top-k."""
        if delta.height == 0:
            return self.empty_delta()
        d = self._grouped(delta)
        keys = d.select(self._part).unique()
        if not self._cleared:
            self.store.load({})
            self._cleared = True
        old = self._netted(self._from_store(self.store.fetch(keys)[ROWS]))
        merged = self._netted(pl.concat([old, d]))
        self.store.replace(keys, {ROWS: self._keyed(merged)})
        both = pl.concat([self.top(old).with_columns(-pl.col(MULT)), self.top(merged)])
        cols = [*self.data_cols, self.node.rank, SKEY]
        out = both.group_by(cols).agg(pl.col(MULT).sum(), pl.col(SET).first()).filter(pl.col(MULT) != 0)
        return out.select(self._out_cols())

    def _grouped(self, delta: pl.DataFrame) -> pl.DataFrame:
        """``delta`` as rows of the in-memory state: one per (row, annotation) with its summed multiplicity."""
        d = as_sets(delta).with_columns(skey_expr())
        d = d.group_by([*self.data_cols, SKEY]).agg(pl.col(MULT).sum().alias(N), pl.col(SET).first())
        return d.select(self.rows.columns).cast(self.rows.schema)

    def _keyed(self, rows: pl.DataFrame) -> pl.DataFrame:
        """``rows`` (in-memory state rows) as the store keeps them: with the partition key, without the set."""
        stored = self.component_schemas()[ROWS]
        return rows.with_columns(self._part).select(list(stored)).cast(stored)  # type: ignore[arg-type]

    def _from_store(self, stored: pl.DataFrame) -> pl.DataFrame:
        """Stored rows as the in-memory state holds them (the set rebuilt from its text)."""
        return stored.with_columns(skey_set()).select(self.rows.columns).cast(
            self.rows.schema)

    # -- the whole state, for the operators above a capture and for tests -----------------------------------------

    def output_chunks(self) -> Iterator[pl.DataFrame]:
        for frames in self.store.contents():  # chunks of complete groups
            yield self.top(self._netted(self._from_store(frames[ROWS]))).select(self._out_cols())

    def output_for(self, wanted: pl.DataFrame) -> pl.DataFrame | None:
        """The current result rows of the groups whose partition columns equal a row of ``wanted`` (columns named
        as the output's), read from the store for those groups only; None when a column of ``wanted`` is not a plain
        partition column."""
        by_name = {e.name: p for e, p in zip(self.node.partition, self.pcols) if isinstance(e, Col)}
        if not set(wanted.columns) <= set(by_name):
            return None
        types = self.component_schemas()[ROWS]
        keys = wanted.select([pl.col(c).alias(by_name[c]) for c in wanted.columns])
        keys = keys.cast({k: types[k] for k in keys.columns})
        rows = self._netted(self._from_store(self.store.fetch_where(keys)[ROWS]))
        return self.top(rows).select(self._out_cols())

    def whole_frames(self) -> dict[str, pl.DataFrame]:
        parts = [self._from_store(frames[ROWS]) for frames in self.store.contents()]
        rows = self._netted(pl.concat(parts)) if parts else self.rows.clear()
        return {"rows": rows, "pending": rows.clear()}

    def state_frames(self) -> tuple[dict[str, Any], dict[str, pl.DataFrame]]:
        return {"k": self.k, "function": self.function, "external": self.store.reference()}, {}

    def set_state_frames(self, meta: dict[str, Any], frames: dict[str, pl.DataFrame]) -> None:
        if meta.get("k") != self.k or meta.get("function") != self.function:
            raise StateError(f"operator {self.op_id}: saved top-k-per-group state is for a different query; "
                             f"recapture the sketch")
        if frames and "rows" not in frames:
            raise StateError(f"operator {self.op_id}: saved top-k-per-group state has no rows; recapture the sketch")
        stored = None
        if frames:  # whole frames (state moved out of memory, or relabeled by a repartition)
            rows = pl.concat([frames[name].select(self.rows.columns) for name in ("rows", "pending") if name in frames])
            stored = {ROWS: self._keyed(self._netted(rows))}
        self.take_state(meta, stored)

    def relabeled_state(self, mapping: Any, total: int) -> tuple[dict[str, Any], dict[str, pl.DataFrame]]:
        meta, _ = self.state_frames()
        rows = self.whole_frames()["rows"]
        return meta, {"rows": relabel(rows, mapping).with_columns(skey_expr())}

    def canonical(self) -> dict[str, pl.DataFrame]:
        rows = self.whole_frames()["rows"]
        cols = [c for c in rows.columns if c != SET]
        return {"rows": rows.sort(cols, nulls_last=True) if rows.height else rows}


__all__ = ["ROWS", "ExternalGroupTopK", "has_external_form"]

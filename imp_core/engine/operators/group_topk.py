"""Top-k per group (``ROW_NUMBER`` / ``RANK`` / ``DENSE_RANK`` ``OVER (PARTITION BY p ORDER BY o) <= k``).

Top-k's rule (paper 5.2.7) applied to each group on its own: a result row is an input row ranked within ``k`` in its
group, with the rank as a column, annotated with that row's own fragments (copies of one tuple from different
fragments stay separate rows). The rank is SQL's: ``RANK`` = 1 + the rows of the group strictly before the row,
``DENSE_RANK`` = 1 + the distinct order keys before it, ``ROW_NUMBER`` numbers the rows one by one, tied rows in the
order of their values then annotation (Spark picks among tied rows arbitrarily; the sketch keeps the rows the engine
picked, and every row ranked before them, so the query over the sketch still returns one of Spark's answers).

State: every input row with its annotation and multiplicity. A batch recomputes the ranking of the groups it touches
only: output delta = the new top-k of those groups − their old top-k. The groups' rows are found by hashing the group
key; batches wait in a pending log netted into the stored rows once it passes an eighth of them (a batch costs a hash
look-up over the stored rows, not a rewrite of them). See docs/ARCHITECTURE.md, "Operators".
"""

from __future__ import annotations

from typing import Any

import polars as pl

from imp_core.engine.annotation import SET_DTYPE, as_sets
from imp_core.engine.evaluate import compile_expr, polars_type
from imp_core.engine.float_keys import nan_free
from imp_core.engine.operators.base import OutputStateOperator
from imp_core.engine.operators.context import BuildContext
from imp_core.engine.operators.topk import group_number
from imp_core.engine.schema import COUNT, MULT, SET, nan_flag
from imp_core.errors import StateError, UnsupportedError
from imp_core.plan.nodes import GroupTopK, Plan

N = COUNT
SKEY = "__skey"  # the annotation as text: orders copies of one tuple from different fragments
HASH = "__h"  # the group key's hash, on the cached top-k rows
MIN_PENDING = 4096  # changed rows kept in the pending log before it is netted into the stored rows (at least)


class GroupTopKOp(OutputStateOperator):
    """State frame ``rows``: the input rows (plan columns), ``__sk`` their annotation, ``__skey`` it as text and
    ``__n`` their multiplicity."""

    kind = "group_topk"

    def __init__(self, op_id: str, node: GroupTopK, fingerprint: str = "") -> None:
        super().__init__(op_id)
        if node.k is None:
            raise UnsupportedError(f"{node.function.upper()}() is not bounded by a filter on its rank")
        self.node = node
        self.k = node.k
        self.function = node.function
        self.fingerprint = fingerprint
        self.data_cols = list(node.child.names)
        self.schema = {f.name: polars_type(f.dtype) for f in node.child.schema}
        self._part: list[pl.Expr] = []  # the partition key, floats NaN-free (NaN and -0.0 group as in Spark)
        for i, e in enumerate(node.partition):
            x = compile_expr(e)
            self._part += nan_free(x.cast(pl.Float64), f"__p{i}") if polars_type(e.dtype).is_float() \
                else [x.alias(f"__p{i}")]
        self._ties: list[str] = []  # columns equal exactly for tied rows (floats NaN-free)
        self._order: list[pl.Expr] = []
        for i, s in enumerate(node.order):
            x = compile_expr(s.expr)
            self._order.append(x.alias(f"__o{i}"))
            if polars_type(s.expr.dtype).is_float():
                self._order += nan_free(x.cast(pl.Float64), f"__t{i}")
                self._ties += [f"__t{i}", nan_flag(f"__t{i}")]
            else:
                self._ties.append(f"__o{i}")
        self.pcols = [str(e.meta.output_name()) for e in self._part]
        self.reset()

    @classmethod
    def from_node(cls, node: Plan, ctx: BuildContext) -> GroupTopKOp:
        assert isinstance(node, GroupTopK)
        return cls(ctx.op_id(cls.kind), node, ctx.fingerprint)

    # -- state ---------------------------------------------------------------------------------------------------

    def reset(self) -> None:
        self.rows = pl.DataFrame(schema={**self.schema, SET: SET_DTYPE, SKEY: pl.String, N: pl.Int64})
        self.pending: list[pl.DataFrame] = []  # batches not yet netted into ``rows`` (signed ``__n``)
        self._hashes: pl.Series | None = None  # per row of ``rows``: its group's hash (in memory only)
        self._top: pl.DataFrame | None = None  # the current top-k rows with their rank (in memory only)

    def state_frames(self) -> tuple[dict[str, Any], dict[str, pl.DataFrame]]:
        """Frames ``rows`` (netted), ``pending`` (the log not yet netted into them: saving does not net it) and
        ``top`` (the current top-k rows, so a loaded state need not re-rank every group)."""
        if self._top is None:
            self._settle()
            self._top = self._hashed(self.top(self.rows))
        pending = pl.concat(self.pending) if self.pending else self.rows.clear()
        return {"k": self.k, "function": self.function}, \
            {"rows": self.rows, "pending": pending, "top": self._top.drop(HASH)}

    def set_state_frames(self, meta: dict[str, Any], frames: dict[str, pl.DataFrame]) -> None:
        """Take over saved state; without a ``top`` frame (renamed fragments) the top-k is re-ranked when needed."""
        if meta.get("k") != self.k or meta.get("function") != self.function or "rows" not in frames:
            raise StateError(f"operator {self.op_id}: saved top-k-per-group state is for a different query; "
                             f"recapture the sketch")
        self.rows = frames["rows"]
        pending = frames.get("pending")
        self.pending = [pending] if pending is not None and pending.height else []
        top = frames.get("top")
        self._hashes = None
        self._top = self._hashed(top) if top is not None else None

    def relabeled_state(self, mapping: Any, total: int) -> tuple[dict[str, Any], dict[str, pl.DataFrame]]:
        """Renamed fragment ids change the text key that orders a tuple's copies: it is rebuilt, and the top-k is
        left to be re-ranked."""
        meta, frames = super().relabeled_state(mapping, total)
        return meta, {name: frames[name].with_columns(skey_expr()) for name in ("rows", "pending")}

    def canonical(self) -> dict[str, pl.DataFrame]:
        self._settle()
        cols = [c for c in self.rows.columns if c != SET]
        return {"rows": self.rows.sort(cols, nulls_last=True) if self.rows.height else self.rows}

    # -- the rule ------------------------------------------------------------------------------------------------

    def process(self, delta: pl.DataFrame) -> pl.DataFrame:
        """Fold ``delta`` into the rows; the change of the top-k of the groups it changes.

        A change ranked after its group's last kept row (in a group with rows beyond the top-k) changes nothing and
        only joins the pending log; the groups with other changes are re-ranked, their rows found by a hash of the
        group key (a colliding group is re-ranked too, with no change). The log is netted into the stored rows once
        it outgrows an eighth of them."""
        if delta.height == 0:
            return self.empty_delta()
        d = as_sets(delta).with_columns(skey_expr())
        d = d.group_by([*self.data_cols, SKEY]).agg(pl.col(MULT).sum().alias(N), pl.col(SET).first())
        d = d.select(self.rows.columns).cast(self.rows.schema)
        if self._top is None:
            self._settle()
            self._top = self._hashed(self.top(self.rows))
        changed = self._changing(d).implode()
        self.pending.append(d)
        if not changed.list.len().item():
            return self.empty_delta()
        if self._hashes is None:
            self._hashes = self._group_hash(self.rows)
        parts = [self.rows.filter(self._hashes.is_in(changed))]
        parts += [p.filter(self._group_hash(p).is_in(changed)) for p in self.pending]
        merged = self._netted(pl.concat(parts))
        in_changed = pl.col(HASH).is_in(changed)
        old_top, new_top = self._top.filter(in_changed), self._hashed(self.top(merged))
        self._top = pl.concat([self._top.filter(~in_changed), new_top])
        if sum(p.height for p in self.pending) > max(MIN_PENDING, self.rows.height // 8):
            self._settle()
        both = pl.concat([old_top.with_columns(-pl.col(MULT)), new_top])
        keys = [*self.data_cols, self.node.rank, SKEY]
        out = both.group_by(keys).agg(pl.col(MULT).sum(), pl.col(SET).first()).filter(pl.col(MULT) != 0)
        return out.select(self._out_cols())

    def _changing(self, d: pl.DataFrame) -> pl.Series:
        """The group hashes of the changes ``d`` that can change the top-k: in a group whose top-k does not reach
        rank ``k`` (it may hold every row of the group), or ranked at or before the group's last kept row."""
        hashes = self._group_hash(d)
        top = self._top
        assert top is not None
        if not top.height:
            return hashes.unique()
        full = top.filter(pl.col(HASH).is_in(hashes.implode()) & (pl.col(self.node.rank) == self.k)).unique(
            HASH, keep="any")
        cols = [*self.data_cols, SKEY, HASH, "__b"]
        candidates = d.with_columns(hashes.alias(HASH), pl.lit(False).alias("__b")).select(cols)
        open_groups = candidates.join(full.select(HASH), on=HASH, how="anti").get_column(HASH)
        boundaries = full.with_columns(pl.lit(True).alias("__b")).select(cols)
        by, desc, nulls_last = self._sort_keys()
        s = pl.concat([candidates.join(full.select(HASH), on=HASH, how="semi"), boundaries]).with_columns(
            *self._part, *self._order).sort(by, descending=desc, nulls_last=nulls_last, maintain_order=True)
        group = group_number(self.pcols) if self.pcols else pl.lit(1, pl.UInt32)
        before = s.filter(~pl.col("__b") & (pl.col("__b").cast(pl.Int32).cum_sum().over(group) == 0))
        return pl.concat([open_groups, before.get_column(HASH)]).unique()

    def _netted(self, rows: pl.DataFrame) -> pl.DataFrame:
        """Signed rows summed per (row, annotation), the vanished ones dropped."""
        out = rows.group_by([*self.data_cols, SKEY], maintain_order=True).agg(pl.col(N).sum(), pl.col(SET).first())
        if out.filter(pl.col(N) < 0).height:
            raise StateError(f"operator {self.op_id}: the change feed deleted rows the top-k-per-group state never "
                             f"saw; recapture the sketch")
        return out.filter(pl.col(N) > 0).select(self.rows.columns)

    def _settle(self) -> None:
        if self.pending:
            self.rows = self._netted(pl.concat([self.rows, *self.pending]))
            self.pending, self._hashes = [], None

    def _group_hash(self, rows: pl.DataFrame) -> pl.Series:
        """Per row, a hash of its group key (computed in this process only, never stored)."""
        if not self._part:
            return pl.repeat(0, rows.height, dtype=pl.UInt64, eager=True)
        return rows.select(pl.struct(self._part).hash(seed=0)).to_series()

    def _sort_keys(self) -> tuple[list[str], list[bool], list[bool]]:
        """The ranking's order: group, ORDER BY keys, then (ROW_NUMBER) the row's values and annotation."""
        by = [*self.pcols, *(f"__o{i}" for i in range(len(self.node.order)))]
        desc = [False] * len(self.pcols) + [s.descending for s in self.node.order]
        nulls_last = [False] * len(self.pcols) + [not s.effective_nulls_first for s in self.node.order]
        if self.function == "row_number":  # tied rows in the order of their values, then of their annotation
            by += [*self.data_cols, SKEY]
            desc += [False] * (len(self.data_cols) + 1)
            nulls_last += [False] * (len(self.data_cols) + 1)
        return by, desc, nulls_last

    def top(self, rows: pl.DataFrame) -> pl.DataFrame:
        """The rows of ``rows`` ranked within ``k`` in their group, with the rank; ``__mult`` their copies."""
        if rows.height == 0 or self.k == 0:
            return self.empty_delta().with_columns(pl.lit("").alias(SKEY))
        by, desc, nulls_last = self._sort_keys()
        s = rows.with_columns(*self._part, *self._order).sort(by, descending=desc, nulls_last=nulls_last,
                                                             maintain_order=True)
        part = group_number(self.pcols) if self.pcols else pl.lit(1, pl.UInt32)
        s = s.with_columns(part.alias("__g"), group_number([*self.pcols, *self._ties]).alias("__tie"))
        before = (pl.col(N).cum_sum().over("__g") - pl.col(N)).alias("__before")  # rows of the group before
        s = s.with_columns(before)
        rank = self.node.rank
        if self.function == "row_number":
            s = s.filter(pl.col("__before") < self.k).with_columns(
                pl.int_ranges(pl.col("__before") + 1,
                              pl.min_horizontal(pl.col("__before") + pl.col(N), pl.lit(self.k)) + 1).alias(rank))
            s = s.explode(rank).with_columns(pl.lit(1, pl.Int64).alias(MULT))
        else:
            value = (pl.col("__before").min().over("__tie") + 1 if self.function == "rank"
                     else pl.col("__tie") - pl.col("__tie").min().over("__g") + 1)
            s = s.with_columns(value.alias(rank)).filter(pl.col(rank) <= self.k).with_columns(pl.col(N).alias(MULT))
        return s.select([*self.data_cols, pl.col(rank).cast(pl.Int32), MULT, SET, SKEY])

    def output_relation(self) -> pl.DataFrame:
        if self._top is None:
            self._settle()
            self._top = self._hashed(self.top(self.rows))
        return self._top.select(self._out_cols())

    def _hashed(self, top: pl.DataFrame) -> pl.DataFrame:
        return top.with_columns(self._group_hash(top).alias(HASH))

    def _out_cols(self) -> list[str]:
        return [*self.data_cols, self.node.rank, MULT, SET]

    def empty_delta(self) -> pl.DataFrame:
        return pl.DataFrame(schema={**self.schema, self.node.rank: pl.Int32, MULT: pl.Int64, SET: SET_DTYPE})


def skey_expr() -> pl.Expr:
    """The annotation set as text (``__skey``): how state stores outside the process keep it."""
    return pl.col(SET).cast(pl.List(pl.String)).list.join(",").alias(SKEY)


def skey_set() -> pl.Expr:
    """The annotation set rebuilt from its text (:func:`skey_expr`)."""
    text = pl.col(SKEY)
    return pl.when(text == "").then(pl.lit([], dtype=SET_DTYPE)).otherwise(
        text.str.split(",").cast(SET_DTYPE)).alias(SET)


__all__ = ["N", "SKEY", "GroupTopKOp", "skey_expr", "skey_set"]

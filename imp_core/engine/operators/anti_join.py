"""Anti join (``NOT EXISTS`` / ``NOT IN``): the left rows no right row matches, each keeping its left annotation.

The paper's negation rule (as Perm/GProM trace set difference): a result row's provenance is its left row's alone,
right rows are never in it. The operator keeps the right side as per-key row counts (plus, for ``NOT IN``, the right
rows with a NULL key and all right rows) and every left row, keyed, with annotation and multiplicity, so that a
right key appearing (count 0 → n) retracts the stored left rows of that key and one disappearing (n → 0) inserts them
again. A batch applies the right delta first, to the old left rows (their verdict under the old and the new right
side decides what to emit), then the left delta against the new right side:
``Δ(L ▷ R) = (L ▷ R' − L ▷ R) + ΔL ▷ R'``, exact. See docs/ARCHITECTURE.md, "Operators".
"""

from __future__ import annotations

from typing import Any

import polars as pl

from imp_core.engine.annotation import AnnotationLayout, as_sets, consolidate
from imp_core.engine.evaluate import polars_type
from imp_core.engine.float_keys import nan_free
from imp_core.engine.operators.base import BinaryOperator, InputSide, StatefulOperator
from imp_core.engine.operators.context import BuildContext
from imp_core.engine.operators.group_topk import SKEY, skey_expr
from imp_core.engine.schema import CERTAIN, COUNT, MULT, is_carried, nan_flag
from imp_core.errors import StateError
from imp_core.plan.nodes import AntiJoin, Plan

KEY_PREFIX = "__ak"  # __ak{i}: key pair i in one comparable form (floats NaN-free, with a NaN flag)
NULL_KEY = "__anull"  # a row has a NULL key: it matches nothing
DELTA = "__dn"  # the change of a right key's count in a batch
OLD, NEW = "__nold", "__nnew"  # a right key's count before and after a batch
MIN_PENDING = 4096  # left rows appended unsettled before the stored rows are netted again (at least)


class AntiJoinOp(BinaryOperator, StatefulOperator):
    """``left ▷ right`` on equal keys; ``null_aware``: ``NOT IN``'s three-valued rule (one key pair).

    State: ``right`` (key columns, ``__n``: right rows per non-NULL key), ``totals`` (right rows with a NULL key,
    all right rows), ``left`` (every left row with its annotation and multiplicity). The output is a function of the
    state (``output_relation``), so the pipeline never reads an anti join's contents from the tables. Left deltas are
    appended to a pending run, netted into the stored rows once it outgrows an eighth of them (a left batch costs
    its own size, amortized) and whenever the state is saved.
    """

    kind = "anti_join"

    def __init__(self, op_id: str, node: AntiJoin, annotations: AnnotationLayout | None = None,
                 fingerprint: str = "", certain_right: bool = False) -> None:
        """``certain_right``: the right input carries ``__certain`` (a conservative condition below kept rows Spark
        may lack) and only its sure rows block (``order_dependence.OrderDependence``)."""
        super().__init__(op_id)
        self.node = node
        self.certain_right = certain_right
        self.annotations = annotations
        self.fingerprint = fingerprint
        self.null_aware = node.null_aware
        self.left_keys, self.right_keys, _ = node.equi_keys()
        self.left_names = list(node.left.names)
        self.floats = [polars_type(node.left.field(a).dtype).is_float() for a in self.left_keys]
        self.kcols: list[str] = []
        for i, is_float in enumerate(self.floats):
            self.kcols += [f"{KEY_PREFIX}{i}", nan_flag(f"{KEY_PREFIX}{i}")] if is_float else [f"{KEY_PREFIX}{i}"]
        self.reset()

    @classmethod
    def from_node(cls, node: Plan, ctx: BuildContext) -> AntiJoinOp:
        assert isinstance(node, AntiJoin)
        return cls(ctx.op_id(cls.kind), node, ctx.annotations, ctx.fingerprint, ctx.role(node).certain_right)

    # -- state ---------------------------------------------------------------------------------------------------

    def reset(self) -> None:
        schema: dict[str, Any] = {}
        for i, (a, is_float) in enumerate(zip(self.left_keys, self.floats)):
            name = f"{KEY_PREFIX}{i}"
            schema[name] = pl.Float64 if is_float else polars_type(self.node.left.field(a).dtype)
            if is_float:
                schema[nan_flag(name)] = pl.Boolean
        self.right = pl.DataFrame(schema={**schema, COUNT: pl.Int64})
        self.right_nulls = 0  # right rows with a NULL key
        self.right_total = 0  # all right rows
        self.left = pl.DataFrame()  # takes the left deltas' columns (annotation included) from the first one
        self.pending: list[pl.DataFrame] = []  # left deltas not yet netted into ``left``

    def state_frames(self) -> tuple[dict[str, Any], dict[str, pl.DataFrame]]:
        self._settle()
        totals = pl.DataFrame({"nulls": [self.right_nulls], "total": [self.right_total]},
                              schema={"nulls": pl.Int64, "total": pl.Int64})
        return {"null_aware": self.null_aware, "keys": len(self.left_keys)}, \
            {"right": self.right, "totals": totals, "left": self.left}

    def set_state_frames(self, meta: dict[str, Any], frames: dict[str, pl.DataFrame]) -> None:
        if meta.get("null_aware") != self.null_aware or meta.get("keys") != len(self.left_keys):
            raise StateError(f"operator {self.op_id}: the saved state is of another anti join (NOT EXISTS or NOT IN, "
                             f"its keys); recapture the sketch")
        missing = [n for n in ("right", "totals", "left") if n not in frames]
        if missing or frames["totals"].height != 1:
            raise StateError(f"operator {self.op_id}: the anti join's saved state is incomplete; recapture the "
                             f"sketch")
        if frames["left"].width and (MULT not in frames["left"].columns
                                     or not set(self.left_keys) <= set(frames["left"].columns)):
            raise StateError(f"operator {self.op_id}: the anti join's saved left rows lack their key or "
                             f"multiplicity; recapture the sketch")
        self.right = frames["right"]
        self.right_nulls = int(frames["totals"].item(0, "nulls"))
        self.right_total = int(frames["totals"].item(0, "total"))
        self.left = frames["left"]
        self.pending = []

    def canonical(self) -> dict[str, pl.DataFrame]:
        _, frames = self.state_frames()
        out = {}
        for name, df in frames.items():
            if not df.height:  # no rows: whether a capture or a pass left the columns is not part of the state
                out[name] = pl.DataFrame()
                continue
            if name == "left" and df.width:  # the annotation as text: a store outside the process keeps it so
                df = as_sets(df.select(self._columns(df))).with_columns(skey_expr())
                df = (df.group_by([*self.left_names, SKEY]).agg(pl.col(MULT).sum()).filter(pl.col(MULT) != 0)
                      .select([*self.left_names, MULT, SKEY]))
            cols = [c for c in df.columns if not isinstance(df.schema[c], pl.List)]
            out[name] = df.sort(cols, nulls_last=True) if df.height else df
        return out

    # -- the rule ------------------------------------------------------------------------------------------------

    def process(self, left: pl.DataFrame | None, right: pl.DataFrame | None, left_side: InputSide | None = None,
                right_side: InputSide | None = None) -> pl.DataFrame:
        """The output delta of one batch: the right delta applied to the stored left rows, then the left delta
        against the new right side. The sides are never read: the state holds what the rule needs."""
        parts = []
        right = self.sure_rows(right)
        if right is not None and right.height:
            parts.append(self._right_delta(right))
        if left is not None and left.height:
            left = self._left_rows(left)
            parts.append(self._passing(left, self.right, self.right_total, self.right_nulls))
            self.pending.append(left)
            if sum(p.height for p in self.pending) > max(MIN_PENDING, self.left.height // 8):
                self._settle()
        parts = [p for p in parts if p.height]
        if not parts:
            return self.empty_delta()
        return pl.concat(parts, how="diagonal_relaxed") if len(parts) > 1 else parts[0]

    def sure_rows(self, right: pl.DataFrame | None) -> pl.DataFrame | None:
        """The right rows that block: with ``certain_right`` only the sure ones (a row's flag is a function of its
        values, so its later ``Δ−`` is dropped exactly when its ``Δ+`` was)."""
        if not self.certain_right or right is None:
            return right
        return right.filter(pl.col(CERTAIN).fill_null(False)).drop(CERTAIN)

    def output_relation(self) -> pl.DataFrame:
        """The current output as a whole relation (all-insert, annotated): the stored left rows that pass."""
        self._settle()
        if not self.left.width or not self.left.height:
            return self.empty_delta()
        return self._passing(self.left, self.right, self.right_total, self.right_nulls)

    def _settle(self) -> None:
        """Net the pending left deltas into the stored left rows."""
        if self.pending:
            parts = [self.left, *self.pending] if self.left.width else self.pending
            self.left = consolidate(pl.concat(parts, how="diagonal_relaxed") if len(parts) > 1 else parts[0])
            self.pending = []

    def _stored(self) -> pl.DataFrame:
        """Every stored left row, the pending ones unnetted (a row may appear with + and - multiplicities)."""
        parts = [p for p in (self.left, *self.pending) if p.width]
        if not parts:
            return self.left
        return pl.concat(parts, how="diagonal_relaxed", rechunk=False) if len(parts) > 1 else parts[0]

    def _right_delta(self, right: pl.DataFrame) -> pl.DataFrame:
        """Fold the right delta into the key counts; the stored left rows whose verdict changes, signed."""
        keyed = right.select([*self._key_exprs(self.right_keys), pl.col(MULT)])
        nulls = int(keyed.filter(pl.col(NULL_KEY)).get_column(MULT).sum())
        total = int(keyed.get_column(MULT).sum())
        change = (keyed.filter(~pl.col(NULL_KEY)).group_by(self.kcols).agg(pl.col(MULT).sum().alias(DELTA))
                  .filter(pl.col(DELTA) != 0))
        counts = change.join(self.right, on=self.kcols, how="left").select(
            [*self.kcols, pl.col(COUNT).fill_null(0).alias(OLD), (pl.col(COUNT).fill_null(0) + pl.col(DELTA))
             .alias(NEW)])
        old_right, old_total, old_nulls = self.right, self.right_total, self.right_nulls
        self.right_total, self.right_nulls = old_total + total, old_nulls + nulls
        if change.height:  # the batch's keys leave the counts and come back with their new count, if any
            kept = self.right.join(change.select(self.kcols), on=self.kcols, how="anti")
            now = counts.filter(pl.col(NEW) > 0).select([*self.kcols, pl.col(NEW).alias(COUNT)])
            self.right = pl.concat([kept, now], how="vertical_relaxed")
            if self.right.n_chunks() > 16:  # one chunk per batch otherwise, and joins slow down with them
                self.right = self.right.rechunk()
        stored = self._stored()
        if not stored.width or not stored.height:
            return self.empty_delta()
        flags_changed = self.null_aware and ((old_total == 0) != (self.right_total == 0)
                                             or (old_nulls == 0) != (self.right_nulls == 0))
        if flags_changed:
            candidates = stored  # the global conditions flipped: every stored row may change verdict
        else:
            flipped = counts.filter((pl.col(OLD) > 0) != (pl.col(NEW) > 0))
            if not flipped.height:
                return self.empty_delta()
            keyed_left = stored.with_columns(self._key_exprs(self.left_keys))
            candidates = keyed_left.join(flipped.select(self.kcols), on=self.kcols, how="semi")
        before = self._verdict(candidates, old_right, old_total, old_nulls)
        after = self._verdict(candidates, self.right, self.right_total, self.right_nulls)
        sign = pl.when(after & ~before).then(1).when(before & ~after).then(-1).otherwise(0)
        out = candidates.with_columns((pl.col(MULT) * sign).alias(MULT)).filter(pl.col(MULT) != 0)
        return consolidate(out.select(self._columns(out)))

    def _passing(self, rows: pl.DataFrame, right: pl.DataFrame, total: int, nulls: int) -> pl.DataFrame:
        """The rows of ``rows`` (left rows, signed) that no row of a right side with these counts matches."""
        out = rows.filter(self._verdict(rows, right, total, nulls))
        return out.select(self._columns(out))

    def _verdict(self, rows: pl.DataFrame, right: pl.DataFrame, total: int, nulls: int) -> pl.Series:
        """Per row of ``rows``: whether it passes against a right side with key counts ``right``, ``total`` rows
        and ``nulls`` rows with a NULL key."""
        if self.null_aware and total == 0:
            return pl.repeat(True, rows.height, dtype=pl.Boolean, eager=True)
        if self.null_aware and nulls > 0:
            return pl.repeat(False, rows.height, dtype=pl.Boolean, eager=True)
        keyed = rows.select(self._key_exprs(self.left_keys)).with_row_index("__i")
        matched = keyed.join(right.select(self.kcols), on=self.kcols, how="semi")
        hit = pl.repeat(False, rows.height, dtype=pl.Boolean, eager=True)
        if matched.height:
            hit = hit.scatter(matched.get_column("__i"), True)
        null_key = keyed.get_column(NULL_KEY)
        # a NULL key matches nothing: NOT EXISTS keeps the row; NOT IN over a non-empty right side drops it
        unmatched = ~hit & ~null_key
        return unmatched if self.null_aware else unmatched | null_key

    # -- columns ---------------------------------------------------------------------------------------------------

    def _key_exprs(self, names: list[str]) -> list[pl.Expr]:
        """``names`` as the comparable key columns ``__ak{i}`` (floats as Spark matches them: NaN = NaN, -0.0 =
        0.0) and ``__anull``: some key is NULL."""
        out: list[pl.Expr] = []
        for i, (n, is_float) in enumerate(zip(names, self.floats)):
            x = pl.col(n)
            out += nan_free(x.cast(pl.Float64), f"{KEY_PREFIX}{i}") if is_float else [x.alias(f"{KEY_PREFIX}{i}")]
        out.append(pl.any_horizontal([pl.col(n).is_null() for n in names]).alias(NULL_KEY))
        return out

    def _left_rows(self, delta: pl.DataFrame) -> pl.DataFrame:
        """A left delta in the stored layout: plan columns, ``__mult``, annotation (raw partition values resolved)."""
        if self.annotations is not None:
            delta = self.annotations.resolve_raw(delta)
        return delta.select(self._columns(delta))

    def _columns(self, df: pl.DataFrame) -> list[str]:
        """The output columns present in ``df``: left's plan columns, ``__mult``, then the carried annotation."""
        carried = [c for c in df.columns if is_carried(c) and c != MULT]
        return [*self.left_names, MULT, *carried]

    def empty_delta(self) -> pl.DataFrame:
        """No change: left's plan columns and ``__mult`` (and the stored rows' annotation columns, if known)."""
        layout = self.left if self.left.width else (self.pending[0] if self.pending else None)
        if layout is not None:
            return layout.clear()
        return pl.DataFrame(schema={**{f.name: polars_type(f.dtype) for f in self.node.schema}, MULT: pl.Int64})


__all__ = ["AntiJoinOp"]

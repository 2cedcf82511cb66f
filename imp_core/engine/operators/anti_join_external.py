"""Anti join whose state lives outside the process (``engine/external.py``): a ``NOT EXISTS`` or ``NOT IN`` placed
*external* because its left rows outgrew the memory budget (TPC-H Q21 keeps the late line items of every order, Q16
the part suppliers it tests).

The store holds two components keyed by the anti-join key (``__ak0``, ``__ak1``, ...): ``right``, the right rows per
key (``__n``), and ``left``, the left rows as the in-memory operator keeps them (plan columns, ``__mult``), their
annotation as text (``__skey``). The right side's totals (rows, rows with a NULL key) are two numbers kept with the
saved state. A batch asks the store for the keys it touches (its right delta's and its left delta's), decides with
the in-memory operator's rule which stored left rows change verdict (a key's count going 0 → n retracts them, n → 0
inserts them again) and which new left rows pass, and hands the touched keys' new rows back: one read and one append
per batch, whatever the size of the state. The output carries the annotation as one fragment set per row.

``NOT IN`` adds a rule of the whole right side (:func:`gate`): over an empty right side every left row passes, over
one with a NULL key none does, and otherwise a row passes while its key is not NULL and has no right row. While the
gate stays, a batch is the keyed rule above (rows with a NULL key never pass a keyed gate). A batch that moves the
gate (the subquery's first NULL, its last row gone) changes the verdict of every stored row: the process raises
``WholeStateChangedError`` before writing, and the service recaptures (computing the new result on Spark, instead of
reading every stored row into the process). Keys that are floats have no external form (their NaN-free form is two
columns). A capture on Spark writes both components from the inputs, netted as here, nothing collected
(``spark/external_capture.capture_anti_join``). See docs/ARCHITECTURE.md, "Where state lives".
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import polars as pl

from imp_core.engine.annotation import SET_DTYPE, as_sets, relabel
from imp_core.engine.evaluate import polars_type
from imp_core.engine.external import ExternalOperator, MemoryGroupStore
from imp_core.engine.operators.anti_join import DELTA, NEW, NULL_KEY, OLD, AntiJoinOp
from imp_core.engine.operators.base import InputSide
from imp_core.engine.operators.context import BuildContext
from imp_core.engine.operators.group_topk import SKEY, skey_expr, skey_set
from imp_core.engine.schema import COUNT, MULT, SET
from imp_core.errors import StateError, WholeStateChangedError
from imp_core.plan.nodes import AntiJoin, Plan

LEFT, RIGHT = "left", "right"
OPEN, CLOSED, KEYED = "open", "closed", "keyed"  # NOT IN's gate: every row passes, none, by key (``gate``)


def has_external_form(node: AntiJoin) -> bool:
    """Whether an anti join can keep its state in a store: ``NOT EXISTS`` or ``NOT IN`` on equal keys, none of them
    a float."""
    left_keys, _, _ = node.equi_keys()
    return bool(left_keys) and not any(polars_type(node.left.field(k).dtype).is_float() for k in left_keys)


def gate(null_aware: bool, total: int, nulls: int) -> str:
    """What a right side of ``total`` rows, ``nulls`` of them with a NULL key, lets through: ``NOT IN`` over an empty
    one every row (``OPEN``), over one with a NULL key none (``CLOSED``); otherwise (and always for ``NOT EXISTS``)
    the rows by key (``KEYED``)."""
    if not null_aware:
        return KEYED
    return OPEN if total == 0 else CLOSED if nulls > 0 else KEYED


class ExternalAntiJoin(ExternalOperator, AntiJoinOp):
    """A ``NOT EXISTS`` keeping its right key counts and left rows in a :class:`GroupStore` keyed by the anti-join
    key."""

    def __init__(self, op_id: str, node: AntiJoin, annotations: Any = None, fingerprint: str = "",
                 certain_right: bool = False) -> None:
        AntiJoinOp.__init__(self, op_id, node, annotations, fingerprint, certain_right)
        self.key_names = list(self.kcols)
        self.store = MemoryGroupStore(self.key_names, self.component_schemas())
        self._cleared = True

    @classmethod
    def from_node(cls, node: Plan, ctx: BuildContext) -> ExternalAntiJoin:
        assert isinstance(node, AntiJoin)
        return cls(ctx.op_id(cls.kind), node, ctx.annotations, ctx.fingerprint, ctx.role(node).certain_right)

    def component_schemas(self) -> dict[str, dict[str, pl.DataType]]:
        keys = {k: self.right.schema[k] for k in self.kcols}
        plan = {f.name: polars_type(f.dtype) for f in self.node.left.schema}
        return {LEFT: {**keys, **plan, SKEY: pl.String(), MULT: pl.Int64()}, RIGHT: {**keys, COUNT: pl.Int64()}}

    def reset(self) -> None:
        AntiJoinOp.reset(self)  # the totals start at 0; the store is emptied at the next write
        self._cleared = False

    def set_totals(self, nulls: int, total: int) -> None:
        """The right side's rows with a NULL key and all its rows (a capture written to the store elsewhere)."""
        self.right_nulls, self.right_total = nulls, total

    # -- the rule ------------------------------------------------------------------------------------------------

    def process(self, left: pl.DataFrame | None, right: pl.DataFrame | None, left_side: InputSide | None = None,
                right_side: InputSide | None = None) -> pl.DataFrame:
        """The output delta of one batch, from the touched keys' rows read from the store (see the module)."""
        change = self.right.clear().select(self.kcols).with_columns(pl.lit(0, dtype=pl.Int64).alias(DELTA))
        nulls, total = self.right_nulls, self.right_total
        right = self.sure_rows(right)
        if right is not None and right.height:
            keyed = right.select([*self._key_exprs(self.right_keys), pl.col(MULT)])
            nulls += int(keyed.filter(pl.col(NULL_KEY)).get_column(MULT).sum())
            total += int(keyed.get_column(MULT).sum())
            change = (keyed.filter(~pl.col(NULL_KEY)).group_by(self.kcols).agg(pl.col(MULT).sum().alias(DELTA))
                      .filter(pl.col(DELTA) != 0))
        now = gate(self.null_aware, total, nulls)
        if self._cleared and now != self.gate:  # (after a reset the store holds no row yet: nothing to re-decide)
            raise WholeStateChangedError(
                f"operator {self.op_id}: the NOT IN's subquery {_moved(self.gate, now)}, which changes the verdict "
                f"of every stored row; a recapture computes the new result (imp sketch recapture)")
        self.right_nulls, self.right_total = nulls, total
        rows = self._stored_rows(left) if left is not None and left.height else None
        keys = change.select(self.kcols) if rows is None else \
            pl.concat([change.select(self.kcols), rows.select(self.kcols)], how="vertical_relaxed")
        keys = keys.unique()
        if keys.height == 0:
            return self.empty_delta()
        old = self._fetch(keys)
        counts = (keys.join(old[RIGHT], on=self.kcols, how="left", nulls_equal=True)
                  .join(change, on=self.kcols, how="left", nulls_equal=True)
                  .select([*self.kcols, pl.col(COUNT).fill_null(0).alias(OLD),
                           (pl.col(COUNT).fill_null(0) + pl.col(DELTA).fill_null(0)).alias(NEW)]))
        parts = []
        flipped = counts.filter((pl.col(OLD) > 0) != (pl.col(NEW) > 0))
        if flipped.height and old[LEFT].height and now == KEYED:  # a row passes while its key has no right row
            sign = pl.when(pl.col(NEW) > 0).then(-1).otherwise(1)
            parts.append(old[LEFT].join(flipped, on=self.kcols, how="inner")
                         .with_columns((pl.col(MULT) * sign).alias(MULT)))
        if rows is not None and now != CLOSED:
            parts.append(self._passing(rows, counts.filter(pl.col(NEW) > 0).select(self.kcols), now))
        new_left = self._netted(pl.concat([old[LEFT], rows], how="vertical_relaxed") if rows is not None
                                else old[LEFT])
        new_right = counts.filter(pl.col(NEW) > 0).select([*self.kcols, pl.col(NEW).alias(COUNT)])
        self.store.replace(keys, {LEFT: new_left, RIGHT: new_right})
        parts = [p for p in parts if p.height]
        if not parts:
            return self.empty_delta()
        return self._output(self._netted(pl.concat([p.select(new_left.columns) for p in parts])))

    @property
    def gate(self) -> str:
        """What the right side lets through now (``gate``)."""
        return gate(self.null_aware, self.right_total, self.right_nulls)

    def _passing(self, rows: pl.DataFrame, blocked: pl.DataFrame, now: str) -> pl.DataFrame:  # type: ignore[override]
        """The stored-layout ``rows`` that pass a right side whose keys with rows are ``blocked``, under gate ``now``:
        a NULL key matches no right row (``NOT EXISTS`` keeps its row, a keyed ``NOT IN`` drops it)."""
        if now == CLOSED:
            return rows.clear()
        if now == OPEN:
            return rows
        if self.null_aware:
            rows = rows.filter(pl.all_horizontal([pl.col(k).is_not_null() for k in self.kcols]))
        return rows.join(blocked, on=self.kcols, how="anti")

    def _fetch(self, keys: pl.DataFrame) -> dict[str, pl.DataFrame]:
        """The touched keys' stored rows (none right after a reset: the store is emptied instead of read)."""
        if not self._cleared:
            self.store.load({})
            self._cleared = True
            schemas = self.component_schemas()
            return {name: pl.DataFrame(schema=schema) for name, schema in schemas.items()}
        return self.store.fetch(keys)

    def _stored_rows(self, delta: pl.DataFrame) -> pl.DataFrame:
        """A left delta in the stored layout: keys, plan columns, annotation text, multiplicity; netted."""
        rows = as_sets(self._left_rows(delta)).with_columns(skey_expr(), *self._key_exprs(self.left_keys)[:-1])
        return self._netted(rows.select(list(self.component_schemas()[LEFT])))

    def _netted(self, rows: pl.DataFrame) -> pl.DataFrame:
        """Signed rows summed per (key, row, annotation), those that cancel dropped (the in-memory netting)."""
        schema = self.component_schemas()[LEFT]
        out = rows.group_by([c for c in schema if c != MULT], maintain_order=True).agg(pl.col(MULT).sum())
        return out.filter(pl.col(MULT) != 0).select(list(schema)).cast(schema)  # type: ignore[arg-type]

    def _output(self, rows: pl.DataFrame) -> pl.DataFrame:
        """Stored left rows as output rows: plan columns, ``__mult``, the annotation set."""
        return rows.with_columns(skey_set()).select([*self.left_names, MULT, SET])

    def empty_delta(self) -> pl.DataFrame:
        return pl.DataFrame(schema={**{f.name: polars_type(f.dtype) for f in self.node.schema}, MULT: pl.Int64,
                                    SET: SET_DTYPE})

    # -- the whole state, for the operators above a capture and for tests -----------------------------------------

    def output_chunks(self) -> Iterator[pl.DataFrame]:
        for frames in self.store.contents():  # chunks of complete keys
            blocked = frames[RIGHT].filter(pl.col(COUNT) > 0).select(self.kcols)
            yield self._output(self._passing(self._netted(frames[LEFT]), blocked, self.gate))

    def output_for(self, wanted: pl.DataFrame) -> pl.DataFrame | None:
        """The current result rows whose anti-join key columns equal a row of ``wanted`` (columns named as the left
        keys), read from the store for those keys only; None when ``wanted`` names another column."""
        by_name = dict(zip(self.left_keys, self.kcols))
        if not wanted.width or not set(wanted.columns) <= set(by_name):
            return None
        types = self.component_schemas()[LEFT]
        keys = wanted.select([pl.col(c).alias(by_name[c]) for c in wanted.columns])
        frames = self.store.fetch_where(keys.cast({k: types[k] for k in keys.columns}))
        blocked = frames[RIGHT].filter(pl.col(COUNT) > 0).select(self.kcols)
        return self._output(self._passing(self._netted(frames[LEFT]), blocked, self.gate))

    def whole_frames(self) -> dict[str, pl.DataFrame]:
        """The state as the in-memory operator saves it (left rows with their annotation set)."""
        lefts, rights = [], []
        for frames in self.store.contents():
            lefts.append(self._netted(frames[LEFT]))
            rights.append(frames[RIGHT].filter(pl.col(COUNT) > 0))
        left = pl.concat(lefts) if lefts else self._netted(pl.DataFrame(schema=self.component_schemas()[LEFT]))
        right = pl.concat(rights) if rights else self.right.clear()
        totals = pl.DataFrame({"nulls": [self.right_nulls], "total": [self.right_total]},
                              schema={"nulls": pl.Int64, "total": pl.Int64})
        return {RIGHT: right.select(self.right.columns).cast(self.right.schema),
                "totals": totals, LEFT: self._output(left)}

    def state_frames(self) -> tuple[dict[str, Any], dict[str, pl.DataFrame]]:
        return {"null_aware": self.null_aware, "keys": len(self.left_keys), "nulls": self.right_nulls,
                "total": self.right_total, "external": self.store.reference()}, {}

    def set_state_frames(self, meta: dict[str, Any], frames: dict[str, pl.DataFrame]) -> None:
        if meta.get("null_aware") != self.null_aware or meta.get("keys") != len(self.left_keys):
            raise StateError(f"operator {self.op_id}: the saved state is of another anti join (NOT EXISTS or NOT IN, "
                             f"its keys); recapture the sketch")
        stored = None
        if frames:  # whole frames (state moved out of memory, or relabeled by a repartition)
            if any(n not in frames for n in (LEFT, RIGHT, "totals")) or frames["totals"].height != 1:
                raise StateError(f"operator {self.op_id}: the anti join's saved state is incomplete; recapture the "
                                 f"sketch")
            self.right_nulls = int(frames["totals"].item(0, "nulls"))
            self.right_total = int(frames["totals"].item(0, "total"))
            left = frames[LEFT]
            stored = {LEFT: self._stored_rows(left) if left.width else None, RIGHT: frames[RIGHT]}
        else:
            self.right_nulls, self.right_total = int(meta.get("nulls", 0)), int(meta.get("total", 0))
        self.take_state(meta, stored)

    def relabeled_state(self, mapping: Any, total: int) -> tuple[dict[str, Any], dict[str, pl.DataFrame]]:
        meta, _ = self.state_frames()
        frames = self.whole_frames()
        return meta, {**frames, LEFT: relabel(frames[LEFT], mapping)}

    def canonical(self) -> dict[str, pl.DataFrame]:
        """The store's contents in the in-memory operator's canonical form."""
        memory = AntiJoinOp(self.op_id, self.node, self.annotations, self.fingerprint)
        memory.set_state_frames({"null_aware": self.null_aware, "keys": len(self.left_keys)}, self.whole_frames())
        return memory.canonical()


def _moved(before: str, now: str) -> str:
    """How a NOT IN's gate moved, in words."""
    if now == CLOSED:
        return "gained its first NULL"
    if now == OPEN:
        return "lost its last row"
    return "lost its last NULL" if before == CLOSED else "gained its first row"


__all__ = ["CLOSED", "KEYED", "LEFT", "OPEN", "RIGHT", "ExternalAntiJoin", "gate", "has_external_form"]

"""Join and cross product (paper 5.2.4, with the errata's signs), with optional side caches kept as state.

``Δ(L ⋈ R) = ΔL ⋈ R' + L' ⋈ ΔR − ΔL ⋈ ΔR`` where ``L'``/``R'`` are the inputs after this pass; with signed
multiplicities the product carries the sign (the errata's eight cases). The operator never reads an input: it asks
the input's ``InputSide`` to join a delta with it. Side caches (a small side kept whole, a partner index, a counting
Bloom filter) follow each side's own deltas. See docs/ARCHITECTURE.md, "Operators" and "Optimizations".
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np
import polars as pl

from imp_core.engine.annotation import after_join, ann_cols, as_sets, consolidate, rename_for_join
from imp_core.engine.bloom import CountingBloom
from imp_core.engine.evaluate import compile_expr, polars_type
from imp_core.engine.float_keys import nan_free, normalize_float
from imp_core.engine.operators.base import BinaryOperator, InputSide, StatefulOperator
from imp_core.engine.operators.context import BuildContext, JoinCaching
from imp_core.engine.operators.partners import N_KEY, Partners, partner_index
from imp_core.engine.schema import COUNT, MULT, RIGHT_MULT, join_columns, nan_flag
from imp_core.engine.state import Rows
from imp_core.errors import StateError
from imp_core.plan.expr import Binary, Col, Expr, conjoin
from imp_core.plan.nodes import Join, Plan

PARTNER_KEYS_PER_ROW = 4


def canonical_keys(frame: pl.DataFrame, names: list[str], key_types: tuple[pl.DataType, ...]) -> pl.DataFrame:
    """Key columns ``k0..`` in one type per key pair, floats normalized as Spark matches them (so equal keys hash
    equally in the Bloom filters and match in the partner index)."""
    cols = []
    for i, (n, t) in enumerate(zip(names, key_types)):
        x = pl.col(n).cast(t, strict=False)
        cols.append((normalize_float(x) if t.is_float() else x).alias(f"k{i}"))
    return frame.select(cols)


class JoinOp(BinaryOperator, StatefulOperator):
    """A join of two annotated inputs. Its state is the side caches (``caches``, per side: ``("rows", frame)``,
    ``("partners", Partners)``, ``("bloom", filter)`` or None until built); without caching it is stateless."""

    kind = "join"

    def __init__(self, op_id: str, node: Join, caching: JoinCaching | None = None, fingerprint: str = "") -> None:
        super().__init__(op_id)
        self.node = node
        self.fingerprint = fingerprint
        self.caching = caching or JoinCaching(bloom=False, small_rows=0)
        self.use_caches = True  # the pipeline switches caches off during a capture
        left_keys, right_keys, residual = node.equi_keys()
        # polars joins on distinct key columns: a column repeated among the keys (`a = b AND b = a`, `a = b AND
        # a = c`) is checked after the join instead, an exact repeat not at all
        self.left_keys: list[str] = []
        self.right_keys: list[str] = []
        for a, b in zip(left_keys, right_keys):
            if a not in self.left_keys and b not in self.right_keys:
                self.left_keys.append(a)
                self.right_keys.append(b)
            elif (a, b) not in zip(self.left_keys, self.right_keys):
                residual.append(Binary("=", Col(a, node.left.field(a).dtype), Col(b, node.right.field(b).dtype)))
        self.residual: Expr | None = conjoin(residual)
        self.left_names = list(node.left.names)
        self.right_names = list(node.right.names)
        # one hash type per key pair, so both sides' filters hash equal keys equally
        self.key_types: list[pl.DataType] = []
        for a, b in zip(self.left_keys, self.right_keys):
            ta, tb = polars_type(node.left.field(a).dtype), polars_type(node.right.field(b).dtype)
            self.key_types.append(ta if ta == tb else (pl.Float64 if (ta.is_float() or tb.is_float()) else pl.Int64)())
        # a partner index matches keys by value with polars joins: only when both sides' key columns have the same
        # type, and not for float keys (polars joins do not match NaN with NaN reliably)
        self._same_key_types = all(polars_type(node.left.field(a).dtype) == polars_type(node.right.field(b).dtype)
                                   for a, b in zip(self.left_keys, self.right_keys)) and \
            not any(t.is_float() for t in self.key_types)
        self.reset()

    @classmethod
    def from_node(cls, node: Plan, ctx: BuildContext) -> JoinOp:
        assert isinstance(node, Join)
        return cls(ctx.op_id(cls.kind), node, ctx.join_caching, ctx.fingerprint)

    @property
    def keeps_caches(self) -> bool:
        """Whether this join keeps side caches (an equi-join with some cache switched on): then it has state."""
        return bool(self.left_keys) and (self.caching.bloom or self.caching.small_rows > 0
                                         or self.caching.partner_rows > 0)

    def reset(self) -> None:
        # per side: ("rows", frame) | ("partners", Partners) | ("bloom", filter) | None (not built yet)
        self.caches: dict[str, tuple[str, Any] | None] = {"left": None, "right": None}
        self.appended = {"left": 0, "right": 0}  # rows added to a "rows" cache since it was last consolidated

    def process(self, left: pl.DataFrame | None, right: pl.DataFrame | None, left_side: InputSide,
                right_side: InputSide) -> pl.DataFrame:
        dl = left if left is not None and left.height else None
        dr = right if right is not None and right.height else None
        caching = self.use_caches and self.keeps_caches
        if caching:
            # caches describe the sides as of before this pass: bring them to the versions now reached
            if dl is not None:
                self._apply("left", dl)
            if dr is not None:
                self._apply("right", dr)
        parts = []
        if dl is not None:
            parts.append(self._join_with("right", right_side, dl, True, left_side) if caching
                         else right_side.join_delta(dl, delta_is_left=True))
        if dr is not None:
            parts.append(self._join_with("left", left_side, dr, False, right_side) if caching
                         else left_side.join_delta(dr, delta_is_left=False))
        if dl is not None and dr is not None:
            parts.append(self.join_frames(dl, dr).with_columns(-pl.col(MULT)))
        parts = [p for p in parts if p.height]
        if not parts:
            return self.empty_delta()
        return pl.concat(parts, how="diagonal_relaxed") if len(parts) > 1 else parts[0]

    # -- side caches ---------------------------------------------------------------------------------------------

    def _keys(self, side: str, frame: pl.DataFrame) -> pl.DataFrame:
        return self._canonical(frame, self.left_keys if side == "left" else self.right_keys)

    def _names(self, side: str) -> list[str]:
        return self.left_keys if side == "left" else self.right_keys

    def _apply(self, side: str, delta: pl.DataFrame) -> None:
        """Bring ``side``'s cache to the side's contents after its own ``delta``."""
        cache = self.caches[side]
        if cache is None:
            return
        kind, value = cache
        if kind == "rows":
            if ann_cols(delta) != ann_cols(value):
                # the side read whole (fragment columns) and its delta (fragment sets, from a stateful operator
                # below) annotate alike once both are sets
                value, delta = as_sets(value), as_sets(delta)
            # the join is bilinear, so the rows may hold a row and its retraction for a while: they are merged once
            # the appended rows reach an eighth of the cache, which keeps a batch's cost at its own size
            rows = pl.concat([value, delta.select(value.columns)], how="vertical_relaxed")
            self.appended[side] += delta.height
            if self.appended[side] * 8 > rows.height:
                rows, self.appended[side] = consolidate(rows), 0
            self.caches[side] = ("rows", rows)
        elif kind == "bloom":
            value.add(self._keys(side, delta), delta.get_column(MULT).to_numpy())
        else:
            index: Partners = value
            if index.bloom is not None:
                index.bloom.add(self._keys(side, delta), delta.get_column(MULT).to_numpy())
            index.apply(delta)  # rows of listed keys change with the side; the index's other rows are not affected

    def _named(self, keys: pl.DataFrame, names: list[str]) -> pl.DataFrame:
        """Canonical key columns ``k0..`` renamed to a side's key column names."""
        return keys.select([pl.col(f"k{i}").alias(n) for i, n in enumerate(names)])

    def _build(self, side: str, access: InputSide, other: InputSide | None) -> None:
        names = self._names(side)
        small = self.caching.small_rows if self.caching.small_rows > 0 else 0
        rows, key_counts = access.summary(names, small)
        if rows is not None:
            self.caches[side] = ("rows", rows)
            return
        if key_counts is None:
            return  # the side is computed in memory anyway
        bloom = None
        if self.caching.bloom:
            bloom = CountingBloom.for_keys(key_counts.height)
            bloom.add(self._canonical(key_counts, names), key_counts.get_column(COUNT).to_numpy())
        if self.caching.partner_rows > 0 and self._same_key_types and other is not None:
            index = self._partner_index(side, access, other, bloom)
            if index is not None:
                self.caches[side] = ("partners", index)
                return
        if bloom is not None:
            self.caches[side] = ("bloom", bloom)

    def _partner_index(self, side: str, access: InputSide, other: InputSide,
                       bloom: CountingBloom | None) -> Partners | None:
        """``side``'s rows with a key the other side has, if there are at most ``partner_rows`` of them."""
        other_side = "right" if side == "left" else "left"
        limit = self.caching.partner_rows
        # key counts are two numbers a key: up to PARTNER_KEYS_PER_ROW of them per partner row the index may hold
        counts = other.key_counts(self._names(other_side), PARTNER_KEYS_PER_ROW * limit)
        if counts is None:
            return None
        keys = self._canonical(counts, self._names(other_side)).with_columns(
            counts.get_column(COUNT).cast(pl.Int64).alias(N_KEY)).drop_nulls().filter(pl.col(N_KEY) > 0)
        names = self._names(side)
        rows = access.rows_with_keys(names, self._named(keys, names), limit)
        if rows is None:
            return None
        return self._index(side, rows, keys, bloom)

    def _index(self, side: str, rows: pl.DataFrame, keys: pl.DataFrame, bloom: CountingBloom | None) -> Partners:
        names = self._names(side)
        # a partial of a module function, not a closure over self: the index must not point back at the operator
        # (that cycle kept every loaded pipeline's state alive until a full garbage collection)
        canon = partial(canonical_keys, names=names, key_types=tuple(self.key_types))
        return partner_index(rows, keys, bloom, canon, names, self.caching.keyed)

    def _canonical(self, frame: pl.DataFrame, names: list[str]) -> pl.DataFrame:
        return canonical_keys(frame, names, tuple(self.key_types))

    def build_caches(self, left: InputSide, right: InputSide) -> None:
        """Build both side caches now instead of on the first delta (e.g. right after a capture)."""
        if self.keeps_caches:
            for side, access, other in (("left", left, right), ("right", right, left)):
                if self.caches[side] is None:
                    self._build(side, access, other)

    def _join_with(self, side: str, access: InputSide, delta: pl.DataFrame, delta_is_left: bool,
                   other: InputSide | None = None) -> pl.DataFrame:
        """``delta`` joined with ``side``'s contents, using (and lazily building) the side's cache."""
        if self.caches[side] is None:
            self._build(side, access, other)
            cache = self.caches[side]
            if cache is not None and cache[0] == "partners":
                cache[1].fresh = True  # built at the versions this pass reaches: its key counts include `delta`
        cache = self.caches[side]
        if cache is not None and cache[0] == "rows":
            rows = cache[1]
            return self.join_frames(delta, rows) if delta_is_left else self.join_frames(rows, delta)
        if cache is not None and cache[0] == "partners":
            return self._join_partners(side, access, cache[1], delta, delta_is_left)
        if cache is not None and cache[0] == "bloom":
            own = "left" if delta_is_left else "right"
            keep = cache[1].may_contain(self._keys(own, delta))
            delta = delta.filter(pl.Series(keep))
            if delta.height == 0:
                return self.empty_delta()  # no delta row can have a partner: no join at all
        return access.join_delta(delta, delta_is_left)

    def _join_partners(self, side: str, access: InputSide, index: Partners, delta: pl.DataFrame,
                       delta_is_left: bool) -> pl.DataFrame:
        """``delta`` (of the other side) joined through ``side``'s partner index; then the index follows the other
        side's keys: new keys come with their fetched partners, keys whose count reaches 0 leave."""
        own = "left" if delta_is_left else "right"
        kcols = [f"k{i}" for i in range(len(self.key_types))]
        dkeys = self._keys(own, delta)
        known = index.listed(dkeys)
        has_key = ~np.any(np.stack([dkeys.get_column(c).is_null().to_numpy() for c in kcols]), axis=0)
        fresh_mask = ~known & has_key  # keys the other side did not have: their partners are not in the index
        parts = []
        if known.any():
            keep = pl.Series(known)
            part, rows = delta.filter(keep), index.partners(dkeys.filter(keep))
            parts.append(self.join_frames(part, rows) if delta_is_left else self.join_frames(rows, part))
        fetched = None
        if fresh_mask.any():
            new = delta.filter(pl.Series(fresh_mask))
            if index.bloom is not None:
                new = new.filter(pl.Series(index.bloom.may_contain(self._keys(own, new))))
            if new.height:
                names = self._names(side)
                fetched = access.rows_with_keys(names, self._named(self._keys(own, new).unique(), names), 0)
                if fetched is None:  # the side cannot be looked up by key: the plain join
                    parts.append(access.join_delta(new, delta_is_left))
                else:
                    parts.append(self.join_frames(new, fetched) if delta_is_left
                                 else self.join_frames(fetched, new))
        self._follow_keys(index, dkeys, delta.get_column(MULT), fetched)
        parts = [p for p in parts if p.height]
        if not parts:
            return self.empty_delta()
        return pl.concat(parts, how="diagonal_relaxed") if len(parts) > 1 else parts[0]

    def _follow_keys(self, index: Partners, dkeys: pl.DataFrame, mult: pl.Series,
                     fetched: pl.DataFrame | None) -> None:
        """Count the other side's delta into the index's keys; keep the fetched partners of keys now listed and
        drop the rows of keys no longer listed."""
        if index.fresh:
            index.fresh = False  # the counts were read at the versions this pass reaches
        else:
            index.count(dkeys, mult.to_numpy())
        if fetched is not None and fetched.height:
            index.add_fetched(fetched)  # fetched keys were not listed before, so none of their rows is in the index

    def state_frames(self) -> tuple[dict[str, Any], dict[str, pl.DataFrame]]:
        return self._frames(lazy=False)  # type: ignore[return-value]

    def saved_frames(self) -> tuple[dict[str, Any], dict[str, pl.DataFrame | Rows]]:
        """The state's frames, a keyed partner index's keys as :class:`Rows` (a streaming save never builds them)."""
        return self._frames(lazy=True)

    def _frames(self, lazy: bool) -> tuple[dict[str, Any], dict[str, pl.DataFrame | Rows]]:
        meta: dict[str, Any] = {"polars": pl.__version__}
        frames: dict[str, pl.DataFrame | Rows] = {}
        for side, cache in self.caches.items():
            meta[side] = None if cache is None else cache[0]
            if cache is None:
                continue
            kind, value = cache
            if kind == "rows":
                frames[side] = consolidate(value) if self.appended[side] else value
            elif kind == "bloom":
                frames[side] = value.to_frame()
            else:
                frames[side], frames[f"{side}_keys"] = value.saved(lazy)
                if value.bloom is not None:
                    frames[f"{side}_bloom"] = value.bloom.to_frame()
        return meta, frames

    def set_state_frames(self, meta: dict[str, Any], frames: dict[str, pl.DataFrame]) -> None:
        self.reset()
        same_hash = meta.get("polars") == pl.__version__
        for side in ("left", "right"):
            kind = meta.get(side)
            if kind is None:
                continue
            if side not in frames or (kind == "partners" and f"{side}_keys" not in frames):
                raise StateError(f"operator {self.op_id}: the {side} join cache is missing its data; recapture")
            if kind == "rows":
                self.caches[side] = ("rows", frames[side])
            elif kind == "partners":
                # a filter hashed by another polars version is dropped (it only ever saves work); rows and key
                # counts do not depend on hashing
                bloom = CountingBloom.from_frame(frames[f"{side}_bloom"]) \
                    if same_hash and f"{side}_bloom" in frames else None
                self.caches[side] = ("partners", self._index(side, frames[side], frames[f"{side}_keys"], bloom))
            elif same_hash:
                self.caches[side] = ("bloom", CountingBloom.from_frame(frames[side]))
            # a filter hashed by another polars version is rebuilt on first use (it only ever saves work)

    def canonical(self) -> dict[str, pl.DataFrame]:
        return {}  # caches are built lazily: they are not part of the state a capture must reproduce

    def join_frames(self, left: pl.DataFrame, right: pl.DataFrame) -> pl.DataFrame:
        """In memory, ``left ⋈ right`` of two annotated frames (deltas or relations alike: the join is bilinear)."""
        right = rename_for_join(left, right).rename({MULT: RIGHT_MULT})
        if self.left_keys:
            lk, rk = self.left_keys, self.right_keys
            casts_l, casts_r = {}, {}
            for a, b in zip(lk, rk):
                if left.schema[a] != right.schema[b]:
                    target = pl.Float64 if (left.schema[a].is_float() or right.schema[b].is_float()) else left.schema[a]
                    casts_l[a], casts_r[b] = target, target
            left, right = left.cast(casts_l), right.cast(casts_r)  # type: ignore[arg-type]
            # Spark matches float join keys normalized (NaN = NaN whatever its bits, -0.0 = 0.0); polars joins do not
            # match NaN reliably, so the join is on NaN-free copies (value or 0.0, is NaN)
            floats = [i for i, a in enumerate(lk) if left.schema[a].is_float()]
            if floats:
                left = left.with_columns([x for i in floats for x in nan_free(pl.col(lk[i]), f"__jk{i}")])
                right = right.with_columns([x for i in floats for x in nan_free(pl.col(rk[i]), f"__jk{i}")])
                extra = [nan_flag(f"__jk{i}") for i in floats]
                lk = [f"__jk{i}" if i in floats else a for i, a in enumerate(lk)] + extra
                rk = [f"__jk{i}" if i in floats else b for i, b in enumerate(rk)] + extra
            out = left.join(right, left_on=lk, right_on=rk, how="inner", coalesce=False, suffix="__r")
        else:
            out = left.join(right, how="cross")
        if self.residual is not None and out.height:
            out = out.filter(compile_expr(self.residual).fill_null(False))
        out = out.with_columns((pl.col(MULT) * pl.col(RIGHT_MULT)).alias(MULT)).drop(RIGHT_MULT)
        out = after_join(out)
        return out.select(join_columns(self.left_names, self.right_names, out.columns))

    def empty_delta(self) -> pl.DataFrame:
        """No change: every output column of the join (both sides), even when only one side had a delta."""
        return pl.DataFrame(schema={**{f.name: polars_type(f.dtype) for f in self.node.schema}, MULT: pl.Int64})

"""Join and cross product (paper 5.2.4, with the errata's signs).

``Δ(L ⋈ R) = ΔL ⋈ R' + L' ⋈ ΔR − ΔL ⋈ ΔR`` where ``L'``/``R'`` are the inputs *after* this pass. With signed
multiplicities the product ``n·m`` carries the sign, which yields exactly the paper's eight cases (an insert joined
with a delete is a delete; two deletes joined make an insert). Within one pass usually only one side changes (the
maintenance driver processes changed tables one after another, each against the others at the versions already
reached), so this is one delta joined with the other side's current annotated contents. Those contents are large
and live in tables, so the operator does not fetch them: it asks a ``JoinSide`` (the Spark backend, or the
in-memory state of the other side) to join the delta. The output annotation is the union of both sides'.

Side caches (optional, kept as operator state and updated with each side's own deltas, so they always describe the
side at the versions already reached):

* a **small side** (at most ``small_rows`` rows, e.g. a dimension table) is kept whole, annotated, and deltas of the
  other side join it in memory without any Spark job (the iOLAP paper's small-state joins);
* a **large side** gets a counting Bloom filter over its join keys: delta rows whose key certainly has no partner
  are dropped before the join, and when none is left the join with the large side is skipped entirely.

Both are built lazily, the first time a delta needs the side after a capture, so full maintenance stays the plain
capture query.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import polars as pl

from imp_core.engine.annotation import MULT, after_join, consolidate, rename_for_join
from imp_core.engine.bloom import CountingBloom
from imp_core.engine.evaluate import compile_expr, polars_type
from imp_core.engine.operators.base import StatefulOperator
from imp_core.errors import StateError
from imp_core.plan.expr import Binary, Col, Expr, conjoin
from imp_core.plan.nodes import Join


class JoinSide(Protocol):
    """Access to one input's current annotated contents, able to join a delta of the other input with them."""

    def join_delta(self, delta: pl.DataFrame, delta_is_left: bool) -> pl.DataFrame:
        """``delta ⋈ contents`` (or ``contents ⋈ delta``) with left columns first, ``__mult`` = product."""
        ...

    def summary(self, keys: list[str], max_rows: int) -> tuple[pl.DataFrame | None, pl.DataFrame | None]:
        """The side's annotated rows if there are at most ``max_rows``, else its join-key counts (``__n``);
        ``(None, None)`` when the side is in memory anyway (nothing to cache)."""
        ...


@dataclass(frozen=True)
class JoinCaching:
    """Which side caches a join may build (``imp_core.config.Optimizations``)."""

    bloom: bool = True
    small_rows: int = 0  # 0: never keep a side whole


class JoinOp(StatefulOperator):
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
            self.key_types.append(ta if ta == tb else (pl.Float64 if (ta.is_float() or tb.is_float()) else pl.Int64))
        self.reset()

    @property
    def stateful_now(self) -> bool:
        return bool(self.left_keys) and (self.caching.bloom or self.caching.small_rows > 0)

    def reset(self) -> None:
        # per side: ("rows", frame) | ("bloom", filter) | None (not built yet)
        self.caches: dict[str, tuple[str, Any] | None] = {"left": None, "right": None}

    def process(self, dl: pl.DataFrame | None, dr: pl.DataFrame | None, left: JoinSide,
                right: JoinSide) -> pl.DataFrame:
        parts = []
        has_l = dl is not None and dl.height > 0
        has_r = dr is not None and dr.height > 0
        caching = self.use_caches and self.stateful_now
        if caching:
            # caches describe the sides as of before this pass: bring them to the versions now reached
            if has_l:
                self._apply("left", dl)  # type: ignore[arg-type]
            if has_r:
                self._apply("right", dr)  # type: ignore[arg-type]
        if has_l:
            parts.append(self._join_with("right", right, dl, True) if caching  # type: ignore[arg-type]
                         else right.join_delta(dl, delta_is_left=True))  # type: ignore[arg-type]
        if has_r:
            parts.append(self._join_with("left", left, dr, False) if caching  # type: ignore[arg-type]
                         else left.join_delta(dr, delta_is_left=False))  # type: ignore[arg-type]
        if has_l and has_r:
            dd = self.join_frames(dl, dr)  # type: ignore[arg-type]
            parts.append(dd.with_columns(-pl.col(MULT)))
        parts = [p for p in parts if p.height]
        if not parts:
            return self.empty_output()
        return pl.concat(parts, how="diagonal_relaxed") if len(parts) > 1 else parts[0]

    # -- side caches ---------------------------------------------------------------------------------------------

    def _keys(self, side: str, frame: pl.DataFrame) -> pl.DataFrame:
        names = self.left_keys if side == "left" else self.right_keys
        return frame.select([pl.col(n).cast(t, strict=False).alias(f"k{i}")
                             for i, (n, t) in enumerate(zip(names, self.key_types))])

    def _apply(self, side: str, delta: pl.DataFrame) -> None:
        cache = self.caches[side]
        if cache is None:
            return
        kind, value = cache
        if kind == "rows":
            self.caches[side] = ("rows", consolidate(pl.concat([value, delta.select(value.columns)],
                                                               how="vertical_relaxed")))
        else:
            value.add(self._keys(side, delta), delta.get_column(MULT).to_numpy())

    def _build(self, side: str, access: JoinSide) -> None:
        names = self.left_keys if side == "left" else self.right_keys
        small = self.caching.small_rows if self.caching.small_rows > 0 else 0
        rows, key_counts = access.summary(names, small)
        if rows is not None:
            self.caches[side] = ("rows", rows)
        elif key_counts is not None and self.caching.bloom:
            bloom = CountingBloom.for_keys(key_counts.height)
            keys = key_counts.select([pl.col(n).cast(t, strict=False).alias(f"k{i}")
                                      for i, (n, t) in enumerate(zip(names, self.key_types))])
            bloom.add(keys, key_counts.get_column("__n").to_numpy())
            self.caches[side] = ("bloom", bloom)

    def build_caches(self, left: JoinSide, right: JoinSide) -> None:
        """Build both side caches now instead of on the first delta (e.g. right after a capture)."""
        if self.stateful_now:
            for side, access in (("left", left), ("right", right)):
                if self.caches[side] is None:
                    self._build(side, access)

    def _join_with(self, side: str, access: JoinSide, delta: pl.DataFrame, delta_is_left: bool) -> pl.DataFrame:
        """``delta`` joined with ``side``'s contents, using (and lazily building) the side's cache."""
        if self.caches[side] is None:
            self._build(side, access)
        cache = self.caches[side]
        if cache is not None and cache[0] == "rows":
            rows = cache[1]
            return self.join_frames(delta, rows) if delta_is_left else self.join_frames(rows, delta)
        if cache is not None and cache[0] == "bloom":
            own = "left" if delta_is_left else "right"
            keep = cache[1].may_contain(self._keys(own, delta))
            delta = delta.filter(pl.Series(keep))
            if delta.height == 0:
                return self.empty_output()  # no delta row can have a partner: no join at all
        return access.join_delta(delta, delta_is_left)

    def state_frames(self) -> tuple[dict[str, Any], dict[str, pl.DataFrame]]:
        meta: dict[str, Any] = {"polars": pl.__version__}
        frames: dict[str, pl.DataFrame] = {}
        for side, cache in self.caches.items():
            meta[side] = None if cache is None else cache[0]
            if cache is not None:
                frames[side] = cache[1] if cache[0] == "rows" else cache[1].to_frame()
        return meta, frames

    def set_state_frames(self, meta: dict[str, Any], frames: dict[str, pl.DataFrame]) -> None:
        self.reset()
        for side in ("left", "right"):
            kind = meta.get(side)
            if kind is None:
                continue
            if side not in frames:
                raise StateError(f"operator {self.op_id}: the {side} join cache is missing its data; recapture")
            if kind == "rows":
                self.caches[side] = ("rows", frames[side])
            elif meta.get("polars") == pl.__version__:
                self.caches[side] = ("bloom", CountingBloom.from_frame(frames[side]))
            # a filter hashed by another polars version is rebuilt on first use (it only ever saves work)

    def canonical(self) -> dict[str, pl.DataFrame]:
        return {}  # caches are built lazily: they are not part of the state a capture must reproduce

    def join_frames(self, left: pl.DataFrame, right: pl.DataFrame) -> pl.DataFrame:
        """In-memory ``left ⋈ right`` of two annotated relations (both with ``__mult`` and annotations)."""
        right = rename_for_join(left, right).rename({MULT: "__mult_r"})
        if self.left_keys:
            lk, rk = self.left_keys, self.right_keys
            casts_l, casts_r = {}, {}
            for a, b in zip(lk, rk):
                if left.schema[a] != right.schema[b]:
                    target = pl.Float64 if (left.schema[a].is_float() or right.schema[b].is_float()) else left.schema[a]
                    casts_l[a], casts_r[b] = target, target
            out = left.cast(casts_l).join(right.cast(casts_r), left_on=lk, right_on=rk, how="inner", coalesce=False)  # type: ignore[arg-type]
        else:
            out = left.join(right, how="cross")
        if self.residual is not None and out.height:
            out = out.filter(compile_expr(self.residual).fill_null(False))
        out = out.with_columns((pl.col(MULT) * pl.col("__mult_r")).alias(MULT)).drop("__mult_r")
        out = after_join(out)
        ann = [c for c in out.columns if c not in self.left_names and c not in self.right_names and c != MULT]
        return out.select([*self.left_names, *self.right_names, MULT, *ann])

    def empty_output(self) -> pl.DataFrame:
        """No change: every output column of the join (both sides), even when only one side had a delta."""
        return pl.DataFrame(schema={**{f.name: polars_type(f.dtype) for f in self.node.schema}, MULT: pl.Int64})

"""Join and cross product (paper 5.2.4, with the errata's signs).

``Δ(L ⋈ R) = ΔL ⋈ R' + L' ⋈ ΔR − ΔL ⋈ ΔR`` where ``L'``/``R'`` are the inputs *after* this pass. With signed
multiplicities the product ``n·m`` carries the sign, which yields exactly the paper's eight cases (an insert joined
with a delete is a delete; two deletes joined make an insert). Within one pass usually only one side changes (the
maintenance driver processes changed tables one after another, each against the others at the versions already
reached), so this is one delta joined with the other side's current annotated contents. Those contents are large
and live in tables, so the operator does not fetch them: it asks a ``JoinSide`` (the Spark backend, or the
in-memory state of the other side) to join the delta. The output annotation is the union of both sides'.
"""

from __future__ import annotations

from typing import Protocol

import polars as pl

from imp_core.engine.annotation import MULT, after_join, rename_for_join
from imp_core.engine.evaluate import compile_expr, polars_type
from imp_core.engine.operators.base import Operator
from imp_core.plan.expr import Binary, Col, Expr, conjoin
from imp_core.plan.nodes import Join


class JoinSide(Protocol):
    """Access to one input's current annotated contents, able to join a delta of the other input with them."""

    def join_delta(self, delta: pl.DataFrame, delta_is_left: bool) -> pl.DataFrame:
        """``delta ⋈ contents`` (or ``contents ⋈ delta``) with left columns first, ``__mult`` = product."""
        ...


class JoinOp(Operator):
    kind = "join"

    def __init__(self, op_id: str, node: Join) -> None:
        super().__init__(op_id)
        self.node = node
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

    def process(self, dl: pl.DataFrame | None, dr: pl.DataFrame | None, left: JoinSide,
                right: JoinSide) -> pl.DataFrame:
        parts = []
        has_l = dl is not None and dl.height > 0
        has_r = dr is not None and dr.height > 0
        if has_l:
            parts.append(right.join_delta(dl, delta_is_left=True))  # type: ignore[arg-type]
        if has_r:
            parts.append(left.join_delta(dr, delta_is_left=False))  # type: ignore[arg-type]
        if has_l and has_r:
            dd = self.join_frames(dl, dr)  # type: ignore[arg-type]
            parts.append(dd.with_columns(-pl.col(MULT)))
        parts = [p for p in parts if p.height]
        if not parts:
            return self.empty_output()
        return pl.concat(parts, how="diagonal_relaxed") if len(parts) > 1 else parts[0]

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

"""Bag union (``UNION ALL``): stateless; the delta of a union is the union of its inputs' deltas, each row keeping
the annotation of the input row it came from.

Every input's delta is brought to one layout: the union's columns, ``__mult``, and the fragment column of every
partitioned scan below the union, NULL where a row's branch has no such scan (a NULL fragment is no fragment: every
counting operator skips it). When a branch carries fragment sets (an aggregation, DISTINCT or top-k below the union),
every input is folded into ``__sk`` sets instead. See docs/ARCHITECTURE.md, "Operators", and docs/SQL.md.
"""

from __future__ import annotations

import polars as pl

from imp_core.engine.annotation import FRAG_DTYPE, as_sets
from imp_core.engine.operators.base import Operator
from imp_core.engine.operators.context import BuildContext
from imp_core.engine.schema import MULT, SET, is_carried, raw_col
from imp_core.plan.nodes import Plan, Union


class UnionOp(Operator):
    """``process(delta, branch)`` aligns one input's delta; ``combine`` puts the aligned deltas together."""

    kind = "union"

    def __init__(self, op_id: str, names: tuple[str, ...], fragment_columns: tuple[str, ...],
                 sets: bool = False) -> None:
        """``fragment_columns``: the fragment columns of the partitioned scans below the union, in plan order;
        ``sets``: a branch carries fragment sets (it has an aggregation, DISTINCT or top-k), so every delta is
        folded into sets (one layout in every pass, whichever inputs changed)."""
        super().__init__(op_id)
        self.names = names
        self.fragment_columns = fragment_columns
        self.sets = sets

    @classmethod
    def from_node(cls, node: Plan, ctx: BuildContext) -> UnionOp:
        assert isinstance(node, Union)
        below = {id(s) for s in node.scans()}
        columns = tuple(a.column for a in ctx.annotations.scans if id(a.scan) in below)
        return cls(ctx.op_id(cls.kind), node.names, columns, not all(b.is_stateless() for b in node.inputs))

    def process(self, delta: pl.DataFrame, branch: int = 0) -> pl.DataFrame:
        """Input ``branch``'s delta in the union's layout (its plan columns already have the union's names)."""
        if self.sets or SET in delta.columns:
            return as_sets(delta).select([*self.names, MULT, SET])
        out: list[pl.Expr] = [*(pl.col(n) for n in self.names), pl.col(MULT)]
        for c in self.fragment_columns:
            if c in delta.columns:
                out.append(pl.col(c))
            elif raw_col(c) in delta.columns:  # a raw partition value (from a backend) stands for its fragment
                out.append(pl.col(raw_col(c)))
            else:
                out.append(pl.lit(None, dtype=FRAG_DTYPE).alias(c))
        named = {*self.names, MULT, *self.fragment_columns, *map(raw_col, self.fragment_columns)}
        out += [pl.col(c) for c in delta.columns if is_carried(c) and c not in named]
        return delta.select(out)

    def combine(self, deltas: list[pl.DataFrame]) -> pl.DataFrame:
        """The union of aligned input deltas (folded into sets when any of them holds sets)."""
        if len(deltas) == 1:
            return deltas[0]
        if any(SET in d.columns for d in deltas):
            deltas = [as_sets(d).select([*self.names, MULT, SET]) for d in deltas]
        return pl.concat(deltas, how="diagonal_relaxed")


__all__ = ["UnionOp"]

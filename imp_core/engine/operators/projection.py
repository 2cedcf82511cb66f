"""Projection (paper 5.2.2): stateless; computes the output expressions and keeps each row's annotation.

Bag semantics: duplicates stay separate rows (or one row with a multiplicity). Items over an order-dependent value
also get its interval when an operator above decides membership from it (``imp_core.engine.order_dependence``).
See docs/ARCHITECTURE.md, "Operators".
"""

from __future__ import annotations

import polars as pl

from imp_core.engine import frames
from imp_core.engine.annotation import ann_cols
from imp_core.engine.evaluate import compile_expr
from imp_core.engine.operators.base import UnaryOperator
from imp_core.engine.operators.context import BuildContext
from imp_core.engine.order_dependence import IntervalCompiler
from imp_core.engine.schema import CERTAIN, MULT, hi_name, lo_name
from imp_core.plan.expr import Expr
from imp_core.plan.nodes import Plan, Project


class Projection(UnaryOperator):
    kind = "project"

    def __init__(self, op_id: str, items: tuple[tuple[str, Expr], ...],
                 bounded: frozenset[str] | set[str] = frozenset(), carry: frozenset[str] | set[str] = frozenset(),
                 flagged: bool = False) -> None:
        """``bounded``: input columns with intervals; ``carry``: output items whose interval the output carries;
        ``flagged``: the input's ``__certain`` passes through."""
        super().__init__(op_id)
        self.items = items
        self._exprs = [compile_expr(e).alias(name) for name, e in items]
        self._ic = IntervalCompiler(bounded)
        for name, e in items:
            if name in carry:
                iv = self._ic.interval(e)
                self._exprs += [iv.lo.alias(lo_name(name)), iv.hi.alias(hi_name(name))]
        if flagged:
            self._exprs.append(pl.col(CERTAIN))
        self._items = frames.Exprs(self._exprs)

    @classmethod
    def from_node(cls, node: Plan, ctx: BuildContext) -> Projection:
        assert isinstance(node, Project)
        role = ctx.role(node)
        return cls(ctx.op_id(cls.kind), node.items, ctx.bounded_input(node), role.carry, role.flagged_input)

    def process(self, delta: pl.DataFrame) -> pl.DataFrame:
        items = None if self._ic.stages else self._items.series(delta)
        if items is not None:  # plain columns: no polars run
            return frames.frame([*items, delta.get_column(MULT), *[delta.get_column(c) for c in ann_cols(delta)]])
        return self._ic.apply(delta).select([*self._exprs, pl.col(MULT), *[pl.col(c) for c in ann_cols(delta)]])


__all__ = ["Projection"]

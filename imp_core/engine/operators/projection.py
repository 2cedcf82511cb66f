"""Projection (paper 5.2.2): stateless; computes the output expressions and keeps each row's annotation.

Bag semantics: duplicates stay separate rows (or one row with a multiplicity); nothing is merged here. Items over a
value Spark computes in an order-dependent way also get that value's interval (``__lo__``/``__hi__`` columns) when an
operator above decides membership from it (``imp_core.engine.order_dependence``); a ``__certain`` flag passes through.
"""

from __future__ import annotations

import polars as pl

from imp_core.engine.annotation import MULT, ann_cols
from imp_core.engine.evaluate import compile_expr
from imp_core.engine.operators.base import Operator
from imp_core.engine.order_dependence import CERTAIN, IntervalCompiler, hi_name, lo_name
from imp_core.plan.expr import Expr


class Projection(Operator):
    kind = "projection"

    def __init__(self, op_id: str, items: tuple[tuple[str, Expr], ...],
                 bounded: frozenset[str] | set[str] = frozenset(), carry: frozenset[str] | set[str] = frozenset(),
                 flagged: bool = False) -> None:
        """``bounded``: input columns with intervals; ``carry``: output items whose interval the output carries."""
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

    def process(self, delta: pl.DataFrame) -> pl.DataFrame:
        return self._ic.apply(delta).select([*self._exprs, pl.col(MULT), *[pl.col(c) for c in ann_cols(delta)]])

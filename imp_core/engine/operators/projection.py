"""Projection (paper 5.2.2): stateless; computes the output expressions and keeps each row's annotation.

Bag semantics: duplicates stay separate rows (or one row with a multiplicity); nothing is merged here.
"""

from __future__ import annotations

import polars as pl

from imp_core.engine.annotation import MULT, ann_cols
from imp_core.engine.evaluate import compile_expr
from imp_core.engine.operators.base import Operator
from imp_core.plan.expr import Expr


class Projection(Operator):
    kind = "projection"

    def __init__(self, op_id: str, items: tuple[tuple[str, Expr], ...]) -> None:
        super().__init__(op_id)
        self.items = items
        self._exprs = [compile_expr(e).alias(name) for name, e in items]

    def process(self, delta: pl.DataFrame) -> pl.DataFrame:
        return delta.select([*self._exprs, pl.col(MULT), *[pl.col(c) for c in ann_cols(delta)]])

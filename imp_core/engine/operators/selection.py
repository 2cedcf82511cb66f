"""Selection (paper 5.2.3): stateless; passes the delta rows that satisfy the condition, annotations unchanged."""

from __future__ import annotations

import polars as pl

from imp_core.engine.evaluate import compile_expr
from imp_core.engine.operators.base import Operator
from imp_core.plan.expr import Expr


class Selection(Operator):
    kind = "selection"

    def __init__(self, op_id: str, predicate: Expr) -> None:
        super().__init__(op_id)
        self.predicate = predicate
        self._expr = compile_expr(predicate).fill_null(False)

    def process(self, delta: pl.DataFrame) -> pl.DataFrame:
        if delta.height == 0:
            return delta
        return delta.filter(self._expr)

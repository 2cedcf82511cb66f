"""Selection (paper 5.2.3): stateless; passes the delta rows that satisfy the condition, annotations unchanged.

A condition over a value Spark computes in an order-dependent way (a float SUM/AVG, see
``imp_core.engine.order_dependence``) is evaluated *conservatively*: a row passes when the condition is TRUE for some
value in the intervals its input carries, so the sketch keeps every group that some summation order lets through.
Such a selection also records in ``__certain`` which rows pass for every value (what a top-k above needs).
"""

from __future__ import annotations

import polars as pl

from imp_core.engine.evaluate import compile_expr
from imp_core.engine.operators.base import Operator
from imp_core.engine.order_dependence import CERTAIN, IntervalCompiler
from imp_core.plan.expr import Expr


class Selection(Operator):
    kind = "selection"

    def __init__(self, op_id: str, predicate: Expr, bounded: frozenset[str] | set[str] = frozenset(),
                 conservative: bool = False, flagged_input: bool = False, flagged_output: bool = False) -> None:
        """``bounded``: the input columns that carry intervals; with ``conservative`` the condition is decided from
        them; ``flagged_*``: whether the input/output carries ``__certain``."""
        super().__init__(op_id)
        self.predicate = predicate
        self.conservative = conservative
        self._expr = compile_expr(predicate).fill_null(False)
        if conservative:
            self._ic = IntervalCompiler(bounded)
            may_true, may_false = self._ic.may(predicate)
            surely = ~may_false
            if flagged_input:
                surely = pl.col(CERTAIN) & surely
            self._cols = [may_true.alias("__may")] + ([surely.alias(CERTAIN)] if flagged_output else [])

    def process(self, delta: pl.DataFrame) -> pl.DataFrame:
        if not self.conservative:
            return delta if delta.height == 0 else delta.filter(self._expr)
        lazy = delta.lazy()
        for stage in self._ic.stages:
            lazy = lazy.with_columns(stage)
        out = lazy.with_columns(self._cols).filter(pl.col("__may")).drop(["__may", *self._ic.temps()])
        return out.collect(engine="in-memory")

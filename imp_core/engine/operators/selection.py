"""Selection (paper 5.2.3): stateless; passes the delta rows that satisfy the condition, annotations unchanged.

A condition over an order-dependent float SUM/AVG is decided conservatively from the intervals its input carries
(``imp_core.engine.order_dependence``). See docs/ARCHITECTURE.md, "Operators".
"""

from __future__ import annotations

import polars as pl

from imp_core.engine import frames
from imp_core.engine.evaluate import compile_expr
from imp_core.engine.interval_select import compile_may
from imp_core.engine.operators.base import UnaryOperator
from imp_core.engine.operators.context import BuildContext
from imp_core.engine.order_dependence import IntervalCompiler
from imp_core.engine.schema import CERTAIN
from imp_core.plan.expr import Expr
from imp_core.plan.nodes import Plan, Select


class Selection(UnaryOperator):
    kind = "select"

    def __init__(self, op_id: str, predicate: Expr, bounded: frozenset[str] | set[str] = frozenset(),
                 conservative: bool = False, flagged_input: bool = False, flagged_output: bool = False) -> None:
        """``bounded``: the input columns that carry intervals; with ``conservative`` a row passes when the
        condition is TRUE for some value in them; ``flagged_*``: whether the input/output carries ``__certain``
        (the rows that pass for every value)."""
        super().__init__(op_id)
        self.predicate = predicate
        self.conservative = conservative
        self._expr = compile_expr(predicate).fill_null(False)
        self._flags = (flagged_input, flagged_output)
        self._numpy = None
        if conservative:
            self._ic = IntervalCompiler(bounded)
            may_true, may_false = self._ic.may(predicate)
            surely = ~may_false
            if flagged_input:
                surely = pl.col(CERTAIN) & surely
            self._cols = [may_true.alias("__may")] + ([surely.alias(CERTAIN)] if flagged_output else [])
            if not self._ic.stages:  # the same decision in NumPy where the predicate's shape allows
                self._numpy = compile_may(predicate, self._ic.bounded)

    @classmethod
    def from_node(cls, node: Plan, ctx: BuildContext) -> Selection:
        assert isinstance(node, Select)
        role = ctx.role(node)
        return cls(ctx.op_id(cls.kind), node.predicate, ctx.bounded_input(node), role.conservative,
                   role.flagged_input, role.flagged_output)

    def process(self, delta: pl.DataFrame) -> pl.DataFrame:
        if not self.conservative:
            return delta if delta.height == 0 else delta.filter(self._expr)
        flagged_input, flagged_output = self._flags
        if self._numpy is not None and delta.height and not (flagged_input and delta.get_column(CERTAIN).null_count()):
            may_true, may_false = self._numpy(delta)
            if flagged_output:
                surely = ~may_false
                if flagged_input:
                    surely &= delta.get_column(CERTAIN).to_numpy()
                delta = frames.with_series(delta, frames.series(CERTAIN, surely))
            return frames.rows(delta, may_true)
        lazy = delta.lazy()
        for stage in self._ic.stages:
            lazy = lazy.with_columns(stage)
        out = lazy.with_columns(self._cols).filter(pl.col("__may")).drop(["__may", *self._ic.temps()])
        return out.collect(engine="in-memory")


__all__ = ["Selection"]

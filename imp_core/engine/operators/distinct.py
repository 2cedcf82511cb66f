"""Duplicate elimination δ (DISTINCT): an aggregation with every input column a key and no aggregates.

A row is in the output (once) while its count is positive; its annotation is the union of its copies' fragments.
See docs/ARCHITECTURE.md, "Operators".
"""

from __future__ import annotations

from imp_core.engine.evaluate import polars_type
from imp_core.engine.operators.aggregation import Aggregation
from imp_core.engine.operators.context import BuildContext
from imp_core.plan.expr import Col
from imp_core.plan.nodes import Distinct, Field, Plan


class DistinctOp(Aggregation):
    kind = "distinct"

    def __init__(self, op_id: str, columns: tuple[Field, ...], fingerprint: str = "") -> None:
        super().__init__(op_id, tuple((f.name, Col(f.name, f.dtype)) for f in columns), (),
                         {f.name: polars_type(f.dtype) for f in columns}, fingerprint)

    @classmethod
    def from_node(cls, node: Plan, ctx: BuildContext) -> DistinctOp:
        assert isinstance(node, Distinct)
        return cls(ctx.op_id(cls.kind), node.child.schema, ctx.fingerprint)


__all__ = ["DistinctOp"]

"""Which operator class maintains each kind of plan node, and what building one needs besides the node.

See docs/ARCHITECTURE.md, "How to add an operator".
"""

from __future__ import annotations

from dataclasses import dataclass

from imp_core.engine.annotation import AnnotationLayout
from imp_core.engine.operators.aggregation import Aggregation
from imp_core.engine.operators.base import Operator
from imp_core.engine.operators.distinct import DistinctOp
from imp_core.engine.operators.join import JoinCaching, JoinOp
from imp_core.engine.operators.projection import Projection
from imp_core.engine.operators.selection import Selection
from imp_core.engine.operators.table_access import TableAccess
from imp_core.engine.operators.topk import TopKOp
from imp_core.engine.order_dependence import NodeRole, OrderDependence
from imp_core.errors import UnsupportedError
from imp_core.plan.nodes import Aggregate, Distinct, Join, Plan, Project, Scan, Select, TopK


@dataclass(frozen=True)
class BuildContext:
    """What building the operator of the node at ``path`` needs besides the node: how scans are annotated, the
    plan's order-dependence analysis (None: no operator decides conservatively), the plan fingerprint its state is
    tied to, and the optimizations that shape state."""

    path: str
    annotations: AnnotationLayout
    order_dependence: OrderDependence | None = None
    fingerprint: str = ""
    topk_buffer: int = 0
    minmax_buffer: int = 0
    join_caching: JoinCaching | None = None

    def op_id(self, kind: str) -> str:
        """The operator's id in saved state: ``<kind>@<node path>``."""
        return f"{kind}@{self.path}"

    def role(self, node: Plan) -> NodeRole:
        return self.order_dependence.role(node) if self.order_dependence is not None else NodeRole()

    def bounded_input(self, node: Plan) -> frozenset[str]:
        return self.order_dependence.bounded_input(node) if self.order_dependence is not None else frozenset()


OPERATORS: dict[type[Plan], type[Operator]] = {
    Scan: TableAccess,
    Select: Selection,
    Project: Projection,
    Join: JoinOp,
    Aggregate: Aggregation,
    Distinct: DistinctOp,
    TopK: TopKOp,
}


def build_operator(node: Plan, ctx: BuildContext) -> Operator:
    """The incremental operator for ``node``.

    Raises:
        UnsupportedError: No operator maintains this kind of node.
    """
    cls = OPERATORS.get(type(node))
    if cls is None:
        raise UnsupportedError(f"plan node {type(node).__name__} has no incremental operator")
    return cls.from_node(node, ctx)


__all__ = ["OPERATORS", "BuildContext", "build_operator"]

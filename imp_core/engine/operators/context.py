"""What building an operator needs besides its plan node: the node's path, the annotation of the plan's scans, the
order-dependence analysis, the plan fingerprint and the optimizations that shape state.

See docs/ARCHITECTURE.md, "Operators".
"""

from __future__ import annotations

from dataclasses import dataclass

from imp_core.engine.annotation import AnnotationLayout
from imp_core.engine.order_dependence import NodeRole, OrderDependence
from imp_core.plan.nodes import Plan


@dataclass(frozen=True)
class JoinCaching:
    """Which side caches a join may build (``imp_core.config.Optimizations``)."""

    bloom: bool = True
    small_rows: int = 0  # 0: never keep a side whole
    partner_rows: int = 0  # 0: no partner index
    keyed: bool = True  # a partner index keyed by join key (False: the first engine's frames, rewritten per batch)


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
    topk_index: bool = True  # False: the first engine's top-k state (every row, re-sorted per batch)
    agg_index: bool = True  # False: the first engine's aggregation state (whole frames rewritten per batch)
    minmax_buffer: int = 0
    join_caching: JoinCaching | None = None

    def op_id(self, kind: str) -> str:
        """The operator's id in saved state: ``<kind>@<node path>``."""
        return f"{kind}@{self.path}"

    def role(self, node: Plan) -> NodeRole:
        return self.order_dependence.role(node) if self.order_dependence is not None else NodeRole()

    def bounded_input(self, node: Plan) -> frozenset[str]:
        return self.order_dependence.bounded_input(node) if self.order_dependence is not None else frozenset()


__all__ = ["BuildContext", "JoinCaching"]

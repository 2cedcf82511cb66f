"""Which operator class maintains each kind of plan node, and what building one needs besides the node.

See docs/ARCHITECTURE.md, "How to add an operator".
"""

from __future__ import annotations

from imp_core.engine.operators.aggregation import Aggregation
from imp_core.engine.operators.aggregation_external import ExternalAggregation, ExternalDistinct
from imp_core.engine.operators.anti_join import AntiJoinOp
from imp_core.engine.operators.anti_join_external import ExternalAntiJoin
from imp_core.engine.operators.anti_join_external import has_external_form as anti_join_external
from imp_core.engine.operators.base import Operator
from imp_core.engine.operators.context import BuildContext
from imp_core.engine.operators.distinct import DistinctOp
from imp_core.engine.operators.group_topk import GroupTopKOp
from imp_core.engine.operators.group_topk_external import ExternalGroupTopK
from imp_core.engine.operators.group_topk_external import has_external_form as ranking_external
from imp_core.engine.operators.join import JoinOp
from imp_core.engine.operators.projection import Projection
from imp_core.engine.operators.selection import Selection
from imp_core.engine.operators.table_access import TableAccess
from imp_core.engine.operators.topk import TopKOp
from imp_core.engine.operators.union import UnionOp
from imp_core.errors import UnsupportedError
from imp_core.plan.nodes import Aggregate, AntiJoin, Distinct, GroupTopK, Join, Plan, Project, Scan, Select, TopK, Union

OPERATORS: dict[type[Plan], type[Operator]] = {
    Scan: TableAccess,
    Select: Selection,
    Project: Projection,
    Join: JoinOp,
    AntiJoin: AntiJoinOp,
    Union: UnionOp,
    Aggregate: Aggregation,
    Distinct: DistinctOp,
    TopK: TopKOp,
    GroupTopK: GroupTopKOp,
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


# the operators that can keep their state outside the process (engine/external.py), by node type
EXTERNAL: dict[type[Plan], type[Operator]] = {Aggregate: ExternalAggregation, Distinct: ExternalDistinct,
                                               GroupTopK: ExternalGroupTopK, AntiJoin: ExternalAntiJoin}


def can_be_external(node: Plan) -> bool:
    """Whether ``node``'s operator has an external form: a grouped aggregation (one without GROUP BY has one row),
    a DISTINCT, a top-k per group partitioned by keys other than floats, a NOT EXISTS or NOT IN on keys other than
    floats."""
    if isinstance(node, Aggregate):
        return bool(node.keys)
    if isinstance(node, GroupTopK):
        return ranking_external(node)
    if isinstance(node, AntiJoin):
        return anti_join_external(node)
    return type(node) in EXTERNAL


def build_external(node: Plan, ctx: BuildContext) -> Operator:
    """The operator for ``node`` with its state in a store outside the process.

    Raises:
        UnsupportedError: The node's operator has no external form.
    """
    if not can_be_external(node):
        raise UnsupportedError(f"a {type(node).__name__} keeps its state in memory only")
    return EXTERNAL[type(node)].from_node(node, ctx)


__all__ = ["EXTERNAL", "OPERATORS", "build_external", "build_operator", "can_be_external"]

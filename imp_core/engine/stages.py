"""The stages of a pipeline (plan nodes bound to their operators) and the walks a pass makes over them: which
subtrees follow from operator state, and which of those keep their state outside the process.

See docs/ARCHITECTURE.md, "Passes and backends" and "Where state lives".
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import polars as pl

from imp_core.engine.external import ExternalOperator
from imp_core.engine.operators.aggregation_external import ExternalAggregation, ExternalDistinct
from imp_core.engine.operators.anti_join import AntiJoinOp
from imp_core.engine.operators.anti_join_external import ExternalAntiJoin
from imp_core.engine.operators.base import Operator, OutputStateOperator
from imp_core.engine.operators.group_topk_external import ExternalGroupTopK
from imp_core.engine.operators.projection import Projection
from imp_core.engine.operators.selection import Selection
from imp_core.plan.expr import Col
from imp_core.plan.nodes import Plan


@dataclass(eq=False)
class Stage:
    """A plan node bound to its operator; ``path`` is the node's position (``r``, ``r.0``, ``r.0.1``, ...).

    ``from_state``: the node's current contents follow from operator state alone (its operator keeps its output, or
    every input does), so a join reads them in memory, never from the tables. Decided once, when the tree is built.
    """

    path: str
    node: Plan
    op: Operator
    inputs: tuple[Stage, ...]
    tables: frozenset[str] = field(default_factory=frozenset)
    stateless: bool = True
    from_state: bool = False

    def walk(self) -> Iterator[Stage]:
        yield self
        for s in self.inputs:
            yield from s.walk()


def is_external(stage: Stage) -> bool:
    """Whether ``stage``'s operator keeps its state outside the process."""
    return isinstance(stage.op, ExternalOperator)


def holds_external(stage: Stage) -> bool:
    """Whether ``stage`` or a stage below it keeps its state outside the process."""
    return any(is_external(s) for s in stage.walk())


def backend_roots(stage: Stage) -> Iterator[Stage]:
    """Like :func:`state_roots`, but through the stateless operators above external operators (projections,
    selections, joins, unions a backend computes itself): the operators whose results a capture on the backend
    reads, external or in memory."""
    if stage.from_state and (is_external(stage) or isinstance(stage.op, (OutputStateOperator, AntiJoinOp))
                             or not holds_external(stage)):
        yield stage
        return
    for s in stage.inputs:
        yield from backend_roots(s)


def external_below(stage: Stage) -> bool:
    """Whether ``stage``'s contents come from external state through projections and selections only."""
    while isinstance(stage.op, (Projection, Selection)):
        stage = stage.inputs[0]
    return isinstance(stage.op, ExternalOperator)


def contents_for(stage: Stage, wanted: pl.DataFrame) -> pl.DataFrame | None:
    """``stage``'s current rows whose columns equal a row of ``wanted`` (its columns named as ``stage``'s output):
    read from the external state below for those keys only, through rename-only projections and selections; None
    when a key is not a group key (or plain partition column) down there."""
    op = stage.op
    if isinstance(op, Selection):
        below = contents_for(stage.inputs[0], wanted)
        return None if below is None else op.process(below)
    if isinstance(op, Projection):
        renames = {name: e.name for name, e in op.items if isinstance(e, Col)}
        if not set(wanted.columns) <= set(renames):
            return None
        below = contents_for(stage.inputs[0], wanted.rename({c: renames[c] for c in wanted.columns}))
        return None if below is None else op.process(below)
    if isinstance(op, (ExternalAggregation, ExternalDistinct)):
        plain = {n for n, _ in op.keys} - set(op.layout.float_keys)
        if not set(wanted.columns) <= plain:
            return None
        return op.output_for(wanted)
    if isinstance(op, (ExternalGroupTopK, ExternalAntiJoin)):
        return op.output_for(wanted)
    return None


def state_roots(stage: Stage) -> Iterator[Stage]:
    """The topmost stages below ``stage`` (or ``stage`` itself) whose contents follow from operator state."""
    if stage.from_state:
        yield stage
        return
    for s in stage.inputs:
        yield from state_roots(s)


__all__ = ["Stage", "backend_roots", "contents_for", "external_below", "holds_external", "is_external", "state_roots"]

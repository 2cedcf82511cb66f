"""The columns a query reads: each scan narrowed to the columns some operator above it uses.

A sketch stores its plan with narrowed scans, so maintenance reads, keeps and checks only those columns: a column no
sketch of a table reads can be renamed, dropped or widened without touching the sketch (docs/SEMANTICS.md,
"Lifecycle"), and change rows, Spark scans and operator state carry nothing the answer does not depend on.

A column is kept when an expression of the plan reads it, the answer returns it, or an operator's result depends on
all its input columns (DISTINCT, UNION ALL's positions); ``keep`` adds columns per table (a partition column the
query itself may not read). Operators other than scans are not rewritten: every expression still finds its columns.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from imp_core.plan.expr import Col
from imp_core.plan.nodes import (
    Aggregate,
    AntiJoin,
    Distinct,
    GroupTopK,
    Join,
    Plan,
    Project,
    Scan,
    Select,
    TopK,
    Union,
)


def narrowed(plan: Plan, keep: Mapping[str, set[str]] | None = None) -> Plan:
    """``plan`` with every scan narrowed to the columns it needs (plus ``keep[table]``), in the table's order, and the
    projections and UNION ALL branches between them and the answer narrowed to what is read above them."""
    wanted: dict[int, set[str]] = {}
    _need(plan, set(plan.names), wanted)
    keep = keep or {}
    built: dict[int, Plan] = {}

    def rebuild(node: Plan) -> Plan:
        if id(node) in built:
            return built[id(node)]
        mine = wanted.get(id(node), set())
        out: Plan
        if isinstance(node, Scan):
            cols = tuple(
                c for c in node.columns if node.qualified(c.name) in mine or c.name in keep.get(node.table, set())
            )
            out = node if len(cols) == len(node.columns) else replace(node, columns=cols or node.columns[:1])
        elif isinstance(node, Project):
            items = tuple(i for i in node.items if i[0] in mine) or node.items[:1]
            out = replace(node, child=rebuild(node.child), items=items)
        elif isinstance(node, (Join, AntiJoin)):
            out = replace(node, left=rebuild(node.left), right=rebuild(node.right))
        elif isinstance(node, Union):
            names = _kept(node, mine)
            out = replace(node, inputs=tuple(_positions(rebuild(i), names) for i in node.inputs))
        elif isinstance(node, (Select, Aggregate, Distinct, TopK, GroupTopK)):
            out = replace(node, child=rebuild(node.child))
        else:
            raise AssertionError(f"no rebuild rule for {type(node).__name__}")
        built[id(node)] = out
        return out

    return rebuild(plan)


def read_columns(plan: Plan, table: str) -> list[str]:
    """The columns of ``table`` the plan's scans read, in the table's order."""
    out: list[str] = []
    for scan in plan.scans():
        if scan.table == table:
            out += [c.name for c in scan.columns if c.name not in out]
    return out


def _need(node: Plan, wanted: set[str], needed: dict[int, set[str]]) -> None:
    """Record, per node, the columns of its output the operators above read (a node reached twice, a shared
    subplan, needs the union), and walk down with what it reads itself."""
    mine = needed.setdefault(id(node), set())
    mine |= wanted & set(node.names)
    if isinstance(node, (Join, AntiJoin)):
        cond = node.condition.columns() if node.condition is not None else set()
        _need(node.left, mine | cond, needed)
        _need(node.right, (mine if isinstance(node, Join) else set()) | cond, needed)
    elif isinstance(node, Union):
        for branch in node.inputs:
            _need(branch, set(_kept(node, mine)), needed)  # the branches keep the same positions
    elif not isinstance(node, Scan):
        _need(node.children[0], _reads(node, mine), needed)


def _reads(node: Plan, mine: set[str]) -> set[str]:
    """The columns of its input a one-input operator reads when ``mine`` of its output are read above it."""
    if isinstance(node, Project):
        items = [e for name, e in node.items if name in mine] or [node.items[0][1]]
        return set().union(*(e.columns() for e in items))
    if isinstance(node, Select):
        return mine | node.predicate.columns()
    if isinstance(node, Aggregate):  # every key groups, every aggregate is kept
        return set().union(*(e.columns() for _, e in node.keys), *(a.columns() for _, a in node.aggs))
    if isinstance(node, TopK):
        return mine | set().union(*(k.expr.columns() for k in node.order))
    if isinstance(node, GroupTopK):
        return mine | set().union(*(e.columns() for e in node.partition), *(k.expr.columns() for k in node.order))
    if isinstance(node, Distinct):
        return set(node.child.names)  # every column decides a duplicate
    raise AssertionError(f"no column rule for {type(node).__name__}")


def _kept(node: Union, mine: set[str]) -> tuple[str, ...]:
    """The union's output columns read above it, in order (its first when none is: rows must stay rows)."""
    return tuple(n for n in node.names if n in mine) or node.names[:1]


def _positions(branch: Plan, names: tuple[str, ...]) -> Plan:
    """A union branch narrowed to ``names``: a projection of them unless it already has exactly those columns."""
    if branch.names == names:
        return branch
    return Project(branch, tuple((n, Col(n, branch.field(n).dtype)) for n in names))


__all__ = ["narrowed", "read_columns"]

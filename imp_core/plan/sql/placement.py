"""Predicate placement: the join tree of a query block's FROM items, each conjunct pushed as low as it can go.

See docs/ARCHITECTURE.md, "The plan IR" (what the front-end guarantees).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from imp_core.plan.expr import BOOL, Expr, Lit, conjoin
from imp_core.plan.nodes import Join, Plan, Select
from imp_core.plan.sql.scope import Scope

_Linked = tuple[Expr, frozenset[int]]  # a condition over several FROM items and the items it reads


@dataclass
class _Pool:
    """The conjuncts of ON and WHERE sorted by the FROM items they read."""

    local: list[list[Expr]]  # per FROM item: conditions over that item only
    constant: list[Expr] = field(default_factory=list)  # conditions over no item
    linked: list[_Linked] = field(default_factory=list)


def place(scope: Scope, conds: list[Expr]) -> Plan:
    """Build the join tree of the FROM items with every conjunct pushed as low as it can go.

    Items connected by conditions are joined in FROM order, preferring an item that a condition connects to those
    already joined, so no cross product is built where a join condition exists; unconnected groups are crossed.
    """
    pool = _pool(scope, conds)
    plans = []
    for item, preds in zip(scope.items, pool.local):
        pred = conjoin(preds)
        plans.append(item.plan if pred is None else Select(item.plan, pred))
    result: Plan | None = None
    for members in _components(len(plans), pool.linked):
        plan = _join_component(members, plans, pool.linked)
        result = plan if result is None else Join(result, plan)
    assert result is not None
    constant = conjoin(pool.constant)
    return result if constant is None else Select(result, constant)


def _pool(scope: Scope, conds: list[Expr]) -> _Pool:
    pool = _Pool([[] for _ in scope.items])
    seen: list[Expr] = []
    for c in conds:
        if c in seen or c == Lit(True, BOOL):
            continue  # `a JOIN b ON x WHERE x` and `JOIN ... ON TRUE`
        seen.append(c)
        refs = frozenset(scope.owner[name] for name in c.columns())
        if not refs:
            pool.constant.append(c)
        elif len(refs) == 1:
            pool.local[next(iter(refs))].append(c)
        else:
            pool.linked.append((c, refs))
    return pool


def _components(n: int, linked: list[_Linked]) -> list[list[int]]:
    """The connected components of the join graph (items as nodes, conditions as edges), in FROM order."""
    component = list(range(n))

    def root(i: int) -> int:
        while component[i] != i:
            i = component[i]
        return i

    for _, refs in linked:
        first, *rest = sorted(refs)
        for r in rest:
            component[root(r)] = root(first)
    groups: dict[int, list[int]] = {}
    for i in range(n):
        groups.setdefault(root(i), []).append(i)
    return sorted(groups.values())


def _join_component(members: list[int], plans: list[Plan], linked: list[_Linked]) -> Plan:
    """Join one component's items; each condition goes into the first join that covers its items."""
    joined = {members[0]}
    plan = plans[members[0]]
    remaining = members[1:]
    pending = [m for m in linked if m[1] <= set(members)]
    while remaining:
        pick = next((i for i in remaining if any(i in refs and refs <= joined | {i} for _, refs in pending)), None)
        if pick is None:  # only conditions over three or more items link the rest
            pick = next((i for i in remaining if any(i in refs and refs & joined for _, refs in pending)), remaining[0])
        joined.add(pick)
        remaining.remove(pick)
        here = [m for m in pending if m[1] <= joined]
        pending = [m for m in pending if not m[1] <= joined]
        plan = Join(plan, plans[pick], conjoin([c for c, _ in here]))
    return plan

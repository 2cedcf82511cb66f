"""Aggregation: the Aggregate node of a query block and its SELECT, HAVING and ORDER BY rewritten over its outputs.

See docs/ARCHITECTURE.md, "The plan IR".
"""

from __future__ import annotations

from sqlglot import exp

from imp_core.plan.expr import AggCall, Col, Expr, substitute
from imp_core.plan.nodes import Aggregate, Plan
from imp_core.plan.sql.positions import Locator
from imp_core.plan.sql.scope import OrderItem, Scope, SelectItem, free_name


def aggregate(loc: Locator, source: Plan, scope: Scope, items: list[SelectItem], keys: list[Expr],
              having: Expr | None, order: list[OrderItem], node: exp.Select
              ) -> tuple[Plan, list[Expr], Expr | None, list[Expr | None]]:
    """The Aggregate node, and the SELECT / HAVING / ORDER BY expressions rewritten over its outputs.

    Raises:
        PlanError: A column outside GROUP BY is used outside an aggregate function.
    """
    used: set[str] = set()
    key_names = [free_name(_key_candidates(i, k, keys, items, scope), used) for i, k in enumerate(keys)]
    aggs: list[AggCall] = []
    for e in [it.expr for it in items] + [having] + [o.expr for o in order]:
        for sub in (e.walk() if e is not None else ()):
            if isinstance(sub, AggCall) and sub not in aggs:
                aggs.append(sub)
    agg_names = [free_name([it.name for it in items if it.alias and it.expr == a][:1] + [f"__agg{i}"], used)
                 for i, a in enumerate(aggs)]

    agg = Aggregate(source, tuple(zip(key_names, keys)), tuple(zip(agg_names, aggs)))
    mapping: dict[Expr, Expr] = {k: Col(n, k.dtype) for n, k in zip(key_names, keys)}
    mapping.update({a: Col(n, a.dtype) for n, a in zip(agg_names, aggs)})
    grouped = set(keys)

    def over_groups(e: Expr, what: str, at: exp.Expression) -> Expr:
        col = _ungrouped(e, grouped)
        if col is not None:
            bare = scope.bare[col.name]
            at = next((c for c in at.find_all(exp.Column) if c.name.lower() == bare.lower()), at)
            raise loc.error(f"{what}: column {col.name} is neither in GROUP BY nor inside an aggregate function",
                            at, f"add it to GROUP BY or aggregate it, e.g. MAX({bare})")
        return substitute(e, mapping)

    item_exprs = []
    for it in items:
        at = next((s for s in node.expressions if s.alias_or_name == it.name), node)
        item_exprs.append(over_groups(it.expr, f"SELECT item {it.name}", at))
    new_having = over_groups(having, "HAVING", node.args["having"]) if having is not None else None
    order_exprs: list[Expr | None] = [
        over_groups(o.expr, "ORDER BY", node.args["order"]) if o.expr is not None else None for o in order]
    return agg, item_exprs, new_having, order_exprs


def _key_candidates(i: int, key: Expr, keys: list[Expr], items: list[SelectItem], scope: Scope) -> list[str]:
    """Names for grouping key ``i``, best first: its SELECT alias, its bare column name when no other key has the
    same one, its plan column name, ``__key{i}``."""
    candidates = [it.name for it in items if it.alias and it.expr == key][:1]
    if isinstance(key, Col):
        bare = scope.bare.get(key.name, key.name)
        same = [o for o in keys if isinstance(o, Col) and scope.bare.get(o.name, o.name).lower() == bare.lower()]
        if len(same) == 1:
            candidates.append(bare)
        candidates.append(key.name)
    candidates.append(f"__key{i}")
    return candidates


def _ungrouped(e: Expr, grouped: set[Expr]) -> Col | None:
    """The first column of ``e`` outside a grouped expression or aggregate (top-down, like ``substitute``)."""
    if e in grouped or isinstance(e, AggCall):
        return None
    if isinstance(e, Col):
        return e
    for child in e.children():
        found = _ungrouped(child, grouped)
        if found is not None:
            return found
    return None

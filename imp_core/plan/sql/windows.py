"""Ranking windows filtered by a constant: ``ROW_NUMBER() / RANK() / DENSE_RANK() OVER (PARTITION BY p ORDER BY o)``
in a SELECT list, with ``rank <= N`` in the enclosing query, as one top-k per group (``GroupTopK``).

A ranking over every row cannot be maintained with the paper's annotations (a row's rank depends on every row before
it); its first ``N`` rows per group can, as top-k does. So a block's ranking becomes an unbounded ``GroupTopK``, and
after the whole statement is translated, ``bound_rankings`` gives each one the bound of a filter on its rank column
(``rn <= N``, ``rn < N``, ``rn = N``, ``rn BETWEEN a AND N``, ``rn IN (...)``) found above it through Projects and
Selects; the filter itself stays. A ranking left unbounded is refused. See docs/SQL.md, "Top-k per group".
"""

from __future__ import annotations

import dataclasses

from sqlglot import exp

from imp_core.plan.expr import Col, Expr, conjuncts
from imp_core.plan.needed import ranking_below, upper_bound
from imp_core.plan.nodes import RANK_TYPE, GroupTopK, Plan, Select, SortKey
from imp_core.plan.sql.positions import Locator
from imp_core.plan.sql.scope import Scope

RANKINGS = {exp.RowNumber: "row_number", exp.Rank: "rank", exp.DenseRank: "dense_rank"}
HINT = ("rank in a subquery in FROM and filter the rank with a constant in the enclosing query: "
        "SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY g ORDER BY v DESC) AS rn FROM t) WHERE rn <= 3")


class Windows:
    """A mixin of the query translator: the ranking window of a SELECT list."""

    loc: Locator
    _rankings: int

    def _windows(self, node: exp.Select, scope: Scope, source: Plan) -> Plan:
        """``source`` under the select list's ranking window, if any (an unbounded ``GroupTopK`` whose rank column
        the select list then reads through ``scope.windows``)."""
        windows = [w for e in node.expressions for w in e.find_all(exp.Window)]
        if not windows:
            return source
        if len(windows) > 1:
            raise self.loc.unsupported("more than one window function in a SELECT list", windows[1], HINT)
        w = windows[0]
        if node.args.get("group") is not None or node.args.get("having") is not None or \
                any(a.find_ancestor(exp.Window) is None for e in node.expressions for a in e.find_all(exp.AggFunc)):
            raise self.loc.unsupported("a window function in a query block with GROUP BY or aggregates", w,
                                       "aggregate in a subquery in FROM and rank its rows in the enclosing query")
        function = RANKINGS.get(type(w.this))
        if function is None:
            raise self.loc.unsupported(f"the window function {w.this.sql(dialect='spark')} OVER (...)", w,
                                       "only ROW_NUMBER(), RANK() and DENSE_RANK() filtered by a constant are "
                                       "supported (top-k per group)")
        if w.args.get("spec") is not None:
            raise self.loc.unsupported("a window frame on a ranking function", w.args["spec"],
                                       "ranking functions take no frame: remove ROWS/RANGE BETWEEN ...")
        order_node = w.args.get("order")
        if order_node is None or w.args.get("alias") is not None:
            raise self.loc.unsupported(f"{function.upper()}() without ORDER BY in its OVER clause", w,
                                       "write OVER (PARTITION BY ... ORDER BY ...)")
        partition = tuple(self._expr(p, scope, "PARTITION BY") for p in w.args.get("partition_by") or [])
        order = []
        for o in order_node.expressions:
            desc = bool(o.args.get("desc"))
            nulls_first = o.args.get("nulls_first")
            nulls = None if nulls_first is None or bool(nulls_first) == (not desc) else bool(nulls_first)
            order.append(SortKey(self._expr(o.this, scope, "OVER (ORDER BY ...)"), desc, nulls))
        name = f"__rank{self._rankings}"
        self._rankings += 1
        scope.windows[id(w)] = Col(name, RANK_TYPE)
        return GroupTopK(source, partition, tuple(order), function, name)

    def _expr(self, node: exp.Expression, scope: Scope, clause: str, aliases: dict[str, Expr] | None = None,
              allow_aggs: bool = False) -> Expr:
        raise NotImplementedError  # QueryTranslator._expr


def bound_rankings(plan: Plan, loc: Locator, statement: exp.Expression) -> Plan:
    """``plan`` with every unbounded ``GroupTopK`` bounded by the filter on its rank above it.

    Raises:
        UnsupportedError: A ranking has no such filter.
    """
    if not any(isinstance(n, GroupTopK) and n.k is None for n in plan.walk()):
        return plan
    out = _bound(plan)
    if any(isinstance(n, GroupTopK) and n.k is None for n in out.walk()):
        window = statement.find(exp.Window)
        raise loc.unsupported("a ranking window whose rank is not filtered by a constant bound",
                              window if window is not None else statement, HINT)
    return out


def _bound(node: Plan) -> Plan:
    if isinstance(node, Select):
        node = _fused(node) or node
    kids = tuple(_bound(c) for c in node.children)
    return node if kids == node.children else _with_children(node, kids)


def _fused(select: Select) -> Plan | None:
    """``select`` with the unbounded ranking below it (through Projects and Selects) bounded by the select's
    conditions on the rank, or None."""
    found = ranking_below(select)
    if found is None or found[0].k is not None:
        return None
    node, name = found
    bounds = [b for c in conjuncts(select.predicate) for b in [upper_bound(c, name)] if b is not None]
    if not bounds:
        return None
    bounded: Plan = dataclasses.replace(node, k=max(min(bounds), 0))
    chain: list[Plan] = []
    n = select.child
    while n is not node:
        chain.append(n)
        n = n.children[0]
    for p in reversed(chain):
        bounded = _with_children(p, (bounded,))
    return _with_children(select, (bounded,))


def _with_children(node: Plan, kids: tuple[Plan, ...]) -> Plan:
    """``node`` over ``kids`` (its constructor re-checks it)."""
    fields = {f.name for f in dataclasses.fields(node)}  # type: ignore[arg-type]
    if "child" in fields:
        return dataclasses.replace(node, child=kids[0])  # type: ignore[type-var]
    if "inputs" in fields:
        return dataclasses.replace(node, inputs=kids)  # type: ignore[type-var]
    return dataclasses.replace(node, left=kids[0], right=kids[1])  # type: ignore[type-var]


__all__ = ["HINT", "Windows", "bound_rankings"]

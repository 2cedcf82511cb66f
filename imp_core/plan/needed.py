"""Which rows of a plan's nodes the answer needs, for the safety check (``imp_core.plan.safety``).

Shapes of a plan that the safety rules ask about: the nodes every answer row is derived from, the top-k nodes whose
every output row reaches the answer, one-row aggregates compared so that NULL matches nothing. See docs/SAFETY.md.
"""

from __future__ import annotations

from imp_core.plan.expr import Between, Binary, Cast, Col, Expr, InList, IsNull, Lit, Unary, conjuncts
from imp_core.plan.nodes import RANK_TYPE, Aggregate, AntiJoin, Distinct, GroupTopK, Plan, Project, Select, TopK, Union

_FLIP = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "=": "="}

_COMPARISONS = ("=", "<>", "<", "<=", ">", ">=")
_NULL_PROPAGATING = ("+", "-", "*", "/")
_NULL_ON_NO_ROWS = ("sum", "avg", "min", "max")


def null_rejecting(e: Expr) -> bool:
    """A comparison of NULL-propagating expressions: NULL (unknown) when an operand is NULL, so it matches nothing."""
    return isinstance(e, Binary) and e.op in _COMPARISONS and propagates(e.left) and propagates(e.right)


def propagates(e: Expr) -> bool:
    if isinstance(e, (Col, Lit)):
        return True
    if isinstance(e, Binary) and e.op in _NULL_PROPAGATING:
        return propagates(e.left) and propagates(e.right)
    if isinstance(e, Unary) and e.op == "neg":
        return propagates(e.arg)
    return isinstance(e, Cast) and propagates(e.arg)


def scalar_aggregate(side: Plan) -> tuple[Aggregate, bool] | None:
    """The aggregation without GROUP BY at the bottom of ``side``'s projections and filters, if its values are NULL
    over no rows and the projections keep NULL NULL; with whether a filter rejects a NULL value."""
    null_rejected = False
    node = side
    while isinstance(node, (Project, Select)):
        if isinstance(node, Project) and not all(propagates(e) for _, e in node.items):
            return None
        if isinstance(node, Select):
            p = node.predicate
            null_rejected |= null_rejecting(p) or (isinstance(p, IsNull) and p.negated)
        node = node.child
    if not isinstance(node, Aggregate) or node.keys:
        return None
    if not all(a.func in _NULL_ON_NO_ROWS for _, a in node.aggs):
        return None
    return node, null_rejected


def result_dependent(plan: Plan) -> set[int]:
    """Nodes every row of the answer is derived from (through filters, projections, joins, the left side of anti
    joins, grouped aggregations, DISTINCT and top-k; not through a union's branch or an aggregation without GROUP BY,
    whose result can have a row that no input row made)."""
    out: set[int] = set()

    def walk(node: Plan) -> None:
        out.add(id(node))
        if isinstance(node, Union) or (isinstance(node, Aggregate) and not node.keys):
            return
        children = node.children[:1] if isinstance(node, AntiJoin) else node.children
        for child in children:
            walk(child)

    walk(plan)
    return out


def fully_needed_topks(plan: Plan) -> set[int]:
    """Top-k nodes (and top-k per group) with only projections, DISTINCT, aggregations and filters that bound the
    rank between them and the result: every row they output is in the provenance of the answer."""
    out: set[int] = set()

    def walk(node: Plan, all_needed: bool) -> None:
        if isinstance(node, (TopK, GroupTopK)) and all_needed:
            out.add(id(node))
        keeps = all_needed and (isinstance(node, (Project, Distinct, Aggregate, Union))
                                or (isinstance(node, Select) and only_rank_bounds(node)))
        for child in node.children:
            walk(child, keeps)

    walk(plan, True)
    return out


def aggregated_ties(plan: Plan) -> str:
    """A reason when an aggregation reads a top-k whose ORDER BY can tie different rows.

    The engine keeps every row tied with the k-th (the paper's Fig. 4), SQL keeps an arbitrary k: a COUNT or SUM
    above would then see other values than the query and a HAVING could decide differently.
    """
    for node in plan.walk():
        if not isinstance(node, Aggregate):
            continue
        for inner in node.child.walk():
            if isinstance(inner, TopK):
                ordered = {k.expr.name for k in inner.order if isinstance(k.expr, Col)}
                if not set(inner.child.names) <= ordered:
                    return ("an aggregation reads ORDER BY ... LIMIT whose order can tie different rows; order by "
                            "all of its columns")
    return ""



def ranking_below(select: Select) -> tuple[GroupTopK, str] | None:
    """The top-k per group under ``select`` through Projects and Selects that keep its rank column, and that
    column's name as ``select`` reads it; None if there is none."""
    chain: list[Plan] = []
    n = select.child
    while isinstance(n, (Project, Select)):
        chain.append(n)
        n = n.child
    if not isinstance(n, GroupTopK):
        return None
    name = n.rank
    for p in reversed(chain):
        if isinstance(p, Project):
            renamed = next((out for out, e in p.items if e == Col(name, RANK_TYPE)), None)
            if renamed is None:
                return None
            name = renamed
    return n, name


def only_rank_bounds(select: Select) -> bool:
    """Whether every condition of ``select`` lets through every rank from 1 to the ``k`` of the top-k per group below
    it (so the select keeps every row of that top-k)."""
    found = ranking_below(select)
    if found is None:
        return False
    node, name = found
    k = node.k
    return k is not None and all(_keeps_first(c, name, k) for c in conjuncts(select.predicate))


def upper_bound(c: Expr, name: str) -> int | None:
    """The largest rank ``c`` lets through when it bounds column ``name`` from above by a constant, else None."""
    found = _rank_values(c, name)
    return None if found is None else found[1]


def _keeps_first(c: Expr, name: str, k: int) -> bool:
    found = _rank_values(c, name)
    if found is None:
        return False
    low, high, listed = found
    if high is None:
        return False
    return set(range(1, k + 1)) <= listed if listed is not None else low <= 1 and high >= k


def _rank_values(c: Expr, name: str) -> tuple[int, int | None, set[int] | None] | None:
    """The ranks a condition ``c`` on column ``name`` lets through: the lowest, the highest (None: no bound) and,
    for IN, the listed ones; None when ``c`` is not a comparison of the rank with integer constants."""
    def rank(e: Expr) -> bool:
        while isinstance(e, Cast):
            e = e.arg
        return isinstance(e, Col) and e.name == name

    def const(e: Expr) -> int | None:
        while isinstance(e, Cast):
            e = e.arg
        return e.value if isinstance(e, Lit) and isinstance(e.value, int) and not isinstance(e.value, bool) else None

    if isinstance(c, Binary) and c.op in _FLIP:
        op, value = (c.op, const(c.right)) if rank(c.left) else (_FLIP[c.op], const(c.left)) if rank(c.right) \
            else (None, None)
        if value is None:
            return None
        return {"<": (1, value - 1), "<=": (1, value), "=": (value, value), ">": (value + 1, None),
                ">=": (value, None)}[op] + (None,)  # type: ignore[index]
    if isinstance(c, Between) and not c.negated and rank(c.arg):
        low, high = const(c.low), const(c.high)
        return None if low is None or high is None else (low, high, None)
    if isinstance(c, InList) and not c.negated and rank(c.arg):
        values = [const(i) for i in c.items]
        if any(v is None for v in values):
            return None
        listed = {v for v in values if v is not None}
        return min(listed), max(listed), listed
    return None


__all__ = ["aggregated_ties", "fully_needed_topks", "null_rejecting", "only_rank_bounds", "propagates",
           "ranking_below", "result_dependent", "scalar_aggregate", "upper_bound"]

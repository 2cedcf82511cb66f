"""Wide decimal sums whose Spark value depends on the order of the rows, and the aggregations that must watch them.

Spark (ANSI off) returns NULL for a grouped SUM/AVG of a DECIMAL(p > 28, s) when a *running* partial sum leaves 38
digits, which depends on the order in which its partitions deliver the rows (6e37, 6e37, −6e37 is NULL; −6e37,
6e37, 6e37 is 6e37). The engine keeps the exact sum (``decimal_sums``), so Spark's value is the engine's or NULL,
and surely the engine's while the group's Σ|x| stays below 10^38 units of the scale: no partial sum is larger.

Where such a value only reaches the answer, or a condition built of null-propagating operations (arithmetic,
casts, comparisons, BETWEEN, IN) under AND/OR/NOT, the engine keeps at least Spark's rows: Kleene logic is monotone,
so a condition TRUE with a NULL is TRUE with any value, and the sketch holds every fragment Spark's answer needs.
Those rows may be *extra* (in the engine's result, not in Spark's), which an inner join, a UNION ALL, a selection
or the left side of NOT EXISTS keep harmless. Every other use (the value ordered, grouped, aggregated, joined on,
tested by IS NULL / COALESCE / CASE, or the extra rows reaching a LIMIT, an aggregation, a DISTINCT or the right
side of NOT EXISTS) *guards* the aggregation: it keeps each wide sum's Σ|x| (in two parts, like the sum) and refuses
a batch that takes a group's Σ|x| beyond 38 digits (``errors.OrderDependentValueError``). See docs/SEMANTICS.md,
"Decimal sums beyond 38 digits".
"""

from __future__ import annotations

from dataclasses import dataclass, field

from imp_core.engine.decimal_sums import is_wide
from imp_core.errors import OrderDependentValueError
from imp_core.plan.expr import AggCall, Between, Binary, Cast, Col, Expr, Func, InList, Unary
from imp_core.plan.nodes import Aggregate, AntiJoin, Distinct, GroupTopK, Join, Plan, Project, Scan, Select, TopK, Union

Origins = frozenset[int]  # ids of the Aggregate nodes a column's or a row's uncertainty comes from
_STRICT_FUNCS = ("abs", "round", "floor", "ceil", "sign", "sqrt", "ln", "exp")  # NULL in, NULL out


def is_order_dependent_decimal(a: AggCall) -> bool:
    """Whether Spark's value of ``a`` is NULL for some orders of the rows and the exact sum for others (a DISTINCT
    one: of its distinct values)."""
    return a.arg is not None and a.func in ("sum", "avg") and is_wide(a.arg.dtype)


def order_dependent(aggregate: str) -> OrderDependentValueError:
    """The refusal of a guarded sum (``aggregate``: which, as "operator ...: SUM(x)") whose group's absolute sum
    reached 10^38 units."""
    return OrderDependentValueError(
        f"{aggregate} of a group adds values whose absolute sum reaches 10^38, so Spark's result (NULL when a "
        f"running sum leaves 38 digits) depends on the order of the rows, and the query uses it beyond a comparison "
        f"(ORDER BY, GROUP BY, a join, an aggregation, COALESCE/CASE/IS NULL); the sketch stays at its last "
        f"version: keep that sum only in comparisons, or cast its argument to DOUBLE"
    )


@dataclass(frozen=True)
class _Facts:
    nullable: dict[str, Origins] = field(default_factory=dict)  # Spark's value is the engine's or NULL
    differ: dict[str, Origins] = field(default_factory=dict)  # Spark's value may differ in other ways
    extra: Origins = frozenset()  # rows that may be here and not in Spark's result

    def origins(self, cols: set[str]) -> tuple[Origins, Origins]:
        """The origins of ``cols`` that are nullable, and those that differ otherwise."""
        n = frozenset().union(*(self.nullable.get(c, frozenset()) for c in cols))
        d = frozenset().union(*(self.differ.get(c, frozenset()) for c in cols))
        return n, d


def guarded_sums(plan: Plan) -> dict[int, frozenset[str]]:
    """Per guarded Aggregate node (by ``id``), the names of its order-dependent decimal sums."""
    analysis = _Analysis()
    analysis.facts(plan)
    return {o: analysis.wide[o] for o in analysis.guarded}


class _Analysis:
    def __init__(self) -> None:
        self.wide: dict[int, frozenset[str]] = {}
        self.guarded: set[int] = set()
        self._memo: dict[int, _Facts] = {}

    def guard(self, *origins: Origins) -> None:
        for o in origins:
            self.guarded |= o

    def facts(self, node: Plan) -> _Facts:
        if id(node) not in self._memo:  # a plan is a DAG: a shared subtree is analysed once
            self._memo[id(node)] = self._node(node, [self.facts(c) for c in node.children])
        return self._memo[id(node)]

    def _node(self, node: Plan, kids: list[_Facts]) -> _Facts:
        if isinstance(node, Scan):
            return _Facts()
        if isinstance(node, Aggregate):
            return self._aggregate(node, kids[0])
        if isinstance(node, Project):
            return _project(node, kids[0])
        if isinstance(node, Select):
            return self._condition(node.predicate, kids[0])
        if isinstance(node, (TopK, GroupTopK)):
            c = kids[0]
            exprs = [k.expr for k in node.order] + (list(node.partition) if isinstance(node, GroupTopK) else [])
            self.guard(*c.origins(set().union(*(e.columns() for e in exprs))), c.extra)
            return c
        if isinstance(node, Distinct):
            c = kids[0]
            self.guard(*c.nullable.values(), *c.differ.values(), c.extra)
            return c
        if isinstance(node, Join):
            merged = _merge(kids)
            return merged if node.condition is None else self._condition(node.condition, merged)
        if isinstance(node, AntiJoin):
            left, right = kids
            self.guard(*_merge(kids).origins(node.condition.columns()), right.extra)
            return left
        if isinstance(node, Union):
            return _merge(kids)
        return _Facts()

    def _aggregate(self, node: Aggregate, c: _Facts) -> _Facts:
        used = set().union(
            *(e.columns() for _, e in node.keys), *(a.arg.columns() for _, a in node.aggs if a.arg is not None)
        )
        self.guard(*c.origins(used), c.extra)
        names = frozenset(n for n, a in node.aggs if is_order_dependent_decimal(a))
        if not names:
            return _Facts()
        self.wide[id(node)] = names
        return _Facts(nullable={n: frozenset({id(node)}) for n in names})

    def _condition(self, predicate: Expr, c: _Facts) -> _Facts:
        """A condition over nullable values through null-propagating operations keeps at least Spark's rows (they
        may be extra); any other test of an uncertain value guards its origins."""
        nullable, differ = c.origins(predicate.columns())
        if differ or (nullable and not _monotone(predicate, set(c.nullable))):
            self.guard(nullable, differ)
            return c
        return _Facts(c.nullable, c.differ, c.extra | nullable)


def _project(node: Project, c: _Facts) -> _Facts:
    nullable: dict[str, Origins] = {}
    differ: dict[str, Origins] = {}
    for name, e in node.items:
        n, d = c.origins(e.columns())
        if d or (n and not _monotone(e, set(c.nullable))):
            differ[name] = n | d
        elif n:
            nullable[name] = n
    return _Facts(nullable, differ, c.extra)


def _merge(kids: list[_Facts]) -> _Facts:
    nullable: dict[str, Origins] = {}
    differ: dict[str, Origins] = {}
    for k in kids:
        for name, o in k.nullable.items():
            nullable[name] = nullable.get(name, frozenset()) | o
        for name, o in k.differ.items():
            differ[name] = differ.get(name, frozenset()) | o
    return _Facts(nullable, differ, frozenset().union(*(k.extra for k in kids)))


def _monotone(e: Expr, cols: set[str]) -> bool:
    """Whether every path from a column of ``cols`` up to ``e`` passes only null-propagating operations and
    AND/OR/NOT (so ``e`` with NULL for such a column is NULL, or the same for any value put in its place)."""
    if not (e.columns() & cols) or isinstance(e, Col):
        return True
    if isinstance(e, (Binary, Unary, Cast, Between, InList)) or (isinstance(e, Func) and e.name in _STRICT_FUNCS):
        return all(_monotone(k, cols) for k in e.children())
    return False


__all__ = ["guarded_sums", "is_order_dependent_decimal", "order_dependent"]

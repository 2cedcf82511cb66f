"""Names in scope: the FROM items a query block sees, CTEs, and the items of its SELECT and ORDER BY lists.

See docs/ARCHITECTURE.md, "The plan IR".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from sqlglot import exp

from imp_core.plan.expr import Col, Expr
from imp_core.plan.nodes import Plan

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Column:
    """One column a FROM item exposes: the name SQL uses for it and the plan column it is."""

    name: str
    col: Col


@dataclass(frozen=True, slots=True)
class Item:
    """A FROM item (table, subquery or CTE reference) with its alias, plan and columns."""

    alias: str
    label: str  # how messages name it: "sales", "sales AS s", "subquery tt"
    plan: Plan
    columns: tuple[Column, ...]
    node: exp.Expression  # where it is written, for messages
    hidden: bool = False  # a subquery of WHERE/HAVING joined in: reachable by its alias only, not by * or bare names

    def find(self, name: str) -> Column | None:
        """The column ``name``: spelled exactly so, else the only one equal to it case-insensitively."""
        return find_name(self.columns, name, lambda c: c.name)


class Scope:
    """The FROM items visible to one query block (no outer scopes: correlation is not supported)."""

    def __init__(self, items: Sequence[Item]) -> None:
        self.items = tuple(items)
        self.owner = {c.col.name: i for i, item in enumerate(self.items) for c in item.columns}
        self.bare = {c.col.name: c.name for item in self.items for c in item.columns}
        self.visible = tuple(i for i in self.items if not i.hidden)
        self.windows: dict[int, Col] = {}  # id of a window expression of the SELECT list -> its rank column
        # GROUPING(...) / GROUPING_ID(...) calls: placeholder column name -> (function, its GROUP BY arguments);
        # each grouping set's aggregation replaces the placeholder by its constant (``grouping_sets.py``)
        self.groupings: dict[str, tuple[str, tuple[Expr, ...]]] = {}

    def item(self, alias: str) -> Item | None:
        """The FROM item named ``alias``: spelled exactly so, else the only one equal to it case-insensitively."""
        return find_name(self.items, alias, lambda i: i.alias)

    def describe(self) -> str:
        return ", ".join(i.label for i in self.visible)


@dataclass(frozen=True, slots=True)
class Cte:
    name: str
    body: exp.Expression
    columns: tuple[str, ...]
    env: Mapping[str, Cte]  # the CTEs visible where this one was defined (not itself: no recursion)


@dataclass(slots=True)
class SelectItem:
    name: str  # before de-duplication
    expr: Expr
    alias: bool  # the user wrote AS name


@dataclass(slots=True)
class OrderItem:
    item: int | None  # index of the SELECT item it refers to, or None
    expr: Expr | None  # otherwise the expression (over FROM columns, before aggregation)
    descending: bool
    nulls_first: bool | None


def find_name(things: Sequence[_T], name: str, name_of: Callable[[_T], str]) -> _T | None:
    """The thing named ``name``: spelled exactly so, else the only one equal to it case-insensitively (as Spark)."""
    exact = [t for t in things if name_of(t) == name]
    if exact:
        return exact[0]
    folded = [t for t in things if name_of(t).lower() == name.lower()]
    return folded[0] if len(folded) == 1 else None


def unique_names(names: Sequence[str], taken: set[str] | None = None) -> list[str]:
    """Make names unique case-insensitively (Spark treats ``a`` and ``A`` as the same column)."""
    used = set() if taken is None else taken
    out = []
    for n in names:
        name = n
        k = 2
        while name.lower() in used:
            name = f"{n}_{k}"
            k += 1
        used.add(name.lower())
        out.append(name)
    return out


def free_name(candidates: Sequence[str], used: set[str]) -> str:
    """The first candidate not in ``used`` (case-insensitively), else the last one made unique; marks it used."""
    for c in candidates:
        if c.lower() not in used:
            used.add(c.lower())
            return c
    return unique_names([candidates[-1]], used)[0]

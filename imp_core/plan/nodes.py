"""Relational-algebra plan nodes (paper Fig. 4): scan, select, project, join, union, aggregate, distinct, top-k; and
beyond the paper: the anti join and top-k per group (a ranking window filtered by a constant).

See docs/ARCHITECTURE.md, "The plan IR".
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields, replace
from typing import Any

import pyarrow as pa

from imp_core.errors import PlanError
from imp_core.plan.expr import BOOL, NULL, AggCall, Binary, Col, Expr, conjuncts


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    dtype: pa.DataType


@dataclass(frozen=True, slots=True)
class SortKey:
    expr: Expr
    descending: bool = False
    nulls_first: bool | None = None  # None = SQL default (NULLS LAST for ASC, FIRST for DESC in Spark: smallest)

    @property
    def effective_nulls_first(self) -> bool:
        # Spark and DuckDB: NULLs are the smallest values -> first for ASC, last for DESC.
        if self.nulls_first is None:
            return not self.descending
        return self.nulls_first


class Plan:
    """Base class of plan nodes."""

    __slots__ = ()
    schema: tuple[Field, ...]

    @property
    def children(self) -> tuple[Plan, ...]:
        return ()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.schema)

    def field(self, name: str) -> Field:
        for f in self.schema:
            if f.name == name:
                return f
        raise PlanError(f"column {name} does not exist; available: {', '.join(self.names)}")

    def walk(self) -> Iterator[Plan]:
        yield self
        for c in self.children:
            yield from c.walk()

    def scans(self) -> list[Scan]:
        return [n for n in self.walk() if isinstance(n, Scan)]

    def tables(self) -> set[str]:
        return {s.table for s in self.scans()}

    def is_stateless(self) -> bool:
        """True when no aggregation, distinct, top-k or anti join is in this subtree (no operator state: Spark can
        evaluate it from tables with annotations)."""
        return not any(isinstance(n, (Aggregate, Distinct, TopK, GroupTopK, AntiJoin)) for n in self.walk())

    def _set_schema(self, schema: tuple[Field, ...]) -> None:
        names = [f.name for f in schema]
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise PlanError(f"duplicate output column name(s) {', '.join(dup)}; give them distinct aliases")
        object.__setattr__(self, "schema", schema)

    def _check(self, e: Expr, child: Plan, where: str) -> None:
        available = set(child.names)
        for c in e.columns():
            if c not in available:
                raise PlanError(f"{where}: column {c} does not exist; available: {', '.join(child.names)}")


class _OneChild(Plan):
    """A node over one input, ``child``."""

    __slots__ = ()
    child: Plan

    @property
    def children(self) -> tuple[Plan, ...]:
        return (self.child,)


@dataclass(frozen=True, slots=True)
class Scan(Plan):
    """Access to a registered table under an alias; outputs ``alias.column`` for each column."""

    table: str
    alias: str
    columns: tuple[Field, ...]  # the table's columns (plain names)
    schema: tuple[Field, ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        self._set_schema(tuple(Field(f"{self.alias}.{c.name}", c.dtype) for c in self.columns))

    def qualified(self, column: str) -> str:
        return f"{self.alias}.{column}"


@dataclass(frozen=True, slots=True)
class Select(_OneChild):
    child: Plan
    predicate: Expr
    schema: tuple[Field, ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        self._check(self.predicate, self.child, "WHERE/HAVING")
        if self.predicate.dtype not in (BOOL, NULL):
            raise PlanError(f"a filter condition must be boolean, got {self.predicate.dtype}")
        if self.predicate.has_aggregate():
            raise PlanError("aggregate functions are not allowed in WHERE; use HAVING")
        self._set_schema(self.child.schema)


@dataclass(frozen=True, slots=True)
class Project(_OneChild):
    child: Plan
    items: tuple[tuple[str, Expr], ...]
    schema: tuple[Field, ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        for name, e in self.items:
            self._check(e, self.child, f"SELECT item {name}")
            if e.has_aggregate():
                raise PlanError(f"SELECT item {name}: aggregate outside an aggregation")
        self._set_schema(tuple(Field(n, e.dtype) for n, e in self.items))

    def is_rename_only(self) -> bool:
        return all(isinstance(e, Col) for _, e in self.items)


@dataclass(frozen=True, slots=True)
class Join(Plan):
    """Inner join (cross product when ``condition`` is None)."""

    left: Plan
    right: Plan
    condition: Expr | None = None
    schema: tuple[Field, ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        schema = self.left.schema + self.right.schema
        self._set_schema(schema)
        if self.condition is not None:
            available = {f.name for f in schema}
            for c in self.condition.columns():
                if c not in available:
                    raise PlanError(f"JOIN condition: column {c} does not exist")
            if self.condition.dtype not in (BOOL, NULL):
                raise PlanError("a JOIN condition must be boolean")

    @property
    def children(self) -> tuple[Plan, ...]:
        return (self.left, self.right)

    def equi_keys(self) -> tuple[list[str], list[str], list[Expr]]:
        """Split the condition into equi-join key pairs (left col, right col) and a residual theta part."""
        return _equi_keys(self.left, self.right, self.condition)


@dataclass(frozen=True, slots=True)
class AntiJoin(Plan):
    """The rows of ``left`` that no row of ``right`` matches on ``condition`` (``NOT EXISTS``); output = ``left``'s
    columns. ``condition`` is a conjunction of equalities between a left and a right column (the keys).

    ``null_aware`` gives ``NOT IN``'s three-valued semantics (one key pair): a left row is kept when ``right`` is
    empty, or when its key is not NULL, no right key is NULL and no right key equals it.
    """

    left: Plan
    right: Plan
    condition: Expr
    null_aware: bool = False
    schema: tuple[Field, ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        clash = set(self.left.names) & set(self.right.names)
        if clash:
            raise PlanError(f"anti join: both sides have column(s) {', '.join(sorted(clash))}; rename one side")
        available = set(self.left.names) | set(self.right.names)
        for c in self.condition.columns():
            if c not in available:
                raise PlanError(f"anti join condition: column {c} does not exist")
        lk, rk, rest = self.equi_keys()
        if rest or not lk:
            raise PlanError(f"anti join condition {self.condition} must be equalities between a left and a right "
                            "column")
        if self.null_aware and len(lk) != 1:
            raise PlanError(f"NOT IN compares one column, got {len(lk)}")
        self._set_schema(self.left.schema)

    @property
    def children(self) -> tuple[Plan, ...]:
        return (self.left, self.right)

    def equi_keys(self) -> tuple[list[str], list[str], list[Expr]]:
        """The (left column, right column) key pairs of the condition and what is not such a pair."""
        return _equi_keys(self.left, self.right, self.condition)


@dataclass(frozen=True, slots=True)
class Union(Plan):
    """Bag union (``UNION ALL``) of two or more inputs with the same column names and types (the front-end casts and
    renames each branch to the first branch's names)."""

    inputs: tuple[Plan, ...]
    schema: tuple[Field, ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        if len(self.inputs) < 2:
            raise PlanError(f"a UNION ALL needs at least two inputs, got {len(self.inputs)}")
        first = self.inputs[0].schema
        for i, branch in enumerate(self.inputs[1:], start=2):
            if branch.schema != first:
                raise PlanError(f"UNION ALL branch {i} has columns "
                                f"({', '.join(f'{f.name} {f.dtype}' for f in branch.schema)}), the first has "
                                f"({', '.join(f'{f.name} {f.dtype}' for f in first)}); cast and rename them alike")
        self._set_schema(first)

    @property
    def children(self) -> tuple[Plan, ...]:
        return self.inputs


@dataclass(frozen=True, slots=True)
class Aggregate(_OneChild):
    """Group by ``keys`` and compute ``aggs``; output = key names then aggregate names."""

    child: Plan
    keys: tuple[tuple[str, Expr], ...]
    aggs: tuple[tuple[str, AggCall], ...]
    schema: tuple[Field, ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        for name, e in self.keys:
            self._check(e, self.child, f"GROUP BY {name}")
            if e.has_aggregate():
                raise PlanError("aggregate functions are not allowed in GROUP BY")
        for name, a in self.aggs:
            if not isinstance(a, AggCall):
                raise PlanError(f"aggregate {name} is not an aggregate call")
            if a.arg is not None:
                self._check(a.arg, self.child, f"aggregate {name}")
        self._set_schema(tuple(Field(n, e.dtype) for n, e in self.keys) +
                         tuple(Field(n, a.dtype) for n, a in self.aggs))


@dataclass(frozen=True, slots=True)
class Distinct(_OneChild):
    child: Plan
    schema: tuple[Field, ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        self._set_schema(self.child.schema)


@dataclass(frozen=True, slots=True)
class TopK(_OneChild):
    """The first ``k`` rows in ``order`` (bag semantics with ties as in the paper's Fig. 4)."""

    child: Plan
    order: tuple[SortKey, ...]
    k: int
    schema: tuple[Field, ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.k < 0:
            raise PlanError(f"LIMIT must not be negative, got {self.k}")
        if not self.order:
            raise PlanError("top-k needs at least one ORDER BY key")
        for key in self.order:
            self._check(key.expr, self.child, "ORDER BY")
        self._set_schema(self.child.schema)


RANKINGS = ("row_number", "rank", "dense_rank")
"""The ranking functions of a top-k per group: SQL's ``ROW_NUMBER()``, ``RANK()``, ``DENSE_RANK()``."""
RANK_TYPE = pa.int32()  # Spark's type for all three


@dataclass(frozen=True, slots=True)
class GroupTopK(_OneChild):
    """Top-k per group: ``function() OVER (PARTITION BY partition ORDER BY order)`` as column ``rank``, keeping the
    rows ranked at most ``k``; output = the child's columns then ``rank``.

    ``k`` None is the front-end's unbounded ranking before the filter on the rank is found
    (``imp_core.plan.sql.windows``); no finished plan holds one. ROW_NUMBER numbers rows tied on ``order`` in the
    order of their values (Spark's own choice among them is arbitrary).
    """

    child: Plan
    partition: tuple[Expr, ...]
    order: tuple[SortKey, ...]
    function: str
    rank: str
    k: int | None = None
    schema: tuple[Field, ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.function not in RANKINGS:
            raise PlanError(f"ranking function {self.function!r} is not one of {', '.join(RANKINGS)}")
        if self.k is not None and self.k < 0:
            raise PlanError(f"a top-k per group keeps at most k rows, k must not be negative, got {self.k}")
        if not self.order:
            raise PlanError(f"{self.function.upper()}() needs ORDER BY in its OVER clause")
        for e in self.partition:
            self._check(e, self.child, "PARTITION BY")
        for key in self.order:
            self._check(key.expr, self.child, "ORDER BY")
        self._set_schema(self.child.schema + (Field(self.rank, RANK_TYPE),))


def _equi_keys(left: Plan, right: Plan, condition: Expr | None) -> tuple[list[str], list[str], list[Expr]]:
    """Split ``condition`` into key pairs (left column = right column, same type) and the rest."""
    left_names, right_names = set(left.names), set(right.names)
    lk: list[str] = []
    rk: list[str] = []
    rest: list[Expr] = []
    for c in conjuncts(condition):
        if isinstance(c, Binary) and c.op == "=" and isinstance(c.left, Col) and isinstance(c.right, Col):
            a, b = c.left.name, c.right.name
            if a in left_names and b in right_names and c.left.dtype == c.right.dtype:
                lk.append(a)
                rk.append(b)
                continue
            if b in left_names and a in right_names and c.left.dtype == c.right.dtype:
                lk.append(b)
                rk.append(a)
                continue
        rest.append(c)
    return lk, rk, rest


# Every plan node class (``_OneChild`` is only a base): what a compiler or an operator registry must cover.
PLAN_NODES: tuple[type[Plan], ...] = (Scan, Select, Project, Join, AntiJoin, Union, Aggregate, Distinct, TopK,
                                      GroupTopK)


_LINES: dict[type[Plan], Callable[[Any], str]] = {
    Scan: lambda p: f"Scan {p.table} AS {p.alias}",
    Select: lambda p: f"Select {p.predicate}",
    Project: lambda p: "Project " + ", ".join(f"{e} AS {n}" if not (isinstance(e, Col) and e.name == n) else n
                                              for n, e in p.items),
    Join: lambda p: f"Join ON {p.condition}" if p.condition is not None else "CrossProduct",
    AntiJoin: lambda p: f"{'NullAware' if p.null_aware else ''}AntiJoin ON {p.condition}",
    Union: lambda p: f"UnionAll {len(p.inputs)} inputs",
    Aggregate: lambda p: (f"Aggregate keys=[{', '.join(n for n, _ in p.keys)}] "
                          f"aggs=[{', '.join(f'{a} AS {n}' for n, a in p.aggs)}]"),
    Distinct: lambda p: "Distinct",
    TopK: lambda p: (f"TopK k={p.k} order=[" +
                     ", ".join(f"{s.expr}{' DESC' if s.descending else ''}" for s in p.order) + "]"),
    GroupTopK: lambda p: (f"GroupTopK k={p.k} {p.function.upper()} AS {p.rank} partition=[" +
                          ", ".join(str(e) for e in p.partition) + "] order=[" +
                          ", ".join(f"{s.expr}{' DESC' if s.descending else ''}" for s in p.order) + "]"),
}
"""One line per node kind in ``explain`` (its text is part of the plan fingerprint saved state is tied to)."""


def explain(plan: Plan, indent: int = 0) -> str:
    """A readable tree of the plan, for ``imp sketch show`` and error messages."""
    line = _LINES.get(type(plan), lambda p: type(p).__name__)(plan)
    out = ["  " * indent + line]
    for c in plan.children:
        out.append(explain(c, indent + 1))
    return "\n".join(out)


def shared(plan: Plan) -> Plan:
    """``plan`` with every set of equal subtrees that hold state (an aggregation, a DISTINCT, a top-k, an anti join)
    made one object.

    A rewrite may place one subtree twice (TPC-H Q21's per-order summaries feed both its EXISTS join and its NOT
    EXISTS), and a plan read back from the catalog holds such copies as distinct, equal objects. One object per
    subtree lets the pipeline keep one stage, one state and one delta per pass for all its places: equal subtrees
    over the same tables always hold the same contents. Stateless subtrees keep their objects: a scan's annotation
    columns follow its object, and two scans of one table under one alias in different scopes (a subquery's and
    the outer query's) may meet at a join."""
    seen: dict[Plan, Plan] = {}

    def visit(node: Plan) -> Plan:
        kids = node.children
        new = tuple(visit(c) for c in kids)
        if any(a is not b for a, b in zip(new, kids)):
            mapping = {id(old): nw for old, nw in zip(kids, new)}
            changes: dict[str, Any] = {}
            for f in fields(node):  # type: ignore[arg-type]
                value = getattr(node, f.name)
                if isinstance(value, Plan):
                    changes[f.name] = mapping.get(id(value), value)
                elif isinstance(value, tuple) and value and all(isinstance(v, Plan) for v in value):
                    changes[f.name] = tuple(mapping.get(id(v), v) for v in value)
            node = replace(node, **changes)  # type: ignore[type-var]
        return node if node.is_stateless() else seen.setdefault(node, node)

    return visit(plan)


def shares_state(plan: Plan) -> bool:
    """Whether a subtree that holds state has more than one place in ``plan`` (:func:`shared` makes them one)."""
    stateful = [id(n) for n in shared(plan).walk() if not n.is_stateless()]
    return len(stateful) != len(set(stateful))

"""GROUPING SETS, ROLLUP and CUBE: the bag union of one aggregation per grouping set (docs/SQL.md).

In the aggregation of a set, a GROUP BY expression outside the set is NULL wherever it is used outside an aggregate
function (in the select list, HAVING and ORDER BY), as Spark outputs it; aggregates still read the column's values.
Each set's aggregation reads its own copy of the FROM plan, so every scan of a branch is its own (as in a UNION ALL
written out by hand).
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Sequence
from typing import TypeVar

import pyarrow as pa
from sqlglot import exp

from imp_core.errors import PlanError
from imp_core.plan.expr import NULL, AggCall, Cast, Col, Expr, Lit, substitute

_T = TypeVar("_T")


def expand(elements: list[list[list[Expr]]], keys: list[Expr]) -> list[list[int]]:
    """The grouping sets as lists of indexes into ``keys``: the cross product of each GROUP BY element's sets."""
    sets: list[list[int]] = [[]]
    for options in elements:
        sets = [s + [i for i in (keys.index(e) for e in opt) if i not in s] for s in sets for opt in options]
    return sets


def rollup_sets(xs: Sequence[_T]) -> list[list[_T]]:
    """The sets ``ROLLUP(xs)`` stands for: every prefix of ``xs``, longest first."""
    return [list(xs[:i]) for i in range(len(xs), -1, -1)]


def cube_sets(xs: Sequence[_T]) -> list[list[_T]]:
    """The sets ``CUBE(xs)`` stands for, in Spark's order: the full set first, then subsets by decreasing size (as
    itertools.combinations orders them)."""
    return [list(c) for n in range(len(xs), -1, -1) for c in itertools.combinations(xs, n)]


def element_sets(g: exp.Expression) -> list[list[exp.Expression]] | None:
    """The grouping sets one GROUP BY element stands for, or None for a plain expression."""
    if isinstance(g, exp.Rollup):
        return rollup_sets(g.expressions)
    if isinstance(g, exp.Cube):
        return cube_sets(g.expressions)
    if isinstance(g, exp.GroupingSets):
        out = []
        for s in g.expressions:
            inner = s.this if isinstance(s, exp.Paren) else s
            out.append(list(inner.expressions) if isinstance(inner, exp.Tuple) else [inner])
        return out
    return None


def rolled_up(e: Expr, absent: list[Expr]) -> Expr:
    """``e`` with the GROUP BY expressions ``absent`` from a set made NULL outside aggregate functions."""
    if not absent:
        return e
    aggs = [a for a in e.walk() if isinstance(a, AggCall)]
    hold: dict[Expr, Expr] = {a: Col(f"__held{i}", a.dtype) for i, a in enumerate(aggs)}
    nulls: dict[Expr, Expr] = {k: Cast(Lit(None, NULL), k.dtype) for k in absent}
    out = substitute(e, {**hold, **nulls})
    return substitute(out, {v: k for k, v in hold.items()})


def grouping_values(
    groupings: dict[str, tuple[str, tuple[Expr, ...]]], keys: list[Expr], present: list[int]
) -> dict[Expr, Expr]:
    """The constants ``GROUPING(k)`` (1 when ``k`` is rolled up in this set, else 0) and ``GROUPING_ID(k1, ..., kn)``
    (those bits, ``k1`` the most significant; all GROUP BY expressions when none are given) take in the set of
    ``keys`` at indexes ``present``, keyed by their placeholder columns.

    Raises:
        PlanError: An argument is not a GROUP BY expression.
    """
    out: dict[Expr, Expr] = {}
    for name, (function, args) in groupings.items():
        bits = 0
        for a in args or tuple(keys):
            if a not in keys:
                raise PlanError(f"{function.upper()}({a}): the argument must be one of the GROUP BY expressions")
            bits = bits * 2 + (0 if keys.index(a) in present else 1)
        typ = pa.int8() if function == "grouping" else pa.int64()
        out[Col(name, typ)] = Lit(bits, typ)
    return out


def fresh(plan: _T) -> _T:
    """A copy of a plan with new node objects (each branch's scans are its own)."""
    return copy.deepcopy(plan)


__all__ = ["cube_sets", "element_sets", "expand", "fresh", "grouping_values", "rolled_up", "rollup_sets"]

"""Rewrites of expressions: splitting and joining conjunctions, substituting sub-expressions, renaming columns.

See docs/ARCHITECTURE.md, "The plan IR".
"""

from __future__ import annotations

from collections.abc import Sequence

from imp_core.plan.expr.operators import Binary, Col, Expr


def conjuncts(e: Expr | None) -> list[Expr]:
    """Split a predicate at its top-level ANDs."""
    if e is None:
        return []
    if isinstance(e, Binary) and e.op == "and":
        return conjuncts(e.left) + conjuncts(e.right)
    return [e]


def conjoin(parts: list[Expr]) -> Expr | None:
    out: Expr | None = None
    for p in parts:
        out = p if out is None else Binary("and", out, p)
    return out


def substitute(e: Expr, mapping: dict[Expr, Expr]) -> Expr:
    """Replace sub-expressions (by structural equality) bottom-up; used to rewrite over aggregate outputs."""
    if e in mapping:
        return mapping[e]
    kids = e.children()
    if not kids:
        return e
    new = [substitute(k, mapping) for k in kids]
    if all(a is b for a, b in zip(new, kids)):
        return e
    return rebuild(e, new)


def rebuild(e: Expr, kids: Sequence[Expr]) -> Expr:
    """A copy of ``e`` with new children (in ``children()`` order)."""
    return e.with_children(kids)


def rename_columns(e: Expr, names: dict[str, str]) -> Expr:
    """Rename column references (``old -> new``)."""
    mapping: dict[Expr, Expr] = {
        c: Col(names[c.name], c.dtype) for c in e.walk() if isinstance(c, Col) and c.name in names
    }
    return substitute(e, mapping) if mapping else e


__all__ = ["conjoin", "conjuncts", "rebuild", "rename_columns", "substitute"]

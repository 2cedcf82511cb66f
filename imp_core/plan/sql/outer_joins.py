"""LEFT / RIGHT / FULL outer joins as the operators the engine maintains (docs/SQL.md, "Outer joins").

``L LEFT JOIN R ON L.k = R.k AND p(R)`` is the bag union of the inner join and of the left rows no right row
matches, padded with NULLs: ``(L ⋈ σp(R)) ⊎ π[L.*, NULL…](L ▷ σp(R))``. A padded row keeps its left row's annotation
only (the provenance of a missing match holds no right row); as matches come and go the anti join retracts and
re-inserts the padded rows. RIGHT mirrors LEFT; FULL adds both padded sides. The ON condition must be equalities
between a left and a right column (the keys) plus conditions on the padded-against side alone, which filter it first.
"""

from __future__ import annotations

import pyarrow as pa

from imp_core.errors import UnsupportedError
from imp_core.plan.expr import NULL, Binary, Cast, Col, Expr, Lit, conjoin, conjuncts
from imp_core.plan.nodes import AntiJoin, Join, Plan, Project, Select, Union


def outer_join(left: Plan, right: Plan, side: str, on: Expr | None) -> Plan:
    """``left side JOIN right ON on`` (``side``: LEFT, RIGHT or FULL) as inner join, anti joins and a union.

    Raises:
        UnsupportedError: The ON condition has a part other than key equalities and conditions on one side where
            that side is not preserved (the caller adds the place).
    """
    keys, only = _split(left, right, side, on)
    if not keys:
        raise UnsupportedError("an outer join needs at least one equality between a left and a right column in ON")
    if only["left"] and side in ("LEFT", "FULL"):
        raise UnsupportedError(f"the condition {conjoin(only['left'])} on the preserved side of a {side} JOIN (it "
                               "decides which rows are padded; filter in WHERE if the rows should go)")
    if only["right"] and side in ("RIGHT", "FULL"):
        raise UnsupportedError(f"the condition {conjoin(only['right'])} on the preserved side of a {side} JOIN (it "
                               "decides which rows are padded; filter in WHERE if the rows should go)")
    left_f = _filtered(left, only["left"])
    right_f = _filtered(right, only["right"])
    cond = conjoin(keys)
    assert cond is not None
    branches: list[Plan] = [Join(left_f, right_f, cond)]
    if side in ("LEFT", "FULL"):
        branches.append(_padded(AntiJoin(left_f, right_f, cond), left_f, right_f, pad_right=True))
    if side in ("RIGHT", "FULL"):
        branches.append(_padded(AntiJoin(right_f, left_f, cond), left_f, right_f, pad_right=False))
    return Union(tuple(branches))


def _split(left: Plan, right: Plan, side: str, on: Expr | None) -> tuple[list[Expr], dict[str, list[Expr]]]:
    """The ON conjuncts as key equalities and conditions on one side (a constant goes with the padded-against side)."""
    left_names, right_names = set(left.names), set(right.names)
    keys: list[Expr] = []
    only: dict[str, list[Expr]] = {"left": [], "right": []}
    for c in conjuncts(on):
        cols = c.columns()
        if not cols and side in ("LEFT", "RIGHT"):
            only["right" if side == "LEFT" else "left"].append(c)
        elif cols and cols <= left_names:
            only["left"].append(c)
        elif cols and cols <= right_names:
            only["right"].append(c)
        elif _is_key(c, left_names, right_names):
            keys.append(c)
        else:
            raise UnsupportedError(f"the outer join condition {c} is not an equality of a left and a right column or a "
                                   "condition on one side (only those can be maintained)")
    return keys, only


def _is_key(c: Expr, left: set[str], right: set[str]) -> bool:
    if not (isinstance(c, Binary) and c.op == "=" and isinstance(c.left, Col) and isinstance(c.right, Col)):
        return False
    if c.left.dtype != c.right.dtype:
        raise UnsupportedError(f"the outer join keys in {c} have different types ({c.left.dtype}, {c.right.dtype}); "
                               "CAST one side in a subquery")
    a, b = c.left.name, c.right.name
    return (a in left and b in right) or (a in right and b in left)


def _filtered(plan: Plan, preds: list[Expr]) -> Plan:
    pred = conjoin(preds)
    return plan if pred is None else Select(plan, pred)


def _padded(anti: Plan, left: Plan, right: Plan, pad_right: bool) -> Plan:
    """The unmatched rows with NULLs for the other side's columns, in the inner join's column order."""
    def null(f_dtype: pa.DataType) -> Expr:
        return Cast(Lit(None, NULL), f_dtype)

    items: list[tuple[str, Expr]] = []
    for f in left.schema:
        items.append((f.name, null(f.dtype) if not pad_right else Col(f.name, f.dtype)))
    for f in right.schema:
        items.append((f.name, null(f.dtype) if pad_right else Col(f.name, f.dtype)))
    return Project(anti, tuple(items))


__all__ = ["outer_join"]

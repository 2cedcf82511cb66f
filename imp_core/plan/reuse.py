"""The reuse check: may a sketch captured for one query answer another query of the same template?

See docs/ARCHITECTURE.md, "Sketch use and reuse".
"""

from __future__ import annotations

from typing import Any

from imp_core.plan.expr import Binary, Expr, Lit, Unary
from imp_core.plan.nodes import Distinct, Plan, Project, Select, Union

_FLIP = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}


def can_reuse(captured: Plan, query: Plan) -> tuple[bool, str]:
    """Whether a sketch captured for ``captured`` is sufficient for ``query`` (same template), and why not.

    Two queries of one template differ only in constants of their conditions. The sketch is sufficient when
    ``query``'s provenance is contained in ``captured``'s, which holds when every differing constant only makes a
    condition *tighter* where tightening shrinks the result to a subset:

    * the condition is a selection with nothing but projections, selections and DISTINCT between it and the result
      (a top-level ``HAVING``, or a ``WHERE`` of a query without aggregation / top-k above it): fewer rows there
      means a subset of the result rows, and each remaining row has the same provenance;
    * the constant sits in a comparison reached through AND/OR only (an even number of NOTs flips it back):
      ``e > c`` / ``e >= c`` may grow ``c``, ``e < c`` / ``e <= c`` may shrink it; ``=``, ``<>``, IN, BETWEEN, LIKE
      must keep their constants.

    Example: a sketch for ``... HAVING AVG(c) > 10`` serves ``HAVING AVG(c) > 20`` but not ``> 5``; a sketch for a
    ``WHERE b < 1000`` below the aggregation serves no other constant (the groups' aggregates would change). The
    safety of the partition column does not depend on constant values, so it carries over.
    """
    return _nodes(captured, query, top=True)


def _nodes(a: Plan, b: Plan, top: bool) -> tuple[bool, str]:
    if type(a) is not type(b):
        return False, "the plans differ in shape"
    if isinstance(a, Select):
        assert isinstance(b, Select)
        if a.predicate != b.predicate:
            if not top:
                return False, f"a constant differs in {a.predicate}, below an aggregation, join or top-k"
            ok, why = _tighter(a.predicate, b.predicate, positive=True)
            if not ok:
                return False, why
    elif _differs_outside_selections(a, b) or len(a.children) != len(b.children):
        return False, "the plans differ outside their conditions"
    still_top = top and isinstance(a, (Select, Project, Distinct, Union))
    for ca, cb in zip(a.children, b.children):
        ok, why = _nodes(ca, cb, still_top)
        if not ok:
            return False, why
    return True, "reusable"


def _differs_outside_selections(a: Plan, b: Plan) -> bool:
    """True when the nodes themselves (not their children) differ."""
    fields = [
        f for f in getattr(a, "__dataclass_fields__", {}) if f not in ("schema", "child", "left", "right", "inputs")
    ]
    return any(getattr(a, f) != getattr(b, f) for f in fields)


def _tighter(old: Expr, new: Expr, positive: bool) -> tuple[bool, str]:
    """Does ``new`` accept only rows that ``old`` accepts (for ``positive``; the converse otherwise)?"""
    if old == new:
        return True, ""
    if type(old) is not type(new):
        return False, "the conditions differ in shape"
    if isinstance(old, Binary) and isinstance(new, Binary) and old.op == new.op and old.op in ("and", "or"):
        for x, y in ((old.left, new.left), (old.right, new.right)):
            ok, why = _tighter(x, y, positive)
            if not ok:
                return False, why
        return True, ""
    if isinstance(old, Unary) and isinstance(new, Unary) and old.op == new.op == "not":
        return _tighter(old.arg, new.arg, not positive)
    if isinstance(old, Binary) and isinstance(new, Binary) and old.op == new.op and old.op in _FLIP:
        return _tighter_comparison(old, new, positive)
    return False, f"the constants of {old} must stay the same (only <, <=, >, >= may be tightened)"


def _tighter_comparison(old: Binary, new: Binary, positive: bool) -> tuple[bool, str]:
    """``e op c_old`` against ``e op c_new`` (or the constant on the left): does the new constant only tighten?"""
    op = old.op
    if old.left == new.left and isinstance(old.right, Lit) and isinstance(new.right, Lit):
        c_old, c_new = old.right.value, new.right.value
    elif old.right == new.right and isinstance(old.left, Lit) and isinstance(new.left, Lit):
        c_old, c_new, op = old.left.value, new.left.value, _FLIP[op]
    else:
        return False, f"{old} and {new} differ in more than one constant"
    if not positive:
        op = _FLIP[op]
    return _ordered(op, c_old, c_new, old)


def _ordered(op: str, c_old: Any, c_new: Any, where: Expr) -> tuple[bool, str]:
    try:
        ok = c_new >= c_old if op in (">", ">=") else c_new <= c_old
    except TypeError:
        return False, f"cannot compare the constants of {where}"
    if ok:
        return True, ""
    return False, f"{where} with the new constant {c_new!r} accepts rows the captured query rejected"

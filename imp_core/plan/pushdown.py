"""Selection push-down into the change-feed read (IMP paper 7.2, "Filtering deltas based on selections").

See docs/ARCHITECTURE.md, "Optimizations".
"""

from __future__ import annotations

from imp_core.plan.expr import Binary, Col, Expr, InList, IsNull, Lit, Unary, rename_columns
from imp_core.plan.nodes import Plan, Select


def change_filter(plan: Plan, table: str) -> Expr | None:
    """The condition every useful change row of ``table`` satisfies, over the table's own column names.

    Change rows failing a selection that only stateless operators separate from the table can never reach a stateful
    operator or the result. The front-end puts every single-table condition directly above its scan, so this is the
    OR, over the table's scans, of the selection right above each scan; a scan without one makes the table
    unfilterable (None).
    """
    parents: dict[int, Plan] = {}
    for node in plan.walk():
        for child in node.children:
            parents[id(child)] = node
    parts: list[Expr] = []
    for scan in plan.scans():
        if scan.table != table:
            continue
        parent = parents.get(id(scan))
        if not isinstance(parent, Select):
            return None
        names = {scan.qualified(c.name): c.name for c in scan.columns}
        parts.append(rename_columns(parent.predicate, names))
    if not parts:
        return None
    out = parts[0]
    for p in parts[1:]:
        out = Binary("or", out, p)
    return out


def to_datafusion(e: Expr) -> str | None:
    """A DataFusion SQL predicate for delta-rs' ``load_cdf(predicate=...)``, for a conservative subset of
    expressions whose semantics are the same in DataFusion and Spark (comparisons of columns with numeric or
    string literals, AND/OR/NOT, IS NULL, IN); None otherwise (the filter is then applied after reading)."""
    if isinstance(e, Binary) and e.op in ("and", "or"):
        left, right = to_datafusion(e.left), to_datafusion(e.right)
        if left is None or right is None:
            return None
        return f"({left} {e.op.upper()} {right})"
    if isinstance(e, Unary) and e.op == "not":
        inner = to_datafusion(e.arg)
        return None if inner is None else f"(NOT {inner})"
    if isinstance(e, IsNull) and isinstance(e.arg, Col):
        return f'("{e.arg.name}" IS {"NOT " if e.negated else ""}NULL)'
    if isinstance(e, Binary) and e.op in ("=", "<>", "<", "<=", ">", ">="):
        return _comparison(e)
    if (
        isinstance(e, InList)
        and isinstance(e.arg, Col)
        and all(isinstance(i, Lit) and _plain_literal(i) for i in e.items)
    ):
        items = ", ".join(_literal(i) for i in e.items)  # type: ignore[arg-type]
        return f'("{e.arg.name}" {"NOT " if e.negated else ""}IN ({items}))'
    return None


def _comparison(e: Binary) -> str | None:
    """``column op constant`` (either way round) or ``column op column``."""
    sides = []
    for side in (e.left, e.right):
        if isinstance(side, Col):
            sides.append(f'"{side.name}"')
        elif isinstance(side, Lit) and _plain_literal(side):
            sides.append(_literal(side))
        else:
            return None
    if not any(isinstance(s, Col) for s in (e.left, e.right)):
        return None
    return f"({sides[0]} {'!=' if e.op == '<>' else e.op} {sides[1]})"


def _plain_literal(lit: Lit) -> bool:
    v = lit.value
    return (isinstance(v, (int, str)) and not isinstance(v, bool)) or (isinstance(v, float) and v == v)


def _literal(lit: Lit) -> str:
    v = lit.value
    if isinstance(v, str):
        return "'" + v.replace("'", "''") + "'"
    return repr(v)


__all__ = ["change_filter", "to_datafusion"]

"""What the engine refuses to compute in sketched queries, because it cannot reproduce Spark's value exactly: checked
for every expression of a plan before a sketch is captured, with a one-line error saying what to write instead.

See docs/SEMANTICS.md.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from imp_core.errors import UnsupportedError
from imp_core.plan.expr import Cast, Expr, Func, is_string
from imp_core.plan.nodes import Aggregate, AntiJoin, GroupTopK, Join, Plan, Project, Select, TopK

EXP_HINT = ("the JVM's math library and the engine's differ in the last bit for about one value in 15, so a "
            "sketch could miss rows at a comparison; keep {0} out of sketched queries (compute it after the query)")

# Functions the engine refuses, with the reason (the compilers' import check accepts these in place of a func_<name>).
UNSUPPORTED_FUNCTIONS: dict[str, str] = {
    "exp": EXP_HINT.format("EXP"),
    "ln": EXP_HINT.format("LN"),
    "power": EXP_HINT.format("POWER"),
}


def engine_cast_reason(src: pa.DataType, dst: pa.DataType) -> str | None:
    """Why the engine refuses ``CAST(src AS dst)`` (Spark defines it, the engine cannot reproduce it)."""
    if is_string(dst) and pa.types.is_floating(src):
        return ("CAST of a FLOAT/DOUBLE to STRING (also inside CONCAT or ||) is not supported in sketched queries: "
                "Spark formats doubles the JVM's way ('1.0E10'); CAST to DECIMAL first, or compare numbers as numbers")
    if is_string(dst) and pa.types.is_decimal(src) and src.scale > 6:
        return (f"CAST of a DECIMAL with scale {src.scale} to STRING is not supported in sketched queries (Spark "
                f"writes small values in scientific notation); CAST it to a DECIMAL with scale 6 or less first")
    if is_string(src) and pa.types.is_timestamp(dst):
        return ("CAST of a string column to TIMESTAMP is not supported in sketched queries (Spark's timestamp text "
                "parsing has time zones and partial forms the engine does not reproduce); store the column as a "
                "TIMESTAMP, or compare with TIMESTAMP constants")
    return None


def engine_unsupported(e: Expr) -> str | None:
    """Why the engine refuses ``e`` (a one-line message with what to do), or None if it computes ``e`` as Spark
    does. Checked for every expression of a plan before a sketch is captured (``require_engine_support``)."""
    for node in e.walk():
        if isinstance(node, Func) and node.name in UNSUPPORTED_FUNCTIONS:
            return f"{node.name.upper()} is not supported in sketched queries: {UNSUPPORTED_FUNCTIONS[node.name]}"
        if isinstance(node, Cast):
            reason = engine_cast_reason(node.arg.dtype, node.to)
            if reason:
                return reason
        if isinstance(node, Func) and node.name == "concat":
            for a in node.args:
                reason = engine_cast_reason(a.dtype, pa.string())
                if reason:
                    return reason
    return None


def plan_expressions(plan: Plan) -> Iterator[Expr]:
    """Every scalar expression of a plan (predicates, projections, join conditions, grouping keys, aggregate
    arguments, ORDER BY keys)."""
    for node in plan.walk():
        if isinstance(node, Select):
            yield node.predicate
        elif isinstance(node, Project):
            yield from (e for _, e in node.items)
        elif isinstance(node, (Join, AntiJoin)) and node.condition is not None:
            yield node.condition
        elif isinstance(node, Aggregate):
            yield from (e for _, e in node.keys)
            yield from (a.arg for _, a in node.aggs if a.arg is not None)
        elif isinstance(node, TopK):
            yield from (k.expr for k in node.order)
        elif isinstance(node, GroupTopK):
            yield from node.partition
            yield from (k.expr for k in node.order)


def require_engine_support(plan: Plan) -> None:
    """Refuse, before anything runs, a plan with an expression the engine cannot compute as Spark does.

    Raises:
        UnsupportedError: One line naming the function or cast and what to write instead.
    """
    for e in plan_expressions(plan):
        reason = engine_unsupported(e)
        if reason is not None:
            raise UnsupportedError(reason)


__all__ = ["UNSUPPORTED_FUNCTIONS", "engine_cast_reason", "engine_unsupported", "plan_expressions",
           "require_engine_support"]

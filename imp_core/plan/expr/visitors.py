"""The expression node classes, and the check that a compiler handles every one of them.

See docs/ARCHITECTURE.md, "The plan IR".
"""

from __future__ import annotations

from imp_core.plan.expr import calls
from imp_core.plan.expr import operators as ops
from imp_core.plan.expr.calls import EXTRACT_FIELDS, FUNCTIONS

# Every expression node class. Each compiler (engine/evaluate.py, spark/compile.py) has one ``visit_<Node>`` per
# class, checked when the compiler module is imported (``require_visitors``).
EXPR_NODES: tuple[type[ops.Expr], ...] = (
    ops.Col, ops.Lit, ops.Interval, ops.Unary, ops.Binary, ops.IsNull, ops.InList, ops.Between, ops.Like, ops.Case,
    ops.Cast, calls.Func, calls.Extract, calls.AggCall,
)


def _subclasses(cls: type) -> set[str]:
    out: set[str] = set()
    subclasses: list[type] = cls.__subclasses__()
    for sub in subclasses:
        out.add(sub.__name__)
        out |= _subclasses(sub)
    return out


def require_visitors(compiler: type, backend: str) -> None:
    """Raise at import time unless ``compiler`` has a ``visit_<Node>`` for every expression node class, and a
    handler (``func_<name>`` / ``extract_<field>``) or an ``UNSUPPORTED_FUNCTIONS`` entry for every function and
    EXTRACT field, so a new node or function cannot reach a compiler that silently mishandles it."""
    names = {c.__name__ for c in EXPR_NODES} | _subclasses(ops.Expr)
    unsupported = getattr(compiler, "UNSUPPORTED_FUNCTIONS", {})

    def has(name: str) -> bool:
        return callable(getattr(compiler, name, None))

    missing = [f"visit_{n}" for n in sorted(names) if not has(f"visit_{n}")]
    missing += [f"func_{n}" for n in FUNCTIONS if not has(f"func_{n}") and n not in unsupported]
    missing += [f"extract_{f}" for f in EXTRACT_FIELDS if not has(f"extract_{f}")]
    if missing:
        raise ImportError(f"the {backend} expression compiler {compiler.__name__} has no {', '.join(missing)}; "
                          f"add them (or an UNSUPPORTED_FUNCTIONS entry saying why not)")


__all__ = ["EXPR_NODES", "require_visitors"]

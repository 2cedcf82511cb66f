"""The conservative selection's decision in NumPy, for its common shape: comparisons of a column that carries an
interval with a number, under AND, OR and NOT (``HAVING AVG(x) < 1600``).

``order_dependence.IntervalCompiler.may`` gives the rule as polars expressions; evaluating them is a query run of
~0.3 ms on any batch, while the same comparisons in NumPy take microseconds. The rules here are the same, term by
term: polars' (and Spark's) float order, where NaN is above every number and equal to itself; a NULL end decides
neither way (``fill_null(False)`` after each comparison, with Kleene logic inside it). Any other predicate shape
returns None and the selection evaluates the expressions. See docs/ARCHITECTURE.md, "Cost of a batch".
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import polars as pl

from imp_core.engine.schema import hi_name, lo_name
from imp_core.plan.expr import Binary, Col, Expr, Lit, Unary

Masks = tuple[np.ndarray, np.ndarray]  # per row: may the predicate be TRUE, may it be FALSE (no NULL)
Decide = Callable[[pl.DataFrame], Masks]
# an interval's ends over a batch, and where each is known (not NULL)
Ends = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
_COMPARISONS = ("<", "<=", ">", ">=", "=", "<>")


def compile_may(p: Expr, bounded: frozenset[str] | set[str]) -> Decide | None:
    """``IntervalCompiler(bounded).may(p)`` as a NumPy function of the batch, or None when ``p`` is not made of
    comparisons of a bounded column with a numeric constant under AND, OR and NOT."""
    if isinstance(p, Unary) and p.op == "not":
        inner = compile_may(p.arg, bounded)
        return None if inner is None else (lambda d: inner(d)[::-1])
    if isinstance(p, Binary) and p.op in ("and", "or"):
        left, right = compile_may(p.left, bounded), compile_may(p.right, bounded)
        if left is None or right is None:
            return None
        both = p.op == "and"

        def combined(d: pl.DataFrame) -> Masks:
            (t1, f1), (t2, f2) = left(d), right(d)
            return (t1 & t2, f1 | f2) if both else (t1 | t2, f1 & f2)
        return combined
    if isinstance(p, Binary) and p.op in _COMPARISONS:
        a, b = _ends(p.left, bounded), _ends(p.right, bounded)
        if a is None or b is None or not ({*p.left.columns(), *p.right.columns()} & set(bounded)):
            return None
        op = p.op
        return lambda d: _compare(op, a(d), b(d))
    return None


def _ends(e: Expr, bounded: frozenset[str] | set[str]) -> Callable[[pl.DataFrame], Ends] | None:
    if isinstance(e, Col) and e.name in bounded:
        def read(d: pl.DataFrame) -> Ends:
            lo, hi = d.get_column(lo_name(e.name)), d.get_column(hi_name(e.name))
            return _floats(lo), _floats(hi), _known(lo), _known(hi)
        return read
    if isinstance(e, Lit) and type(e.value) in (int, float):  # not bool, Decimal, strings: their casts differ
        value = float(e.value)
        return lambda d: (np.full(d.height, value), np.full(d.height, value), np.ones(d.height, dtype=bool),
                          np.ones(d.height, dtype=bool))
    return None


def _known(s: pl.Series) -> np.ndarray:
    return ~s.is_null().to_numpy() if s.null_count() else np.ones(s.len(), dtype=bool)


def _floats(s: pl.Series) -> np.ndarray:
    return (s if s.dtype == pl.Float64 else s.cast(pl.Float64)).to_numpy()


def _lt(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return (x < y) | (~np.isnan(x) & np.isnan(y))


def _le(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return (x <= y) | np.isnan(y)


def _eq(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return (x == y) | (np.isnan(x) & np.isnan(y))


def _compare(op: str, a: Ends, b: Ends) -> Masks:
    """``IntervalCompiler._compare`` on ends: (may be TRUE, may be FALSE)."""
    if op in (">", ">="):
        return _compare("<" if op == ">" else "<=", b, a)
    (alo, ahi, kalo, kahi), (blo, bhi, kblo, kbhi) = a, b
    if op == "<":  # a.lo < b.hi; a.hi >= b.lo
        return _lt(alo, bhi) & kalo & kbhi, _le(blo, ahi) & kahi & kblo
    if op == "<=":  # a.lo <= b.hi; a.hi > b.lo
        return _le(alo, bhi) & kalo & kbhi, _lt(blo, ahi) & kahi & kblo
    # "=": TRUE is possible when the intervals meet (a Kleene AND: TRUE only when both terms are known TRUE);
    # FALSE unless both are the same single value (a Kleene OR: TRUE when any term is known TRUE)
    t = _le(alo, bhi) & kalo & kbhi & _le(blo, ahi) & kblo & kahi
    f = (~_eq(alo, ahi) & kalo & kahi) | (~_eq(blo, bhi) & kblo & kbhi) | (~_eq(alo, blo) & kalo & kblo)
    return (t, f) if op == "=" else (f, t)


__all__ = ["compile_may"]

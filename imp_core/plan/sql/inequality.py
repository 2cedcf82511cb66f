"""EXISTS / NOT EXISTS correlated by one inequality ``inner <> outer`` besides the key equalities (TPC-H Q21).

Per key, the subquery's rows are summarized by the number of distinct non-NULL ``inner`` values ``nd`` and their
minimum ``mn``. Some row has ``inner <> x`` (``x`` not NULL) exactly when ``nd >= 2``, or ``nd = 1`` and ``mn <> x``:

* ``EXISTS``: an inner join with the summary on the keys, filtered by ``x IS NOT NULL AND (nd >= 2 OR (nd = 1 AND
  mn <> x))``; each outer row matches at most one summary row, so its multiplicity is kept;
* ``NOT EXISTS``: a LEFT JOIN with the summary (an outer row without a summary row has no subquery row), filtered by
  ``nd IS NULL OR nd = 0 OR (nd = 1 AND mn = x) OR x IS NULL``.

The summary is an aggregation (COUNT(DISTINCT), MIN): its annotation is every fragment of the key's subquery rows,
so the sketch keeps the rows the answer rests on; the LEFT JOIN's padded side makes a sketch on the subquery's tables
unsafe, as for every NOT EXISTS.
"""

from __future__ import annotations

from sqlglot import exp


def summary(sub: exp.Select, keys: list[exp.Expression], local: list[exp.Expression], inner: exp.Expression
            ) -> exp.Select:
    """``SELECT keys, COUNT(DISTINCT inner), MIN(inner) FROM ... WHERE local GROUP BY keys``."""
    out = sub.copy()
    items = [*keys, exp.Count(this=exp.Distinct(expressions=[inner.copy()])), exp.Min(this=inner.copy())]
    out.set("expressions", [exp.alias_(k.copy(), f"__k{i}") for i, k in enumerate(items)])
    out.set("where", exp.Where(this=exp.and_(*[c.copy() for c in local])) if local else None)
    out.set("group", exp.Group(expressions=[k.copy() for k in keys]) if keys else None)
    out.set("distinct", None)
    out.set("order", None)
    return out


def exists(nd: exp.Column, mn: exp.Column, outer: exp.Expression) -> exp.Expression:
    """Some summarized row differs from ``outer``."""
    differs = exp.or_(exp.GTE(this=nd, expression=exp.Literal.number(2)),
                      exp.and_(exp.EQ(this=nd.copy(), expression=exp.Literal.number(1)),
                               exp.NEQ(this=mn, expression=outer.copy())))
    return _node(exp.and_(exp.Not(this=exp.Is(this=outer.copy(), expression=exp.Null())), exp.Paren(this=differs)))


def not_exists(nd: exp.Column, mn: exp.Column, outer: exp.Expression) -> exp.Expression:
    """No summarized row (none at all, or all equal to ``outer``) differs from ``outer``."""
    return _node(exp.or_(exp.Is(this=nd, expression=exp.Null()),
                         exp.EQ(this=nd.copy(), expression=exp.Literal.number(0)),
                         exp.and_(exp.EQ(this=nd.copy(), expression=exp.Literal.number(1)),
                                  exp.EQ(this=mn, expression=outer.copy())),
                         exp.Is(this=outer.copy(), expression=exp.Null())))


def _node(condition: exp.Expr) -> exp.Expression:
    """The ``And``/``Or`` node ``exp.and_``/``exp.or_`` build (typed by sqlglot as its ``Condition`` trait)."""
    assert isinstance(condition, exp.Expression)
    return condition


__all__ = ["exists", "not_exists", "summary"]

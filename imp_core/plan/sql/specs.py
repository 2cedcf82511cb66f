"""What the subquery translation hands to the FROM clause's: an anti join to place over a block's rows.

Its own module so that ``from_clause`` (which places anti joins) and ``subqueries`` (which finds them) both import it
and neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from imp_core.plan.sql.scope import Item


@dataclass
class AntiSpec:
    """A NOT EXISTS / NOT IN conjunct: the subquery's rows (``item``) and the outer expressions its keys compare to."""

    item: Item
    outer: list[exp.Expression]  # compared with item's columns in order
    null_aware: bool
    node: exp.Expression
    neq: exp.Expression | None = None  # ``inner <> neq`` also correlates: item is a summary (inequality.py)


__all__ = ["AntiSpec"]

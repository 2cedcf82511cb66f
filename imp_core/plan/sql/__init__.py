"""SQL front-end: SQL text -> the plan IR, names resolved against the registered tables.

Modules, in the order a query goes through them: ``statement`` (parse), ``blocks`` (query blocks), ``from_clause``
and ``placement`` (FROM items, join tree), ``exprs`` and ``calls`` (expressions), ``grouping`` (aggregation);
``scope``, ``constants``, ``dates`` and ``positions`` (errors with line and column) serve them. See
docs/ARCHITECTURE.md, "The plan IR" and "How to add a SQL construct".
"""

from imp_core.plan.sql.statement import Query, parse_query, parse_statement

__all__ = ["Query", "parse_query", "parse_statement"]

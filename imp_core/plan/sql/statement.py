"""Parsing one query: ``parse_statement`` (text -> sqlglot tree) and ``parse_query`` (text -> plan).

See docs/ARCHITECTURE.md, "The plan IR".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow as pa
import sqlglot
from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import ParseError, SqlglotError, TokenError

from imp_core.errors import PlanError, UnsupportedError, first_line
from imp_core.plan.nodes import Plan
from imp_core.plan.sql.blocks import QueryTranslator
from imp_core.plan.sql.positions import parse_error, sqlglot_text
from imp_core.plan.sql.windows import bound_rankings


@dataclass(frozen=True, slots=True)
class Query:
    """A parsed query: its plan and the names of the result columns.

    Attributes:
        plan: The relational-algebra plan; its root's ``names`` equal ``output_names``.
        output_names: The result column names, in order, unique (case-insensitively): SELECT aliases, the bare
            column name for a plain column, ``_c{i}`` for an unaliased expression at position ``i``; a repeated
            name gets ``_2``, ``_3`` ... appended.
        sql: The SQL text the plan was made from.
    """

    plan: Plan
    output_names: tuple[str, ...]
    sql: str


def parse_query(
    sql: str, tables: Mapping[str, pa.Schema], dialect: str = "spark", *, statement: exp.Expression | None = None
) -> Query:
    """Translate one SELECT query into a plan over the registered tables.

    Identifiers are resolved case-insensitively (as Spark does); the plan keeps the spelling stored in ``tables``.

    Args:
        sql: The query text (one statement).
        tables: Registered table name -> Arrow schema of the table.
        dialect: The sqlglot dialect the text is written in.
        statement: ``sql`` already parsed by ``parse_statement``, so a caller that parsed it once does not pay for
            parsing again; it is read, not changed. ``sql`` is still needed: errors point into it.

    Returns:
        The plan and the result column names.

    Raises:
        PlanError: The SQL does not parse, or names an unknown table or column, an ambiguous column, or has a
            type error; ``line`` and ``column`` say where.
        UnsupportedError: The query uses a construct the platform cannot maintain (docs/SQL.md, "Refused").
    """
    if statement is None:
        statement = parse_statement(sql, dialect)
    translator = QueryTranslator(tables, sql, dialect)
    plan, names = translator.query(statement, {})
    plan = bound_rankings(plan, translator.loc, statement)
    return Query(plan, names, sql)


def parse_statement(sql: str, dialect: str = "spark") -> exp.Expression:
    """Parse SQL text that must hold exactly one query.

    Raises:
        PlanError: The text does not parse, is empty, or the dialect is unknown.
        UnsupportedError: The text holds several statements, or a statement that is not a query.
    """
    try:
        Dialect.get_or_raise(dialect)
    except ValueError as e:
        raise PlanError(f"unknown SQL dialect {dialect!r}: {first_line(str(e))}") from e
    try:
        statements = [s for s in sqlglot.parse(sql, read=dialect) if s is not None]
    except ParseError as e:
        raise parse_error(e) from e
    except (TokenError, SqlglotError) as e:
        raise PlanError(f"cannot parse the query: {sqlglot_text(str(e))}") from e
    if not statements:
        raise PlanError("the query text is empty")
    if len(statements) > 1:
        raise UnsupportedError(
            f"multiple statements ({len(statements)}) are not supported; a sketch is made for exactly one SELECT query"
        )
    statement = statements[0]
    if not (isinstance(statement, exp.Query) and isinstance(statement, exp.Expression)):
        kind = statement.name.upper() if isinstance(statement, exp.Command) else statement.key.upper()
        raise UnsupportedError(f"only SELECT queries can have sketches; got {kind}")
    return statement

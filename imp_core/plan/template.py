"""Query templates: the key under which a sketch is found again for a later query with other constants.

See docs/ARCHITECTURE.md, "Sketch use and reuse".
"""

from __future__ import annotations

import datetime as dt
import decimal
import re
from typing import Any

from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import SqlglotError
from sqlglot.optimizer.normalize_identifiers import normalize_identifiers

from imp_core.errors import PlanError
from imp_core.plan.sql import parse_statement


def template_key(sql: str, dialect: str = "spark", *,
                 statement: exp.Expression | None = None) -> tuple[str, tuple[Any, ...]]:
    """The template key of a query and the constants taken out of it.

    Queries that differ only in the constants of their WHERE and HAVING conditions share a key (the IMP paper's reuse
    setting: a dashboard runs the same query with new parameters); constants elsewhere (SELECT list, JOIN ... ON,
    LIMIT) stay in the key, since changing them changes the query, not its parameters.

    Args:
        sql: One SELECT query.
        dialect: The sqlglot dialect the text is written in; the key is generated in the same dialect.
        statement: ``sql`` already parsed by ``parse_statement`` (not parsed again); a copy is normalized, the
            caller's tree is left as it was.

    Returns:
        ``(key, constants)``: the normalized SQL (identifiers case-folded as the dialect does: all of them in
        Spark, unquoted ones in Postgres; keywords and spacing canonical) with ``?`` for each literal in a WHERE
        or HAVING condition of any query block, and those literals as Python values in the order of the
        placeholders: ``int``, ``decimal.Decimal`` for ``0.05``, ``float`` for ``1e3``, ``str``,
        ``datetime.date`` / ``datetime.datetime`` for ``DATE '...'`` / ``TIMESTAMP '...'`` (one constant each),
        ``int`` for the amount of ``INTERVAL '3' DAY``. A negated number (``-5``) is one constant.

    Raises:
        PlanError: The SQL does not parse.
        UnsupportedError: The text is not a single SELECT query.
    """
    tree = parse_statement(sql, dialect) if statement is None else statement.copy()
    try:
        tree = normalize_identifiers(tree, dialect=dialect)
    except SqlglotError as e:  # pragma: no cover - normalization does not fail on parsed trees
        raise PlanError(f"cannot normalize the query: {e}") from e

    # `"brand"` and `brand` name the same column once normalized: drop quotes that are not needed
    keywords = Dialect.get_or_raise(dialect).tokenizer_class.KEYWORDS
    for ident in tree.find_all(exp.Identifier):
        if ident.quoted and _PLAIN.fullmatch(ident.name) and ident.name.upper() not in keywords:
            ident.set("quoted", False)

    constants: list[Any] = []
    # walk in document order (depth first) so placeholders and constants line up the same way for every query
    # of a template
    for clause in list(tree.find_all(exp.Where, exp.Having, bfs=False)):
        for lit in _literals(clause):
            constants.append(_value(lit))
            lit.replace(exp.Var(this="?"))  # a bare `?` in every dialect (Postgres would print %s)
    return tree.sql(dialect=dialect, normalize=True, pretty=False, comments=False), tuple(constants)


_PLAIN = re.compile(r"[a-z_][a-z0-9_]*")


def _literals(clause: exp.Expression) -> list[exp.Expression]:
    """The constants of a condition (not those of subqueries inside it, which have their own WHERE)."""
    out: list[exp.Expression] = []

    def visit(node: exp.Expression) -> None:
        if isinstance(node, exp.Query) and node is not clause:
            return
        if isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal) and not node.this.is_string:
            out.append(node)
            return
        if isinstance(node, exp.Literal) or _temporal_literal(node) is not None:
            out.append(node)
            return
        for child in node.iter_expressions():
            visit(child)

    visit(clause)
    return out


def _temporal_literal(node: exp.Expression) -> dt.date | None:
    """The value of ``DATE '...'`` / ``TIMESTAMP '...'`` (parsed as a CAST of a string), else None."""
    if not (isinstance(node, exp.Cast) and isinstance(node.this, exp.Literal) and node.this.is_string):
        return None
    text = node.this.this.strip()
    try:
        if node.to.this == exp.DataType.Type.DATE:
            return dt.date.fromisoformat(text)
        if node.to.this in (exp.DataType.Type.TIMESTAMP, exp.DataType.Type.TIMESTAMPTZ,
                            exp.DataType.Type.TIMESTAMPLTZ, exp.DataType.Type.TIMESTAMPNTZ):
            return dt.datetime.fromisoformat(text)
    except ValueError:
        return None  # not a valid constant: its string stays a (string) constant of the CAST
    return None


def _value(node: exp.Expression) -> Any:
    temporal = _temporal_literal(node)
    if temporal is not None:
        return temporal
    if isinstance(node, exp.Neg):
        return -_value(node.this)
    assert isinstance(node, exp.Literal)
    text = node.this
    if node.is_string:
        # the amount of INTERVAL '3' DAY is a string in SQL but a number to the reuse check
        return int(text) if isinstance(node.parent, exp.Interval) and re.fullmatch(r"-?\d+", text) else text
    if re.fullmatch(r"\d+", text):
        return int(text)
    if re.fullmatch(r"\d*\.\d*", text):
        return decimal.Decimal(text)
    try:
        return float(text)
    except ValueError:
        return text

"""Errors of the SQL front-end that say where they are: line, column and the SQL written there.

See docs/ARCHITECTURE.md, "The plan IR".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TypeVar

from sqlglot import exp
from sqlglot.errors import ParseError

from imp_core.errors import PlanError, UnsupportedError

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_TOKEN = re.compile(r"<Token token_type: TokenType\.(\w+), text: (.*?), line: \d+, col: \d+, start: \d+, "
                    r"end: \d+, comments: \[.*?\]>")
_SNIPPET_CHARS = 60
_E = TypeVar("_E", bound=PlanError)

# The keywords that start a clause node before its first positioned token (see Locator.position).
_KEYWORDS: dict[type[exp.Expr], str] = {
    exp.Join: "NATURAL|LEFT|RIGHT|FULL|OUTER|INNER|CROSS|SEMI|ANTI|JOIN", exp.Limit: "LIMIT",
    exp.Offset: "OFFSET", exp.Fetch: "FETCH|FIRST|NEXT", exp.Qualify: "QUALIFY", exp.Group: "GROUP|BY",
    exp.Sort: "SORT|BY", exp.Cluster: "CLUSTER|BY", exp.Distribute: "DISTRIBUTE|BY", exp.Lateral: "LATERAL|VIEW",
    exp.With: "WITH|RECURSIVE", exp.Distinct: "DISTINCT|ON",
}


def sqlglot_text(text: str) -> str:
    """A sqlglot message or SQL text on one line: no ANSI highlighting, tokens by their text, spaces folded."""
    text = _TOKEN.sub(lambda m: "the end of the query" if m[1] == "SENTINEL" else f"'{m[2]}'", _ANSI.sub("", text))
    return " ".join(text.split())


def parse_error(e: ParseError) -> PlanError:
    """The ``PlanError`` for a sqlglot parse error, at sqlglot's position: the last character of the token where
    parsing stopped."""
    if not e.errors:
        return PlanError(f"cannot parse the query: {sqlglot_text(str(e))}")
    err = e.errors[0]
    near = sqlglot_text(f"{err.get('start_context', '')}{err.get('highlight', '')}")
    line, column = err.get("line") or None, err.get("col") or None
    where = f" at line {line}, column {column}" if line else ""
    message = sqlglot_text(f"{err.get('description', 'syntax error')}{where}" + (f" near '{near}'" if near else ""))
    return PlanError(f"cannot parse the query: {message}", line=line, column=column if line else None,
                     snippet=near or None)


def has_position(error: PlanError) -> bool:
    """Whether the error's message already says where it is (so an outer level does not add a second place)."""
    return error.line is not None or error.snippet is not None


@dataclass(frozen=True, slots=True)
class Locator:
    """Builds errors about a node of one parsed query: its position in ``sql`` and a snippet in ``dialect``."""

    sql: str
    dialect: str

    def position(self, node: exp.Expr) -> tuple[int | None, int | None, str]:
        """Line and column of the node's leftmost token that has a position (None, None without one), and its SQL."""
        snippet = sqlglot_text(node.sql(dialect=self.dialect))
        if len(snippet) > _SNIPPET_CHARS:
            snippet = snippet[:_SNIPPET_CHARS - 3] + "..."
        starts = [n.meta["start"] for n in node.walk() if "start" in n.meta]
        if not starts:
            return None, None, snippet
        s = min(starts)
        # a clause's first position is that of its first operand; step back over its keywords
        keywords = _KEYWORDS.get(type(node))
        if keywords:
            m = re.search(rf"(?:\b(?:{keywords})\s+)+$", self.sql[:s], re.IGNORECASE)
            if m:
                s = m.start()
        return self.sql.count("\n", 0, s) + 1, s - self.sql.rfind("\n", 0, s), snippet

    def located(self, cls: type[_E], before: str, node: exp.Expr, after: str = "") -> _E:
        """``cls(before + <where node is> + after)`` with the position as fields."""
        line, column, snippet = self.position(node)
        where = f"at line {line}, column {column} (`{snippet}`)" if line is not None else f"in `{snippet}`"
        return cls(f"{before}{where}{after}", line=line, column=column, snippet=snippet)

    def error(self, message: str, node: exp.Expr, hint: str = "") -> PlanError:
        """A ``PlanError``: "<message> at line L, column C (`sql`); <hint>"."""
        return self.located(PlanError, f"{message} ", node, f"; {hint}" if hint else "")

    def unsupported(self, construct: str, node: exp.Expr, hint: str = "") -> UnsupportedError:
        """An ``UnsupportedError``: "<construct> is not supported; found at line L, column C (`sql`); <hint>"."""
        return self.located(UnsupportedError, f"{construct} is not supported; found ", node,
                            f"; {hint}" if hint else "")

    def at(self, error: _E, node: exp.Expr) -> _E:
        """The same error (class and message) with where ``node`` is appended, for errors of the IR constructors."""
        return self.located(type(error), f"{error} ", node)

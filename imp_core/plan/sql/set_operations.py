"""``UNION ALL`` of query blocks -> a ``Union`` plan node; every other set operation is refused.

A mixin of ``blocks.QueryTranslator``. Each branch is cast to the column types Spark brings the branches to and
renamed to the first branch's names, so the ``Union`` node's inputs have one schema. See docs/SQL.md.
"""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa
from sqlglot import exp

from imp_core.errors import PlanError
from imp_core.plan.expr import NULL, Cast, Col
from imp_core.plan.expr.types import common_type, is_string
from imp_core.plan.nodes import Plan, Project, Union
from imp_core.plan.sql.positions import Locator
from imp_core.plan.sql.scope import Cte


class SetOperations:
    """The set operations of a query; ``QueryTranslator`` provides the attributes and methods declared here."""

    loc: Locator

    def query(self, node: exp.Expression, ctes: Mapping[str, Cte]) -> tuple[Plan, tuple[str, ...]]:
        raise NotImplementedError  # QueryTranslator.query

    def _set_operation(self, node: exp.SetOperation, ctes: Mapping[str, Cte]) -> tuple[Plan, tuple[str, ...]]:
        branches = self._branches(node)
        planned = [self.query(b, ctes) for b in branches]
        names = planned[0][1]
        for i, (_, branch_names) in enumerate(planned[1:], start=2):
            if len(branch_names) != len(names):
                raise self.loc.error(f"UNION ALL branch {i} has {len(branch_names)} columns, the first has "
                                     f"{len(names)}", branches[i - 1], "select the same number of columns in each")
        types: list[pa.DataType] = []
        for j, name in enumerate(names):
            t = planned[0][0].schema[j].dtype
            for i, (plan, _) in enumerate(planned[1:], start=2):
                try:
                    if _string_with_other(t, plan.schema[j].dtype):  # Spark's union turns those into strings
                        raise PlanError("a string and another type")
                    t = common_type(t, plan.schema[j].dtype)
                except PlanError:
                    raise self.loc.error(f"UNION ALL branch {i}: column {j + 1} ({name}) is "
                                         f"{plan.schema[j].dtype}, the branches before it {t}",
                                         branches[i - 1], "CAST the column to one type in every branch") from None
            types.append(t)
        inputs = tuple(_aligned(plan, names, types) for plan, _ in planned)
        return Union(inputs), names

    def _branches(self, node: exp.Expression) -> list[exp.Expression]:
        """The query blocks of a chain of ``UNION ALL`` (left-deep, as sqlglot parses it)."""
        if not isinstance(node, exp.SetOperation):
            return [node]
        if not isinstance(node, exp.Union) or node.args.get("distinct"):
            op = node.key.upper() + ("" if node.args.get("distinct") else " ALL")
            hint = ("write SELECT DISTINCT over a UNION ALL subquery for a set union" if isinstance(node, exp.Union)
                    else "only UNION ALL (bag union) is maintained")
            raise self.loc.unsupported(f"set operation {op}", node, hint)
        if node.args.get("by_name"):
            raise self.loc.unsupported("UNION ALL BY NAME", node,
                                       "select the columns in the same order in every branch")
        for key in ("order", "limit", "side", "kind", "on"):
            if node.args.get(key):
                what = {"order": "ORDER BY", "limit": "LIMIT"}.get(key, key.upper())
                raise self.loc.unsupported(f"{what} on a UNION ALL", node,
                                           "put the UNION ALL in a FROM subquery and order or limit the outer query")
        return [*self._branches(node.this), *self._branches(node.expression)]


def _aligned(plan: Plan, names: tuple[str, ...], types: list[pa.DataType]) -> Plan:
    """``plan`` with its columns renamed to ``names`` and cast to ``types`` (itself when they already are)."""
    if all(f.name == n and f.dtype == t for f, n, t in zip(plan.schema, names, types)):
        return plan
    items = []
    for f, n, t in zip(plan.schema, names, types):
        c = Col(f.name, f.dtype)
        items.append((n, c if f.dtype == t else Cast(c, t)))
    return Project(plan, tuple(items))


def _string_with_other(a: pa.DataType, b: pa.DataType) -> bool:
    """A string and a non-string value in one column: Spark's union brings them to a string, other expressions to the
    other type, so such a union is refused rather than guessed."""
    strings = [is_string(t) for t in (a, b) if t != NULL]
    return len(strings) == 2 and strings[0] != strings[1]

"""Set operations of query blocks: ``UNION ALL`` -> a ``Union`` plan node; ``UNION`` -> DISTINCT over it;
``INTERSECT`` / ``EXCEPT`` (set semantics) -> the rows of both inputs grouped, each group kept when it has rows of
both inputs / of the left one only. ``INTERSECT ALL`` / ``EXCEPT ALL`` are refused.

A mixin of ``blocks.QueryTranslator``. Each branch is cast to the column types Spark brings the branches to and
renamed to the first branch's names, so the ``Union`` node's inputs have one schema. See docs/SQL.md.
"""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa
from sqlglot import exp

from imp_core.errors import PlanError
from imp_core.plan.expr import NULL, AggCall, Binary, Cast, Col, Lit
from imp_core.plan.expr.types import common_type, is_string
from imp_core.plan.nodes import Aggregate, Distinct, Plan, Project, Select, Union
from imp_core.plan.sql.positions import Locator
from imp_core.plan.sql.scope import Cte


class SetOperations:
    """The set operations of a query; ``QueryTranslator`` provides the attributes and methods declared here."""

    loc: Locator

    def query(self, node: exp.Expression, ctes: Mapping[str, Cte]) -> tuple[Plan, tuple[str, ...]]:
        raise NotImplementedError  # QueryTranslator.query

    def _set_operation(self, node: exp.SetOperation, ctes: Mapping[str, Cte]) -> tuple[Plan, tuple[str, ...]]:
        self._check_set_operation(node)
        if isinstance(node, exp.Union) and not node.args.get("distinct"):
            return self._bag_union(self._branches(node), ctes, "UNION ALL")
        op = node.key.upper()
        if not node.args.get("distinct"):
            raise self.loc.unsupported(f"{op} ALL", node, f"write {op} (DISTINCT); its bag form is not maintained")
        union, names = self._bag_union([node.this, node.expression], ctes, op)
        if isinstance(node, exp.Union):
            return Distinct(union), names
        return _set_filter(union, names, intersect=isinstance(node, exp.Intersect)), names

    def _bag_union(self, branches: list[exp.Expression], ctes: Mapping[str, Cte], op: str
                   ) -> tuple[Union, tuple[str, ...]]:
        """The branches cast to common types and renamed to the first branch's names, in one ``Union``."""
        planned = [self.query(b, ctes) for b in branches]
        names = planned[0][1]
        for i, (_, branch_names) in enumerate(planned[1:], start=2):
            if len(branch_names) != len(names):
                raise self.loc.error(f"{op} branch {i} has {len(branch_names)} columns, the first has "
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
                    raise self.loc.error(f"{op} branch {i}: column {j + 1} ({name}) is "
                                         f"{plan.schema[j].dtype}, the branches before it {t}",
                                         branches[i - 1], "CAST the column to one type in every branch") from None
            types.append(t)
        inputs = tuple(_aligned(plan, names, types) for plan, _ in planned)
        return Union(inputs), names

    def _branches(self, node: exp.Expression) -> list[exp.Expression]:
        """The query blocks of a chain of ``UNION ALL`` (left-deep, as sqlglot parses it); another set operation in
        the chain is one branch."""
        if not (isinstance(node, exp.Union) and not node.args.get("distinct")):
            return [node]
        self._check_set_operation(node)
        return [*self._branches(node.this), *self._branches(node.expression)]

    def _check_set_operation(self, node: exp.SetOperation) -> None:
        op = node.key.upper() + ("" if node.args.get("distinct") else " ALL")
        if node.args.get("by_name"):
            raise self.loc.unsupported(f"{op} BY NAME", node, "select the columns in the same order in every branch")
        for key in ("order", "limit", "side", "kind", "on"):
            if node.args.get(key):
                what = {"order": "ORDER BY", "limit": "LIMIT"}.get(key, key.upper())
                raise self.loc.unsupported(f"{what} on a {op}", node,
                                           f"put the {op} in a FROM subquery and order or limit the outer query")


def _set_filter(union: Union, names: tuple[str, ...], intersect: bool) -> Plan:
    """INTERSECT / EXCEPT (set semantics) as a grouping of both inputs' rows: a row is in A INTERSECT B when its group
    has rows of both, in A EXCEPT B when it has rows of A only (GROUP BY treats NULLs as equal, as these do)."""
    left, right = union.inputs
    marks = [(left, 1, 0), (right, 0, 1)]
    tagged = Union(tuple(Project(p, tuple((f.name, Col(f.name, f.dtype)) for f in p.schema) +
                                 (("__in_left", Lit.of(a)), ("__in_right", Lit.of(b))))
                         for p, a, b in marks))
    cols = tuple((f.name, Col(f.name, f.dtype)) for f in union.schema)
    mark = tagged.field("__in_left").dtype
    agg = Aggregate(tagged, cols, (("__left_rows", AggCall("sum", Col("__in_left", mark))),
                                   ("__right_rows", AggCall("sum", Col("__in_right", mark)))))
    left_rows, right_rows = (Col(n, agg.field(n).dtype) for n in ("__left_rows", "__right_rows"))
    cond = Binary("and", Binary(">", left_rows, Lit.of(0)),
                  Binary(">" if intersect else "=", right_rows, Lit.of(0)))
    return Project(Select(agg, cond), tuple((n, Col(n, union.field(n).dtype)) for n in names))


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

"""Query blocks: SELECT ... FROM ... WHERE ... GROUP BY ... HAVING ... ORDER BY ... LIMIT -> a plan.

See docs/ARCHITECTURE.md, "The plan IR" (what the front-end guarantees).
"""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa
from sqlglot import exp

from imp_core.errors import PlanError, UnsupportedError
from imp_core.plan.expr import BOOL, Col, Expr, Lit, substitute
from imp_core.plan.nodes import Distinct, Plan, Project, Select, SortKey, TopK, Union
from imp_core.plan.sql.constants import CLAUSE_NAMES, SELECT_CLAUSES
from imp_core.plan.sql.exprs import ExprTranslator
from imp_core.plan.sql.grouping import aggregate
from imp_core.plan.sql.grouping_sets import (
    cube_sets,
    element_sets,
    expand,
    fresh,
    grouping_values,
    rolled_up,
    rollup_sets,
)
from imp_core.plan.sql.positions import Locator
from imp_core.plan.sql.scope import Cte, OrderItem, Scope, SelectItem, free_name, unique_names
from imp_core.plan.sql.set_operations import SetOperations
from imp_core.plan.sql.subqueries import Subqueries, lift_scalars
from imp_core.plan.sql.windows import Windows


class QueryTranslator(Subqueries, SetOperations, Windows):
    """Translates one parsed statement against the registered tables.

    Args:
        tables: Registered table name -> Arrow schema.
        sql: The statement's text (for positions in messages).
        dialect: The sqlglot dialect it is written in.
    """

    def __init__(self, tables: Mapping[str, pa.Schema], sql: str, dialect: str) -> None:
        self.tables = dict(tables)
        self.loc = Locator(sql, dialect)
        self._subqueries = 0
        self._rankings = 0

    def query(self, node: exp.Expression, ctes: Mapping[str, Cte]) -> tuple[Plan, tuple[str, ...]]:
        """Plan a query expression; returns the plan and its output names."""
        if isinstance(node, exp.Subquery):
            extra = [k for k, v in node.args.items() if v and k != "this"]
            if extra:
                raise self.loc.unsupported(f"{extra[0].upper()} on a parenthesized query", node)
            return self.query(node.this, ctes)
        if isinstance(node, exp.SetOperation):
            return self._set_operation(node, ctes)
        if isinstance(node, exp.Select):
            return self._select(node, ctes)
        raise self.loc.unsupported(f"{node.key.upper()} as a query", node)

    def _select(self, node: exp.Select, ctes: Mapping[str, Cte]) -> tuple[Plan, tuple[str, ...]]:
        self._check_clauses(node)
        ctes = self._with(node, ctes)
        if node.args.get("from_") is None:
            raise self.loc.unsupported("a SELECT without FROM", node, "a sketch needs at least one table")
        having_node = node.args.get("having")
        scope, source, having_sql = self._from(node, ctes, having_node.this if having_node is not None else None)
        source = self._windows(node, scope, source)

        items = self._select_items(node, scope)
        aliases: dict[str, int] = {}
        for i, it in enumerate(items):
            if it.alias:
                aliases.setdefault(it.name.lower(), i)
        alias_exprs = {a: items[i].expr for a, i in aliases.items()}

        group = node.args.get("group")
        keys, sets = self._group_by(group, scope, items, alias_exprs) if group is not None else (None, None)
        having = (self._condition(having_sql, scope, "HAVING", alias_exprs, allow_aggs=True)
                  if having_sql is not None else None)

        limit = self._limit(node)
        order_node = node.args.get("order")
        written_order = self._order_by(order_node, scope, items, alias_exprs) if order_node is not None else []
        if limit is not None and not written_order:
            raise self.loc.located(UnsupportedError, "LIMIT without ORDER BY is nondeterministic and not supported; "
                                   "found ", node.args["limit"],
                                   "; add an ORDER BY that makes the first rows well defined")
        # ORDER BY alone does not change the result set: it is checked above, then dropped
        order = written_order if limit is not None else []

        if sets is not None:
            assert keys is not None
            return self._grouping_sets(source, scope, items, keys, sets, having, order, limit, node)
        if scope.groupings:
            raise self.loc.error("GROUPING() and GROUPING_ID() need GROUP BY ROLLUP, CUBE or GROUPING SETS",
                                 node.find(exp.Grouping) or node.find(exp.GroupingId) or node)
        exprs = [it.expr for it in items] + ([having] if having is not None else []) + \
            [o.expr for o in written_order if o.expr is not None]
        if keys is not None or having is not None or any(e.has_aggregate() for e in exprs):
            plan, item_exprs, having, order_exprs = aggregate(self.loc, source, scope, items, keys or [], having,
                                                              order, node)
            plan = lift_scalars(plan)
            if having is not None:
                plan = Select(plan, having)
        else:
            plan, item_exprs = source, [it.expr for it in items]
            order_exprs = [o.expr for o in order]
        return self._output(plan, node, [it.name for it in items], item_exprs, order, order_exprs, limit)

    def _output(self, plan: Plan, node: exp.Select, item_names: list[str], item_exprs: list[Expr],
                order: list[OrderItem], order_exprs: list[Expr | None], limit: int | None
                ) -> tuple[Plan, tuple[str, ...]]:
        """SELECT list -> Project, DISTINCT -> Distinct, ORDER BY + LIMIT -> TopK over the Project's columns.

        An ORDER BY expression that is not an output column becomes a hidden ``__order{i}`` column of the Project,
        dropped again by a final Project after the TopK.
        """
        names = unique_names(item_names)
        project = list(zip(names, item_exprs))
        used = {n.lower() for n in names}
        sort_keys = []
        distinct = node.args.get("distinct") is not None
        for i, (o, e) in enumerate(zip(order, order_exprs)):
            if o.item is None:
                assert e is not None
                matches = [j for j, ie in enumerate(item_exprs) if ie == e]
                if matches:
                    o.item = matches[0]
                elif distinct:
                    raise self.loc.error("with SELECT DISTINCT, ORDER BY expressions must appear in the select list",
                                         node.args["order"].expressions[i])
                else:
                    hidden = free_name([f"__order{i}"], used)
                    project.append((hidden, e))
                    sort_keys.append(SortKey(Col(hidden, e.dtype), o.descending, o.nulls_first))
                    continue
            name, e = project[o.item]
            sort_keys.append(SortKey(Col(name, e.dtype), o.descending, o.nulls_first))

        plan = Project(plan, tuple(project))
        if distinct:
            plan = Distinct(plan)
        if limit is not None:
            plan = TopK(plan, tuple(sort_keys), limit)
            if len(project) > len(names):
                plan = Project(plan, tuple((n, Col(n, e.dtype)) for n, e in project[:len(names)]))
        return plan, tuple(names)

    def _check_clauses(self, node: exp.Select) -> None:
        for key, value in node.args.items():
            if key in SELECT_CLAUSES or not value:
                continue
            at = value[0] if isinstance(value, list) else value
            if not isinstance(at, exp.Expression):
                at = node
            raise self.loc.unsupported(CLAUSE_NAMES.get(key, f"the {key.upper()} clause"), at)
        distinct = node.args.get("distinct")
        if distinct is not None and distinct.args.get("on") is not None:
            raise self.loc.unsupported("SELECT DISTINCT ON", distinct)
        if node.args.get("offset") is not None:
            raise self.loc.unsupported("OFFSET", node.args["offset"],
                                       "a sketch of rows past an offset cannot be maintained; use ORDER BY ... LIMIT")

    def _with(self, node: exp.Expression, ctes: Mapping[str, Cte]) -> Mapping[str, Cte]:
        with_ = node.args.get("with_")
        if with_ is None:
            return ctes
        if with_.args.get("recursive"):
            raise self.loc.unsupported("WITH RECURSIVE", with_)
        env = dict(ctes)
        for cte in with_.expressions:
            alias = cte.args.get("alias")
            name = cte.alias
            columns = tuple(c.name for c in alias.columns) if alias is not None else ()
            # A CTE is inlined at every reference, seeing only the CTEs defined before it.
            env[name.lower()] = Cte(name, cte.this, columns, dict(env))
        return env

    def _select_items(self, node: exp.Select, scope: Scope) -> list[SelectItem]:
        items: list[SelectItem] = []
        for pos, e in enumerate(node.expressions):
            if isinstance(e, exp.Star) or (isinstance(e, exp.Column) and isinstance(e.this, exp.Star)):
                star = e if isinstance(e, exp.Star) else e.this
                extra = [k for k, v in star.args.items() if v]
                if extra:
                    raise self.loc.unsupported(f"SELECT * {extra[0].rstrip('_').upper()}", e)
                if isinstance(e, exp.Star):
                    sources = scope.visible
                else:
                    found = scope.item(e.table)
                    if found is None:
                        raise self.loc.error(f"{e.table}.* does not name a FROM item", e,
                                             f"FROM has {scope.describe()}")
                    sources = (found,)
                items += [SelectItem(c.name, c.col, False) for item in sources for c in item.columns]
                continue
            if isinstance(e, exp.Alias):
                items.append(SelectItem(e.alias, self._expr(e.this, scope, "SELECT", allow_aggs=True), True))
                continue
            ir = self._expr(e, scope, "SELECT", allow_aggs=True)
            if isinstance(e, exp.Column) and isinstance(ir, Col):
                items.append(SelectItem(scope.bare[ir.name], ir, False))
            else:
                items.append(SelectItem(f"_c{pos}", ir, False))
        return items

    def _group_by(self, group: exp.Group, scope: Scope, items: list[SelectItem],
                  aliases: dict[str, Expr]) -> tuple[list[Expr], list[list[int]] | None]:
        """The GROUP BY expressions, and the grouping sets (indexes into them) when ROLLUP, CUBE or GROUPING SETS
        is used (None otherwise)."""
        if group.args.get("totals"):
            raise self.loc.unsupported("GROUP BY ... WITH TOTALS", group)
        if group.args.get("all"):
            raise self.loc.unsupported("GROUP BY ALL", group, "list the grouping columns")
        elements: list[list[list[Expr]]] = []
        keys: list[Expr] = []
        for g in group.expressions:
            options = element_sets(g)
            translated = [[self._group_key(x, scope, items, aliases) for x in opt]
                          for opt in (options if options is not None else [[g]])]
            elements.append(translated)
            for e in (e for opt in translated for e in opt):
                if e not in keys:
                    keys.append(e)
        for key in ("rollup", "cube"):  # GROUP BY a, b WITH ROLLUP / WITH CUBE
            if group.args.get(key):
                elements = [rollup_sets(keys) if key == "rollup" else cube_sets(keys)]
        if group.args.get("grouping_sets"):
            raise self.loc.unsupported("this form of GROUPING SETS", group,
                                       "write GROUP BY GROUPING SETS ((a, b), (a))")
        plain = all(len(options) == 1 for options in elements)
        return keys, (None if plain else expand(elements, keys))

    def _group_key(self, g: exp.Expression, scope: Scope, items: list[SelectItem], aliases: dict[str, Expr]) -> Expr:
        if isinstance(g, exp.Literal) and not g.is_string and g.is_int:
            k = self._ordinal(g, items, "GROUP BY")
            e = items[k].expr
            if e.has_aggregate():
                raise self.loc.error(f"GROUP BY {k + 1} refers to an aggregate", g)
            return e
        e = self._expr(g, scope, "GROUP BY", aliases)
        if e.has_aggregate():
            raise self.loc.error("aggregate functions are not allowed in GROUP BY", g)
        return e

    def _grouping_sets(self, source: Plan, scope: Scope, items: list[SelectItem], keys: list[Expr],
                       sets: list[list[int]], having: Expr | None, order: list[OrderItem], limit: int | None,
                       node: exp.Select) -> tuple[Plan, tuple[str, ...]]:
        """The union of one aggregation per grouping set (``grouping_sets.py``), then DISTINCT and ORDER BY/LIMIT
        over the select list's names."""
        names = unique_names([it.name for it in items])
        for i, o in enumerate(order):
            if o.item is None:
                o.item = next((j for j, it in enumerate(items) if it.expr == o.expr), None)
                if o.item is None:
                    raise self.loc.unsupported("ORDER BY an expression outside the select list with GROUPING SETS, "
                                               "ROLLUP or CUBE", node.args["order"].expressions[i],
                                               "select it and order by its name")
        branches: list[Plan] = []
        for s in sets:
            absent = [k for i, k in enumerate(keys) if i not in s]
            try:
                values = grouping_values(scope.groupings, keys, s)
            except PlanError as e:
                raise self.loc.at(e, node.find(exp.Grouping) or node.find(exp.GroupingId) or node) from e
            its = [SelectItem(it.name, substitute(rolled_up(it.expr, absent), values), it.alias) for it in items]
            cond = substitute(rolled_up(having, absent), values) if having is not None else None
            # Spark groups every set by its keys and the set's id: over no rows even the empty set has no group
            group = [keys[i] for i in s] or ([Lit.of(0)] if len(sets) > 1 else [])
            plan, item_exprs, cond, _ = aggregate(self.loc, fresh(source), scope, its, group, cond, [], node)
            branches.append(Project(plan if cond is None else Select(plan, cond), tuple(zip(names, item_exprs))))
        out: Plan = Union(tuple(branches)) if len(branches) > 1 else branches[0]
        if node.args.get("distinct") is not None:
            out = Distinct(out)
        if limit is not None:
            out = TopK(out, tuple(SortKey(Col(names[o.item], out.schema[o.item].dtype), o.descending, o.nulls_first)
                                  for o in order if o.item is not None), limit)
        return out, tuple(names)

    def _ordinal(self, node: exp.Literal, items: list[SelectItem], clause: str) -> int:
        k = int(node.this)
        if not 1 <= k <= len(items):
            raise self.loc.error(f"{clause} position {k} is not in the select list (1..{len(items)})", node)
        return k - 1

    def _order_by(self, order: exp.Order, scope: Scope, items: list[SelectItem],
                  aliases: dict[str, Expr]) -> list[OrderItem]:
        out = []
        for o in order.expressions:
            if o.args.get("with_fill"):
                raise self.loc.unsupported("ORDER BY ... WITH FILL", o)
            desc = bool(o.args.get("desc"))
            nulls_first = o.args.get("nulls_first")
            # sqlglot fills in the dialect's default; keep None when it equals Spark's (NULLs smallest) so only
            # an order that differs from the default is spelled out in the plan.
            nulls = None if nulls_first is None or bool(nulls_first) == (not desc) else bool(nulls_first)
            e = o.this
            if isinstance(e, exp.Literal) and not e.is_string and e.is_int:
                out.append(OrderItem(self._ordinal(e, items, "ORDER BY"), None, desc, nulls))
                continue
            if isinstance(e, exp.Column) and not e.table and isinstance(e.this, exp.Identifier):
                # Spark resolves a bare name in ORDER BY against the select list first.
                hits = [i for i, it in enumerate(items) if it.name == e.name] or \
                       [i for i, it in enumerate(items) if it.name.lower() == e.name.lower()]
                if len({items[i].expr for i in hits}) > 1:
                    raise self.loc.error(f"ORDER BY {e.name} is ambiguous: several select items are named so", e)
                if hits:
                    out.append(OrderItem(hits[0], None, desc, nulls))
                    continue
            out.append(OrderItem(None, self._expr(e, scope, "ORDER BY", aliases, allow_aggs=True), desc, nulls))
        return out

    def _limit(self, node: exp.Select) -> int | None:
        limit = node.args.get("limit")
        if limit is None:
            return None
        if isinstance(limit, exp.Fetch):
            options = limit.args.get("limit_options")
            if options is not None and (options.args.get("percent") or options.args.get("with_ties")):
                raise self.loc.unsupported("FETCH ... PERCENT / WITH TIES", limit)
            value = limit.args.get("count")
            if value is None:
                return 1  # FETCH FIRST ROW ONLY
        else:
            if limit.args.get("offset") is not None:
                raise self.loc.unsupported("OFFSET", limit, "a sketch of rows past an offset cannot be maintained")
            if limit.args.get("expressions"):
                raise self.loc.unsupported("LIMIT BY", limit)
            value = limit.expression
        if not (isinstance(value, exp.Literal) and not value.is_string and value.is_int):
            raise self.loc.unsupported("a LIMIT that is not an integer constant", limit)
        return int(value.this)

    def _expr(self, node: exp.Expression, scope: Scope, clause: str, aliases: dict[str, Expr] | None = None,
              allow_aggs: bool = False) -> Expr:
        return ExprTranslator(self.loc, scope, clause, aliases or {}, allow_aggs)(node)

    def _condition(self, node: exp.Expression, scope: Scope, clause: str, aliases: dict[str, Expr] | None = None,
                   allow_aggs: bool = False) -> Expr:
        e = self._expr(node, scope, clause, aliases, allow_aggs)
        if e.dtype not in (BOOL, pa.null()):
            raise self.loc.error(f"the {clause} condition must be boolean, got an expression of type {e.dtype}", node)
        return e

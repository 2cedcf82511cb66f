"""FROM items and joins of a query block: tables, subqueries, CTE references; which joins are supported.

A mixin of ``blocks.QueryTranslator``. See docs/ARCHITECTURE.md, "The plan IR".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pyarrow as pa
from sqlglot import exp

from imp_core.errors import UnsupportedError
from imp_core.plan.expr import Col, Expr, conjuncts
from imp_core.plan.nodes import Field, Plan, Project, Scan
from imp_core.plan.sql.constants import TABLE_ARG_NAMES
from imp_core.plan.sql.outer_joins import outer_join
from imp_core.plan.sql.placement import place
from imp_core.plan.sql.positions import Locator
from imp_core.plan.sql.scope import Column, Cte, Item, Scope, unique_names
from imp_core.plan.sql.specs import AntiSpec


class FromClause:
    """The FROM clause's translation; ``QueryTranslator`` provides the attributes and methods declared here."""

    loc: Locator
    tables: dict[str, pa.Schema]
    _subqueries: int

    def query(self, node: exp.Expression, ctes: Mapping[str, Cte]) -> tuple[Plan, tuple[str, ...]]:
        raise NotImplementedError  # QueryTranslator.query

    def _condition(self, node: exp.Expression, scope: Scope, clause: str) -> Expr:
        raise NotImplementedError  # QueryTranslator._condition

    def _where_subqueries(self, where: exp.Expression, ctes: Mapping[str, Cte], items: list[Item]
                          ) -> tuple[list[exp.Expression], list[AntiSpec]]:
        raise NotImplementedError  # Subqueries._where_subqueries

    def _having_subqueries(self, having: exp.Expression, ctes: Mapping[str, Cte], items: list[Item]
                           ) -> exp.Expression:
        raise NotImplementedError  # Subqueries._having_subqueries

    def _anti_joins(self, plan: Plan, antis: list[AntiSpec], scope: Scope) -> Plan:
        raise NotImplementedError  # Subqueries._anti_joins

    def _from(self, node: exp.Select, ctes: Mapping[str, Cte], having: exp.Expression | None = None
              ) -> tuple[Scope, Plan, exp.Expression | None]:
        """The scope of the FROM items and their join tree with the ON and WHERE conditions placed; subqueries of
        WHERE and of ``having`` are joined in as hidden items (``having`` comes back rewritten to read them)."""
        items: list[Item] = []
        ons: list[tuple[exp.Expression, int]] = []  # ON condition, number of FROM items visible to it
        outers: list[tuple[int, str, exp.Join]] = []  # outer joins: the joined item's index, LEFT/RIGHT/FULL
        self._add_item(node.args["from_"].this, ctes, items, ons)
        self._add_joins(node.args.get("joins") or [], ctes, items, ons, outers)
        seen: dict[str, Item] = {}
        for item in items:
            other = seen.get(item.alias.lower())
            if other is not None:
                raise self.loc.error(f"the name {item.alias} is used for two FROM items ({other.label} and "
                                     f"{item.label})", item.node, "give them distinct aliases")
            seen[item.alias.lower()] = item

        where = node.args.get("where")
        wheres, antis = self._where_subqueries(where.this, ctes, items) if where is not None else ([], [])
        if having is not None:
            having = self._having_subqueries(having, ctes, items)
        scope = Scope(items)
        conds: list[Expr] = []
        for on, n in ons:
            conds += conjuncts(self._condition(on, Scope(items[:n]), "ON"))
        where_conds: list[Expr] = []
        for w in wheres:
            where_conds += conjuncts(self._condition(w, scope, "WHERE"))
        plan = place(scope, conds + where_conds) if not outers else self._outer_tree(items, outers, conds,
                                                                                      where_conds)
        if antis:
            plan = self._anti_joins(plan, antis, scope)
        return scope, plan, having

    def _add_joins(self, joins: Sequence[exp.Join], ctes: Mapping[str, Cte], items: list[Item],
                   ons: list[tuple[exp.Expression, int]], outers: list[tuple[int, str, exp.Join]] | None = None
                   ) -> None:
        """Add the joined items; ``outers`` collects outer joins (None: inside a parenthesized join, none allowed)."""
        for join in joins:
            side = self._check_join(join, outers is not None)
            if outers and not side:
                raise self.loc.unsupported("an inner join after an outer join", join,
                                           "put the outer joins last, or join the outer join's result in a subquery")
            self._add_item(join.this, ctes, items, ons)
            on = join.args.get("on")
            if side:
                if on is None:
                    raise self.loc.unsupported(f"{side} JOIN without ON", join, "give the join keys with ON")
                assert outers is not None
                outers.append((len(items) - 1, side, join))
            elif on is not None:
                ons.append((on, len(items)))

    def _outer_tree(self, items: list[Item], outers: list[tuple[int, str, exp.Join]], ons: list[Expr],
                    wheres: list[Expr]) -> Plan:
        """The items before the first outer join joined as usual, then each outer join (docs/SQL.md, "Outer
        joins"), then the WHERE conditions that read a joined item (those on the preserved side of LEFT joins go
        below them) and the hidden items of WHERE's subqueries."""
        first = outers[0][0]
        inner = items[:first]
        inner_names = {c.col.name for it in inner for c in it.columns}
        left_only = all(side == "LEFT" for _, side, _ in outers)
        low = [c for c in wheres if left_only and c.columns() <= inner_names]
        plan = place(Scope(inner), ons + low)
        for index, side, join in outers:
            on = self._condition(join.args["on"], Scope(items[:index + 1]), "ON")
            try:
                plan = outer_join(plan, items[index].plan, side, on)
            except UnsupportedError as e:
                raise self.loc.at(e, join) from e
        last = outers[-1][0]
        joined = Item("__joined", "the outer join", plan,
                      tuple(c for it in items[:last + 1] for c in it.columns), items[0].node)
        return place(Scope([joined, *items[last + 1:]]), [c for c in wheres if c not in low])

    def _outer_side(self, join: exp.Join, outer_ok: bool) -> str:
        side, kind = join.side, join.kind
        if not outer_ok:
            raise self.loc.unsupported(f"{side} OUTER JOIN inside a parenthesized join", join,
                                       "join the outer join's result in a subquery")
        if kind not in ("", "OUTER"):
            raise self.loc.unsupported(f"{side} {kind} JOIN", join)
        if join.args.get("using"):
            raise self.loc.unsupported("JOIN ... USING", join, "write the join condition with ON")
        return str(side).upper()

    def _check_join(self, join: exp.Join, outer_ok: bool) -> str:
        """LEFT, RIGHT or FULL for an outer join, "" for an inner or cross join; refuses the rest."""
        side, kind, method = join.side, join.kind, join.method
        if method:
            raise self.loc.unsupported(f"{method} JOIN", join, "write the join condition with ON")
        if kind in ("SEMI", "ANTI"):
            raise self.loc.unsupported(f"{(side + ' ') if side else ''}{kind} JOIN (semi/anti join)", join,
                                       f"write {'NOT ' if kind == 'ANTI' else ''}EXISTS (SELECT ...) in WHERE")
        if side:
            return self._outer_side(join, outer_ok)
        if kind not in ("", "INNER", "CROSS"):
            raise self.loc.unsupported(f"{kind} JOIN", join)
        if join.args.get("using"):
            raise self.loc.unsupported("JOIN ... USING", join, "write the join condition with ON")
        for key, value in join.args.items():
            if value and key not in ("this", "on", "side", "kind", "method", "using", "hint"):
                raise self.loc.unsupported(f"{key.upper()} in a join", join)
        return ""

    def _add_item(self, node: exp.Expression, ctes: Mapping[str, Cte], items: list[Item],
                  ons: list[tuple[exp.Expression, int]]) -> None:
        if isinstance(node, exp.Subquery) and isinstance(node.this, exp.Table):
            # a parenthesized join: inner joins are associative, so its items join the enclosing FROM
            if node.args.get("alias") is not None:
                raise self.loc.unsupported("an alias on a parenthesized join", node)
            node = node.this
        if isinstance(node, exp.Table):
            items.append(self._table_item(node, ctes))
            self._add_joins(node.args.get("joins") or [], ctes, items, ons)
        elif isinstance(node, exp.Subquery):
            alias_node = node.args.get("alias")
            alias = node.alias
            if not alias:
                self._subqueries += 1
                alias = f"__subquery{self._subqueries}"
            columns = tuple(c.name for c in alias_node.columns) if alias_node is not None else ()
            plan, names = self.query(node.this, ctes)
            items.append(self._renamed(plan, names, alias, columns, f"subquery {alias}", node))
        elif isinstance(node, exp.Lateral):
            raise self.loc.unsupported("LATERAL", node)
        elif isinstance(node, exp.Values):
            raise self.loc.unsupported("VALUES in FROM", node, "register the rows as a table")
        elif isinstance(node, exp.Unnest):
            raise self.loc.unsupported("UNNEST", node)
        else:
            raise self.loc.unsupported(f"{node.key.upper()} in FROM", node)

    def _table_item(self, node: exp.Table, ctes: Mapping[str, Cte]) -> Item:
        if not isinstance(node.this, exp.Identifier):
            raise self.loc.unsupported("a table-valued function", node)
        for key, value in node.args.items():
            if value and key not in ("this", "alias", "db", "catalog", "joins", "hints"):
                hint = "the platform pins table versions itself" if key in ("version", "system_time") else ""
                raise self.loc.unsupported(TABLE_ARG_NAMES.get(key, f"{key.upper()} on a table"), node, hint)
        parts = [p.name for p in node.parts]
        name = ".".join(parts)
        alias_node = node.args.get("alias")
        alias = node.alias or node.name
        if len(parts) == 1 and name.lower() in ctes:
            cte = ctes[name.lower()]
            columns = tuple(c.name for c in alias_node.columns) if alias_node is not None else ()
            plan, names = self.query(cte.body, cte.env)
            label = cte.name if alias == cte.name else f"{cte.name} AS {alias}"
            return self._renamed(plan, names, alias, columns or cte.columns, label, node)
        if alias_node is not None and alias_node.columns:
            raise self.loc.unsupported("column aliases on a table", node, "rename the columns in the SELECT list")
        stored = self._lookup_table(name, node, ctes)
        schema = self.tables[stored]
        if not node.alias:
            alias = stored.split(".")[-1]
        scan = Scan(stored, alias, tuple(Field(f.name, f.type) for f in schema))
        label = stored if alias == stored else f"{stored} AS {alias}"
        columns = tuple(Column(c.name, Col(f.name, f.dtype)) for c, f in zip(scan.columns, scan.schema))
        return Item(alias, label, scan, columns, node)

    def _lookup_table(self, name: str, node: exp.Expression, ctes: Mapping[str, Cte]) -> str:
        if name in self.tables:
            return name
        folded = [t for t in self.tables if t.lower() == name.lower()]
        if len(folded) == 1:
            return folded[0]
        if len(folded) > 1:
            raise self.loc.error(f"table name {name} is ambiguous: {', '.join(sorted(folded))} differ only in case",
                                 node)
        known = ", ".join(sorted(self.tables)) or "(none)"
        also = f"; CTEs in scope: {', '.join(c.name for c in ctes.values())}" if ctes else ""
        raise self.loc.error(f"unknown table {name}", node, f"registered tables: {known}{also}")

    def _renamed(self, plan: Plan, names: Sequence[str], alias: str, columns: Sequence[str], label: str,
                 node: exp.Expression) -> Item:
        """A subquery as a FROM item: a Project renaming its output ``x`` to ``alias.x``."""
        if columns:
            if len(columns) != len(names):
                raise self.loc.error(f"{label} has {len(names)} columns but {len(columns)} column aliases", node)
            names_out = unique_names(columns)
        else:
            names_out = list(names)
        proj = Project(plan, tuple((f"{alias}.{out}", Col(n, f.dtype))
                                   for out, n, f in zip(names_out, names, plan.schema)))
        cols = tuple(Column(out, Col(f.name, f.dtype)) for out, f in zip(names_out, proj.schema))
        return Item(alias, label, proj, cols, node)

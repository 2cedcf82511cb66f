"""Subqueries in WHERE and HAVING: decorrelated into joins the engine maintains (docs/SQL.md, "Subqueries").

* ``x IN (SELECT y ...)`` and ``EXISTS (SELECT ... WHERE inner = outer ...)``: a semi join, written as an inner join
  with the DISTINCT correlation keys (and ``y``) of the subquery. Each outer row matches at most one distinct key row,
  so its multiplicity is kept; the key row's annotation is the union of the fragments of every subquery row with that
  key (paper 5.2: DISTINCT), so the sketch keeps every row the match depends on.
* ``NOT EXISTS (...)`` (correlated by equalities) and ``x NOT IN (SELECT y ...)``: an ``AntiJoin`` over the block's
  rows, with NOT IN's NULL semantics (``null_aware``).
* A scalar subquery compared in WHERE (``x < (SELECT 0.2 * AVG(y) ... WHERE inner = outer)``): uncorrelated, its one
  aggregate row is joined in; correlated, the aggregate grouped by the correlation keys is joined on them (an outer
  row without a group compares with NULL and is dropped, as in Spark, so only aggregates that are NULL over no rows
  are accepted). In HAVING an uncorrelated scalar subquery is joined into the FROM and read as ``MAX(v)``: every row
  of a group carries the same ``v``. ``lift_scalars`` then moves that join above a grouped aggregation: the same rows
  and the same annotations (each group's row depends on all of its rows and on the scalar's), but the scalar's
  fragments join each group's one output row instead of entering every input row and the groups' ``F_g``.

A mixin of ``blocks.QueryTranslator``; everything else (outer references past one level, correlation other than
equalities, subqueries under OR or in the select list) is refused with the place and a hint.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow as pa
from sqlglot import exp

from imp_core.errors import PlanError, UnsupportedError
from imp_core.plan.expr import AggCall, Binary, Cast, Col, Expr
from imp_core.plan.expr.types import common_type
from imp_core.plan.nodes import Aggregate, AntiJoin, Join, Plan, Project, Select
from imp_core.plan.sql import inequality
from imp_core.plan.sql.from_clause import FromClause
from imp_core.plan.sql.outer_joins import outer_join
from imp_core.plan.sql.scope import Cte, Item, Scope
from imp_core.plan.sql.specs import AntiSpec

# aggregates (and wrappers) whose value over no rows is not NULL: a missing correlated group would differ
_NOT_NULL_WHEN_EMPTY = (exp.Count, exp.Coalesce, exp.Case, exp.If, exp.Nvl2)


@dataclass
class Decorrelated:
    """A subquery's conjuncts split by whether they read the outer block: ``pairs`` (inner, outer) equalities."""

    pairs: list[tuple[exp.Expression, exp.Expression]]
    local: list[exp.Expression]
    neq: tuple[exp.Expression, exp.Expression] | None = None  # one (inner, outer) of ``inner <> outer``


class Subqueries(FromClause):
    """Subqueries in WHERE/HAVING; ``QueryTranslator`` provides the attributes and methods declared here."""

    def _expr(self, node: exp.Expression, scope: Scope, clause: str, aliases: dict[str, Expr] | None = None,
              allow_aggs: bool = False) -> Expr:
        raise NotImplementedError  # QueryTranslator._expr

    # -- WHERE ---------------------------------------------------------------------------------------------------------

    def _where_subqueries(self, where: exp.Expression, ctes: Mapping[str, Cte], items: list[Item]
                          ) -> tuple[list[exp.Expression], list[AntiSpec]]:
        """Split WHERE into conjuncts to translate (semi-join and scalar conditions rewritten to read the derived
        FROM items this appends to ``items``) and the anti joins to put over the block's join tree."""
        conds: list[exp.Expression] = []
        antis: list[AntiSpec] = []
        outer = Scope(items)
        for c in _conjuncts(where):
            inner, negated = _strip_not(c)
            if isinstance(inner, exp.Exists):
                if negated:
                    antis.append(self._not_exists(inner, ctes, outer))
                else:
                    conds += self._exists(inner, ctes, outer, items)
            elif isinstance(inner, exp.In) and inner.args.get("query") is not None:
                if negated:
                    antis.append(self._not_in(inner, ctes, outer))
                else:
                    conds += self._in(inner, ctes, outer, items)
            elif _scalar_subqueries(c):
                conds += self._scalar_condition(c, ctes, outer, items)
            else:
                conds.append(c)
        return conds, antis

    def _exists(self, node: exp.Exists, ctes: Mapping[str, Cte], outer: Scope, items: list[Item]
                ) -> list[exp.Expression]:
        sub = self._plain_select(node.this, "EXISTS")
        if sub.args.get("group") or sub.args.get("having") or _has_aggregate(sub):
            raise self.loc.unsupported("EXISTS over an aggregation", node, "an aggregate subquery always has a row")
        d = self._decorrelate(sub, ctes, outer, "EXISTS", allow_neq=True)
        if d.neq is not None:
            keys = [inner for inner, _ in d.pairs]
            alias = self._derived(inequality.summary(sub, keys, d.local, d.neq[0]), ctes, items, "semi", node)
            n = len(keys)
            return [exp.EQ(this=o.copy(), expression=_ref(alias, i)) for i, (_, o) in enumerate(d.pairs)] + \
                [inequality.exists(_ref(alias, n), _ref(alias, n + 1), d.neq[1])]
        keys = [inner for inner, _ in d.pairs] or [exp.Literal.number(1)]
        alias = self._derived(_reselect(sub, keys, d.local, distinct=True), ctes, items, "semi", node)
        return [exp.EQ(this=o.copy(), expression=_ref(alias, i)) for i, (_, o) in enumerate(d.pairs)]

    def _in(self, node: exp.In, ctes: Mapping[str, Cte], outer: Scope, items: list[Item]) -> list[exp.Expression]:
        sub_node = node.args["query"]
        body = sub_node.this if isinstance(sub_node, exp.Subquery) else sub_node
        value = node.this
        if isinstance(value, exp.Tuple):
            raise self.loc.unsupported("IN with several columns", node, "compare one column, or use EXISTS")
        self._one_column(body, "IN")
        if _is_simple(body):
            d = self._decorrelate(body, ctes, outer, "IN")
            keys = [body.expressions[0].unalias()] + [inner for inner, _ in d.pairs]
            alias = self._derived(_reselect(body, keys, d.local, distinct=True), ctes, items, "semi", node)
            outers = [value] + [o for _, o in d.pairs]
            return [exp.EQ(this=o.copy(), expression=_ref(alias, i)) for i, o in enumerate(outers)]
        if _correlated(self, body, ctes):
            raise self.loc.unsupported("a correlated IN subquery with an aggregation, DISTINCT or LIMIT", node,
                                       "write it as EXISTS with the IN value as one more equality")
        alias = self._derived(_wrapped(body, distinct=True), ctes, items, "semi", node)
        return [exp.EQ(this=value.copy(), expression=_ref(alias, 0))]

    def _not_exists(self, node: exp.Exists, ctes: Mapping[str, Cte], outer: Scope) -> AntiSpec:
        sub = self._plain_select(node.this, "NOT EXISTS")
        if sub.args.get("group") or sub.args.get("having") or _has_aggregate(sub):
            raise self.loc.unsupported("NOT EXISTS over an aggregation", node, "an aggregate subquery always has a "
                                       "row, so NOT EXISTS is always false")
        d = self._decorrelate(sub, ctes, outer, "NOT EXISTS", allow_neq=True)
        if not d.pairs:
            raise self.loc.unsupported("an uncorrelated NOT EXISTS", node,
                                       "correlate it with the outer query by an equality (inner = outer)")
        items: list[Item] = []
        if d.neq is not None:
            keys = [i for i, _ in d.pairs]
            self._derived(inequality.summary(sub, keys, d.local, d.neq[0]), ctes, items, "anti", node)
            return AntiSpec(items[0], [o for _, o in d.pairs], False, node, d.neq[1])
        self._derived(_reselect(sub, [i for i, _ in d.pairs], d.local, distinct=False), ctes, items, "anti", node)
        return AntiSpec(items[0], [o for _, o in d.pairs], False, node)

    def _not_in(self, node: exp.In, ctes: Mapping[str, Cte], outer: Scope) -> AntiSpec:
        sub_node = node.args["query"]
        body = sub_node.this if isinstance(sub_node, exp.Subquery) else sub_node
        if isinstance(node.this, exp.Tuple):
            raise self.loc.unsupported("NOT IN with several columns", node, "use NOT EXISTS")
        if _correlated(self, body, ctes):
            raise self.loc.unsupported("a correlated NOT IN subquery", node,
                                       "write it as NOT EXISTS (its NULL semantics differ: check the columns' NULLs)")
        self._one_column(body, "NOT IN")
        derived = (_reselect(body, [body.expressions[0].unalias()], _conjuncts_of(body), distinct=False)
                   if _is_simple(body) else _wrapped(body, distinct=False))
        items: list[Item] = []
        self._derived(derived, ctes, items, "anti", node)
        return AntiSpec(items[0], [node.this], True, node)

    def _scalar_condition(self, cond: exp.Expression, ctes: Mapping[str, Cte], outer: Scope, items: list[Item]
                          ) -> list[exp.Expression]:
        """A conjunct comparing with scalar subqueries: each replaced by a column of a joined derived item."""
        subs = _scalar_subqueries(cond)
        for s in subs:
            parent = s.parent
            if not isinstance(parent, (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.Paren, exp.Binary)):
                raise self.loc.unsupported("a scalar subquery outside a comparison", s,
                                           "compare it: x < (SELECT ...)")
        if not isinstance(cond, (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)):
            raise self.loc.unsupported("a scalar subquery under AND/OR/NOT or a function", subs[0],
                                       "use it in a comparison that is a conjunct of WHERE")
        out = cond.copy()
        conds: list[exp.Expression] = []
        for s, copied in zip(subs, _scalar_subqueries(out)):
            body = self._plain_select(s.this, "a scalar subquery")
            self._one_column(body, "a scalar subquery")
            if not _correlated(self, body, ctes):
                self._one_row(body, s)
                alias = self._derived(body.copy(), ctes, items, "scalar", s)
                copied.replace(_ref(alias, 0))
                continue
            value = body.expressions[0].unalias()
            if body.args.get("group") or body.args.get("having") or not _has_aggregate(body):
                raise self.loc.unsupported("a correlated scalar subquery that is not one aggregate", s,
                                           "write it as SELECT agg(...) FROM ... WHERE inner = outer")
            if any(value.find_all(*_NOT_NULL_WHEN_EMPTY)):
                raise self.loc.unsupported("a correlated scalar subquery with COUNT, COALESCE or CASE", s,
                                           "its value for an outer row without inner rows is not NULL; "
                                           "join a grouped subquery in FROM instead")
            d = self._decorrelate(body, ctes, outer, "a scalar subquery")
            keys = [inner for inner, _ in d.pairs]
            derived = _reselect(body, keys + [value], d.local, distinct=False)
            derived.set("group", exp.Group(expressions=[k.copy() for k in keys]))
            alias = self._derived(derived, ctes, items, "scalar", s)
            copied.replace(_ref(alias, len(keys)))
            conds += [exp.EQ(this=o.copy(), expression=_ref(alias, i)) for i, (_, o) in enumerate(d.pairs)]
        return conds + [out]

    # -- HAVING -------------------------------------------------------------------------------------------------------

    def _having_subqueries(self, having: exp.Expression, ctes: Mapping[str, Cte], items: list[Item]
                           ) -> exp.Expression:
        """HAVING with each uncorrelated scalar subquery joined into FROM and read as ``MAX(v)``."""
        for s in _scalar_subqueries(having):
            if isinstance(s.parent, (exp.In, exp.Exists)) or isinstance(s, exp.Exists):
                raise self.loc.unsupported("IN/EXISTS (subquery) in HAVING", s, "move the condition to WHERE")
        for node in having.find_all(exp.Exists, exp.In):
            if isinstance(node, exp.Exists) or node.args.get("query") is not None:
                raise self.loc.unsupported("IN/EXISTS (subquery) in HAVING", node, "move the condition to WHERE")
        out = having.copy()
        for s, copied in zip(_scalar_subqueries(having), _scalar_subqueries(out)):
            body = self._plain_select(s.this, "a scalar subquery")
            self._one_column(body, "a scalar subquery")
            if _correlated(self, body, ctes):
                raise self.loc.unsupported("a correlated scalar subquery in HAVING", s,
                                           "join a grouped subquery in FROM instead")
            self._one_row(body, s)
            if not any(s in _scalar_subqueries(c) for c in _conjuncts(having)
                       if isinstance(c, (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE))):
                raise self.loc.unsupported("a scalar subquery in HAVING outside a comparison that is a conjunct", s,
                                           "compare it: HAVING ... AND SUM(x) > (SELECT ...)")
            # a NULL value fails that comparison for every group: the joined row is dropped instead (no groups)
            derived = _wrapped(body, distinct=False)
            derived.set("where", exp.Where(this=exp.Not(this=exp.Is(this=exp.column("__v", table="__in"),
                                                                     expression=exp.Null()))))
            alias = self._derived(derived, ctes, items, "scalar", s)
            copied.replace(exp.Max(this=_ref(alias, 0)))
        return out

    # -- anti joins over the block ------------------------------------------------------------------------------------

    def _anti_joins(self, plan: Plan, antis: list[AntiSpec], scope: Scope) -> Plan:
        """``plan`` with each NOT EXISTS / NOT IN applied; keys of other types or expressions are cast in
        projections that are dropped again."""
        for spec in antis:
            if spec.neq is not None:
                plan = self._not_exists_summary(plan, spec, scope)
                continue
            left_names = plan.names
            outer = [self._expr(o, scope, "WHERE") for o in spec.outer]
            right = spec.item.plan
            extra: list[tuple[str, Expr]] = []
            right_items: list[tuple[str, Expr]] = [(f.name, Col(f.name, f.dtype)) for f in right.schema]
            cond: Expr | None = None
            for i, (o, f) in enumerate(zip(outer, right.schema)):
                dtype = _common(o.dtype, f.dtype)
                if dtype is None:
                    raise self.loc.error(f"cannot compare {o} ({o.dtype}) with the subquery's column ({f.dtype})",
                                         spec.node, "CAST one side")
                if isinstance(o, Col) and o.dtype == dtype:
                    lname = o.name
                else:
                    lname = f"{spec.item.alias}.__o{i}"
                    extra.append((lname, o if o.dtype == dtype else Cast(o, dtype)))
                rname = f.name
                if f.dtype != dtype:
                    rname = f"{f.name}__cast"
                    right_items.append((rname, Cast(Col(f.name, f.dtype), dtype)))
                eq = Binary("=", Col(lname, dtype), Col(rname, dtype))
                cond = eq if cond is None else Binary("and", cond, eq)
            assert cond is not None
            left = plan if not extra else Project(plan, tuple((f.name, Col(f.name, f.dtype)) for f in plan.schema)
                                                  + tuple(extra))
            if len(right_items) > len(right.schema):
                right = Project(right, tuple(right_items))
            plan = AntiJoin(left, right, cond, spec.null_aware)
            if extra:
                plan = Project(plan, tuple((n, Col(n, plan.field(n).dtype)) for n in left_names))
        return plan

    def _not_exists_summary(self, plan: Plan, spec: AntiSpec, scope: Scope) -> Plan:
        """NOT EXISTS correlated by an inequality: a LEFT JOIN with the per-key summary, then its condition."""
        assert spec.neq is not None
        item, n = spec.item, len(spec.outer)
        keys: Expr | None = None
        for o, f in zip(spec.outer, item.plan.schema):
            e = self._expr(o, scope, "WHERE")
            if not (isinstance(e, Col) and e.dtype == f.dtype):
                raise self.loc.unsupported("a NOT EXISTS with <> whose outer keys are not columns of the subquery's "
                                           "key types", spec.node, "CAST the keys in a FROM subquery")
            eq = Binary("=", e, Col(f.name, f.dtype))
            keys = eq if keys is None else Binary("and", keys, eq)
        try:
            plan = outer_join(plan, item.plan, "LEFT", keys)
        except UnsupportedError as e:
            raise self.loc.at(e, spec.node) from e
        wide = Scope([*scope.items, item])
        cond = inequality.not_exists(_ref(item.alias, n), _ref(item.alias, n + 1), spec.neq)
        return Select(plan, self._expr(cond, wide, "WHERE"))

    # -- helpers ------------------------------------------------------------------------------------------------------

    def _derived(self, select: exp.Expression, ctes: Mapping[str, Cte], items: list[Item], kind: str,
                 node: exp.Expression) -> str:
        """Plan ``select`` as a hidden FROM item ``__{kind}{n}`` with columns ``c0, c1, ...``; returns its alias."""
        self._subqueries += 1
        alias = f"__{kind}{self._subqueries}"
        plan, names = self.query(select, ctes)
        columns = tuple(f"c{i}" for i in range(len(names)))
        item = self._renamed(plan, names, alias, columns, f"subquery {alias}", node)
        items.append(Item(item.alias, item.label, item.plan, item.columns, item.node, hidden=True))
        return alias

    def _decorrelate(self, sub: exp.Select, ctes: Mapping[str, Cte], outer: Scope, what: str,
                     allow_neq: bool = False) -> Decorrelated:
        """Split the subquery's WHERE into equalities inner = outer and conditions on its own FROM items (and, with
        ``allow_neq``, one inequality inner <> outer)."""
        inner = self.inner_scope(sub, ctes)
        where = sub.args.get("where")
        d = Decorrelated([], [])
        for c in _conjuncts(where.this) if where is not None else []:
            sides = {_side(col, inner, outer) for col in _own_columns(c, sub)}
            if "outer" not in sides:
                d.local.append(c)
                continue
            pair = _equality(c, inner, outer, sub)
            if pair is not None:
                d.pairs.append(pair)
                continue
            neq = _equality(c, inner, outer, sub, exp.NEQ) if allow_neq and d.neq is None else None
            if neq is None:
                raise self.loc.unsupported(f"a correlated condition other than inner = outer in {what}", c,
                                           "only equalities between the subquery's and the outer query's "
                                           "expressions (and one inner <> outer in EXISTS) can be decorrelated")
            d.neq = neq
        return d

    def inner_scope(self, sub: exp.Select, ctes: Mapping[str, Cte]) -> Scope:
        bare = sub.copy()
        bare.set("where", None)
        scope, _, _ = self._from(bare, ctes)
        return scope

    def _plain_select(self, body: exp.Expression, what: str) -> exp.Select:
        while isinstance(body, exp.Subquery) and not body.alias:
            body = body.this
        if not isinstance(body, exp.Select):
            raise self.loc.unsupported(f"{body.key.upper()} as {what}", body, "use one SELECT block")
        return body

    def _one_column(self, body: exp.Expression, what: str) -> None:
        select = body if isinstance(body, exp.Select) else body.find(exp.Select)
        if select is not None and (len(select.expressions) != 1 or isinstance(select.expressions[0], exp.Star)):
            raise self.loc.error(f"{what} must select exactly one column", body)

    def _one_row(self, body: exp.Select, node: exp.Expression) -> None:
        if body.args.get("group") or not _has_aggregate(body):
            raise self.loc.unsupported("a scalar subquery that is not one aggregate row", node,
                                       "write it as SELECT agg(...) FROM ... without GROUP BY")


def _conjuncts(e: exp.Expression) -> list[exp.Expression]:
    while isinstance(e, exp.Paren):
        e = e.this
    if isinstance(e, exp.And):
        return _conjuncts(e.this) + _conjuncts(e.expression)
    return [e]


def _strip_not(e: exp.Expression) -> tuple[exp.Expression, bool]:
    negated = False
    while isinstance(e, (exp.Not, exp.Paren)):
        if isinstance(e, exp.Not):
            negated = not negated
        e = e.this
    return e, negated


def _scalar_subqueries(e: exp.Expression) -> list[exp.Subquery]:
    """Subqueries used as values in ``e`` (not those of IN/EXISTS, not inside another subquery)."""
    found = []
    for s in e.find_all(exp.Subquery):
        if isinstance(s.parent, exp.In) and s.arg_key == "query":
            continue
        if any(isinstance(a, (exp.Subquery, exp.Exists)) for a in _ancestors(s, e)):
            continue
        found.append(s)
    return found


def _ancestors(node: exp.Expression, stop: exp.Expression) -> list[exp.Expr]:
    out: list[exp.Expr] = []
    p = node.parent
    while p is not None and p is not stop:
        out.append(p)
        p = p.parent
    return out


def _has_aggregate(select: exp.Select) -> bool:
    return any(e.find(exp.AggFunc) is not None for e in select.expressions)


def _own_columns(e: exp.Expression, sub: exp.Select) -> list[exp.Column]:
    """Columns of ``e`` that belong to ``sub``'s level (not to a subquery nested in it)."""
    return [c for c in e.find_all(exp.Column) if c.find_ancestor(exp.Select) is sub]


def _side(col: exp.Column, inner: Scope, outer: Scope) -> str:
    """'inner' when the subquery's FROM has the column (innermost wins, as in SQL), else 'outer'."""
    if col.table:
        return "inner" if inner.item(col.table) is not None else "outer"
    return "inner" if any(i.find(col.name) is not None for i in inner.items) else "outer"


def _equality(c: exp.Expression, inner: Scope, outer: Scope, sub: exp.Select, kind: type = exp.EQ
              ) -> tuple[exp.Expression, exp.Expression] | None:
    """``(inner side, outer side)`` of an equality (or ``kind``) whose sides read only one level each, else None."""
    if not isinstance(c, kind):
        return None
    a, b = c.this, c.expression
    sa = {_side(col, inner, outer) for col in _own_columns(a, sub)}
    sb = {_side(col, inner, outer) for col in _own_columns(b, sub)}
    if sa == {"inner"} and sb == {"outer"}:
        return a, b
    if sa == {"outer"} and sb == {"inner"}:
        return b, a
    return None


def _correlated(tr: Subqueries, body: exp.Expression, ctes: Mapping[str, Cte]) -> bool:
    """True when a WHERE conjunct of the SELECT block reads a column its FROM does not have."""
    while isinstance(body, exp.Subquery) and not body.alias:
        body = body.this
    if not isinstance(body, exp.Select) or body.args.get("where") is None:
        return False
    inner = tr.inner_scope(body, ctes)
    return any(_side(col, inner, Scope(())) == "outer" for col in _own_columns(body.args["where"].this, body))


def _reselect(sub: exp.Select, keys: list[exp.Expression], local: list[exp.Expression], distinct: bool
              ) -> exp.Select:
    """``sub`` with its select list replaced by ``keys`` and its WHERE by ``local``."""
    out = sub.copy()
    out.set("expressions", [exp.alias_(k.copy(), f"__k{i}") for i, k in enumerate(keys)])
    out.set("where", exp.Where(this=exp.and_(*[c.copy() for c in local])) if local else None)
    out.set("distinct", exp.Distinct() if distinct else None)
    out.set("order", None)
    return out


def _is_simple(body: exp.Expression) -> bool:
    """A SELECT block without aggregation, DISTINCT, LIMIT or set operation: its select list can be replaced."""
    return (isinstance(body, exp.Select) and not body.args.get("group") and not body.args.get("having")
            and not _has_aggregate(body) and not body.args.get("distinct") and not body.args.get("limit"))


def _conjuncts_of(select: exp.Select) -> list[exp.Expression]:
    where = select.args.get("where")
    return _conjuncts(where.this) if where is not None else []


def _wrapped(body: exp.Expression, distinct: bool) -> exp.Select:
    """``SELECT [DISTINCT] __in.__v FROM (body) AS __in(__v)``: a one-column query kept whole."""
    out = exp.select(exp.column("__v", table="__in")).from_(exp.Subquery(this=body.copy(), alias=exp.TableAlias(
        this=exp.to_identifier("__in"), columns=[exp.to_identifier("__v")])))
    return out.distinct() if distinct else out


def _ref(alias: str, i: int) -> exp.Column:
    return exp.column(f"c{i}", table=alias)


def _common(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    """The type two compared keys are brought to (numbers widen; otherwise both must be equal)."""
    if a == b:
        return a
    try:
        return common_type(a, b)
    except PlanError:
        return None


def lift_scalars(agg: Plan) -> Plan:
    """``agg`` with a HAVING scalar subquery's row joined above it instead of below it.

    ``Aggregate(Join(X, S))`` with ``S`` at most one row (an aggregate without GROUP BY under projections and
    selections), joined without a condition and read only as ``MAX(s)``, becomes ``Aggregate(X)`` joined with ``S``
    and projected to the same columns. With GROUP BY keys every group has rows of ``X``, so ``MAX(s)`` is ``s``; with
    no ``S`` row neither form has a group; a group's annotation is its rows' fragments and ``S``'s in both. (Without
    GROUP BY the forms differ over an empty ``X``: one NULL row against one row carrying ``s``; left as it is.)
    The lifted form keeps ``S``'s fragments, all of its input's, out of every input row and out of ``F_g``.
    """
    if not isinstance(agg, Aggregate):
        return agg
    join = agg.child
    if not agg.keys or not isinstance(join, Join) or join.condition is not None or not _one_row_plan(join.right):
        return agg
    scalar = {f.name for f in join.right.schema}
    lifted: dict[str, Col] = {}
    rest: list[tuple[str, AggCall]] = []
    for name, a in agg.aggs:
        if not _reads(a, scalar):
            rest.append((name, a))
        elif a.func == "max" and not a.distinct and isinstance(a.arg, Col):
            lifted[name] = a.arg
        else:
            return agg
    if not lifted or any(_reads(k, scalar) for _, k in agg.keys):
        return agg
    grouped = Aggregate(join.left, agg.keys, tuple(rest))
    # a join's sides expose ``alias.column`` names, as FROM items do
    side = Project(grouped, tuple((f"__grouped.{f.name}", Col(f.name, f.dtype)) for f in grouped.schema))
    items = [(n, Col(f"__grouped.{n}", k.dtype)) for n, k in agg.keys] + [
        (n, lifted[n] if n in lifted else Col(f"__grouped.{n}", a.dtype)) for n, a in agg.aggs]
    return Project(Join(side, join.right), tuple(items))


def _reads(e: Expr, names: set[str]) -> bool:
    return any(isinstance(c, Col) and c.name in names for c in e.walk())


def _one_row_plan(plan: Plan) -> bool:
    """At most one row: an aggregate without grouping keys under projections and selections."""
    while isinstance(plan, (Project, Select)):
        plan = plan.child
    return isinstance(plan, Aggregate) and not plan.keys


__all__ = ["Subqueries", "lift_scalars"]

"""Safety check: is every sketch on a range partition of these columns sufficient for the query?

The rules, with examples, are in docs/SAFETY.md; see docs/ARCHITECTURE.md, "Safety".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from imp_core.errors import UnsafeSketchError
from imp_core.plan.assumptions import SignAssumption
from imp_core.plan.expr import (
    AggCall,
    Binary,
    Case,
    Cast,
    Col,
    Expr,
    Func,
    Lit,
    Unary,
    conjuncts,
    is_numeric,
    sum_leaves_38_digits,
)
from imp_core.plan.needed import aggregated_ties, fully_needed_topks, null_rejecting, result_dependent, scalar_aggregate
from imp_core.plan.nodes import (
    Aggregate,
    AntiJoin,
    Distinct,
    GroupTopK,
    Join,
    Plan,
    Project,
    Scan,
    Select,
    SortKey,
    TopK,
    Union,
)
from imp_core.sketch.bounds import partition_kind

SignOracle = Callable[[str, str], str | None]  # (table, column) -> "+" (>= 0), "-" (<= 0) or None

_UNKNOWN: tuple[str | None, frozenset[str]] = (None, frozenset())


@dataclass(frozen=True)
class Rel:
    """What evaluating a subplan over the sketch's data (``D_P``) can produce, next to evaluating it over ``D``.

    ``exact``: the same rows; ``sub``: a sub-bag that still holds every row the parents need (a partitioned scan,
    then monotone operators); ``part``: every needed row exactly, plus extra rows (partial groups) whose aggregate
    columns are off in a known direction (``dirs``: ``<=`` never above the true value, ``>=``, ``?``). ``anchored``
    means each extra row has a counterpart in the full result (true right after an aggregation); the final result
    is safe when it is ``exact``, ``sub`` or anchored ``part``, since the whole result is needed then.

    ``det`` maps a partitioned scan's alias to the columns that determine that scan's fragment in every row carrying
    it. ``mixed`` means some rows carry no sketched fragment at all (a UNION ALL branch over other tables, the
    preserved rows of an exact side): they are never lost, so a group that holds them is never absent over the
    sketch's data, and determining columns cannot make it whole. ``lossy`` gives the signs over only the rows that
    can be lost (None: the same as ``signs``); its sign ``0`` means zero or NULL in every such row, so a SUM loses
    nothing with them (the tag columns of EXCEPT).
    """

    tag: str  # exact | sub | part
    dirs: dict[str, str] = field(default_factory=dict)  # part: column -> "<=" | ">=" | "?"
    anchored: bool = True
    det: dict[str, frozenset[str]] = field(default_factory=dict)  # partitioned scan alias -> determining columns
    signs: dict[str, tuple[str, frozenset[str]]] = field(default_factory=dict)  # column -> (sign, base columns)
    why: str = ""
    mixed: bool = False
    lossy: dict[str, tuple[str, frozenset[str]]] | None = None

    @property
    def keeps_some(self) -> bool:
        """Whether some of its rows are never lost over the sketch's data."""
        return self.tag == "exact" or self.mixed

    def lossy_view(self) -> Rel:
        """This relation with the signs of the rows that can be lost (what a partial group's direction rests on)."""
        return self if self.lossy is None else replace(self, signs=self.lossy)


@dataclass(frozen=True)
class SafetyReport:
    safe: bool
    reason: str
    assumptions: tuple[SignAssumption, ...]

    def to_json(self) -> dict[str, object]:
        return {"safe": self.safe, "reason": self.reason, "assumptions": [str(a) for a in self.assumptions]}


class _Analysis:
    def __init__(self, partitioned: dict[str, str], oracle: SignOracle | None) -> None:
        self.partitioned = partitioned  # table -> column
        self.oracle = oracle
        self.assumptions: set[str] = set()
        self.fully_needed: set[int] = set()  # ids of top-k nodes whose every output row the result needs
        self.result_dependent: set[int] = set()  # ids of nodes every row of the answer is derived from

    # -- signs ----------------------------------------------------------------------------------------------------

    def sign(self, e: Expr, rel: Rel) -> str | None:
        """'+' if ``e`` is never negative, '-' if never positive, else None."""
        return self.signed(e, rel)[0]

    def signed(self, e: Expr, rel: Rel) -> tuple[str | None, frozenset[str]]:
        """The sign of ``e`` and the base columns (``table.column``) whose sign it relies on."""
        if isinstance(e, Lit):
            return _literal_sign(e), frozenset()
        if isinstance(e, Col):
            return rel.signs.get(e.name, _UNKNOWN)
        if isinstance(e, Unary) and e.op == "neg":
            s, deps = self.signed(e.arg, rel)
            return ({"+": "-", "-": "+"}.get(s) if s else None), deps
        if isinstance(e, Binary) and e.op in ("+", "*", "/", "-"):
            return self._binary_sign(e, rel)
        if isinstance(e, Func) and e.name == "abs":
            return "+", frozenset()
        if isinstance(e, Func) and e.name in ("coalesce", "greatest", "least"):
            return self._common_sign(list(e.args), rel)
        if isinstance(e, Case):
            return self._common_sign([v for _, v in e.whens] + ([e.default] if e.default is not None else []), rel)
        if isinstance(e, Cast) and is_numeric(e.to):
            return self._common_sign([e.arg], rel)
        return _UNKNOWN

    def _binary_sign(self, e: Binary, rel: Rel) -> tuple[str | None, frozenset[str]]:
        (a, da), (b, db) = self.signed(e.left, rel), self.signed(e.right, rel)
        deps = da | db
        if e.op == "+":
            return (a if a is not None and a == b else None), deps
        if e.op == "-":
            return ("+" if (a == "+" and b == "-") else ("-" if (a == "-" and b == "+") else None)), deps
        if a is None or b is None:
            return _UNKNOWN
        return ("+" if a == b else "-"), deps

    def _common_sign(self, parts: list[Expr], rel: Rel) -> tuple[str | None, frozenset[str]]:
        """The sign all of ``parts`` share (a value is one of them), else unknown."""
        results = [self.signed(p, rel) for p in parts]
        signs = {r[0] for r in results}
        if len(signs) == 1 and None not in signs:
            return signs.pop(), frozenset().union(*(r[1] for r in results))
        return _UNKNOWN

    # -- directions of partial values -------------------------------------------------------------------------------

    def direction(self, e: Expr, rel: Rel) -> str:
        """How ``e`` over a partial row relates to its full version: '=', '<=', '>=' or '?'."""
        if not (e.columns() & set(rel.dirs)):
            return "="
        if isinstance(e, Col):
            return rel.dirs.get(e.name, "=")
        if isinstance(e, Binary) and e.op in ("+", "-"):
            a, b = self.direction(e.left, rel), self.direction(e.right, rel)
            if e.op == "-":
                b = _flip(b)
            return _combine(a, b)
        if isinstance(e, Binary) and e.op in ("*", "/"):
            a, b = self.direction(e.left, rel), self.direction(e.right, rel)
            if b == "=" and isinstance(e.right, Lit):
                s = self.sign(e.right, rel)
                return a if s == "+" else (_flip(a) if s == "-" else "?")
            if a == "=" and isinstance(e.left, Lit) and e.op == "*":
                s = self.sign(e.left, rel)
                return b if s == "+" else (_flip(b) if s == "-" else "?")
            return "?"
        if isinstance(e, Unary) and e.op == "neg":
            return _flip(self.direction(e.arg, rel))
        if isinstance(e, Cast) and is_numeric(e.to):
            return self.direction(e.arg, rel)
        return "?"

    def accepts_only_if_full(self, p: Expr, rel: Rel, positive: bool = True) -> bool:
        """True if ``p(partial row)`` implies ``p(full row)`` (``positive``), or the converse when not."""
        if not (p.columns() & set(rel.dirs)):
            return True
        if isinstance(p, Binary) and p.op in ("and", "or"):
            return (self.accepts_only_if_full(p.left, rel, positive)
                    and self.accepts_only_if_full(p.right, rel, positive))
        if isinstance(p, Unary) and p.op == "not":
            return self.accepts_only_if_full(p.arg, rel, not positive)
        if isinstance(p, Binary) and p.op in (">", ">=", "<", "<="):
            left, right = self.direction(p.left, rel), self.direction(p.right, rel)
            # needs left - right to only grow from partial to full (for > and >=; shrink for < and <=)
            grow = _combine(left, _flip(right)) if p.op in (">", ">=") else _flip(_combine(left, _flip(right)))
            if not positive:
                grow = _flip(grow)
            return grow in ("=", "<=")
        return False

    # -- relations ----------------------------------------------------------------------------------------------------

    def rel(self, node: Plan) -> Rel:
        fn: Callable[[Plan], Rel] = getattr(self, f"visit_{type(node).__name__}")
        return fn(node)

    def visit_Scan(self, node: Scan) -> Rel:
        signs = {}
        if self.oracle is not None:
            for c in node.columns:
                if is_numeric(c.dtype):
                    s = self.oracle(node.table, c.name)
                    if s:
                        signs[node.qualified(c.name)] = (s, frozenset({f"{node.table}.{c.name}"}))
        if node.table in self.partitioned:
            col = node.qualified(self.partitioned[node.table])
            return Rel("sub", det={node.alias: frozenset({col})}, signs=signs)
        return Rel("exact", signs=signs)

    def visit_Select(self, node: Select) -> Rel:
        child = self.rel(node.child)
        det = _with_equalities(child.det, node.predicate)
        if child.tag != "part":
            return replace(child, det=det)
        ok = self.accepts_only_if_full(node.predicate, child)
        why = child.why if ok else f"the condition {node.predicate} can accept a partial group"
        return replace(child, anchored=child.anchored and ok, det=det, why=why)

    def visit_Project(self, node: Project) -> Rel:
        child = self.rel(node.child)
        det = {alias: frozenset(n for n, e in node.items if isinstance(e, Col) and e.name in cols)
               for alias, cols in child.det.items()}
        signs = {}
        lossy = {}
        dirs = {}
        lost = child.lossy_view()
        for name, e in node.items:
            s, deps = self.signed(e, child)
            if s:
                signs[name] = (s, deps)
            s, deps = ("0", frozenset()) if _zero_or_null(e) else self.signed(e, lost)
            if s:
                lossy[name] = (s, deps)
            if child.tag == "part":
                d = self.direction(e, child)
                if d != "=":
                    dirs[name] = d
        return Rel(child.tag, dirs, child.anchored, det, signs, child.why, child.mixed, lossy)

    def visit_Join(self, node: Join) -> Rel:
        left, right = self.rel(node.left), self.rel(node.right)
        if id(node) in self.result_dependent:
            if self._exact_scalar(node.right, node.condition):
                right = Rel("exact", signs=right.signs)
            if self._exact_scalar(node.left, node.condition):
                left = Rel("exact", signs=left.signs)
        det = _with_equalities({**left.det, **right.det}, node.condition)
        signs = {**left.signs, **right.signs}
        tags = {left.tag, right.tag}
        # a joined row is never lost when neither of its parts is; when one side loses nothing, the rows that can be
        # lost are the other side's (with any row of the exact side), else any row (the signs of all rows)
        mixed = left.keeps_some and right.keeps_some and tags != {"exact"}
        lossy = ({**left.signs, **right.lossy_view().signs} if left.tag == "exact" else
                 {**left.lossy_view().signs, **right.signs} if right.tag == "exact" else None)
        if "part" not in tags:
            return Rel("sub" if "sub" in tags else "exact", det=det, signs=signs, mixed=mixed, lossy=lossy)
        dirs = {**left.dirs, **right.dirs}
        cond_ok = node.condition is None or not (node.condition.columns() & set(dirs))
        anchored = left.anchored and right.anchored and cond_ok
        why = left.why or right.why or ("" if cond_ok else "a join condition uses a partial aggregate")
        return Rel("part", dirs, anchored, det, signs, why, mixed, lossy)

    def _exact_scalar(self, side: Plan, cond: Expr | None) -> bool:
        """A one-row aggregate (a scalar subquery) over a monotone input, NULL over no rows and compared so that
        NULL matches nothing, under a join every result row passes through: exact over the sketch's data.

        Every row the join outputs carries the aggregate row's annotation, i.e. every fragment of the aggregate's
        input; so when the answer has a row, the sketch keeps the whole input and the aggregate is exact. When the
        answer is empty the sketch is empty, the aggregate over no rows is NULL and the join outputs nothing.
        """
        found = scalar_aggregate(side)
        if found is None:
            return False
        agg, null_rejected = found
        if self.rel(agg.child).tag not in ("exact", "sub"):
            return False
        names = set(side.names)
        reading = [c for c in conjuncts(cond) if c.columns() & names]
        return all(null_rejecting(c) for c in reading) and (null_rejected or bool(reading))

    def visit_AntiJoin(self, node: AntiJoin) -> Rel:
        """Monotone in the left input, anti-monotone in the right: over the sketch's data every scan of a partitioned
        table is filtered, so a partitioned table read by the subquery (the right side, even when the left reads it
        too) loses rows there and lets extra left rows through. Otherwise it keeps the left rows whose keys no right
        row has, as a selection does: safe when the left side is, unless it compares a partial aggregate."""
        cut = sorted(t for t in node.right.tables() if t in self.partitioned)
        left = self.rel(node.left)
        if cut:
            return Rel("part", {}, False, {}, left.signs,
                       f"a sketch on {cut[0]} would drop rows of the NOT EXISTS/NOT IN subquery and let extra rows "
                       f"through")
        keys, _, _ = node.equi_keys()
        if left.tag == "part" and set(keys) & set(left.dirs):
            return Rel("part", left.dirs, False, left.det, left.signs,
                       "a NOT EXISTS/NOT IN compares a partial aggregate")
        return left

    def visit_Union(self, node: Union) -> Rel:
        """Monotone, and every branch has the union's column names: safe when each branch is.

        A column determines a scan's fragment when it does in every branch holding that scan's alias (a self-union
        holds one alias twice). A group of the union's rows is whole or absent over the sketch's data only when every
        branch that can put rows into it carries the same sketched fragment: a branch over other tables (exact, or
        mixed) adds rows that are never lost, so such a group can lose the sketched branch's rows and keep the others
        (``mixed``); with two sketched tables, the sketch can keep a group's fragment of one (for another group)
        without its fragment of the other. Either way such a group is partial, not determined (docs/SAFETY.md)."""
        rels = [self.rel(b) for b in node.inputs]
        det: dict[str, frozenset[str]] = {}
        for r in rels:
            for alias, cols in r.det.items():
                det[alias] = det[alias] & cols if alias in det else cols
        if len({s.table for s in node.scans() if s.table in self.partitioned}) > 1:
            det = {alias: frozenset() for alias in det}
        signs = _common_signs(node.names, [r.signs for r in rels])
        tags = {r.tag for r in rels}
        lossy = _common_signs(node.names, [r.lossy_view().signs for r in rels if r.tag != "exact"])
        mixed = any(r.mixed for r in rels) or ("exact" in tags and tags != {"exact"})
        if "part" not in tags:
            return Rel("sub" if "sub" in tags else "exact", det=det, signs=signs, mixed=mixed, lossy=lossy)
        dirs: dict[str, str] = {}
        for r in rels:
            for name, d in r.dirs.items():
                dirs[name] = _combine(dirs.get(name, "="), d)
        anchored = all(r.anchored or r.tag != "part" for r in rels)
        return Rel("part", dirs, anchored, det, signs, next((r.why for r in rels if r.why), ""), mixed, lossy)

    def visit_Aggregate(self, node: Aggregate) -> Rel:
        child = self.rel(node.child)
        key_cols = {e.name for _, e in node.keys if isinstance(e, Col)}
        signs = self._aggregate_signs(node, child)
        if child.tag == "exact":
            return Rel("exact", signs=signs)
        if child.tag == "sub":
            complete = not child.mixed and bool(child.det) and all(cols & key_cols for cols in child.det.values())
            if complete:
                det = {alias: frozenset(n for n, e in node.keys if isinstance(e, Col) and e.name in cols)
                       for alias, cols in child.det.items()}
                return Rel("sub", det=det, signs=signs)
            # a partial group lacks some of the rows that can be lost: its aggregates move as those rows' values do
            lost = child.lossy_view()
            dirs = {name: self._agg_direction(a, lost) for name, a in node.aggs}
            return Rel("part", {k: v for k, v in dirs.items() if v != "="}, True, {}, signs,
                       "groups are not determined by the partition column")
        # aggregation over partial input
        if not child.anchored or any(self.direction(e, child) != "=" for _, e in node.keys):
            return Rel("part", {n: "?" for n, _ in node.aggs}, False, {}, signs,
                       child.why or "grouping on a partial aggregate")
        dirs = {name: self._agg_direction(a, child) for name, a in node.aggs}
        return Rel("part", {k: v for k, v in dirs.items() if v != "="}, True, {}, signs, child.why)

    def _aggregate_signs(self, node: Aggregate, child: Rel) -> dict[str, tuple[str, frozenset[str]]]:
        """The signs of an aggregation's outputs: COUNT is never negative, other aggregates and the keys keep the
        sign of their argument."""
        signs: dict[str, tuple[str, frozenset[str]]] = {}
        for name, a in node.aggs:
            if a.func == "count":
                signs[name] = ("+", frozenset())
            elif a.arg is not None:
                s, deps = self.signed(a.arg, child)
                if s:
                    signs[name] = (s, deps)
        for name, e in node.keys:
            s, deps = self.signed(e, child)
            if s:
                signs[name] = (s, deps)
        return signs

    def _agg_direction(self, a: AggCall, child: Rel) -> str:
        if a.func == "count" and not a.distinct:
            return "<="
        assert a.arg is not None
        d = self.direction(a.arg, child)
        if a.distinct:
            # a partial group holds a subset of the group's distinct values only while each row's value is exact
            # ({5, 5} has one value, a partial {3, 5} of off values two): then COUNT(DISTINCT) is `<=` like COUNT,
            # and SUM(DISTINCT) follows the values' sign like SUM
            if d != "=":
                return "?"
            if a.func == "count":
                return "<="
        if a.func == "max":
            return "<=" if d in ("=", "<=") else "?"
        if a.func == "min":
            return ">=" if d in ("=", ">=") else "?"
        if a.func == "sum":
            if sum_leaves_38_digits(a.arg.dtype) and not a.distinct:
                # beyond 38 digits Spark's sum is NULL: rows of values >= 0 can take it out of range (and deletes
                # bring it back), so a partial group's sum is off in no direction
                return "=" if self.sign(a.arg, child) == "0" and d == "=" else "?"
            return self._sum_direction(a.arg, d, child)
        return "?"  # avg

    def _sum_direction(self, arg: Expr, d: str, child: Rel) -> str:
        """A partial group's SUM of ``arg`` (whose values are off in direction ``d``): rows of values >= 0 can only
        add (``<=``), of values <= 0 only subtract, of zeros nothing."""
        s = self.sign(arg, child)
        if s == "0" and d == "=":
            return "="
        if s == "+" and d in ("=", "<="):
            self._record(arg, child, "+")
            return "<="
        if s == "-" and d in ("=", ">="):
            self._record(arg, child, "-")
            return ">="
        return "?"

    def _record(self, e: Expr, rel: Rel, sign: str) -> None:
        """Remember the base-column signs a verdict relied on (re-checked on every batch of changes)."""
        for c in e.columns():
            if c in rel.signs:
                for base in rel.signs[c][1]:
                    self.assumptions.add(base)

    def visit_Distinct(self, node: Distinct) -> Rel:
        child = self.rel(node.child)
        return child

    def visit_TopK(self, node: TopK) -> Rel:
        child = self.rel(node.child)
        if child.tag == "exact":
            return Rel("exact", signs=child.signs)
        if id(node) not in self.fully_needed:
            # an operator above drops some top-k rows, and their fragments with them; over the sketch's data the
            # top-k would then admit rows ranked after the dropped ones
            return Rel("part", {}, False, {}, child.signs,
                       "a filter, join or top-k above ORDER BY ... LIMIT drops some of its rows")
        return self._ranked(child, node.order, "ORDER BY")

    def visit_GroupTopK(self, node: GroupTopK) -> Rel:
        """Top-k's rule per group; and when the groups determine the fragments (PARTITION BY a determining column),
        a kept group is whole over the sketch's data, so its ranking is exact even when rows above are dropped."""
        child = self.rel(node.child)
        if child.tag == "exact":
            return Rel("exact", signs=child.signs)
        by = {e.name for e in node.partition if isinstance(e, Col)}
        if child.tag == "sub" and not child.mixed and child.det and all(cols & by for cols in child.det.values()):
            return Rel("sub", det=child.det, signs=child.signs)
        fn = f"{node.function.upper()}()"
        if id(node) not in self.fully_needed:
            return Rel("part", {}, False, {}, child.signs,
                       f"a filter, join or top-k above {fn} OVER (...) drops some of its rows (rank bounds such as "
                       f"rn <= N keep them all)")
        if child.tag == "part" and any(self.direction(e, child) != "=" for e in node.partition):
            return Rel("part", child.dirs, False, {}, child.signs, f"{fn} OVER (PARTITION BY a partial aggregate)")
        return self._ranked(child, node.order, f"{fn} OVER (ORDER BY")

    def _ranked(self, child: Rel, order: tuple[SortKey, ...], clause: str) -> Rel:
        """A ranking whose every kept row the answer needs: over a sub-bag holding those rows it is exact; over
        partial groups, when no partial group can rank before its full version."""
        if child.tag == "sub":
            return Rel("exact", signs=child.signs)
        if not child.anchored:
            return child
        for key in order:
            d = self.direction(key.expr, child)
            ok = d == "=" or (d == "<=" and key.descending) or (d == ">=" and not key.descending)
            if not ok:
                return Rel("part", child.dirs, False, {}, child.signs,
                           f"{clause} {key.expr} {'DESC' if key.descending else 'ASC'} can rank a partial group "
                           f"higher than its full version")
        return Rel("exact", signs=child.signs)

def _common_signs(names: Iterable[str], per_input: list[dict[str, tuple[str, frozenset[str]]]]
                  ) -> dict[str, tuple[str, frozenset[str]]]:
    """The sign each column has in every input (zero counts as either sign), with the base columns it rests on."""
    out = {}
    for name in names:
        found = [signs.get(name) for signs in per_input]
        if not found or any(f is None for f in found):
            continue
        kinds = {f[0] for f in found} - {"0"}  # type: ignore[index]
        if len(kinds) <= 1:
            out[name] = (kinds.pop() if kinds else "0", frozenset().union(*(f[1] for f in found)))  # type: ignore[index]
    return out


def _zero_or_null(e: Expr) -> bool:
    """A constant 0 or NULL (possibly cast): adds nothing to a SUM."""
    while isinstance(e, Cast):
        e = e.arg
    return isinstance(e, Lit) and (e.value is None or (not isinstance(e.value, bool) and e.value == 0))


def _literal_sign(lit: Lit) -> str | None:
    if lit.value is None or isinstance(lit.value, (bool, str)):
        return None
    try:
        return "+" if lit.value >= 0 else "-"
    except TypeError:
        return None


def _flip(d: str) -> str:
    return {"<=": ">=", ">=": "<="}.get(d, d)


def _combine(a: str, b: str) -> str:
    if a == "=":
        return b
    if b == "=" or a == b:
        return a
    return "?"


def _with_equalities(det: dict[str, frozenset[str]], cond: Expr | None) -> dict[str, frozenset[str]]:
    """Columns equal to a determining column (``a = b`` conjuncts) determine the partition too."""
    out = dict(det)
    for c in conjuncts(cond):
        if isinstance(c, Binary) and c.op == "=" and isinstance(c.left, Col) and isinstance(c.right, Col):
            for alias, cols in out.items():
                if c.left.name in cols or c.right.name in cols:
                    out[alias] = cols | {c.left.name, c.right.name}
    return out


def check(plan: Plan, partitions: dict[str, str], oracle: SignOracle | None = None) -> SafetyReport:
    """Is a sketch on ``partitions`` (table -> column) safe for ``plan``?

    Signs (``x >= 0``) come from ``oracle``; every sign the verdict relied on is returned as an assumption, which
    maintenance re-checks on each batch of changes (docs/SAFETY.md, "Sign assumptions").
    """
    analysis = _Analysis(partitions, oracle)
    analysis.fully_needed = fully_needed_topks(plan)
    analysis.result_dependent = result_dependent(plan)
    ties = aggregated_ties(plan)
    rel = analysis.rel(plan)
    safe = not ties and (rel.tag in ("exact", "sub") or (rel.tag == "part" and rel.anchored))
    reason = "safe" if safe else (ties or rel.why or "a partial group can reach the result")
    assumptions = []
    for base in sorted(analysis.assumptions) if safe else []:
        table, _, column = base.partition(".")
        sign = oracle(table, column) if oracle is not None else None
        assumptions.append(SignAssumption(table, column, "+" if sign == "+" else "-"))
    return SafetyReport(safe, reason, tuple(assumptions))


def safe_columns(plan: Plan, oracle: SignOracle | None = None,
                 tables: Iterable[str] | None = None) -> list[str]:
    """Every ``table.column`` of the query's tables on which a single-table sketch is safe."""
    out = []
    wanted = set(tables) if tables is not None else None
    seen: set[tuple[str, str]] = set()
    for scan in plan.scans():
        if wanted is not None and scan.table not in wanted:
            continue
        for c in scan.columns:
            if (scan.table, c.name) in seen or partition_kind(c.dtype) is None:
                continue
            seen.add((scan.table, c.name))
            if check(plan, {scan.table: c.name}, oracle).safe:
                out.append(f"{scan.table}.{c.name}")
    return out


def require_safe(plan: Plan, partitions: dict[str, str], oracle: SignOracle | None = None) -> SafetyReport:
    report = check(plan, partitions, oracle)
    if not report.safe:
        cols = ", ".join(f"{t}.{c}" for t, c in partitions.items())
        others = safe_columns(plan, oracle)
        hint = f"safe columns: {', '.join(others)}" if others else "no single column of these tables is safe"
        raise UnsafeSketchError(f"a sketch on {cols} is not safe for this query ({report.reason}); {hint}")
    return report


__all__ = ["SafetyReport", "SignAssumption", "SignOracle", "check", "require_safe", "safe_columns"]

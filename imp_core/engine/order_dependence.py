"""Order-dependent float sums: which values Spark may compute differently from the engine, their intervals, and
the analysis that tells each operator whether to decide membership conservatively.

``OrderDependence(plan)`` runs once per plan: which aggregations emit interval columns, which projections carry
them, which selections and top-ks work conservatively, and which shapes are refused. ``IntervalCompiler`` turns
expressions and predicates over interval columns into polars expressions. See docs/ARCHITECTURE.md,
"Order-dependent float sums".
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field

import polars as pl
import pyarrow as pa

from imp_core.engine.evaluate import compile_expr
from imp_core.engine.running_sums import guarded_sums
from imp_core.engine.schema import INTERVAL_TMP, hi_name, lo_name
from imp_core.errors import UnsupportedError
from imp_core.plan.expr import (
    AggCall,
    Between,
    Binary,
    Cast,
    Col,
    Expr,
    Func,
    InList,
    IsNull,
    Unary,
    is_numeric,
    rebuild,
)
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
    TopK,
    Union,
)

UNIT = 2.0 ** -53
INF = float("inf")
NAN = float("nan")

FIX_HINT = ("Spark adds floating-point numbers (and an integer AVG's values, as doubles) in an order that depends on "
            "partitioning; cast the SUM/AVG argument to DECIMAL to make it exact")


def is_order_dependent(a: AggCall) -> bool:
    """Whether Spark's value of ``a`` depends on the order in which it adds numbers."""
    if a.arg is None or a.func not in ("sum", "avg"):
        return False
    t = a.arg.dtype
    return pa.types.is_floating(t) or (a.func == "avg" and pa.types.is_integer(t))


def gamma(n: pl.Expr) -> pl.Expr:
    """``γ_(2n+8)`` for a count column: it bounds the error of any summation order, and the engine's own rounding
    (docs/ARCHITECTURE.md, "Order-dependent float sums")."""
    m = (n.cast(pl.Float64) * 2.0 + 8.0) * UNIT
    return m / (1.0 - m)


def rounding_bound(n: pl.Expr, magnitude: pl.Expr) -> pl.Expr:
    """What a plain floating-point summation of ``n`` terms whose absolute values add up to ``magnitude`` (itself
    summed plainly) may have rounded away, in any order: ``γ_(2n+8) · magnitude`` (it covers Higham's
    ``γ_(n−1) · Σ|x|``, the rounding of ``magnitude`` and of this product). A backend that adds a float SUM's terms
    plainly (Spark's capture) reports it next to the sum and Σ|x| it computed: both are off by at most this."""
    return (gamma(n) * magnitude.cast(pl.Float64).abs()).fill_null(0.0)


def grown_bound(old: pl.Expr, batch: pl.Expr) -> pl.Expr:
    """A state's error bound after a batch: the old bound plus the rounding of the batch's additions. It never
    shrinks, whatever the batch deletes: a rounding that reached the stored sum stays in it (only a recapture,
    which computes the sum afresh, resets it)."""
    return old.fill_null(0.0) + batch.fill_null(0.0).clip(lower_bound=0.0)


def sum_interval(value: pl.Expr, n: pl.Expr, abs_sum: pl.Expr, exact: pl.Expr, divide: bool,
                 exact_below: float | None = None, bound: pl.Expr | None = None) -> tuple[pl.Expr, pl.Expr]:
    """``[lo, hi]`` around an engine SUM (``divide``: AVG) ``value`` of ``n`` values whose absolute values add up to
    ``abs_sum``; ``exact`` marks rows whose value is exact in any order (NaN or ±inf counted). With
    ``exact_below``, sums whose ``abs_sum`` stays within it are exact too (integers up to 2^53 add exactly).
    ``bound`` is the state's error bound (``grown_bound``): the stored sum and Σ|x| are each within it of the exact
    ones, so the interval is ``value ± (bound + γ_(2n+8) · (abs_sum + bound))``."""
    a = abs_sum.cast(pl.Float64)
    if bound is not None:
        a = a + bound
    err = gamma(n) * a
    if bound is not None:
        err = err + bound
    if divide:
        err = err / n.cast(pl.Float64)
    if exact_below is not None:
        err = pl.when(a <= exact_below).then(0.0).otherwise(err)
    # partial sums can overflow when A·(1+γ) does: Spark may then reach ±inf or NaN
    unknown = ~(a * (1.0 + gamma(n))).is_finite()
    lo = pl.when(exact).then(value).when(unknown).then(-INF).otherwise(value - err)
    hi = pl.when(exact).then(value).when(unknown).then(NAN).otherwise(value + err)
    none = n <= 0
    return (pl.when(none).then(None).otherwise(lo).cast(pl.Float64),
            pl.when(none).then(None).otherwise(hi).cast(pl.Float64))


# --- the plan analysis --------------------------------------------------------------------------------------------


class Maybe(enum.Enum):
    """Whether a node's output may hold rows Spark's answer lacks."""

    NO = "no"
    FLAGGED = "flagged"  # yes, and a ``__certain`` column tells the sure rows
    UNFLAGGED = "unflagged"  # yes, with no way to tell


@dataclass
class Facts:
    bounded: frozenset[str] = frozenset()  # uncertain columns that can carry an interval
    unreliable: frozenset[str] = frozenset()  # uncertain columns without one (or computed over maybe rows)
    maybe: Maybe = Maybe.NO

    @property
    def uncertain(self) -> frozenset[str]:
        return self.bounded | self.unreliable


@dataclass
class NodeRole:
    """What one operator does about uncertain values (filled by ``OrderDependence``)."""

    carry: set[str] = field(default_factory=set)  # interval columns the node's output carries
    conservative: bool = False  # selection / top-k decides membership from intervals or the certain flag
    flagged_input: bool = False  # the input carries ``__certain``
    flagged_output: bool = False  # the output carries ``__certain``
    certain_right: bool = False  # an anti join: its right input carries ``__certain``, and only sure rows block
    guarded: frozenset[str] = frozenset()  # an aggregation's wide decimal sums whose Σ|x| it checks (``running_sums``)


class OrderDependence:
    """The analysis of one plan; ``role(node)`` tells its operator what to do."""

    def __init__(self, plan: Plan) -> None:
        self.facts: dict[int, Facts] = {}
        self.roles: dict[int, NodeRole] = {}
        self._facts(plan)
        self._needs(plan, set())
        for node_id, names in guarded_sums(plan).items():
            self.roles.setdefault(node_id, NodeRole()).guarded = names

    def role(self, node: Plan) -> NodeRole:
        return self.roles.setdefault(id(node), NodeRole())

    def bounded_input(self, node: Plan) -> frozenset[str]:
        """The interval columns the node's input carries."""
        if not node.children:
            return frozenset()
        return frozenset(self.role(node.children[0]).carry)

    @property
    def any_conservative(self) -> bool:
        return any(r.conservative for r in self.roles.values())

    # -- bottom-up: which columns are uncertain, which rows maybe -------------------------------------------------

    def _facts(self, node: Plan) -> Facts:
        kids = [self._facts(c) for c in node.children]
        f = self._node_facts(node, kids)
        self.facts[id(node)] = f
        return f

    def _node_facts(self, node: Plan, kids: list[Facts]) -> Facts:
        if isinstance(node, Scan):
            return Facts()
        rule = _RULES.get(type(node))
        if rule is not None:
            return rule(node, *kids)
        if isinstance(node, Select):
            return self._select_facts(node, *kids)
        if isinstance(node, TopK):
            return self._topk_facts(node, *kids)
        if isinstance(node, Union):
            if any(k.uncertain or k.maybe != Maybe.NO for k in kids):
                raise UnsupportedError(f"a UNION ALL branch holds a floating-point SUM/AVG or rows a condition on one "
                                       f"may or may not keep; {FIX_HINT}")
            return Facts()
        raise UnsupportedError(f"plan node {type(node).__name__} is not supported")

    def _select_facts(self, node: Select, c: Facts) -> Facts:
        """A condition on a bounded value keeps rows conservatively (flagged when not sure); on an unreliable one it
        is refused."""
        cols = node.predicate.columns()
        if cols & c.unreliable:
            raise UnsupportedError(
                f"the condition {node.predicate} tests a value that depends on the order in which Spark adds "
                f"numbers, through an operation the sketch cannot bound; {FIX_HINT}")
        if cols & c.bounded:
            _check_predicate(node.predicate, c.bounded)
            self.role(node).conservative = True
            return Facts(c.bounded, c.unreliable, Maybe.FLAGGED if c.maybe != Maybe.UNFLAGGED
                         else Maybe.UNFLAGGED)
        return Facts(c.bounded, c.unreliable, c.maybe)

    def _topk_facts(self, node: TopK, c: Facts) -> Facts:
        """A top-k ordered by a bounded value, or over flagged rows, keeps rows conservatively; over rows that may or
        may not exist unflagged, or ordered by an unreliable value, it is refused."""
        cols = set().union(*(k.expr.columns() for k in node.order))
        if c.maybe == Maybe.UNFLAGGED:
            raise UnsupportedError(
                "ORDER BY ... LIMIT over rows that a floating-point SUM/AVG condition may or may not keep "
                f"(through a join, an aggregation or another LIMIT) cannot be sketched safely; {FIX_HINT}")
        if cols & c.unreliable:
            raise UnsupportedError(
                "ORDER BY ... LIMIT orders by a value that depends on the order in which Spark adds numbers, "
                f"through an operation the sketch cannot bound; {FIX_HINT}")
        if cols & c.bounded:
            for k in node.order:
                if k.expr.columns() & c.bounded and not _boundable(k.expr, c.bounded):
                    raise UnsupportedError(f"ORDER BY {k.expr} cannot be bounded; {FIX_HINT}")
        if cols & c.bounded or c.maybe == Maybe.FLAGGED:
            self.role(node).conservative = True
            return Facts(c.bounded, c.unreliable, Maybe.UNFLAGGED)
        return Facts(c.bounded, c.unreliable, c.maybe)

    # -- top-down: which interval columns each operator must carry -------------------------------------------------

    def _needs(self, node: Plan, needed: set[str], flag: bool = False) -> None:
        """``needed``: interval columns an operator above reads; ``flag``: whether one reads ``__certain``."""
        role = self.role(node)
        facts = self.facts[id(node)]
        role.carry = set(needed) & set(facts.bounded)
        role.flagged_output = flag and facts.maybe == Maybe.FLAGGED
        if isinstance(node, (Scan,)):
            return
        if isinstance(node, AntiJoin):
            self._anti_join_needs(node, role)
            return
        if isinstance(node, (Aggregate, Distinct, Join, Union)):
            for c in node.children:
                self._needs(c, set())
            return
        child = node.children[0]
        child_facts = self.facts[id(child)]
        # a top-k over rows a conservative selection kept needs to know the sure ones; others pass the need down
        child_flag = child_facts.maybe == Maybe.FLAGGED and (isinstance(node, TopK) or role.flagged_output)
        role.flagged_input = child_flag
        if isinstance(node, Project):
            below: set[str] = set()
            for name, e in node.items:
                if name in role.carry:
                    below |= e.columns() & child_facts.bounded
            self._needs(child, below, child_flag)
            return
        own: set[str] = set()
        if isinstance(node, Select):
            own = node.predicate.columns() & child_facts.bounded
        elif isinstance(node, TopK):
            own = set().union(*(k.expr.columns() for k in node.order)) & child_facts.bounded
        self._needs(child, role.carry | own, child_flag)

    def _anti_join_needs(self, node: AntiJoin, role: NodeRole) -> None:
        """An anti join is monotone the other way on its right side: a right row Spark's answer lacks would block
        left rows Spark keeps. Right rows a conservative condition kept are flagged, and only the sure ones block
        (the output then holds at least Spark's rows); right rows that may or may not exist unflagged are refused."""
        right = self.facts[id(node.right)]
        if right.maybe == Maybe.UNFLAGGED:
            raise UnsupportedError(
                "NOT EXISTS / NOT IN over a subquery whose rows a floating-point SUM/AVG condition may or may not "
                f"keep (through a join, an aggregation or a LIMIT) cannot be sketched safely; {FIX_HINT}")
        role.certain_right = right.maybe == Maybe.FLAGGED
        self._needs(node.left, set())
        self._needs(node.right, set(), role.certain_right)


def _group_topk_facts(node: GroupTopK, c: Facts) -> Facts:
    """A top-k per group is exact only over sure rows ranked and grouped by exact values: anything else is refused
    (no conservative ranking per group)."""
    cols = set().union(*(e.columns() for e in node.partition), *(k.expr.columns() for k in node.order))
    if c.maybe != Maybe.NO or cols & (c.bounded | c.unreliable):
        raise UnsupportedError(f"{node.function.upper()}() OVER (...) ranks rows or values that depend on the order "
                               f"in which Spark adds numbers (a floating-point SUM/AVG); {FIX_HINT}")
    return Facts(c.bounded, c.unreliable, c.maybe)


def _aggregate_facts(node: Aggregate, c: Facts) -> Facts:
    """Order-dependent aggregates over sure rows are bounded; anything over uncertain values or rows is unreliable,
    and groups keyed by an uncertain value may exist only here."""
    maybe = Maybe.UNFLAGGED if c.maybe != Maybe.NO else Maybe.NO
    unreliable: set[str] = set()
    bounded: set[str] = set()
    for name, e in node.keys:
        if e.columns() & c.uncertain:
            unreliable.add(name)  # groups split or merge with the value: some may exist only here
            maybe = Maybe.UNFLAGGED
    for name, a in node.aggs:
        if c.maybe != Maybe.NO or (a.arg is not None and a.arg.columns() & c.uncertain):
            unreliable.add(name)
        elif is_order_dependent(a):
            bounded.add(name)
    if maybe != Maybe.NO:  # counts and sums over rows that may not exist say nothing
        unreliable |= {n for n, _ in node.aggs}
        bounded -= unreliable
    return Facts(frozenset(bounded), frozenset(unreliable), maybe)


def _distinct_facts(c: Facts) -> Facts:
    """Rows with an uncertain value may or may not be duplicates: their existence becomes uncertain."""
    if c.uncertain:
        return Facts(frozenset(), c.uncertain, Maybe.UNFLAGGED)
    return Facts(maybe=Maybe.UNFLAGGED if c.maybe != Maybe.NO else Maybe.NO)


def _project_facts(node: Project, c: Facts) -> Facts:
    """An output is bounded when its expression can carry its inputs' intervals, else unreliable."""
    bounded, unreliable = set(), set()
    for name, e in node.items:
        cols = e.columns()
        if cols & c.unreliable:
            unreliable.add(name)
        elif cols & c.bounded:
            if _boundable(e, c.bounded):
                bounded.add(name)
            else:
                unreliable.add(name)
    return Facts(frozenset(bounded), frozenset(unreliable), c.maybe)


def _join_facts(node: Join | AntiJoin, left: Facts, right: Facts) -> Facts:
    """A join (or anti join: NOT EXISTS / NOT IN) on an uncertain value is refused; interval columns and flags do
    not cross a join. An anti join outputs left's columns only; rows that may or may not exist on either side make
    its rows' existence uncertain too."""
    if node.condition is not None and node.condition.columns() & (left.uncertain | right.uncertain):
        what = "NOT EXISTS / NOT IN condition" if isinstance(node, AntiJoin) else "join condition"
        raise UnsupportedError(
            f"the {what} {node.condition} uses a value that depends on the order in which Spark "
            f"adds numbers; {FIX_HINT}")
    maybe = Maybe.NO if left.maybe == right.maybe == Maybe.NO else Maybe.UNFLAGGED
    unreliable = left.uncertain if isinstance(node, AntiJoin) else left.uncertain | right.uncertain
    return Facts(frozenset(), unreliable, maybe)


# --- expressions over intervals -----------------------------------------------------------------------------------

_MONOTONE = ("round", "floor", "ceil", "sign", "sqrt", "ln", "exp", "greatest", "least")


def _boundable(e: Expr, bounded: frozenset[str] | set[str]) -> bool:
    """Whether ``e``'s interval can be computed (every uncertain part goes through supported operations)."""
    if not (e.columns() & bounded):
        return True
    if isinstance(e, Col):
        return True
    if isinstance(e, Unary) and e.op == "neg":
        return _boundable(e.arg, bounded)
    if isinstance(e, Binary) and e.op in ("+", "-", "*", "/"):
        return is_numeric(e.dtype) and _boundable(e.left, bounded) and _boundable(e.right, bounded)
    if isinstance(e, Cast):
        return is_numeric(e.to) and _boundable(e.arg, bounded)
    if isinstance(e, Func) and (e.name in _MONOTONE or e.name in ("abs", "coalesce")):
        return is_numeric(e.dtype) and all(_boundable(a, bounded) for a in e.args)
    return False


def _null_certain(e: Expr, bounded: frozenset[str] | set[str]) -> bool:
    """Whether ``e`` is NULL for every summation order or for none: an uncertain divisor may be 0 (Spark: NULL)."""
    return not any(isinstance(x, Binary) and x.op == "/" and x.right.columns() & bounded for x in e.walk())


def _check_predicate(p: Expr, bounded: frozenset[str]) -> None:
    if not (p.columns() & bounded):
        return
    if isinstance(p, Binary) and p.op in ("and", "or"):
        _check_predicate(p.left, bounded)
        _check_predicate(p.right, bounded)
        return
    if isinstance(p, Unary) and p.op == "not":
        _check_predicate(p.arg, bounded)
        return
    if isinstance(p, Binary) and p.op in ("=", "<>", "<", "<=", ">", ">="):
        ok = _boundable(p.left, bounded) and _boundable(p.right, bounded) and \
            is_numeric(p.left.dtype) and is_numeric(p.right.dtype)
    elif isinstance(p, Between):
        ok = all(_boundable(x, bounded) and is_numeric(x.dtype) for x in (p.arg, p.low, p.high))
    elif isinstance(p, IsNull):
        ok = _boundable(p.arg, bounded) and _null_certain(p.arg, bounded)
    elif isinstance(p, InList):
        ok = _boundable(p.arg, bounded) and not any(i.columns() & bounded for i in p.items) and \
            is_numeric(p.arg.dtype)
    else:
        ok = False
    if not ok:
        raise UnsupportedError(f"the condition {p} tests a value that depends on the order in which Spark adds "
                               f"numbers in a way the sketch cannot bound; {FIX_HINT}")


@dataclass
class Iv:
    """An interval of doubles as two polars expressions; ``point`` when it is a certain value."""

    lo: pl.Expr
    hi: pl.Expr
    point: bool = False


class IntervalCompiler:
    """Polars expressions for intervals of expressions over columns that carry ``__lo__``/``__hi__`` companions.

    Monotone functions (ROUND, FLOOR, CAST, ...) are applied to both ends with the engine's own compiled function,
    which needs the ends as columns first: ``stages`` lists the ``with_columns`` steps to run before the final
    expressions (usually none).
    """

    def __init__(self, bounded: frozenset[str] | set[str]) -> None:
        self.bounded = set(bounded)
        self.stages: list[list[pl.Expr]] = []
        self._n = 0

    def temps(self) -> list[str]:
        return [f"{INTERVAL_TMP}{i}" for i in range(self._n)]

    def apply(self, df: pl.DataFrame) -> pl.DataFrame:
        for stage in self.stages:
            df = df.with_columns(stage)
        return df

    def _tmp(self) -> str:
        name = f"{INTERVAL_TMP}{self._n}"
        self._n += 1
        return name

    # -- values ----------------------------------------------------------------------------------------------------

    def interval(self, e: Expr) -> Iv:
        if not (e.columns() & self.bounded):
            v = compile_expr(e).cast(pl.Float64, strict=False)
            return Iv(v, v, point=True)
        if isinstance(e, Col):
            return Iv(pl.col(lo_name(e.name)), pl.col(hi_name(e.name)))
        if isinstance(e, Unary) and e.op == "neg":
            a = self.interval(e.arg)
            return Iv(-a.hi, -a.lo)
        if isinstance(e, Binary) and e.op in ("+", "-", "*", "/"):
            return _arithmetic(e.op, self.interval(e.left), self.interval(e.right))
        if isinstance(e, Func) and e.name == "abs":
            a = self.interval(e.args[0])
            lo = pl.when(a.lo >= 0.0).then(a.lo).when(a.hi <= 0.0).then(-a.hi).otherwise(0.0)
            hi = pl.max_horizontal(a.lo.abs(), a.hi.abs())
            return _fix(lo, hi, [a])
        if isinstance(e, Func) and e.name == "coalesce":
            first = self.interval(e.args[0])
            rest = self.interval(Func("coalesce", e.args[1:])) if len(e.args) > 2 else self.interval(e.args[1])
            null = first.lo.is_null()
            return Iv(pl.when(null).then(rest.lo).otherwise(first.lo), pl.when(null).then(rest.hi).otherwise(first.hi))
        if (isinstance(e, Func) and e.name in _MONOTONE) or isinstance(e, Cast):
            return self._monotone(e)
        raise UnsupportedError(f"{e} cannot be bounded; {FIX_HINT}")

    def _monotone(self, e: Expr) -> Iv:
        """A non-decreasing function of its uncertain arguments: the function of the lower ends and of the upper."""
        kids = list(e.children())
        ivs = [self.interval(k) if k.columns() & self.bounded else None for k in kids]
        stage: list[pl.Expr] = []
        lo_kids, hi_kids = [], []
        for k, iv in zip(kids, ivs):
            if iv is None:
                lo_kids.append(k)
                hi_kids.append(k)
                continue
            tl, th = self._tmp(), self._tmp()
            stage += [iv.lo.alias(tl), iv.hi.alias(th)]
            lo_kids.append(Col(tl, pa.float64()))
            hi_kids.append(Col(th, pa.float64()))
        self.stages.append(stage)
        lo = compile_expr(rebuild(e, lo_kids)).cast(pl.Float64, strict=False)
        hi = compile_expr(rebuild(e, hi_kids)).cast(pl.Float64, strict=False)
        return _fix(lo, hi, [iv for iv in ivs if iv is not None])

    # -- predicates: may the predicate be TRUE, may it be FALSE, for some values in the intervals -------------------

    def may(self, p: Expr) -> tuple[pl.Expr, pl.Expr]:
        """(may be TRUE, may be FALSE); NULL counts as neither, as in SQL."""
        if not (p.columns() & self.bounded):
            v = compile_expr(p)
            return v.fill_null(False), (~v).fill_null(False)
        if isinstance(p, Unary) and p.op == "not":
            t, f = self.may(p.arg)
            return f, t
        if isinstance(p, Binary) and p.op == "and":
            (t1, f1), (t2, f2) = self.may(p.left), self.may(p.right)
            return t1 & t2, f1 | f2
        if isinstance(p, Binary) and p.op == "or":
            (t1, f1), (t2, f2) = self.may(p.left), self.may(p.right)
            return t1 | t2, f1 & f2
        if isinstance(p, Binary):
            return self._compare(p.op, self.interval(p.left), self.interval(p.right))
        if isinstance(p, Between):
            a, lo, hi = self.interval(p.arg), self.interval(p.low), self.interval(p.high)
            t1, f1 = self._compare(">=", a, lo)
            t2, f2 = self._compare("<=", a, hi)
            t, f = t1 & t2, f1 | f2
            return (f, t) if p.negated else (t, f)
        if isinstance(p, IsNull):
            null = self.interval(p.arg).lo.is_null()  # NULL exactly when there are no values (``_null_certain``)
            return (~null, null) if p.negated else (null, ~null)
        if isinstance(p, InList):
            a = self.interval(p.arg)
            parts = [self._compare("=", a, self.interval(i)) for i in p.items]
            t = pl.any_horizontal([x for x, _ in parts])
            f = pl.all_horizontal([y for _, y in parts])
            return (f, t) if p.negated else (t, f)
        raise UnsupportedError(f"the condition {p} cannot be bounded; {FIX_HINT}")

    @staticmethod
    def _compare(op: str, a: Iv, b: Iv) -> tuple[pl.Expr, pl.Expr]:
        # polars orders NaN above every number and NaN = NaN, as Spark does
        if op in (">", ">="):
            return IntervalCompiler._compare("<" if op == ">" else "<=", b, a)
        if op == "<":
            t, f = a.lo < b.hi, a.hi >= b.lo
        elif op == "<=":
            t, f = a.lo <= b.hi, a.hi > b.lo
        elif op == "=":
            t = (a.lo <= b.hi) & (b.lo <= a.hi)
            f = (a.lo != a.hi) | (b.lo != b.hi) | (a.lo != b.lo)
        else:  # <>
            t2, f2 = IntervalCompiler._compare("=", a, b)
            return f2, t2
        return t.fill_null(False), f.fill_null(False)


def _arithmetic(op: str, a: Iv, b: Iv) -> Iv:
    """The interval of ``a op b`` for one of ``+ - * /``."""
    if op == "+":
        return _fix(a.lo + b.lo, a.hi + b.hi, [a, b])
    if op == "-":
        return _fix(a.lo - b.hi, a.hi - b.lo, [a, b])
    if op == "*":
        return _corners([a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi], [a, b])
    # Spark: x / 0 is NULL; a divisor that may be 0 leaves the quotient unknown
    zero = (b.lo <= 0.0) & (b.hi >= 0.0) | b.lo.is_nan() | b.hi.is_nan()
    c = _corners([a.lo / b.lo, a.lo / b.hi, a.hi / b.lo, a.hi / b.hi], [a, b])
    return Iv(pl.when(zero).then(-INF).otherwise(c.lo), pl.when(zero).then(NAN).otherwise(c.hi))


def _unknown(ivs: list[Iv]) -> pl.Expr:
    out = pl.lit(False)
    for iv in ivs:
        if not iv.point:
            out = out | (iv.lo.is_nan() != iv.hi.is_nan())
    return out


def _fix(lo: pl.Expr, hi: pl.Expr, inputs: list[Iv]) -> Iv:
    """Ends computed from the inputs' ends; anything touched by an unknown input (``[-inf, NaN]``) or that produced
    a NaN at one end only (``inf − inf``, ``0 · inf``) is unknown. A NaN at both ends is the exact value NaN."""
    bad = _unknown(inputs) | (lo.is_nan() != hi.is_nan())
    return Iv(pl.when(bad).then(-INF).otherwise(lo), pl.when(bad).then(NAN).otherwise(hi))


def _corners(values: list[pl.Expr], inputs: list[Iv]) -> Iv:
    """Smallest and largest of corner products (rounding is monotone, so the rounded corners bound every rounded
    product in between)."""
    any_nan = pl.any_horizontal([v.is_nan() for v in values])
    all_nan = pl.all_horizontal([v.is_nan() for v in values])
    lo = pl.when(all_nan).then(NAN).when(any_nan).then(-INF).otherwise(pl.min_horizontal(values))
    hi = pl.when(any_nan).then(NAN).otherwise(pl.max_horizontal(values))
    bad = _unknown(inputs)
    return Iv(pl.when(bad).then(-INF).otherwise(lo), pl.when(bad).then(NAN).otherwise(hi))


# the facts of the nodes whose rule needs no analysis state (Select and TopK record roles: methods)
_RULES: dict[type[Plan], Callable[..., Facts]] = {
    Aggregate: _aggregate_facts, Distinct: lambda _node, c: _distinct_facts(c), Project: _project_facts,
    Join: _join_facts, AntiJoin: _join_facts, GroupTopK: _group_topk_facts,
}


__all__ = ["IntervalCompiler", "Iv", "Maybe", "NodeRole", "OrderDependence", "grown_bound", "is_order_dependent",
           "rounding_bound", "sum_interval"]

"""Compile plans and expressions to Spark DataFrames, with provenance annotations.

One ``visit_<Node>`` per plan node and per expression node (checked at import time, as for the polars compiler in
``imp_core.engine.evaluate``); the column layout of annotated relations is ``imp_core.engine.schema``'s. See
docs/ARCHITECTURE.md, "The plan IR" and "Fragments on Spark".
"""

from __future__ import annotations

import copy
import datetime as dt
import decimal
import functools
import operator
from collections.abc import Callable
from typing import ClassVar

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from imp_core.engine.annotation import AnnotationLayout
from imp_core.engine.schema import MULT, RIGHT_MULT, RIGHT_SET, SET, is_carried, is_frag_col, join_columns
from imp_core.errors import UnsupportedError
from imp_core.plan import expr as ex
from imp_core.plan.expr import NULL, Expr, Func
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
from imp_core.spark.fragment import add_fragment
from imp_core.spark.types import arrow_to_spark

# What this compiler does not do: stateful nodes come from engine state (the caller's ``from_state``).
UNSUPPORTED_NODES = {Aggregate: "aggregation", Distinct: "distinct", TopK: "top-k", GroupTopK: "top-k per group"}


def q(name: str) -> str:
    """Backtick-quote a column name (plan names contain dots)."""
    return "`" + name.replace("`", "``") + "`"


def col(name: str) -> Column:
    return F.col(q(name))


# -- expressions -------------------------------------------------------------------------------------------------


class SparkExpressionCompiler:
    """IR expression -> Spark Column. Spark's functions are the truth; types are made explicit."""

    # Every function is compiled; the engine's refusals (imp_core.engine.evaluate) do not apply to plain queries.
    UNSUPPORTED_FUNCTIONS: ClassVar[dict[str, str]] = {}
    # Expression classes that are never compiled on their own, with the reason (their visitors raise it).
    UNSUPPORTED_EXPRESSIONS: ClassVar[dict[type[Expr], str]] = {
        ex.Interval: "an INTERVAL is only valid added to or subtracted from a date or timestamp",
        ex.AggCall: "an aggregate is compiled by the Aggregate plan node, not as a scalar expression",
    }

    def compile(self, e: Expr) -> Column:
        visit: Callable[[Expr], Column] = getattr(self, f"visit_{type(e).__name__}")
        return visit(e)

    def to(self, e: Expr, t: pa.DataType) -> Column:
        c = self.compile(e)
        if e.dtype == t or t == NULL:
            return c
        return c.cast(arrow_to_spark(t))

    def visit_Col(self, e: ex.Col) -> Column:
        return col(e.name)

    def visit_Lit(self, e: ex.Lit) -> Column:
        if e.value is None:
            return F.lit(None) if e.dtype == NULL else F.lit(None).cast(arrow_to_spark(e.dtype))
        value = e.value
        if pa.types.is_decimal(e.dtype):
            value = decimal.Decimal(value)
        elif isinstance(value, dt.datetime):
            # through its text: PySpark would read a naive datetime in the driver's local time zone
            value = value.isoformat(sep=" ")
        return F.lit(value).cast(arrow_to_spark(e.dtype))

    def visit_Interval(self, e: ex.Interval) -> Column:
        raise UnsupportedError(f"{e}: {self.UNSUPPORTED_EXPRESSIONS[ex.Interval]}")

    def visit_AggCall(self, e: ex.AggCall) -> Column:
        raise UnsupportedError(f"{e}: {self.UNSUPPORTED_EXPRESSIONS[ex.AggCall]}")

    def visit_Unary(self, e: ex.Unary) -> Column:
        return ~self.to(e.arg, ex.BOOL) if e.op == "not" else -self.to(e.arg, e.dtype)

    def compare(self, op: str, a: Expr, b: Expr, t: pa.DataType | None = None) -> Column:
        t = ex.comparison_type(a, b) if t is None else t
        x, y = self.to(a, t), self.to(b, t)
        return {"=": x == y, "<>": x != y, "<": x < y, "<=": x <= y, ">": x > y, ">=": x >= y}[op]

    def _plus_interval(self, e: ex.Binary) -> Column:
        """A date or timestamp plus or minus an interval literal (either side)."""
        base, iv = (e.left, e.right) if isinstance(e.right, ex.Interval) else (e.right, e.left)
        assert isinstance(iv, ex.Interval)
        n = iv.value if e.op == "+" else -iv.value
        b = self.to(base, e.dtype if base.dtype == NULL else base.dtype)
        if pa.types.is_date(base.dtype):
            if iv.unit == "day":
                return F.date_add(b, F.lit(n))
            if iv.unit == "week":
                return F.date_add(b, F.lit(7 * n))
            if iv.unit in ("month", "year"):
                return F.add_months(b, F.lit(n * (12 if iv.unit == "year" else 1)))
        return b + F.expr(f"INTERVAL {n} {iv.unit.upper()}")

    def visit_Binary(self, e: ex.Binary) -> Column:
        op = e.op
        if op == "and":
            return self.to(e.left, ex.BOOL) & self.to(e.right, ex.BOOL)
        if op == "or":
            return self.to(e.left, ex.BOOL) | self.to(e.right, ex.BOOL)
        if op in ("=", "<>", "<", "<=", ">", ">="):
            return self.compare(op, e.left, e.right)
        if isinstance(e.right, ex.Interval) or isinstance(e.left, ex.Interval):
            return self._plus_interval(e)
        lt, rt = e.left.dtype, e.right.dtype
        if pa.types.is_date(lt) and pa.types.is_date(rt):
            return F.datediff(self.compile(e.left), self.compile(e.right))
        if pa.types.is_date(lt) or pa.types.is_date(rt):
            date, days = (e.left, e.right) if pa.types.is_date(lt) else (e.right, e.left)
            d, count = self.compile(date), self.to(days, pa.int32())
            return F.date_sub(d, count) if op == "-" else F.date_add(d, count)
        ta, tb, _ = ex.arithmetic_types(op, e.left, e.right)
        x, y = self.to(e.left, ta), self.to(e.right, tb)
        return {"+": x + y, "-": x - y, "*": x * y, "/": x / y, "%": x % y}[op]

    def visit_IsNull(self, e: ex.IsNull) -> Column:
        c = self.compile(e.arg)
        return c.isNotNull() if e.negated else c.isNull()

    def visit_InList(self, e: ex.InList) -> Column:
        out = functools.reduce(operator.or_, (self.compare("=", e.arg, item, e.compare_type) for item in e.items))
        return ~out if e.negated else out

    def visit_Between(self, e: ex.Between) -> Column:
        out = self.compare(">=", e.arg, e.low) & self.compare("<=", e.arg, e.high)
        return ~out if e.negated else out

    def visit_Like(self, e: ex.Like) -> Column:
        c = self.compile(e.arg)
        out = c.ilike(e.pattern) if e.case_insensitive else c.like(e.pattern)
        return ~out if e.negated else out

    def visit_Case(self, e: ex.Case) -> Column:
        chain = None
        for cond, value in e.whens:
            v = self.to(value, e.dtype)
            c = self.to(cond, ex.BOOL)  # Spark refuses a bare NULL condition
            chain = F.when(c, v) if chain is None else chain.when(c, v)
        default = self.to(e.default, e.dtype) if e.default is not None else F.lit(None).cast(arrow_to_spark(e.dtype))
        return chain.otherwise(default) if chain is not None else default

    def visit_Cast(self, e: ex.Cast) -> Column:
        return self.compile(e.arg).cast(arrow_to_spark(e.to))

    def visit_Func(self, e: Func) -> Column:
        return getattr(self, f"func_{e.name}")(e)

    def _args(self, e: Func) -> list[Column]:
        return [self.compile(a) for a in e.args]

    def func_upper(self, e: Func) -> Column:
        return F.upper(self.compile(e.args[0]))

    def func_lower(self, e: Func) -> Column:
        return F.lower(self.compile(e.args[0]))

    def func_length(self, e: Func) -> Column:
        return F.length(self.compile(e.args[0]))

    def func_trim(self, e: Func) -> Column:
        return F.trim(self.compile(e.args[0]))

    def func_ltrim(self, e: Func) -> Column:
        return F.ltrim(self.compile(e.args[0]))

    def func_rtrim(self, e: Func) -> Column:
        return F.rtrim(self.compile(e.args[0]))

    def func_substring(self, e: Func) -> Column:
        pos = self.to(e.args[1], pa.int32())
        length = self.to(e.args[2], pa.int32()) if len(e.args) > 2 else F.lit(2**31 - 1)
        return self.compile(e.args[0]).substr(pos, length)

    def func_concat(self, e: Func) -> Column:
        return F.concat(*[self.to(a, pa.string()) for a in e.args])

    def func_replace(self, e: Func) -> Column:
        search, repl = e.args[1], e.args[2]
        assert isinstance(search, ex.Lit) and isinstance(repl, ex.Lit)
        return F.replace(self.compile(e.args[0]), self.to(search, pa.string()), self.to(repl, pa.string()))

    def func_coalesce(self, e: Func) -> Column:
        return F.coalesce(*[self.to(a, e.dtype) for a in e.args])

    def func_greatest(self, e: Func) -> Column:
        return F.greatest(*[self.to(a, e.dtype) for a in e.args])

    def func_least(self, e: Func) -> Column:
        return F.least(*[self.to(a, e.dtype) for a in e.args])

    def func_nullif(self, e: Func) -> Column:
        equal = self.compare("=", e.args[0], e.args[1])
        return F.when(equal, F.lit(None)).otherwise(self.to(e.args[0], e.dtype))

    def func_abs(self, e: Func) -> Column:
        return F.abs(self.to(e.args[0], e.dtype))

    def func_sign(self, e: Func) -> Column:
        return F.signum(self.compile(e.args[0]))

    def func_round(self, e: Func) -> Column:
        return F.round(self.compile(e.args[0]), e.round_digits)

    def func_floor(self, e: Func) -> Column:
        return F.floor(self.compile(e.args[0]))

    def func_ceil(self, e: Func) -> Column:
        return F.ceil(self.compile(e.args[0]))

    def func_date_add(self, e: Func) -> Column:
        return F.date_add(self.compile(e.args[0]), self.to(e.args[1], pa.int32()))

    def func_date_sub(self, e: Func) -> Column:
        return F.date_sub(self.compile(e.args[0]), self.to(e.args[1], pa.int32()))

    def func_datediff(self, e: Func) -> Column:
        return F.datediff(self.compile(e.args[0]), self.compile(e.args[1]))

    def func_sqrt(self, e: Func) -> Column:
        return F.sqrt(self.compile(e.args[0]))

    def func_ln(self, e: Func) -> Column:
        return F.ln(self.compile(e.args[0]))  # NULL for values <= 0

    def func_exp(self, e: Func) -> Column:
        return F.exp(self.compile(e.args[0]))

    def func_power(self, e: Func) -> Column:
        return F.pow(self.compile(e.args[0]), self.compile(e.args[1]))

    def visit_Extract(self, e: ex.Extract) -> Column:
        return getattr(self, f"extract_{e.field_}")(self.compile(e.arg))

    def extract_year(self, c: Column) -> Column:
        return F.year(c)

    def extract_quarter(self, c: Column) -> Column:
        return F.quarter(c)

    def extract_month(self, c: Column) -> Column:
        return F.month(c)

    def extract_week(self, c: Column) -> Column:
        return F.weekofyear(c)

    def extract_day(self, c: Column) -> Column:
        return F.dayofmonth(c)

    def extract_dayofweek(self, c: Column) -> Column:
        return F.dayofweek(c)

    def extract_dayofyear(self, c: Column) -> Column:
        return F.dayofyear(c)

    def extract_hour(self, c: Column) -> Column:
        return F.hour(c)

    def extract_minute(self, c: Column) -> Column:
        return F.minute(c)

    def extract_second(self, c: Column) -> Column:
        return F.second(c)

    def extract_second_with_fraction(self, c: Column) -> Column:
        return F.extract(F.lit("SECOND"), c)


ex.require_visitors(SparkExpressionCompiler, "Spark")
_COMPILER = SparkExpressionCompiler()


def compile_expr(e: Expr) -> Column:
    """A Spark Column computing ``e``, with exactly the type ``e.dtype``."""
    out = _COMPILER.compile(e)
    if e.dtype != NULL and not isinstance(e, ex.Col):
        out = out.cast(arrow_to_spark(e.dtype))
    return out


# -- plans -------------------------------------------------------------------------------------------------------


class PlanCompiler:
    """Compile a stateless plan (scan, select, project, join) to an annotated Spark DataFrame.

    ``scan_df(scan)`` supplies each scan's rows (the table at the right version, possibly pruned); ``annotations``
    says which scans are partitioned (their rows get the fragment column, or with ``fragments_in_spark=False`` the
    raw partition value, to be turned into fragments in memory after a join); ``from_state(node)`` may return a
    DataFrame of a subtree's contents held in engine state instead. ``plain``: no annotations and no multiplicities,
    the query as a user runs it.
    """

    def __init__(self, spark: SparkSession, scan_df: Callable[[Scan], DataFrame],
                 annotations: AnnotationLayout | None = None, *, fragments_in_spark: bool = True,
                 from_state: Callable[[Plan], DataFrame | None] | None = None, plain: bool = False) -> None:
        self.spark = spark
        self.scan_df = scan_df
        self.annotations = annotations
        self.fragments_in_spark = fragments_in_spark
        self.from_state = from_state
        self.plain = plain

    def compile(self, node: Plan) -> DataFrame:
        if self.from_state is not None:
            df = self.from_state(node)
            if df is not None:
                return df
        visit = getattr(self, f"visit_{type(node).__name__}", None)
        if visit is None:
            raise UnsupportedError(f"{UNSUPPORTED_NODES.get(type(node), type(node).__name__)} cannot be compiled "
                                   f"for Spark here (it is evaluated from engine state)")
        return visit(node)

    def visit_Scan(self, node: Scan) -> DataFrame:
        df = self.scan_df(node)
        cols = [F.col(q(c.name)).alias(node.qualified(c.name)) for c in node.columns]
        if self.plain:
            return df.select(*cols)
        ann = self.annotations.of_scan(node) if self.annotations is not None else None
        mult = F.lit(1).cast("long").alias(MULT)
        if ann is None:
            return df.select(*cols, mult)
        value = F.col(q(ann.partition.column))
        if not self.fragments_in_spark:
            return df.select(*cols, mult, value.alias(ann.raw_column))
        df = add_fragment(df, value, ann.partition, ann.offset, ann.column)
        return df.select(*cols, mult, F.col(ann.column))

    def visit_Select(self, node: Select) -> DataFrame:
        return self.compile(node.child).filter(compile_expr(node.predicate))

    def visit_Project(self, node: Project) -> DataFrame:
        child = self.compile(node.child)
        ann = [col(c) for c in child.columns if is_carried(c)]
        return child.select(*[compile_expr(e).alias(name) for name, e in node.items], *ann)

    def visit_Join(self, node: Join) -> DataFrame:
        if self.plain:
            left, right = self.compile(node.left), self.compile(node.right)
            if node.condition is None:
                return left.crossJoin(right)
            return left.join(right, on=compile_expr(node.condition), how="inner")
        left = self.compile(node.left)
        right = self.compile(node.right).withColumnRenamed(MULT, RIGHT_MULT)
        if SET in right.columns:
            right = right.withColumnRenamed(SET, RIGHT_SET)
        cond = compile_expr(node.condition) if node.condition is not None else None
        joined = left.join(right, on=cond, how="inner") if cond is not None else left.crossJoin(right)
        joined = joined.withColumn(MULT, col(MULT) * col(RIGHT_MULT)).drop(RIGHT_MULT)
        if RIGHT_SET in joined.columns:
            if SET in joined.columns:
                joined = joined.withColumn(SET, F.array_sort(F.array_distinct(F.concat(col(SET), col(RIGHT_SET)))))
                joined = joined.drop(RIGHT_SET)
            else:
                joined = joined.withColumnRenamed(RIGHT_SET, SET)
        return joined.select(*[col(c) for c in join_columns(node.left.names, node.right.names, joined.columns)])

    def visit_AntiJoin(self, node: AntiJoin) -> DataFrame:
        """``NOT EXISTS``: Spark's ``left_anti`` join (a NULL key matches nothing). ``NOT IN`` (``null_aware``) as
        SQL defines it: every left row when the right side is empty, else the unmatched rows with a non-NULL key,
        and none when some right key is NULL. Annotated: the left rows keep their annotation, the right side adds
        none (its rows are never in an anti join's provenance)."""
        left_keys, right_keys, _ = node.equi_keys()
        left = self.compile(node.left)
        right_rows = self.compile(node.right)
        right = right_rows.select(*[col(k) for k in right_keys])
        out = left.join(right, on=compile_expr(node.condition), how="left_anti")
        if not node.null_aware:
            return out
        weight = col(MULT) if MULT in right_rows.columns else F.lit(1)
        key = col(right_keys[0])
        nulls = F.sum(F.when(key.isNull(), weight).otherwise(0))
        stats = right_rows.agg(F.coalesce(F.sum(weight), F.lit(0)).alias(_ANTI_TOTAL),
                               F.coalesce(nulls, F.lit(0)).alias(_ANTI_NULLS))
        kept = (col(_ANTI_TOTAL) == 0) | (col(left_keys[0]).isNotNull() & (col(_ANTI_NULLS) == 0))
        return out.crossJoin(stats).filter(kept).drop(_ANTI_TOTAL, _ANTI_NULLS)

    def visit_Union(self, node: Union) -> DataFrame:
        """``UNION ALL`` by name. Annotated: each branch computes its fragments in Spark (a branch's raw partition
        value could not be told from a NULL meaning "no such scan"), and the fragment columns of the other
        branches' scans are NULL; when a branch carries fragment sets, every branch's annotation becomes a set."""
        if self.plain:
            return functools.reduce(DataFrame.unionByName, (self.compile(b) for b in node.inputs))
        sub = copy.copy(self)
        sub.fragments_in_spark = True
        branches = [sub.compile(b) for b in node.inputs]
        frags = list(dict.fromkeys(c for b in branches for c in b.columns if is_frag_col(c)))
        if any(SET in b.columns for b in branches):
            branches = [as_set(b) for b in branches]
            frags = []
        aligned = [b.select(*[col(n) for n in node.names], col(MULT),
                            *[col(c) if c in b.columns else F.lit(None).cast("int").alias(c) for c in frags],
                            *([col(SET)] if SET in b.columns else [])) for b in branches]
        return functools.reduce(DataFrame.unionByName, aligned)

    # -- plain evaluation of stateful nodes (the use path) --------------------------------------------------------

    def visit_Aggregate(self, node: Aggregate) -> DataFrame:
        if not self.plain:
            raise UnsupportedError("aggregation is evaluated from engine state, not compiled with annotations")
        child = self.compile(node.child)
        aggs = []
        for name, a in node.aggs:
            if a.arg is None:
                value = F.count(F.lit(1))
            else:
                arg = compile_expr(a.arg)
                value = ({"sum": F.sum_distinct, "count": F.count_distinct} if a.distinct else
                         {"sum": F.sum, "count": F.count, "avg": F.avg, "min": F.min, "max": F.max})[a.func](arg)
            aggs.append(value.cast(arrow_to_spark(a.dtype)).alias(name))
        if not node.keys:
            return child.agg(*aggs) if aggs else child.agg(F.count(F.lit(1))).select()
        keys = [compile_expr(e).alias(name) for name, e in node.keys]
        if not aggs:
            return child.select(*keys).distinct()
        return child.groupBy(*keys).agg(*aggs)

    def visit_Distinct(self, node: Distinct) -> DataFrame:
        if not self.plain:
            raise UnsupportedError("distinct is evaluated from engine state, not compiled with annotations")
        return self.compile(node.child).distinct()

    def visit_TopK(self, node: TopK) -> DataFrame:
        if not self.plain:
            raise UnsupportedError("top-k is evaluated from engine state, not compiled with annotations")
        return self.compile(node.child).orderBy(*_sort_columns(node.order)).limit(node.k)

    def visit_GroupTopK(self, node: GroupTopK) -> DataFrame:
        if not self.plain:
            raise UnsupportedError("top-k per group is evaluated from engine state, not compiled with annotations")
        assert node.k is not None
        window = Window.partitionBy(*[compile_expr(e) for e in node.partition]).orderBy(*_sort_columns(node.order))
        ranking = {"row_number": F.row_number, "rank": F.rank, "dense_rank": F.dense_rank}[node.function]()
        return self.compile(node.child).withColumn(node.rank, ranking.over(window)).filter(col(node.rank) <= node.k)


def _sort_columns(order: tuple[SortKey, ...]) -> list[Column]:
    out = []
    for key in order:
        c = compile_expr(key.expr)
        nulls_first = key.effective_nulls_first
        if key.descending:
            out.append(c.desc_nulls_first() if nulls_first else c.desc_nulls_last())
        else:
            out.append(c.asc_nulls_first() if nulls_first else c.asc_nulls_last())
    return out


_ANTI_TOTAL, _ANTI_NULLS = "__anti_total", "__anti_nulls"  # a NOT IN subquery's rows, and those with a NULL key


def as_set(df: DataFrame) -> DataFrame:
    """``df`` with its fragment columns (and set, if any) folded into one sorted, duplicate-free ``__sk`` array."""
    frags = [c for c in df.columns if is_frag_col(c)]
    parts = [F.array(*[col(c) for c in frags])] if frags else []
    if SET in df.columns:
        parts.append(col(SET))
    if not parts:
        return df.withColumn(SET, F.array().cast("array<int>"))
    merged = parts[0] if len(parts) == 1 else F.concat(*parts)
    return df.withColumn(SET, F.array_sort(F.array_distinct(F.array_compact(merged))).cast("array<int>")).drop(*frags)

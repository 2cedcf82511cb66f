"""Compile plans and expressions to Spark DataFrames, with provenance annotations.

One ``visit_<Node>`` per plan node. Annotated relations carry, next to the plan's columns, ``__mult`` (multiplicity,
1 for table rows) and per partitioned scan either its fragment column ``__f{i}`` (computed on Spark: needed when
Spark groups by fragment during capture) or its raw partition value ``__p{i}`` (when a small join result is
annotated afterwards in memory, which avoids computing a fragment for every row of a large table). Expressions
compile with the same semantics as ``imp_core.engine.evaluate`` (results cast to the IR's type).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from imp_core.errors import UnsupportedError
from imp_core.plan.expr import (
    NULL,
    Between,
    Binary,
    Case,
    Cast,
    Col,
    Expr,
    Extract,
    Func,
    InList,
    Interval,
    IsNull,
    Like,
    Lit,
    Unary,
    common_type,
    is_temporal,
)
from imp_core.plan.nodes import Aggregate, Distinct, Join, Plan, Project, Scan, Select, TopK
from imp_core.sketch.partition import Partition
from imp_core.spark.fragment import add_fragment
from imp_core.spark.types import arrow_to_spark

MULT = "__mult"

# What this compiler does not do: stateful nodes are materialized from engine state by the caller.
UNSUPPORTED_NODES = {Aggregate: "aggregation", Distinct: "distinct", TopK: "top-k"}


def q(name: str) -> str:
    """Backtick-quote a column name (plan names contain dots)."""
    return "`" + name.replace("`", "``") + "`"


def col(name: str) -> Column:
    return F.col(q(name))


def is_ann(name: str) -> bool:
    return name == MULT or name.startswith("__f") or name.startswith("__p") or name == "__sk"


# -- expressions -------------------------------------------------------------------------------------------------


def compile_expr(e: Expr) -> Column:
    out = _compile(e)
    if e.dtype != NULL and not isinstance(e, Col):
        out = out.cast(arrow_to_spark(e.dtype))
    return out


def _to(e: Expr, t: Any) -> Column:
    c = _compile(e)
    if e.dtype == t or t == NULL:
        return c
    return c.cast(arrow_to_spark(t))


def _compile(e: Expr) -> Column:
    if isinstance(e, Col):
        return col(e.name)
    if isinstance(e, Lit):
        if e.value is None:
            return F.lit(None)
        return F.lit(e.value).cast(arrow_to_spark(e.dtype))
    if isinstance(e, Unary):
        return ~_compile(e.arg) if e.op == "not" else -_compile(e.arg)
    if isinstance(e, Binary):
        return _binary(e)
    if isinstance(e, IsNull):
        c = _compile(e.arg)
        return c.isNotNull() if e.negated else c.isNull()
    if isinstance(e, InList):
        parts = [_cmp("=", e.arg, i) for i in e.items]
        out = parts[0]
        for p in parts[1:]:
            out = out | p
        return ~out if e.negated else out
    if isinstance(e, Between):
        out = _cmp(">=", e.arg, e.low) & _cmp("<=", e.arg, e.high)
        return ~out if e.negated else out
    if isinstance(e, Like):
        c = _compile(e.arg)
        out = c.ilike(e.pattern) if e.case_insensitive else c.like(e.pattern)
        return ~out if e.negated else out
    if isinstance(e, Case):
        chain = None
        for cond, value in e.whens:
            v = _to(value, e.dtype)
            chain = F.when(_compile(cond), v) if chain is None else chain.when(_compile(cond), v)
        default = _to(e.default, e.dtype) if e.default is not None else F.lit(None).cast(arrow_to_spark(e.dtype))
        return chain.otherwise(default) if chain is not None else default
    if isinstance(e, Cast):
        return _compile(e.arg).cast(arrow_to_spark(e.to))
    if isinstance(e, Func):
        return _func(e)
    if isinstance(e, Extract):
        return _EXTRACT[e.field_](_compile(e.arg))
    raise UnsupportedError(f"expression {type(e).__name__} cannot be compiled for Spark")


def _cmp(op: str, a: Expr, b: Expr) -> Column:
    t = common_type(a.dtype, b.dtype)
    x, y = _to(a, t), _to(b, t)
    return {"=": x == y, "<>": x != y, "<": x < y, "<=": x <= y, ">": x > y, ">=": x >= y}[op]


def _binary(e: Binary) -> Column:
    op = e.op
    if op == "and":
        return _compile(e.left) & _compile(e.right)
    if op == "or":
        return _compile(e.left) | _compile(e.right)
    if op in ("=", "<>", "<", "<=", ">", ">="):
        return _cmp(op, e.left, e.right)
    if isinstance(e.right, Interval) or isinstance(e.left, Interval):
        base, iv = (e.left, e.right) if isinstance(e.right, Interval) else (e.right, e.left)
        assert isinstance(iv, Interval)
        n = iv.value if op == "+" else -iv.value
        b = _compile(base)
        if pa.types.is_date(base.dtype):
            if iv.unit == "day":
                return F.date_add(b, F.lit(n))
            if iv.unit == "week":
                return F.date_add(b, F.lit(7 * n))
            if iv.unit in ("month", "year"):
                return F.add_months(b, F.lit(n * (12 if iv.unit == "year" else 1)))
        unit = {"day": "DAY", "week": "WEEK", "month": "MONTH", "year": "YEAR", "hour": "HOUR",
                "minute": "MINUTE", "second": "SECOND"}[iv.unit]
        return b + F.expr(f"INTERVAL {n} {unit}")
    lt, rt = e.left.dtype, e.right.dtype
    if is_temporal(lt):
        if is_temporal(rt):
            return F.datediff(_compile(e.left), _compile(e.right))
        days = _compile(e.right).cast("int")  # Spark 4's date_add takes an INT, not a BIGINT
        return F.date_add(_compile(e.left), days if op == "+" else -days)
    if op == "/":
        return _compile(e.left).cast("double") / _compile(e.right).cast("double")
    x, y = _compile(e.left), _compile(e.right)
    if op == "+":
        return x + y
    if op == "-":
        return x - y
    if op == "*":
        return x * y
    if op == "%":
        return x % y
    raise UnsupportedError(f"operator {op} cannot be compiled for Spark")


def _func(e: Func) -> Column:
    n = e.name
    c = [_compile(a) for a in e.args]
    if n == "upper":
        return F.upper(c[0])
    if n == "lower":
        return F.lower(c[0])
    if n == "length":
        return F.length(c[0])
    if n == "trim":
        return F.trim(c[0])
    if n == "ltrim":
        return F.ltrim(c[0])
    if n == "rtrim":
        return F.rtrim(c[0])
    if n == "substring":
        length = c[2] if len(c) > 2 else F.lit(2**31 - 1)
        return c[0].substr(c[1].cast("int"), length.cast("int"))
    if n == "concat":
        return F.concat(*[x.cast("string") for x in c])
    if n == "coalesce":
        return F.coalesce(*[_to(a, e.dtype) for a in e.args])
    if n == "abs":
        return F.abs(c[0])
    if n == "sign":
        return F.signum(c[0])
    if n == "round":
        digits = int(e.args[1].value) if len(e.args) > 1 and isinstance(e.args[1], Lit) else 0
        return F.round(c[0], digits)
    if n == "floor":
        return F.floor(c[0])
    if n == "ceil":
        return F.ceil(c[0])
    if n == "date_add":
        return F.date_add(c[0].cast("date"), c[1].cast("int"))
    if n == "date_sub":
        return F.date_sub(c[0].cast("date"), c[1].cast("int"))
    if n == "datediff":
        return F.datediff(c[0].cast("date"), c[1].cast("date"))
    if n == "greatest":
        return F.greatest(*[_to(a, e.dtype) for a in e.args])
    if n == "least":
        return F.least(*[_to(a, e.dtype) for a in e.args])
    if n == "nullif":
        return F.when(_cmp("=", e.args[0], e.args[1]), F.lit(None)).otherwise(c[0])
    if n == "replace":
        a1, a2 = e.args[1], e.args[2]
        if not (isinstance(a1, Lit) and isinstance(a2, Lit)):
            raise UnsupportedError("REPLACE needs constant search and replacement strings")
        return F.replace(c[0], F.lit(str(a1.value)), F.lit(str(a2.value)))
    if n == "sqrt":
        return F.when(c[0] < 0, F.lit(None)).otherwise(F.sqrt(c[0].cast("double")))
    if n == "ln":
        return F.when(c[0] <= 0, F.lit(None)).otherwise(F.log(c[0].cast("double")))
    if n == "exp":
        return F.exp(c[0].cast("double"))
    if n == "power":
        return F.pow(c[0].cast("double"), c[1].cast("double"))
    raise UnsupportedError(f"function {n.upper()} cannot be compiled for Spark")


_EXTRACT: dict[str, Callable[[Column], Column]] = {
    "year": F.year, "quarter": F.quarter, "month": F.month, "week": F.weekofyear, "day": F.dayofmonth,
    "dayofweek": F.dayofweek, "dayofyear": F.dayofyear, "hour": F.hour, "minute": F.minute, "second": F.second,
}


# -- plans -------------------------------------------------------------------------------------------------------


class PlanCompiler:
    """Compile a stateless plan (scan, select, project, join) to an annotated Spark DataFrame.

    ``scan_df(scan)`` supplies each scan's rows (the table at the right version, possibly pruned);
    ``annotation(scan)`` gives ``(column name, partition, global offset)`` for partitioned scans or None;
    ``materialize(node)`` may return a DataFrame for a stateful node (built from engine state) instead.
    """

    def __init__(self, spark: SparkSession, scan_df: Callable[[Scan], DataFrame],
                 annotation: Callable[[Scan], tuple[str, Partition, int] | None] | None = None, *,
                 fragments_in_spark: bool = True, materialize: Callable[[Plan], DataFrame | None] | None = None,
                 plain: bool = False) -> None:
        self.spark = spark
        self.scan_df = scan_df
        self.annotation = annotation or (lambda scan: None)
        self.fragments_in_spark = fragments_in_spark
        self.materialize = materialize
        self.plain = plain  # no annotations, no multiplicities: the query as a user runs it

    def compile(self, node: Plan) -> DataFrame:
        if self.materialize is not None:
            df = self.materialize(node)
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
        ann = self.annotation(node)
        extra = [F.lit(1).cast("long").alias(MULT)]
        if ann is None:
            return df.select(*cols, *extra)
        name, partition, offset = ann
        value = F.col(q(partition.column))
        if not self.fragments_in_spark:
            return df.select(*cols, *extra, value.alias(name.replace("__f", "__p")))
        df = add_fragment(df, value, partition, offset, name)
        return df.select(*cols, *extra, F.col(name))

    def visit_Select(self, node: Select) -> DataFrame:
        return self.compile(node.child).filter(compile_expr(node.predicate))

    def visit_Project(self, node: Project) -> DataFrame:
        child = self.compile(node.child)
        ann = [col(c) for c in child.columns if is_ann(c)]
        return child.select(*[compile_expr(e).alias(name) for name, e in node.items], *ann)

    def visit_Join(self, node: Join) -> DataFrame:
        if self.plain:
            left, right = self.compile(node.left), self.compile(node.right)
            if node.condition is None:
                return left.crossJoin(right)
            return left.join(right, on=compile_expr(node.condition), how="inner")
        left = self.compile(node.left)
        right = self.compile(node.right).withColumnRenamed(MULT, "__mult_r")
        if "__sk" in right.columns:
            right = right.withColumnRenamed("__sk", "__sk_r")
        cond = compile_expr(node.condition) if node.condition is not None else None
        joined = left.join(right, on=cond, how="inner") if cond is not None else left.crossJoin(right)
        joined = joined.withColumn(MULT, col(MULT) * col("__mult_r")).drop("__mult_r")
        if "__sk_r" in joined.columns:
            if "__sk" in joined.columns:
                joined = joined.withColumn("__sk", F.array_sort(F.array_distinct(F.concat(col("__sk"),
                                                                                          col("__sk_r")))))
                joined = joined.drop("__sk_r")
            else:
                joined = joined.withColumnRenamed("__sk_r", "__sk")
        data = [col(n) for n in node.names]
        ann = [col(c) for c in joined.columns if is_ann(c)]
        return joined.select(*data, *ann)

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
                value = {"sum": F.sum, "count": F.count, "avg": F.avg, "min": F.min, "max": F.max}[a.func](arg)
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
        child = self.compile(node.child)
        order = []
        for key in node.order:
            c = compile_expr(key.expr)
            nulls_first = key.effective_nulls_first
            if key.descending:
                order.append(c.desc_nulls_first() if nulls_first else c.desc_nulls_last())
            else:
                order.append(c.asc_nulls_first() if nulls_first else c.asc_nulls_last())
        return child.orderBy(*order).limit(node.k)

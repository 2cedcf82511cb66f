"""A capture of external operator state on Spark: the state tables of an aggregation (or the input rows of a top-k
per group, the left rows and right key counts of an anti join) computed and written by the executors, so its groups
never come to the driver (``engine/external.py``, ``spark/state_store.py``).

Per group, the accumulators of the aggregation's partial layout (``operators/partials.py``) are the terms of its
rows summed over the (group, fragment) partials a capture computes anyway (compensation terms 0); ``F_g`` is the
partials' row count per fragment; a MIN/MAX or DISTINCT aggregate's value counts are the rows per (group, value),
and its value in the groups table the extreme, the count or the sum of the values with a positive count. This is
the state the in-memory engine builds from the same partials (``tests/spark/test_state_store.py`` compares them).
Shapes it leaves to the in-process fold (the caller then folds the partials there): float group keys, floating
point MIN/MAX or DISTINCT values (kept as order keys), rows with multiplicities other than one, a SUM(DISTINCT) of a
wide decimal (its exact sum, or NULL beyond 38 digits, is ``distinct_values.distinct_sums``').

Stacked external operators: the input of an aggregation may read the result of external operators below it
(``Relation.external``); :func:`output_frame` computes such a result from its Delta tables on Spark (the groups with
rows, their output values from the stored accumulators and extremes, their sketches from ``F_g``), so a capture of
the operator above never brings the groups below to the driver. Its value rules are the in-memory engine's
(``Aggregation.output_exprs``) for the outputs that need no rounding decision: counts, integer and decimal sums,
integer averages, extremes and DISTINCT values of non-float arguments; an operator with another output (a float
sum, a decimal average, an order-dependent bound) is left to the in-process path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import polars as pl
import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from imp_core.engine.external import FCOUNTS, GROUPS, ExternalOperator
from imp_core.engine.operators.aggregation_external import ExternalAggregation, ExternalDistinct
from imp_core.engine.operators.anti_join import NULL_KEY
from imp_core.engine.operators.anti_join_external import CLOSED, LEFT, OPEN, RIGHT, ExternalAntiJoin
from imp_core.engine.operators.group_topk import SKEY, N
from imp_core.engine.operators.group_topk_external import ROWS, ExternalGroupTopK
from imp_core.engine.operators.partials import Term, agg_columns
from imp_core.engine.running_sums import is_order_dependent_decimal
from imp_core.engine.schema import COUNT, FRAG, GROUP_ROWS, MULT, SET, VALUE, is_frag_col
from imp_core.spark.compile import as_set, col, compile_expr
from imp_core.spark.frames import spark_schema, to_spark
from imp_core.spark.state_store import COMPONENT, DeltaGroupStore
from imp_core.spark.terms import partial_sums, rounding_bound


def capture_state(spark: SparkSession, df: DataFrame, op: ExternalAggregation | ExternalDistinct) -> bool:
    """Compute ``op``'s state from its whole input ``df`` (annotated, fragments computed on Spark) and write it to
    ``op.store``; False, with nothing written, for the shapes this leaves to the caller."""
    layout = op.layout
    if layout.float_keys or not layout.keys or any(layout.float_values(j) for j in layout.valued):
        return False
    if any(is_order_dependent_decimal(layout.aggs[j][1]) for j in layout.distinct):
        return False  # Spark's SUM over the distinct values may be NULL where the exact sum is not
    m = col(MULT)
    if df.where(F.abs(m) != 1).limit(1).count():
        return False
    with_sets = SET in df.columns  # rows carrying results of aggregations below: one fragment set per row
    if with_sets:
        df = as_set(df)
    frag_names = [c for c in df.columns if is_frag_col(c)]
    names = layout.key_names
    keys = [compile_expr(e).alias(n) for n, e in layout.keys]
    args = {j: compile_expr(a.arg) for j, (_, a) in enumerate(layout.aggs) if a.arg is not None}
    sums = partial_sums(layout, args, m)
    per_fragment = df.groupBy(*keys, *[col(f) for f in frag_names], *([col(SET)] if with_sets else [])).agg(*sums)
    stored = {name: {k: t for k, t in schema.items() if k != SET} for name, schema in op.component_schemas().items()}
    # a group whose terms are all NULL (its values all NULL, NaN or infinite) holds 0, as the in-memory fold does:
    # a NULL accumulator would absorb every later batch's terms (no sum overflows: a wide decimal's parts stay far
    # below 38 digits); an order-dependent float sum's error bound covers Spark's plain additions
    groups = per_fragment.groupBy(*[col(k) for k in names]).agg(
        *[F.coalesce(F.sum(col(c.name)), F.lit(0)).alias(c.name) for c in layout.accumulators
          if c.term is not Term.ROUNDING],
        *[rounding_bound(F.sum(col(r.terms)), F.sum(col(r.magnitude))).alias(r.bound) for r in layout.roundings])
    components: dict[str, DataFrame] = {}
    for c in layout.compensated:
        if c.compensation is not None:
            groups = groups.withColumn(c.compensation, F.lit(0.0))
    for j in layout.valued:
        values = (df.select(*keys, args[j].alias(VALUE), m).where(col(VALUE).isNotNull())
                  .groupBy(*[col(k) for k in names], col(VALUE)).agg(F.sum(m).alias(COUNT)))
        if f"mm{j}" in stored:  # aggregates over one argument keep its counts once
            components[f"mm{j}"] = as_stored(spark, values, stored[f"mm{j}"])
        groups = _with_value(groups, values, names, j, layout.aggs[j][1].func, layout.aggs[j][1].distinct)
    components[GROUPS] = as_stored(spark, groups, stored[GROUPS])
    fcounts = _fragment_counts(per_fragment, names, frag_names, with_sets)
    if fcounts is not None:
        components[FCOUNTS] = as_stored(spark, fcounts, stored[FCOUNTS])
    op.store.write_all(components)  # type: ignore[attr-defined]
    return True


def _fragment_counts(per_fragment: DataFrame, names: list[str], frag_names: list[str],
                     with_sets: bool) -> DataFrame | None:
    """``F_g`` from the partials per (group, annotation): one pair per fragment column, and per fragment of a set
    (a set row counts once per fragment of its set, as the in-memory engine's pairs do); None without annotation."""
    parts = [per_fragment.where(col(f).isNotNull()).select(*[col(k) for k in names], col(f).alias(FRAG),
                                                            col(GROUP_ROWS).alias(COUNT)) for f in frag_names]
    if with_sets:
        parts.append(per_fragment.select(*[col(k) for k in names], F.explode(col(SET)).alias(FRAG),
                                         col(GROUP_ROWS).alias(COUNT)))
    if not parts:
        return None
    fcounts = parts[0]
    for p in parts[1:]:
        fcounts = fcounts.unionByName(p)
    return fcounts.groupBy(*[col(k) for k in names], col(FRAG)).agg(F.sum(col(COUNT)).alias(COUNT))


def _with_value(groups: DataFrame, values: DataFrame, names: list[str], j: int, func: str,
                distinct: bool) -> DataFrame:
    """``groups`` with aggregate ``j``'s value from its value counts: MIN/MAX the extreme, COUNT(DISTINCT) the
    number of values (0 for none), SUM(DISTINCT) their sum (NULL for none)."""
    extreme = agg_columns(j).extreme
    v = col(VALUE)
    if distinct and func == "count":
        agg: Column = F.count(v)
    elif distinct:
        agg = F.sum(v)
    else:
        agg = F.min(v) if func == "min" else F.max(v)
    per_group = values.where(col(COUNT) > 0).groupBy(*[col(k) for k in names]).agg(agg.alias(extreme))
    out = _left_join(groups, per_group, names)
    if distinct and func == "count":
        out = out.withColumn(extreme, F.coalesce(col(extreme), F.lit(0)))
    return out


def _left_join(left: DataFrame, right: DataFrame, names: list[str]) -> DataFrame:
    """``left`` with ``right``'s other columns, matched on ``names`` (NULL keys equal each other)."""
    other = right.select(*[col(k).alias(f"__g{i}") for i, k in enumerate(names)],
                         *[col(c) for c in right.columns if c not in names])
    cond: Column | None = None
    for i, k in enumerate(names):
        term = col(k).eqNullSafe(F.col(f"__g{i}"))
        cond = term if cond is None else cond & term
    return left.join(other, on=cond, how="left").drop(*[f"__g{i}" for i in range(len(names))])


def capture_rows(spark: SparkSession, df: DataFrame, op: ExternalGroupTopK) -> bool:
    """Write a top-k per group's state, its whole input ``df`` (annotated, fragments computed on Spark) netted to one
    row per (row, annotation) with its multiplicity, with the partition key and the annotation as text
    (``operators/group_topk_external.py``), to ``op.store`` by the executors. False when the store is not Delta
    tables."""
    if not isinstance(op.store, DeltaGroupStore):
        return False
    df = as_set(df)
    keys = [compile_expr(e).alias(name) for e, name in zip(op.node.partition, op.pcols)]
    rows = df.select(*keys, *[col(c) for c in op.data_cols], _set_text(col(SET)).alias(SKEY),
                     col(MULT).cast("long").alias(N))
    stored = op.component_schemas()[ROWS]
    op.store.write_all({ROWS: as_stored(spark, _netted(rows, N), stored)})
    return True


def capture_anti_join(spark: SparkSession, left: DataFrame, right: DataFrame, op: ExternalAntiJoin) -> bool:
    """Write an anti join's state from its whole inputs (``operators/anti_join_external.py``): the left rows
    (annotated, fragments computed on Spark) netted per (key, row, annotation) with the annotation as text, and the
    right rows counted per key, by the executors; the right side's two totals are the one row that comes back. False
    when the store is not Delta tables."""
    if not isinstance(op.store, DeltaGroupStore):
        return False
    left = as_set(left)
    rows = _netted(left.select(*[col(k).alias(kc) for k, kc in zip(op.left_keys, op.kcols)],
                               *[col(c) for c in op.left_names], _set_text(col(SET)).alias(SKEY),
                               col(MULT).cast("long").alias(MULT)), MULT)
    null = F.lit(False)
    for k in op.right_keys:
        null = null | col(k).isNull()
    keyed = right.select(*[col(k).alias(kc) for k, kc in zip(op.right_keys, op.kcols)], null.alias(NULL_KEY),
                         col(MULT).cast("long").alias(MULT))
    totals = keyed.agg(F.sum(F.when(col(NULL_KEY), col(MULT)).otherwise(0)).alias("nulls"),
                       F.sum(col(MULT)).alias("total")).first()
    counts = (keyed.where(~col(NULL_KEY)).groupBy(*[col(k) for k in op.kcols]).agg(F.sum(col(MULT)).alias(COUNT))
              .where(col(COUNT) > 0))
    schemas = op.component_schemas()
    op.store.write_all({LEFT: as_stored(spark, rows, schemas[LEFT]),
                        RIGHT: as_stored(spark, counts, schemas[RIGHT])})
    op.set_totals(int(totals["nulls"] or 0) if totals else 0, int(totals["total"] or 0) if totals else 0)
    return True


def _netted(rows: DataFrame, count: str) -> DataFrame:
    """``rows`` as a bag, the form the in-memory operators keep: one row per distinct value of the other columns
    with the sum of ``count``, those that cancel dropped. Identical input rows (equal in every kept column) become
    one stored row with their multiplicity, so a store's change detection sees a delete of one copy."""
    group = [col(c) for c in rows.columns if c != count]
    return rows.groupBy(*group).agg(F.sum(col(count)).alias(count)).where(col(count) != 0)


def _set_text(fragments: Column) -> Column:
    """A fragment set as the text external state keeps it (``group_topk.skey_expr``): its ids joined by commas."""
    return F.concat_ws(",", F.transform(fragments, lambda f: f.cast("string")))


def _text_set(text: Column) -> Column:
    """The fragment set of its text (``group_topk.skey_set``)."""
    return F.when(text == "", F.array().cast("array<int>")).otherwise(F.split(text, ",").cast("array<int>"))


def _anti_join_output(op: ExternalAntiJoin, table: Callable[[str], DataFrame | None]) -> DataFrame | None:
    """An anti join's current result from its tables: the netted left rows whose key has no right row (a ``NOT IN``
    under its gate: every row over an empty right side, none over one with a NULL key, else no row with a NULL key
    either)."""
    left, right = table(LEFT), table(RIGHT)
    if left is None or right is None:
        return None
    group = [col(c) for c in left.columns if c != MULT]
    netted = left.groupBy(*group).agg(F.sum(col(MULT)).alias(MULT)).where(col(MULT) != 0)
    now = op.gate
    if now == CLOSED:
        live = netted.where(F.lit(False))
    elif now == OPEN:
        live = netted
    else:
        blocked = right.where(col(COUNT) > 0).select(*[col(k).alias(f"__b{i}") for i, k in enumerate(op.kcols)])
        cond: Column | None = None
        for i, k in enumerate(op.kcols):  # plain equality: a NULL key matches no right row
            term = col(k) == F.col(f"__b{i}")
            cond = term if cond is None else cond & term
        if op.null_aware:  # NOT IN over a right side with rows and no NULL: a NULL key is unknown, not true
            for k in op.kcols:
                netted = netted.where(col(k).isNotNull())
        live = netted.join(blocked, on=cond, how="left_anti")
    out = live.select(*[col(c) for c in op.left_names], col(MULT), _text_set(col(SKEY)).alias(SET))
    target = spark_schema(dict(op.empty_delta().schema))
    return out.select(*[col(f.name).cast(f.dataType).alias(f.name) for f in target.fields])


def output_frame(spark: SparkSession, op: ExternalOperator) -> DataFrame | None:
    """``op``'s current result (its groups with rows, annotated with their sketches, multiplicity 1) computed by
    Spark from its store's tables; None when the store is not Delta tables, the operator is not an aggregation or an
    output needs a rounding decision (see the module docstring)."""
    table = getattr(op.store, "table", None)
    if isinstance(op, ExternalAntiJoin) and table is not None:
        return _anti_join_output(op, table)
    if not isinstance(op, (ExternalAggregation, ExternalDistinct)) or table is None:
        return None
    layout = op.layout
    if layout.float_keys or not layout.keys or op.bounded or op.floats:
        return None
    store: Any = op.store  # a DeltaGroupStore (its ``table`` above): its wide table and column names
    wide = store.wide_table([GROUPS, FCOUNTS])
    values = _output_values(op)
    if wide is None or values is None:
        return None
    names = layout.key_names
    # one aggregation over both components' rows per group (its groups row, its fragments with a positive count):
    # a filter on the keys from above (a join's key push-down) reaches the scan; a join of the two would stop it
    groups, fcounts = col(COMPONENT) == GROUPS, col(COMPONENT) == FCOUNTS
    count, frag = col(store.physical(FCOUNTS, COUNT)), col(store.physical(FCOUNTS, FRAG))
    live = wide.groupBy(*[col(k) for k in names]).agg(
        *[F.first(F.when(groups, col(store.physical(GROUPS, c))), ignorenulls=True).alias(c)
          for c in store.stored(GROUPS) if c not in names],
        F.array_sort(F.collect_set(F.when(fcounts & (count > 0), frag.cast("int")))).alias(SET))
    out = live.where(col(GROUP_ROWS) > 0).select(*[col(k) for k in names], *values, F.lit(1).cast("long").alias(MULT),
                                                 col(SET))
    target = spark_schema(op.delta_schema())  # the types the in-memory result has in Spark
    return out.select(*[col(f.name).cast(f.dataType).alias(f.name) for f in target.fields])


def _output_values(op: ExternalAggregation | ExternalDistinct) -> list[Column] | None:
    """The aggregates' output values from a groups table's columns; None when one needs a rounding decision."""
    layout = op.layout
    values = []
    for j, (name, a) in enumerate(op.aggs):
        cols = agg_columns(j)
        n = col(cols.non_null)
        if a.arg is None:
            value = col(GROUP_ROWS)
        elif a.distinct:
            value = col(cols.extreme)
        elif a.func == "count":
            value = n
        elif j in layout.wide:  # its value from two parts: left to the in-process path
            return None
        elif a.func == "sum" and not layout.float_values(j):
            value = F.when(n > 0, col(cols.sum))
        elif a.func == "avg" and pa.types.is_integer(a.arg.dtype):
            value = F.when(n > 0, col(cols.sum).cast("double") / n.cast("double"))
        elif a.func in ("min", "max") and not layout.float_values(j):
            value = col(cols.extreme)
        else:
            return None
        values.append(value.alias(name))
    return values


def as_stored(spark: SparkSession, df: DataFrame, schema: dict[str, pl.DataType]) -> DataFrame:
    """``df``'s columns of ``schema`` cast to the Spark types a polars frame of that schema becomes (what the
    store's MERGEs write later), in that order."""
    target = to_spark(spark, pl.DataFrame(schema=schema)).schema
    return df.select(*[col(f.name).cast(f.dataType).alias(f.name) for f in target.fields])


__all__ = ["as_stored", "capture_anti_join", "capture_rows", "capture_state", "output_frame"]

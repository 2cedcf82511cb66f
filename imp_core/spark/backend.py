"""The Spark backend of the incremental engine: capture inputs, joins of a delta with an input, and the join-cache
look-ups, over Delta tables at pinned versions.

It compiles the aggregation's partial-aggregate layout (``imp_core.engine.operators.partials``) term by term. See
docs/ARCHITECTURE.md, "Passes and backends".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import polars as pl
import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from imp_core.config import Optimizations
from imp_core.engine.annotation import FRAG_DTYPE, SET_DTYPE, after_join
from imp_core.engine.backend import Relation, Versions
from imp_core.engine.evaluate import polars_type
from imp_core.engine.operators.aggregation_external import ExternalAggregation, ExternalDistinct
from imp_core.engine.operators.partials import Accumulator, PartialLayout, Partials, Term
from imp_core.engine.schema import (
    COUNT,
    FRAG,
    GROUP_ROWS,
    MULT,
    NO_GROUP,
    RIGHT_SET,
    SET,
    VALUE,
    is_carried,
    is_frag_col,
    is_interval_column,
    join_columns,
)
from imp_core.plan.expr import Expr
from imp_core.plan.nodes import Join, Plan
from imp_core.sources.delta import DeltaSource
from imp_core.spark.compile import PlanCompiler, col, compile_expr
from imp_core.spark.types import arrow_schema_to_spark, arrow_to_spark

OTHER_MULT = "__mult_o"  # the multiplicity of the input a shipped delta is joined with
PUSHDOWN_KEYS = 2000  # up to this many distinct delta keys become an IN filter; beyond, a key range


def to_polars(df: DataFrame) -> pl.DataFrame:
    table = df.toArrow()
    return pl.from_arrow(table) if table.num_rows else pl.from_arrow(table.schema.empty_table())  # type: ignore[return-value]


def to_spark(spark: SparkSession, df: pl.DataFrame) -> DataFrame:
    """A polars frame as a Spark DataFrame (unsigned fragment ids become signed ints on the way).

    Always through Arrow, also when empty: the JVM builds the frame from Arrow batches, so executors never start a
    Python worker (``createDataFrame([], schema)`` would, and a cluster's workers need not have Python).
    """
    casts = {}
    for name, dtype in df.schema.items():
        if dtype == FRAG_DTYPE:
            casts[name] = pl.Int32
        elif dtype == SET_DTYPE:
            casts[name] = pl.List(pl.Int32)
    table = df.cast(casts).to_arrow() if casts else df.to_arrow()  # type: ignore[arg-type]
    table = table.cast(pa.schema([pa.field(f.name, _plain(f.type)) for f in table.schema]))
    return spark.createDataFrame(table, arrow_schema_to_spark(table.schema))


def _plain(t: pa.DataType) -> pa.DataType:
    if t == pa.string_view() or pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_list(t) or (pa.types.is_list(t) and t.value_type == pa.uint32()):
        return pa.list_(pa.int32())
    return t


def to_engine_types(df: pl.DataFrame, node: Plan) -> pl.DataFrame:
    """A frame read back from Spark in the engine's storage types: ``node``'s columns, ``__mult`` as Int64,
    fragment ids as UInt32."""
    casts = {f.name: polars_type(f.dtype) for f in node.schema if f.name in df.columns}
    casts = {k: v for k, v in casts.items() if df.schema[k] != v}
    if MULT in df.columns and df.schema[MULT] != pl.Int64:
        casts[MULT] = pl.Int64
    for c in df.columns:
        if is_frag_col(c) and df.schema[c] != FRAG_DTYPE:
            casts[c] = FRAG_DTYPE
        if c == SET and df.schema[c] != SET_DTYPE:
            casts[c] = SET_DTYPE
    return df.cast(casts, strict=False) if casts else df  # type: ignore[arg-type]


# What a row contributes to each kind of accumulator (before the group-by sums it): ``x`` the aggregate's argument,
# ``d`` the argument as a double, ``m`` the multiplicity. EXACT terms are ``_exact_term``.
_FINITE = "finite"
_TERMS: dict[Term, Callable[[Column, Column, Column], Column]] = {
    Term.ROWS: lambda x, d, m: m,
    Term.NON_NULL: lambda x, d, m: F.when(x.isNotNull(), m).otherwise(F.lit(0)),
    Term.NAN: lambda x, d, m: F.when(F.isnan(d), m).otherwise(F.lit(0)),
    Term.POS_INF: lambda x, d, m: F.when(d == F.lit(float("inf")), m).otherwise(F.lit(0)),
    Term.NEG_INF: lambda x, d, m: F.when(d == F.lit(float("-inf")), m).otherwise(F.lit(0)),
    Term.FINITE: lambda x, d, m: F.when(~F.isnan(d) & (F.abs(d) != F.lit(float("inf"))), d * m),
    Term.FINITE_ABS: lambda x, d, m: F.when(~F.isnan(d) & (F.abs(d) != F.lit(float("inf"))), F.abs(d) * m),
    Term.WRAPPED: lambda x, d, m: x.cast("long") * m,  # wraps like Spark's own bigint SUM
}
EXACT = (Term.EXACT, Term.EXACT_ABS)


def _exact_value(c: Accumulator, x: Column) -> Column:
    """The argument in an EXACT accumulator's DECIMAL(38, s) (absolute for EXACT_ABS)."""
    v = x.cast(arrow_to_spark(pa.decimal128(38, c.dtype.scale)))  # type: ignore[attr-defined]
    return F.abs(v) if c.term is Term.EXACT_ABS else v


def _exact_term(c: Accumulator, x: Column, m: Column) -> Column:
    """Decimal sums add the values themselves, negated for deleted rows: ``DECIMAL(38, s) * BIGINT`` would round
    to 6 digits after the point under Spark's precision rules. Rows with |m| > 1 are left to ``_multiplied_out``."""
    v = _exact_value(c, x)
    return F.when(m == 1, v).when(m == -1, -v)


class SparkBackend:
    """Evaluate plan parts over Delta tables at given versions."""

    def __init__(self, spark: SparkSession | Callable[[], SparkSession], sources: Mapping[str, DeltaSource],
                 optimizations: Optimizations | None = None) -> None:
        # a callable starts Spark only when a pass actually needs it (single-table maintenance never does)
        self._spark = spark
        self.sources = sources
        self.opts = optimizations or Optimizations()
        self._scans: dict[tuple[str, int], DataFrame] = {}
        self.spark_jobs = 0

    @property
    def spark(self) -> SparkSession:
        if callable(self._spark) and not isinstance(self._spark, SparkSession):
            self._spark = self._spark()
        return self._spark  # type: ignore[return-value]

    def scan(self, table: str, version: int) -> DataFrame:
        key = (table, version)
        if key not in self._scans:
            self._scans[key] = self.sources[table].scan(self.spark, version)
        return self._scans[key]

    def _compile(self, rel: Relation, versions: Versions, fragments_in_spark: bool) -> DataFrame:
        def from_state(node: Plan) -> DataFrame | None:
            held = rel.state_of(node)
            if held is None:
                return None
            # intervals of order-dependent sums serve only the engine's own conservative operators
            return to_spark(self.spark, held.select([c for c in held.columns if not is_interval_column(c)]))

        return PlanCompiler(self.spark, lambda s: self.scan(s.table, versions[s.table]), rel.annotations,
                            fragments_in_spark=fragments_in_spark, from_state=from_state).compile(rel.node)

    def _collect(self, df: DataFrame, rel: Relation, node: Plan | None = None) -> pl.DataFrame:
        """Run ``df`` (one Spark job) and bring its rows back annotated, in the engine's types."""
        rows = to_polars(df)
        self.spark_jobs += 1
        return to_engine_types(rel.annotations.resolve_raw(rows), node or rel.node)

    # -- capture -------------------------------------------------------------------------------------------------

    def relation(self, rel: Relation, versions: Versions) -> pl.DataFrame:
        return self._collect(self._compile(rel, versions, fragments_in_spark=False), rel)

    def fragment_counts(self, rel: Relation, versions: Versions) -> np.ndarray:
        total = rel.annotations.total_fragments
        counts = np.zeros(total, dtype=np.int64)
        df = self._compile(rel, versions, fragments_in_spark=True)
        frag_cols = [c for c in df.columns if is_frag_col(c)]
        if not frag_cols:
            return counts
        rows = to_polars(df.groupBy(*[col(c) for c in frag_cols]).agg(F.sum(col(MULT)).alias(COUNT)))
        self.spark_jobs += 1
        for c in frag_cols:
            part = rows.filter(pl.col(c).is_not_null())  # NULL: a union row of a branch without this scan
            f = part.get_column(c).to_numpy().astype(np.int64)
            counts += np.bincount(f, weights=part.get_column(COUNT).to_numpy(), minlength=total).astype(np.int64)
        return counts

    def aggregate_input(self, child: Relation, layout: PartialLayout, versions: Versions) -> Partials:
        """The partial aggregates of a frontier aggregation per (group, fragment), grouped on Spark so that only
        small partials come back: one job, plus one per MIN/MAX or DISTINCT aggregate (its value counts) and per decimal
        sum over rows with |m| > 1."""
        df = self._compile(child, versions, fragments_in_spark=True)
        frags = [col(c) for c in df.columns if is_frag_col(c)]
        keys = [compile_expr(e).alias(n) for n, e in layout.keys] if layout.keys else [F.lit(0).alias(NO_GROUP)]
        m = col(MULT)
        args = {j: compile_expr(a.arg) for j, (_, a) in enumerate(layout.aggs) if a.arg is not None}
        sums = []
        for c in layout.accumulators:
            x = args[c.agg] if c.agg is not None else m
            term = _exact_term(c, x, m) if c.term in EXACT else _TERMS[c.term](x, x.cast("double"), m)
            sums.append(F.sum(term).alias(c.name))
        exact = [c for c in layout.accumulators if c.term in EXACT]
        if exact:
            sums.append(F.max(F.abs(m)).alias("__mmax"))
        rows = layout.encode_keys(to_polars(df.groupBy(*keys, *frags).agg(*sums)))
        self.spark_jobs += 1
        frag_names = [c for c in df.columns if is_frag_col(c)]
        if exact and rows.height and (rows.get_column("__mmax").max() or 0) > 1:  # type: ignore[operator]
            rows = self._multiplied_out(df, keys, frag_names, layout, exact, args, rows)
        values: dict[int, pl.DataFrame] = {}
        for j in layout.valued:
            vdf = (df.select(*keys, args[j].alias(VALUE), m).filter(col(VALUE).isNotNull())
                   .groupBy(*[col(k) for k in layout.plain_keys], col(VALUE)).agg(F.sum(m).alias(COUNT)))
            values[j] = layout.encode_values(j, layout.encode_keys(to_polars(vdf)))
            self.spark_jobs += 1
        return layout.from_grouped(rows, frag_names, values)

    def count_groups(self, child: Relation, keys: tuple[tuple[str, Expr], ...], versions: Versions) -> int:
        """About how many distinct ``keys`` (name, expression) the relation has (one Spark job, HyperLogLog)."""
        df = self._compile(child, versions, fragments_in_spark=False)
        cols = [compile_expr(e) for _, e in keys] if keys else [col(c) for c in df.columns if not is_carried(c)]
        row = df.select(F.approx_count_distinct(F.struct(*cols)).alias("n")).first()
        self.spark_jobs += 1
        return int(row["n"]) if row is not None else 0

    def capture_external(self, child: Relation, op: ExternalAggregation | ExternalDistinct, versions: Versions) -> bool:
        """Capture an external aggregation's state on Spark and write it to its store, without bringing its groups to
        the driver: ``groups`` (per group the accumulators summed over the (group, fragment) partials of
        :meth:`aggregate_input`, compensation terms 0) and ``fcounts`` (the partials' row counts per fragment).
        False (nothing written) for the shapes whose state this does not compute on Spark: float group keys, MIN/MAX
        or DISTINCT aggregates, rows with multiplicities other than one; the caller then folds them in process."""
        layout = op.layout
        if layout.float_keys or layout.valued or not layout.keys:
            return False
        df = self._compile(child, versions, fragments_in_spark=True)
        frag_names = [c for c in df.columns if is_frag_col(c)]
        keys = [compile_expr(e).alias(n) for n, e in layout.keys]
        m = col(MULT)
        if df.where(F.abs(m) != 1).limit(1).count():
            return False
        args = {j: compile_expr(a.arg) for j, (_, a) in enumerate(layout.aggs) if a.arg is not None}
        sums = []
        for c in layout.accumulators:
            x = args[c.agg] if c.agg is not None else m
            term = _exact_term(c, x, m) if c.term in EXACT else _TERMS[c.term](x, x.cast("double"), m)
            sums.append(F.sum(term).alias(c.name))
        per_fragment = df.groupBy(*keys, *[col(f) for f in frag_names]).agg(*sums)
        schemas = op.component_schemas()
        stored = {name: {k: t for k, t in schema.items() if k != SET} for name, schema in schemas.items()}
        names = layout.key_names
        folded = per_fragment.groupBy(*[col(k) for k in names]).agg(
            *[F.sum(col(c.name)).alias(c.name) for c in layout.accumulators])
        for c in layout.compensated:
            if c.compensation is not None:
                folded = folded.withColumn(c.compensation, F.lit(0.0))
        op.store.write("groups", _as_stored(self.spark, folded, stored["groups"]))
        parts = [per_fragment.where(col(f).isNotNull()).select(*[col(k) for k in names], col(f).alias(FRAG),
                                                                col(GROUP_ROWS).alias(COUNT)) for f in frag_names]
        fcounts = parts[0] if parts else None
        for p in parts[1:]:
            fcounts = fcounts.unionByName(p)
        if fcounts is None:
            fcounts = to_spark(self.spark, pl.DataFrame(schema=stored["fcounts"]))
        else:
            fcounts = fcounts.groupBy(*[col(k) for k in names], col(FRAG)).agg(F.sum(col(COUNT)).alias(COUNT))
        op.store.write("fcounts", _as_stored(self.spark, fcounts, stored["fcounts"]))
        self.spark_jobs += 3
        return True

    def _multiplied_out(self, df: DataFrame, keys: list[Column], frag_names: list[str], layout: PartialLayout,
                        exact: list[Accumulator], args: dict[int, Column], rows: pl.DataFrame) -> pl.DataFrame:
        """Add the decimal contributions of rows with |multiplicity| > 1 (never in a capture of tables): per
        distinct value, its multiplicity sum from Spark, multiplied in polars (128-bit, exact)."""
        m = col(MULT)
        group = [*layout.key_names, *frag_names]
        out = rows
        for j in sorted({c.agg for c in exact}):  # type: ignore[type-var]
            columns = [c for c in exact if c.agg == j]
            v = _exact_value(Accumulator(VALUE, Term.EXACT, j, columns[0].dtype), args[j])
            vdf = (df.filter(F.abs(m) > 1).select(*keys, *[col(c) for c in frag_names], v.alias(VALUE), m)
                   .groupBy(*[col(k) for k in [*layout.plain_keys, *frag_names]], col(VALUE))
                   .agg(F.sum(m).alias(COUNT)))
            part = layout.encode_keys(to_polars(vdf))
            self.spark_jobs += 1
            dec = part.schema[VALUE]
            n = pl.col(COUNT).cast(pl.Decimal(38, 0))
            sums = [((pl.col(VALUE).abs() if c.term is Term.EXACT_ABS else pl.col(VALUE)) * n).cast(dec).alias(c.name)
                    for c in columns]
            part = part.select([*group, *sums]).group_by(group).agg(pl.all().sum())
            part = part.cast({c: out.schema[c] for c in group})  # type: ignore[arg-type]
            names = [c.name for c in columns]
            out = out.join(part, on=group, how="left", suffix="__x", nulls_equal=True)
            out = out.with_columns([(pl.col(c).fill_null(0) + pl.col(f"{c}__x").fill_null(0)).alias(c) for c in names])
            out = out.drop([f"{c}__x" for c in names])
        return out

    # -- joins ---------------------------------------------------------------------------------------------------

    def join_delta(self, join: Join, delta: pl.DataFrame, delta_is_left: bool, other: Relation,
                   versions: Versions) -> pl.DataFrame:
        """Ship ``delta`` to Spark (broadcast) and join it with ``other`` at ``versions``; the other input's rows
        carry raw partition values, annotated in memory after the join (no fragment computed for rows that find no
        partner)."""
        side = self._compile(other, versions, fragments_in_spark=False).withColumnRenamed(MULT, OTHER_MULT)
        if SET in side.columns:
            side = side.withColumnRenamed(SET, RIGHT_SET)
        left_keys, right_keys, _ = join.equi_keys()
        keys, delta_keys = (right_keys, left_keys) if delta_is_left else (left_keys, right_keys)
        if self.opts.join_key_pushdown and keys:
            restricted = _restrict(side, delta, delta_keys, keys)
            if restricted is None:
                return _empty_join(join)  # no delta row can find a partner: no Spark job at all
            side = restricted
        d = F.broadcast(to_spark(self.spark, delta))
        cond = compile_expr(join.condition) if join.condition is not None else None
        left, right = (d, side) if delta_is_left else (side, d)
        joined = left.join(right, on=cond, how="inner") if cond is not None else left.crossJoin(right)
        joined = joined.withColumn(MULT, col(MULT) * col(OTHER_MULT)).drop(OTHER_MULT)
        out = after_join(self._collect(joined, other, join))
        return out.select(join_columns(join.left.names, join.right.names, out.columns))

    # -- join-cache look-ups ---------------------------------------------------------------------------------------

    def side_summary(self, side: Relation, keys: list[str], max_rows: int,
                     versions: Versions) -> tuple[pl.DataFrame | None, pl.DataFrame | None]:
        """A small side whole (one job: at most ``max_rows + 1`` rows come back), else its join-key counts."""
        df = self._compile(side, versions, fragments_in_spark=False)
        if max_rows > 0:
            head = self._collect(df.limit(max_rows + 1), side)
            if head.height <= max_rows:
                return head, None
        return None, self._collect(_key_counts(df, keys), side)

    def rows_with_keys(self, side: Relation, keys: list[str], values: pl.DataFrame, max_rows: int,
                       versions: Versions) -> pl.DataFrame | None:
        """One job: ``side``'s rows whose keys occur in ``values`` (a few keys become an ``IN`` filter that Parquet
        statistics can skip data with; many are a broadcast semi-join)."""
        df = self._compile(side, versions, fragments_in_spark=False)
        if len(keys) == 1 and values.height <= PUSHDOWN_KEYS:
            wanted = values.get_column(keys[0]).drop_nulls().unique()
            df = df.filter(col(keys[0]).isin(wanted.to_list()))
        else:
            renamed = values.select([pl.col(k).alias(f"__k{i}") for i, k in enumerate(keys)])
            other = F.broadcast(to_spark(self.spark, renamed))
            cond = None
            for i, k in enumerate(keys):
                term = col(k) == F.col(f"__k{i}")
                cond = term if cond is None else cond & term
            df = df.join(other, on=cond, how="left_semi")
        rows = self._collect(df.limit(max_rows + 1) if max_rows else df, side)
        return None if max_rows and rows.height > max_rows else rows

    def key_counts(self, side: Relation, keys: list[str], max_keys: int, versions: Versions) -> pl.DataFrame | None:
        """One job; at most ``max_keys + 1`` keys come back (a side with more is not worth listing)."""
        df = self._compile(side, versions, fragments_in_spark=False)
        out = self._collect(_key_counts(df, keys).limit(max_keys + 1), side)
        return None if out.height > max_keys else out


def _as_stored(spark: SparkSession, df: DataFrame, schema: dict[str, pl.DataType]) -> DataFrame:
    """``df``'s columns of ``schema`` cast to the Spark types a polars frame of that schema becomes (what the
    store's MERGEs write later), in that order."""
    target = to_spark(spark, pl.DataFrame(schema=schema)).schema
    return df.select(*[col(f.name).cast(f.dataType).alias(f.name) for f in target.fields])


def _key_counts(df: DataFrame, keys: list[str]) -> DataFrame:
    return df.groupBy(*[col(k) for k in keys]).agg(F.sum(col(MULT)).alias(COUNT))


def _restrict(other: DataFrame, delta: pl.DataFrame, delta_keys: list[str], keys: list[str]) -> DataFrame | None:
    """Key push-down: keep only rows of the other input whose first join key occurs in the delta; None when no
    delta row has a key."""
    first = delta.get_column(delta_keys[0]).drop_nulls().unique()
    if first.len() == 0:
        return None
    if first.len() <= PUSHDOWN_KEYS:
        return other.filter(col(keys[0]).isin(first.to_list()))
    # polars' min/max skip NaN, while Spark's join matches NaN with NaN: keep the other side's NaN keys too
    lo, hi = first.min(), first.max()
    cond = col(keys[0]).between(lo, hi)
    if first.dtype.is_float() and bool(first.is_nan().any()):
        cond = cond | F.isnan(col(keys[0]))
    return other.filter(cond)


def _empty_join(join: Join) -> pl.DataFrame:
    names = [*join.left.names, *join.right.names]
    schema = {f.name: polars_type(f.dtype) for f in join.schema}
    return pl.DataFrame(schema={**{n: schema[n] for n in names}, MULT: pl.Int64})


__all__ = ["SparkBackend", "to_engine_types", "to_polars", "to_spark"]

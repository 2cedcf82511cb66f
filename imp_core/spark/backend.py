"""The Spark backend of the incremental engine: everything that touches full tables.

* capture: the annotated input of each frontier operator, pre-aggregated per (group, fragment) on Spark, so only
  small partial aggregates come back to the driver;
* joins during maintenance: a small delta is shipped to Spark (broadcast) and joined with the other input at the
  table versions already reached (time travel by Delta version). The other side's rows are annotated *after* the
  join, in memory, so no fragment is computed for rows that find no partner;
* stateful subtrees inside a join side are materialized from engine state.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import numpy as np
import polars as pl
import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from imp_core.config import Optimizations
from imp_core.engine.annotation import FRAG, FRAG_DTYPE, MULT, SET, after_join, ann_cols
from imp_core.engine.evaluate import polars_type
from imp_core.engine.operators.aggregation import CNT, DUMMY, N, SPECIAL, V, Aggregation, acc_dtype
from imp_core.engine.operators.join import JoinOp
from imp_core.engine.order_dependence import is_interval_column
from imp_core.engine.pipeline import Pipeline, Versions
from imp_core.plan.nodes import Aggregate, Plan, Scan
from imp_core.sources.delta import DeltaSource
from imp_core.spark.compile import PlanCompiler, col, compile_expr
from imp_core.spark.types import arrow_to_spark

if TYPE_CHECKING:
    from imp_core.sketch.partition import Partition

log = logging.getLogger(__name__)


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
        elif dtype == pl.List(FRAG_DTYPE):
            casts[name] = pl.List(pl.Int32)
    table = df.cast(casts).to_arrow() if casts else df.to_arrow()  # type: ignore[arg-type]
    table = table.cast(pa.schema([pa.field(f.name, _plain(f.type)) for f in table.schema]))
    from imp_core.spark.types import arrow_schema_to_spark

    return spark.createDataFrame(table, arrow_schema_to_spark(table.schema))


def _plain(t: pa.DataType) -> pa.DataType:
    if t == pa.string_view() or pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_list(t) or (pa.types.is_list(t) and t.value_type == pa.uint32()):
        return pa.list_(pa.int32())
    return t


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

    # -- compilation -----------------------------------------------------------------------------------------------

    def scan(self, table: str, version: int) -> DataFrame:
        key = (table, version)
        if key not in self._scans:
            self._scans[key] = self.sources[table].scan(self.spark, version)
        return self._scans[key]

    def compiler(self, pipeline: Pipeline, versions: Versions, fragments_in_spark: bool) -> PlanCompiler:
        def annotation(scan: Scan) -> tuple[str, Partition, int] | None:
            part = pipeline.partitions.get(scan.table)
            name = pipeline.frag_column(scan)
            if part is None or name is None:
                return None
            return name, part, pipeline.partitions.offset(scan.table)

        def materialize(node: Plan) -> DataFrame | None:
            if node.is_stateless():
                return None
            current = pipeline.current(node)
            if current is None:
                return None
            # intervals of order-dependent sums serve only the engine's own conservative operators
            return to_spark(self.spark, current.select([c for c in current.columns if not is_interval_column(c)]))

        return PlanCompiler(self.spark, lambda s: self.scan(s.table, versions[s.table]), annotation,
                            fragments_in_spark=fragments_in_spark, materialize=materialize)

    def annotate_raw(self, df: pl.DataFrame, pipeline: Pipeline) -> pl.DataFrame:
        """Turn raw partition values ``__p{i}`` (carried from Spark) into fragment columns ``__f{i}``."""
        for scan in pipeline.plan.scans():
            name = pipeline.frag_column(scan)
            if name is None:
                continue
            raw = name.replace("__f", "__p")
            if raw not in df.columns:
                continue
            part = pipeline.partitions.get(scan.table)
            assert part is not None
            values = df.get_column(raw).cast(polars_type(_part_arrow_type(scan, part)), strict=False)
            frag = part.fragment_of(values) + pipeline.partitions.offset(scan.table)
            df = df.with_columns(pl.Series(name, frag, dtype=FRAG_DTYPE)).drop(raw)
        return df

    def conform(self, df: pl.DataFrame, node: Plan) -> pl.DataFrame:
        casts = {f.name: polars_type(f.dtype) for f in node.schema if f.name in df.columns}
        casts = {k: v for k, v in casts.items() if df.schema[k] != v}
        if MULT in df.columns and df.schema[MULT] != pl.Int64:
            casts[MULT] = pl.Int64
        for c in df.columns:
            if c.startswith("__f") and df.schema[c] != FRAG_DTYPE and c[3:].isdigit():
                casts[c] = FRAG_DTYPE
            if c == SET and df.schema[c] != pl.List(FRAG_DTYPE):
                casts[c] = pl.List(FRAG_DTYPE)
        return df.cast(casts, strict=False) if casts else df  # type: ignore[arg-type]

    # -- Backend protocol ----------------------------------------------------------------------------------------

    def relation(self, node: Plan, pipeline: Pipeline, versions: Versions) -> pl.DataFrame:
        current = pipeline.current(node)
        if current is not None:
            return current
        df = self.compiler(pipeline, versions, fragments_in_spark=False).compile(node)
        self.spark_jobs += 1
        out = self.annotate_raw(to_polars(df), pipeline)
        return self.conform(out, node)

    def side_summary(self, node: Plan, keys: list[str], max_rows: int, pipeline: Pipeline,
                     versions: Versions) -> tuple[pl.DataFrame | None, pl.DataFrame | None]:
        """A small side whole (one job: at most ``max_rows + 1`` rows come back), else its join-key counts."""
        df = self.compiler(pipeline, versions, fragments_in_spark=False).compile(node)
        if max_rows > 0:
            head = to_polars(df.limit(max_rows + 1))
            self.spark_jobs += 1
            if head.height <= max_rows:
                return self.conform(self.annotate_raw(head, pipeline), node), None
        counts = df.groupBy(*[col(k) for k in keys]).agg(F.sum(col(MULT)).alias("__n"))
        self.spark_jobs += 1
        return None, self.conform(to_polars(counts), node)

    def rows_with_keys(self, node: Plan, keys: list[str], values: pl.DataFrame, max_rows: int, pipeline: Pipeline,
                       versions: Versions) -> pl.DataFrame | None:
        """One job: ``node``'s rows whose keys occur in ``values`` (a few keys become an ``IN`` filter that Parquet
        statistics can skip data with; many are a broadcast semi-join)."""
        df = self.compiler(pipeline, versions, fragments_in_spark=False).compile(node)
        if len(keys) == 1 and values.height <= 2000:
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
        if max_rows:
            df = df.limit(max_rows + 1)
        rows = to_polars(df)
        self.spark_jobs += 1
        if max_rows and rows.height > max_rows:
            return None
        return self.conform(self.annotate_raw(rows, pipeline), node)

    def key_counts(self, node: Plan, keys: list[str], max_keys: int, pipeline: Pipeline,
                   versions: Versions) -> pl.DataFrame | None:
        """One job; at most ``max_keys + 1`` keys come back (a side with more is not worth listing)."""
        df = self.compiler(pipeline, versions, fragments_in_spark=False).compile(node)
        counts = df.groupBy(*[col(k) for k in keys]).agg(F.sum(col(MULT)).alias("__n")).limit(max_keys + 1)
        out = to_polars(counts)
        self.spark_jobs += 1
        return None if out.height > max_keys else self.conform(out, node)

    def join_side(self, node: Plan, pipeline: Pipeline, versions: Versions) -> SparkJoinSide:
        return SparkJoinSide(self, pipeline, node, versions)

    def aggregate_input(self, node: Aggregate, op: Aggregation, pipeline: Pipeline,
                        versions: Versions) -> tuple[pl.DataFrame, pl.DataFrame, dict[int, pl.DataFrame]]:
        """The partial aggregates of a frontier aggregation per (group, fragment), in the state layout of
        ``Aggregation`` (see its docstring): counts, wrapping integer sums, exact decimal sums, float sums of the
        finite values with NaN/±inf counts apart, and Σ|x| where the operator keeps an interval.

        Decimal sums add the values themselves, negated for deleted rows: ``DECIMAL(38, s) * BIGINT`` would round
        to 6 digits after the point under Spark's precision rules. Rows with a multiplicity beyond ±1 (never in a
        capture, whose inputs are tables) are multiplied out in polars, exactly, by a second job.
        """
        df = self.compiler(pipeline, versions, fragments_in_spark=True).compile(node.child)
        frag_cols = [c for c in df.columns if c.startswith("__f")]
        keys = ([compile_expr(e).alias(n) for n, e in node.keys] if node.keys else [F.lit(0).alias(DUMMY)])
        key_names = [n for n, _ in node.keys] if node.keys else [DUMMY]
        m = col(MULT)
        aggs = [F.sum(m).alias(CNT), F.max(F.abs(m)).alias("__mmax")]
        summed = [CNT]
        exact: dict[int, tuple[Column, str]] = {}  # decimal accumulators: argument, Spark type
        for j, (_, a) in enumerate(node.aggs):
            if a.arg is None:
                continue
            arg = compile_expr(a.arg)
            aggs.append(F.sum(F.when(arg.isNotNull(), m).otherwise(F.lit(0))).alias(f"__n{j}"))
            summed.append(f"__n{j}")
            if a.func not in ("sum", "avg"):
                continue
            acc = acc_dtype(a)
            if j in op.floats:
                x = arg.cast("double")
                special = (F.isnan(x), x == F.lit(float("inf")), x == F.lit(float("-inf")))
                for name, hit in zip(SPECIAL, special):
                    aggs.append(F.sum(F.when(hit, m).otherwise(F.lit(0))).alias(f"{name}{j}"))
                    summed.append(f"{name}{j}")
                finite = ~F.isnan(x) & (F.abs(x) != F.lit(float("inf")))
                aggs.append(F.sum(F.when(finite, x * m)).alias(f"__s{j}"))
                summed.append(f"__s{j}")
                if j in op.bounded:
                    aggs.append(F.sum(F.when(finite, F.abs(x) * m)).alias(f"__a{j}"))
                    summed.append(f"__a{j}")
            elif acc == pl.Int64:
                aggs.append(F.sum(arg.cast("long") * m).alias(f"__s{j}"))  # wraps like Spark's own bigint SUM
                summed.append(f"__s{j}")
            else:
                t = arrow_to_spark(pa.decimal128(38, acc.scale))  # type: ignore[attr-defined]
                v = arg.cast(t)
                exact[j] = (v, t)
                aggs.append(F.sum(F.when(m == 1, v).when(m == -1, -v)).alias(f"__s{j}"))
                summed.append(f"__s{j}")
                if j in op.bounded:  # Σ|x| of an integer AVG
                    aggs.append(F.sum(F.when(m == 1, F.abs(v)).when(m == -1, -F.abs(v))).alias(f"__a{j}"))
                    summed.append(f"__a{j}")
        grouped = df.groupBy(*keys, *[col(c) for c in frag_cols]).agg(*aggs)
        rows = to_polars(grouped)
        self.spark_jobs += 1
        rows = rows.cast({k: op.key_types[k] for k in key_names}, strict=False)  # type: ignore[arg-type]
        rows = op.encode_keys(rows)
        state_keys = op.key_names  # float keys NaN-free (``nan_flag``)
        if exact and rows.height and (rows.get_column("__mmax").max() or 0) > 1:  # type: ignore[operator]
            rows = self._multiplied_out(df, keys, key_names, frag_cols, exact, op, rows)
        partial = rows.group_by(state_keys).agg([pl.col(c).sum() for c in summed])
        fparts = [rows.select([*state_keys, pl.col(c).cast(FRAG_DTYPE).alias(FRAG), pl.col(CNT).alias(N)])
                  for c in frag_cols]
        if fparts:
            fpairs = pl.concat(fparts).group_by([*state_keys, FRAG]).agg(pl.col(N).sum())
        else:
            fpairs = pl.DataFrame(schema={**{k: op.key_types[k] for k in state_keys}, FRAG: FRAG_DTYPE, N: pl.Int64})
        values: dict[int, pl.DataFrame] = {}
        for j in op.minmax:
            a = node.aggs[j][1]
            arg = compile_expr(a.arg)  # type: ignore[arg-type]
            vdf = (df.select(*keys, arg.alias(V), m).filter(col(V).isNotNull())
                   .groupBy(*[col(k) for k in key_names], col(V)).agg(F.sum(m).alias(N)))
            vals = to_polars(vdf).cast({k: op.key_types[k] for k in key_names}, strict=False)  # type: ignore[arg-type]
            values[j] = op.encode_values(j, op.encode_keys(vals))
            self.spark_jobs += 1
        return partial, fpairs, values

    def _multiplied_out(self, df: DataFrame, keys: list[Column], key_names: list[str], frag_cols: list[str],
                        exact: dict[int, tuple[Column, str]], op: Aggregation, rows: pl.DataFrame) -> pl.DataFrame:
        """Add the decimal contributions of rows with |multiplicity| > 1: per distinct value, its multiplicity sum
        from Spark, multiplied in polars (128-bit, exact)."""
        m = col(MULT)
        extra = []
        for j, (v, _) in exact.items():
            vdf = (df.filter(F.abs(m) > 1).select(*keys, *[col(c) for c in frag_cols], v.alias(V), m)
                   .groupBy(*[col(k) for k in key_names], *[col(c) for c in frag_cols], col(V))
                   .agg(F.sum(m).alias(N)))
            part = to_polars(vdf).cast({k: op.key_types[k] for k in key_names}, strict=False)  # type: ignore[arg-type]
            part = op.encode_keys(part)
            self.spark_jobs += 1
            dec = part.schema[V]
            cols = [(pl.col(V) * pl.col(N).cast(pl.Decimal(38, 0))).cast(dec).alias(f"__s{j}")]
            if f"__a{j}" in rows.columns:
                cols.append((pl.col(V).abs() * pl.col(N).cast(pl.Decimal(38, 0))).cast(dec).alias(f"__a{j}"))
            extra.append(part.select([*op.key_names, *frag_cols, *cols])
                         .group_by([*op.key_names, *frag_cols]).agg(pl.all().sum()))
        out = rows
        for part in extra:
            names = [c for c in part.columns if c not in (*op.key_names, *frag_cols)]
            part = part.cast({c: out.schema[c] for c in (*op.key_names, *frag_cols)})  # type: ignore[arg-type]
            out = out.join(part, on=[*op.key_names, *frag_cols], how="left", suffix="__x", nulls_equal=True)
            out = out.with_columns([(pl.col(c).fill_null(0) + pl.col(f"{c}__x").fill_null(0)).alias(c) for c in names])
            out = out.drop([f"{c}__x" for c in names])
        return out

    def fragment_counts(self, node: Plan, pipeline: Pipeline, versions: Versions) -> np.ndarray:
        total = pipeline.partitions.total_fragments
        counts = np.zeros(total, dtype=np.int64)
        df = self.compiler(pipeline, versions, fragments_in_spark=True).compile(node)
        frag_cols = [c for c in df.columns if c.startswith("__f")]
        if not frag_cols:
            return counts
        rows = to_polars(df.groupBy(*[col(c) for c in frag_cols]).agg(F.sum(col(MULT)).alias(N)))
        self.spark_jobs += 1
        for c in frag_cols:
            f = rows.get_column(c).to_numpy().astype(np.int64)
            counts += np.bincount(f, weights=rows.get_column(N).to_numpy(), minlength=total).astype(np.int64)
        return counts


def _part_arrow_type(scan: Scan, part: Partition) -> pa.DataType:
    for c in scan.columns:
        if c.name == part.column:
            return c.dtype
    raise KeyError(part.column)


class SparkJoinSide:
    """One join input at given versions; joins a shipped delta with it on Spark."""

    def __init__(self, backend: SparkBackend, pipeline: Pipeline, node: Plan, versions: Versions) -> None:
        self.backend, self.pipeline, self.node, self.versions = backend, pipeline, node, versions

    def join_delta(self, delta: pl.DataFrame, delta_is_left: bool) -> pl.DataFrame:
        b = self.backend
        op: JoinOp = self.pipeline.parent_join(self.node)
        other = b.compiler(self.pipeline, self.versions, fragments_in_spark=False).compile(self.node)
        other = other.withColumnRenamed(MULT, "__mult_o")
        if SET in other.columns:
            other = other.withColumnRenamed(SET, "__sk_r")
        keys = op.left_keys if not delta_is_left else op.right_keys
        delta_keys = op.left_keys if delta_is_left else op.right_keys
        if b.opts.join_key_pushdown and keys:
            other = self._restrict(other, delta, delta_keys, keys)
            if other is None:
                return _empty_join(op)
        d = to_spark(b.spark, delta)
        d = F.broadcast(d)
        cond = compile_expr(op.node.condition) if op.node.condition is not None else None
        left, right = (d, other) if delta_is_left else (other, d)
        joined = left.join(right, on=cond, how="inner") if cond is not None else left.crossJoin(right)
        joined = joined.withColumn(MULT, col(MULT) * col("__mult_o")).drop("__mult_o")
        out = to_polars(joined)
        b.spark_jobs += 1
        out = b.annotate_raw(out, self.pipeline)
        out = b.conform(out, op.node)
        out = after_join(out)
        return out.select([*op.left_names, *op.right_names, MULT, *ann_cols(out)])

    def _restrict(self, other: DataFrame, delta: pl.DataFrame, delta_keys: list[str],
                  keys: list[str]) -> DataFrame | None:
        """Key push-down: keep only rows of the large side whose join key occurs in the delta."""
        first = delta.get_column(delta_keys[0]).drop_nulls().unique()
        if first.len() == 0:
            return None
        if first.len() <= 2000:
            return other.filter(col(keys[0]).isin(first.to_list()))
        # polars' min/max skip NaN, while Spark's join matches NaN with NaN: keep the other side's NaN keys too
        lo, hi = first.min(), first.max()
        cond = col(keys[0]).between(lo, hi)
        if first.dtype.is_float() and bool(first.is_nan().any()):
            cond = cond | F.isnan(col(keys[0]))
        return other.filter(cond)


def _empty_join(op: JoinOp) -> pl.DataFrame:
    """No delta row can find a partner: skip the Spark job entirely."""
    names = [*op.left_names, *op.right_names]
    schema = {f.name: polars_type(f.dtype) for f in op.node.schema}
    return pl.DataFrame(schema={**{n: schema[n] for n in names}, MULT: pl.Int64})


__all__ = ["SparkBackend", "SparkJoinSide", "to_polars", "to_spark"]

"""The Spark backend of the incremental engine: capture inputs, joins of a delta with an input, and the join-cache
look-ups, over Delta tables at pinned versions.

It compiles the aggregation's partial-aggregate layout (``imp_core.engine.operators.partials``) term by term. See
docs/ARCHITECTURE.md, "Passes and backends".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import polars as pl
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from imp_core.config import Optimizations
from imp_core.engine.annotation import FRAG_DTYPE, SET_DTYPE, after_join
from imp_core.engine.backend import Relation, Versions
from imp_core.engine.decimal_sums import split as split_decimal
from imp_core.engine.evaluate import polars_type
from imp_core.engine.external import ExternalOperator
from imp_core.engine.operators.aggregation_external import ExternalAggregation, ExternalDistinct
from imp_core.engine.operators.anti_join_external import ExternalAntiJoin
from imp_core.engine.operators.group_topk_external import ExternalGroupTopK
from imp_core.engine.operators.partials import Accumulator, PartialLayout, Partials, Term
from imp_core.engine.schema import (
    COUNT,
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
from imp_core.errors import UnsupportedError
from imp_core.plan.expr import Expr
from imp_core.plan.nodes import Join, Plan, Scan
from imp_core.sources.delta import DeltaSource
from imp_core.spark.compile import PlanCompiler, col, compile_expr
from imp_core.spark.external_capture import capture_anti_join, capture_rows, capture_state, output_frame
from imp_core.spark.frames import to_polars, to_spark
from imp_core.spark.terms import EXACT, exact_value, partial_sums

OTHER_MULT = "__mult_o"  # the multiplicity of the input a shipped delta is joined with
PUSHDOWN_KEYS = 2000  # up to this many distinct delta keys become an IN filter; beyond, a key range


def to_engine_types(df: pl.DataFrame, node: Plan) -> pl.DataFrame:
    """A frame read back from Spark in the engine's storage types: ``node``'s columns, ``__mult`` as Int64,
    fragment ids as UInt32."""
    casts = {f.name: polars_type(f.dtype) for f in node.schema if f.name in df.columns}
    casts = {k: v for k, v in casts.items() if df.schema[k] != v}
    if MULT in df.columns and df.schema[MULT] != pl.Int64:
        casts[MULT] = pl.Int64()
    for c in df.columns:
        if is_frag_col(c) and df.schema[c] != FRAG_DTYPE:
            casts[c] = FRAG_DTYPE
        if c == SET and df.schema[c] != SET_DTYPE:
            casts[c] = SET_DTYPE
    return df.cast(casts, strict=False) if casts else df  # type: ignore[arg-type]


class SparkBackend:
    """Evaluate plan parts over Delta tables at given versions."""

    def __init__(self, spark: SparkSession | Callable[[], SparkSession], sources: Mapping[str, DeltaSource],
                 optimizations: Optimizations | None = None) -> None:
        # a callable starts Spark only when a pass actually needs it (single-table maintenance never does)
        self._spark = spark
        self.sources = sources
        self.opts = optimizations or Optimizations()
        self._scans: dict[tuple[str, int], DataFrame] = {}
        self._table_rows: dict[tuple[str, int], int] = {}
        self.spark_jobs = 0

    @property
    def spark(self) -> SparkSession:
        if callable(self._spark) and not isinstance(self._spark, SparkSession):
            self._spark = self._spark()
        return self._spark

    def scan(self, table: str, version: int) -> DataFrame:
        key = (table, version)
        if key not in self._scans:
            self._scans[key] = self.sources[table].scan(self.spark, version)
        return self._scans[key]

    def reads_external(self, rel: Relation) -> bool:
        """Whether the results of ``rel.external``'s operators can be computed here from their stores' tables."""
        return all(output_frame(self.spark, op) is not None for _, op in rel.external)

    def reads_external_side(self, rel: Relation) -> bool:
        """Whether a join side's external results are better read here from their stores than brought into the
        driver: this backend can read them, and they hold more than ``side_cache_rows`` stored rows (below that,
        computing them on Spark per pass costs more than reading them: SF1 Q21's 1.5M-group summaries, 9-17 s per
        pass read in the driver against 15-20 s on Spark; at SF10, 15M groups, reading them took 40 s a pass)."""
        rows = sum(sum(op.store.size().values()) for _, op in rel.external)
        return rows > self.opts.side_cache_rows and self.reads_external(rel)

    def _compile(self, rel: Relation, versions: Versions, fragments_in_spark: bool) -> DataFrame:
        external = {}
        for node, op in rel.external:  # the caller checked them (``reads_external``)
            frame = output_frame(self.spark, op)
            if frame is None:
                raise UnsupportedError(f"the result of {op.op_id} cannot be computed on Spark from its state tables")
            external[id(node)] = frame

        def from_state(node: Plan) -> DataFrame | None:
            if id(node) in external:
                return external[id(node)]
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
        small partials come back: one job, plus one per argument of MIN/MAX or DISTINCT aggregates (its value counts)
        and per decimal sum over rows with |m| > 1."""
        df = self._compile(child, versions, fragments_in_spark=True)
        frags = [col(c) for c in df.columns if is_frag_col(c)]
        keys = [compile_expr(e).alias(n) for n, e in layout.keys] if layout.keys else [F.lit(0).alias(NO_GROUP)]
        m = col(MULT)
        args = {j: compile_expr(a.arg) for j, (_, a) in enumerate(layout.aggs) if a.arg is not None}
        sums = partial_sums(layout, args, m)  # with the rounding columns ``PartialLayout.from_grouped`` reads
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
            if layout.value_owner[j] != j:
                continue  # the same counts as an aggregate before it over the same argument
            vdf = (df.select(*keys, args[j].alias(VALUE), m).filter(col(VALUE).isNotNull())
                   .groupBy(*[col(k) for k in layout.plain_keys], col(VALUE)).agg(F.sum(m).alias(COUNT)))
            values[j] = layout.encode_values(j, layout.encode_keys(to_polars(vdf)))
            self.spark_jobs += 1
        return layout.from_grouped(rows, frag_names, layout.shared_values(values))

    def count_groups(self, child: Relation, keys: tuple[tuple[str, Expr], ...], versions: Versions) -> int:
        """About how many distinct ``keys`` (name, expression) the relation has (one Spark job, HyperLogLog)."""
        df = self._compile(child, versions, fragments_in_spark=False)
        cols = [compile_expr(e) for _, e in keys] if keys else [col(c) for c in df.columns if not is_carried(c)]
        row = df.select(F.approx_count_distinct(F.struct(*cols)).alias("n")).first()
        self.spark_jobs += 1
        return int(row["n"]) if row is not None else 0

    def capture_external(self, child: Relation, op: ExternalOperator, versions: Versions) -> bool:
        """Capture an external operator's state on Spark into its store (``spark/external_capture.py``), its input
        reading the results of the external operators below it (``child.external``) from their tables; False for the
        shapes it leaves to the caller (nothing written then)."""
        if not self.reads_external(child):
            return False
        df = self._compile(child, versions, fragments_in_spark=True)
        if isinstance(op, ExternalGroupTopK):
            done = capture_rows(self.spark, df, op)
            self.spark_jobs += int(done) * 2
            return done
        assert isinstance(op, (ExternalAggregation, ExternalDistinct))
        done = capture_state(self.spark, df, op)
        self.spark_jobs += int(done) * (3 + len(op.layout.valued))
        return done

    def capture_anti_join(self, left: Relation, right: Relation, op: ExternalAntiJoin, versions: Versions) -> bool:
        """Capture an external ``NOT EXISTS``'s state on Spark into its store from its two inputs (which may read the
        results of external operators below from their tables); False when it cannot (nothing written then)."""
        if not (self.reads_external(left) and self.reads_external(right)):
            return False
        done = capture_anti_join(self.spark, self._compile(left, versions, fragments_in_spark=True),
                                 self._compile(right, versions, fragments_in_spark=False), op)
        self.spark_jobs += int(done) * 3
        return done

    def _multiplied_out(self, df: DataFrame, keys: list[Column], frag_names: list[str], layout: PartialLayout,
                        exact: list[Accumulator], args: dict[int, Column], rows: pl.DataFrame) -> pl.DataFrame:
        """Add the decimal contributions of rows with |multiplicity| > 1 (never in a capture of tables): per
        distinct value, its multiplicity sum from Spark, multiplied in polars (128-bit, exact)."""
        m = col(MULT)
        group = [*layout.key_names, *frag_names]
        out = rows
        for j in sorted({c.agg for c in exact if c.agg is not None}):
            columns = [c for c in exact if c.agg == j]
            v = exact_value(Accumulator(VALUE, Term.EXACT, j, columns[0].dtype), args[j])
            scale = layout.arg_scale(columns[0])
            vdf = (df.filter(F.abs(m) > 1).select(*keys, *[col(c) for c in frag_names], v.alias(VALUE), m)
                   .groupBy(*[col(k) for k in [*layout.plain_keys, *frag_names]], col(VALUE))
                   .agg(F.sum(m).alias(COUNT)))
            part = layout.encode_keys(to_polars(vdf))
            self.spark_jobs += 1
            dec = part.schema[VALUE]
            n = pl.col(COUNT).cast(pl.Decimal(38, 0))
            sums = [(_exact_part(c, pl.col(VALUE), scale) * n).cast(c.dtype if scale is not None else dec).alias(c.name)
                    for c in columns]
            part = part.select([*group, *sums]).group_by(group).agg(pl.all().sum())
            part = part.cast({c: out.schema[c] for c in group})
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
        """A small side whole (one job: at most ``max_rows + 1`` rows come back), else its join-key counts; neither
        for a side too large to evaluate whole (``too_large_to_cache``)."""
        if self.too_large_to_cache(side, versions):
            return None, None
        df = self._compile(side, versions, fragments_in_spark=False)
        if max_rows > 0:
            head = self._collect(df.limit(max_rows + 1), side)
            if head.height <= max_rows:
                return head, None
        return None, self._collect(_key_counts(df, keys), side)

    def too_large_to_cache(self, side: Relation, versions: Versions) -> bool:
        """Whether ``side`` reads more than ``side_cache_rows`` rows (its tables' row counts from their Delta logs,
        and its external operators' state rows): summarizing it evaluates it whole (at SF10, Q18's join of
        lineitem, orders and customer takes ~2 minutes on ``local[2]``), more than many per-delta joins with the key
        push-down, and its key counts alone would outgrow the driver."""
        def rows(node: Plan) -> int:
            op, held = side.external_of(node), side.state_of(node)
            if op is not None:
                return sum(op.store.size().values())
            if held is not None:
                return held.height
            if isinstance(node, Scan):
                return self._rows_of(node.table, versions[node.table])
            return sum(rows(c) for c in node.children)

        return rows(side.node) > self.opts.side_cache_rows

    def _rows_of(self, table: str, version: int) -> int:
        key = (table, version)
        if key not in self._table_rows:
            self._table_rows[key] = self.sources[table].row_count(version)
        return self._table_rows[key]

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
        if self.too_large_to_cache(side, versions):
            return None
        df = self._compile(side, versions, fragments_in_spark=False)
        out = self._collect(_key_counts(df, keys).limit(max_keys + 1), side)
        return None if out.height > max_keys else out


def _exact_part(c: Accumulator, value: pl.Expr, scale: int | None) -> pl.Expr:
    """What one copy of a decimal ``value`` adds to accumulator ``c`` (a wide sum's part: ``decimal_sums.split``)."""
    if scale is not None:
        low, high = split_decimal(value, scale)
        return low if c.term is Term.WIDE_LOW else high
    return value.abs() if c.term is Term.EXACT_ABS else value


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
    cond = col(keys[0]).between(lo, hi)  # type: ignore[arg-type]
    if first.dtype.is_float() and bool(first.is_nan().any()):
        cond = cond | F.isnan(col(keys[0]))
    return other.filter(cond)


def _empty_join(join: Join) -> pl.DataFrame:
    names = [*join.left.names, *join.right.names]
    schema = {f.name: polars_type(f.dtype) for f in join.schema}
    return pl.DataFrame(schema={**{n: schema[n] for n in names}, MULT: pl.Int64})


__all__ = ["SparkBackend", "to_engine_types", "to_polars", "to_spark"]

"""Aggregation (paper 5.2.5 and 5.2.6): SUM, COUNT, COUNT(*), AVG, MIN, MAX with or without GROUP BY.

State, per group ``g`` (paper: ``S[g] = (SUM, CNT, P, F_g)``), kept as columnar frames:

* ``groups``: key columns, ``__cnt`` (rows in the group, bag count), per aggregate its accumulators (``__s{j}`` exact
  sum with a Neumaier compensation term ``__c{j}`` for floats, ``__n{j}`` non-NULL count), the current MIN/MAX
  ``__m{j}``, and the group's sketch ``__sk`` (= ``{ρ | F_g[ρ] > 0}``);
* ``fcounts``: ``F_g`` as rows (key columns, ``__frag``, ``__n``);
* ``mm{j}``: for MIN/MAX, the ordered multiset of values per group (key columns, ``__v``, ``__n``), so deleting the
  current extreme is exact (the paper's balanced tree, as a sorted frame).

Changes: a batch is folded per group first (so there is one ``Δ−old / Δ+new`` pair per changed group per batch, not
per row, paper 7.1); a new group emits only ``Δ+``, a group whose count drops to 0 emits only ``Δ−``; a group whose
output row and sketch did not change emits nothing (the pair would cancel). Without GROUP BY there is always exactly
one output row, as in SQL. DISTINCT is this operator with every column a key and no aggregates.

Values follow Spark (docs/SEMANTICS.md, "Aggregates, grouping and ordering"):

* integer SUM wraps around on overflow like Spark's (non-ANSI) ``bigint`` sum, which is the exact sum modulo 2^64 in
  any order; AVG over integers keeps the exact sum (DECIMAL(38, 0)) and divides in double, as Spark does for sums that
  stay within 2^53 (beyond, Spark's double sum depends on order: see ``order_dependence``);
* decimal SUM is exact (result DECIMAL(p+10, s)); decimal AVG is the exact sum divided by the count, rounded HALF_UP
  to DECIMAL(p+4, s+4) (both capped at 38), NULL when it does not fit, as Spark computes it;
* float SUM/AVG keep NaN, +inf and -inf contributions as three counts apart from the finite part, so inserting and
  deleting them is exact; the value is NaN if a NaN or both infinities are present, else the infinity, else the
  finite sum. The finite part must not drift from a recapture over long insert/delete sequences (a drift could flip a
  HAVING or ORDER BY decision), so it is accurate at two levels: within a batch, the partial sum per group is
  computed error-free up to a negligible remainder (``_accurate_parts``: Dekker's TwoProduct for ``value *
  multiplicity``, then Rump-Ogita-Oishi extraction), and arrives as a pair (sum, error); across batches the state
  keeps a Neumaier compensation term ``__c{j}`` next to the running sum ``__s{j}``. Where an operator above compares
  or orders the value, the aggregation also keeps the sum of absolute values ``__a{j}`` (the same way) and emits the
  interval ``[lo, hi]`` that holds Spark's value for any summation order (``order_dependence``);
* MIN/MAX order NaN above every number (MAX is NaN when a NaN is present, MIN only when all values are NaN); -0.0 is
  kept as 0.0 (Spark's MIN/MAX of -0.0 and 0.0 returns whichever came first);
* float GROUP BY and DISTINCT keys are normalized as Spark normalizes them: every NaN is one key, -0.0 is 0.0.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from imp_core.engine.annotation import FRAG, FRAG_DTYPE, MULT, ROW, SET, SET_DTYPE, pairs_lazy
from imp_core.engine.evaluate import compile_expr, polars_type
from imp_core.engine.operators.base import StatefulOperator
from imp_core.engine.order_dependence import hi_name, is_order_dependent, lo_name, sum_interval
from imp_core.errors import BufferExhaustedError, StateError
from imp_core.plan.expr import AggCall, Expr

CNT = "__cnt"
DUMMY = "__gk"  # constant key for aggregation without GROUP BY
N = "__n"
V = "__v"
_SPLIT = 134217729.0  # 2^27 + 1, Dekker's splitter
_ULP = 2.0 ** -53  # what ExtractVector leaves below σ: |v − q| ≤ 2^-53 σ
OLD = "__old"  # suffix of a group's state before the batch, next to its new state
Frame = pl.DataFrame | pl.LazyFrame
NAN = float("nan")
INT53 = float(2 ** 53)  # integers up to this add up exactly in double, in any order
# version of the state's frames: 2 = NaN/±inf counts, NaN-free float keys, MIN/MAX doubles as order keys
LAYOUT = 2
# per float SUM/AVG: counts of the contributions kept apart from the finite sum
SPECIAL = ("__nan", "__inf", "__ninf")  # NaN, +inf, -inf


def normalize_float(x: pl.Expr) -> pl.Expr:
    """Spark's normalization of float grouping and join keys: -0.0 becomes 0.0, every NaN the same NaN."""
    return pl.when(x == 0.0).then(0.0).when(x.is_nan()).then(NAN).otherwise(x)


def nan_flag(name: str) -> str:
    """The Boolean column that says a float key is NaN (the key column itself then holds 0.0).

    polars joins do not match NaN with NaN reliably (a sorted single-row side takes a merge path where NaN != NaN),
    so state frames never join on a NaN: a float key is stored as (value or 0.0, is NaN).
    """
    return f"__isnan__{name}"


def nan_free(x: pl.Expr, name: str) -> list[pl.Expr]:
    """A float key as the two NaN-free columns ``nan_flag`` describes (normalized as Spark normalizes keys)."""
    return [pl.when(x.is_nan() | (x == 0.0)).then(0.0).otherwise(x).alias(name), x.is_nan().alias(nan_flag(name))]


_FLIP = np.int64(0x7FFFFFFFFFFFFFFF)


def float_order_key(x: np.ndarray) -> np.ndarray:
    """Doubles as int64s in Spark's order (NaN above +inf, -0.0 = 0.0, every NaN one value): a MIN/MAX multiset of
    doubles is kept in this form, which polars joins, groups and compares without NaN's exceptions."""
    x = np.where(np.isnan(x), np.nan, np.where(x == 0.0, 0.0, x)).astype(np.float64)
    bits = x.view(np.int64)
    return np.where(bits < 0, bits ^ _FLIP, bits)


def float_from_order_key(k: np.ndarray) -> np.ndarray:
    k = k.astype(np.int64)
    return np.where(k < 0, k ^ _FLIP, k).view(np.float64)


def _cast_keys(df: pl.DataFrame, types: dict[str, pl.DataType], names: list[str]) -> pl.DataFrame:
    """``df`` with the ``names`` columns cast to ``types`` (no polars step when they already match)."""
    casts = {n: types[n] for n in names if df.schema[n] != types[n]}
    return df.cast(casts) if casts else df  # type: ignore[arg-type]


def _untouched(height: int, rows: pl.Series) -> pl.Series:
    """A mask over ``height`` state rows: False at the (non-null) indices in ``rows``."""
    mask = np.ones(height, dtype=bool)
    mask[rows.drop_nulls().to_numpy()] = False
    return pl.Series(mask)


def _two_product(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``a * b`` as ``p + e``, both doubles, exactly (Dekker); ``e`` is 0 where ``p`` is not finite."""
    p = a * b
    ca, cb = a * _SPLIT, b * _SPLIT
    ah, bh = ca - (ca - a), cb - (cb - b)
    al, bl = a - ah, b - bh
    e = ((ah * bh - p) + ah * bl + al * bh) + al * bl
    return p, np.where(np.isfinite(p), e, 0.0)


def _extract(v: np.ndarray, sigma: np.ndarray, ok: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ExtractVector (Rump, Ogita, Oishi, "Accurate floating-point summation", Lemma 3.3): ``v = q + r`` exactly.

    With σ a power of two ≥ 2^⌈log2(n+2)⌉ · max|v| over n values, every ``q = (σ + v) − σ`` is a multiple of
    2^-53 σ and any partial sum of the q's stays within σ, so the q's add up *exactly in any order*, and
    ``|r| ≤ 2^-53 σ``. Where ``ok`` is False (nothing finite to extract) ``q = v``, ``r = 0``.
    """
    q = np.where(ok, (sigma + v) - sigma, v)
    return q, np.where(ok, v - q, 0.0)


def _acc_dtype(arg_type: pa.DataType, func: str = "sum") -> pl.DataType:
    """The accumulator of a SUM/AVG over ``arg_type``: Int64 (wrapping like Spark's bigint SUM), DECIMAL(38, 0) for
    an integer AVG (exact), DECIMAL(38, s), or Float64 (finite part, with a compensation term)."""
    if pa.types.is_integer(arg_type):
        return pl.Decimal(38, 0) if func == "avg" else pl.Int64
    if pa.types.is_decimal(arg_type):
        return pl.Decimal(38, arg_type.scale)
    return pl.Float64


def acc_dtype(a: AggCall) -> pl.DataType:
    assert a.arg is not None
    return _acc_dtype(a.arg.dtype, a.func)


def _is_float(t: pl.DataType) -> bool:
    return t in (pl.Float32, pl.Float64)


def _decimal_avg(total: pl.Expr, n: pl.Expr, arg_type: pa.DataType, out_type: pa.DataType) -> pl.Expr:
    """Spark's AVG of a DECIMAL(p, s): the exact sum over the count, rounded HALF_UP (ties away from zero) to the
    result scale, NULL when the result needs more than the result precision (non-ANSI overflow).

    Vectorized on the unscaled 128-bit integers: ``|S| = q·n + r``; the result's unscaled magnitude is
    ``q·10^d + round(r·10^d / n)`` with ``d`` the added scale (``r·10^d`` stays far inside 128 bits), written out as
    a decimal string so that no step rounds.
    """
    d = out_type.scale - arg_type.scale
    scale = out_type.scale
    i128 = pl.Int128
    shift = pl.lit(10 ** d, dtype=i128)
    limit = pl.lit(10 ** out_type.precision, dtype=i128)
    s = total.to_physical()
    count = n.cast(i128).clip(lower_bound=1)
    mag = s.abs()
    q, r = mag // count, mag % count
    scaled = r * shift
    frac = scaled // count
    up = ((scaled % count) * pl.lit(2, dtype=i128) >= count).cast(i128)
    fits = q <= pl.lit((10 ** out_type.precision - 1) // 10 ** d, dtype=i128)
    unscaled = pl.when(fits).then(q * shift + frac + up).otherwise(None)
    unscaled = pl.when(unscaled < limit).then(unscaled).otherwise(None)
    digits = unscaled.cast(pl.String).str.zfill(scale + 1)
    text = pl.concat_str([pl.when(s < 0).then(pl.lit("-")).otherwise(pl.lit("")), digits.str.head(-scale), pl.lit("."),
                          digits.str.tail(scale)])
    return text.cast(pl.Decimal(38, scale), strict=False)


class Aggregation(StatefulOperator):
    kind = "aggregation"

    def __init__(self, op_id: str, keys: tuple[tuple[str, Expr], ...], aggs: tuple[tuple[str, AggCall], ...],
                 key_types: dict[str, pl.DataType], fingerprint: str = "", minmax_buffer: int = 0,
                 bounds: frozenset[str] | set[str] = frozenset()) -> None:
        """``bounds``: names of order-dependent aggregates (float SUM/AVG, integer AVG) whose interval the output
        carries (``__lo__<name>``, ``__hi__<name>``) for an operator above that compares or orders them."""
        super().__init__(op_id)
        self.minmax_buffer = max(0, minmax_buffer)
        self.keys = keys
        self.aggs = aggs
        self.fingerprint = fingerprint
        self.global_agg = not keys
        # float keys are stored NaN-free (``nan_flag``); key_names are the state's key columns
        self.float_keys = [n for n, _ in keys if _is_float(key_types[n])]
        self.key_names = ([n for n, _ in keys] + [nan_flag(n) for n in self.float_keys]) if keys else [DUMMY]
        self.key_types = ({**key_types, **{nan_flag(n): pl.Boolean for n in self.float_keys}} if keys
                          else {DUMMY: pl.Int8})
        self._key_exprs = ([x for n, e in keys for x in self._key_expr(n, e)] if keys else
                           [pl.lit(0, dtype=pl.Int8).alias(DUMMY)])
        self._key_out = [pl.when(pl.col(nan_flag(n))).then(NAN).otherwise(pl.col(n)).alias(n)
                         if n in self.float_keys else pl.col(n) for n, _ in keys]
        self._arg_exprs = [self._arg_expr(j, a) for j, (_, a) in enumerate(aggs) if a.arg is not None]
        self.minmax = [j for j, (_, a) in enumerate(aggs) if a.func in ("min", "max")]
        self.sums = [j for j, (_, a) in enumerate(aggs) if a.func in ("sum", "avg")]
        self.floats = [j for j in self.sums if acc_dtype(aggs[j][1]) == pl.Float64]
        unknown = set(bounds) - {n for n, a in aggs if is_order_dependent(a)}
        if unknown:
            raise StateError(f"operator {op_id}: no interval for {', '.join(sorted(unknown))}")
        self.bounded = [j for j, (n, _) in enumerate(aggs) if n in bounds]
        # exactly summed float sources: (argument, "v" finite value | "a" absolute finite value); SUM(x) and AVG(x)
        # share the split of x
        sources: list[tuple[Expr, str]] = []
        self._src_of: dict[tuple[int, str], int] = {}
        for j in self.floats:
            for kind in ("v", "a") if j in self.bounded else ("v",):
                src = (aggs[j][1].arg, kind)
                if src not in sources:
                    sources.append(src)  # type: ignore[arg-type]
                self._src_of[(j, kind)] = sources.index(src)  # type: ignore[arg-type]
        self._sources = sources
        self._src_agg = {i: j for (j, _), i in reversed(self._src_of.items())}
        self._expr_cache: dict[tuple[Any, ...], Any] = {}
        self.reset()

    def _arg_expr(self, j: int, a: AggCall) -> pl.Expr:
        assert a.arg is not None
        x = compile_expr(a.arg)
        if a.func in ("min", "max") and _is_float(polars_type(a.arg.dtype)):
            x = normalize_float(x)
        return x.alias(f"__arg{j}")

    def _key_expr(self, name: str, e: Expr) -> list[pl.Expr]:
        x = compile_expr(e)
        return nan_free(x, name) if name in self.float_keys else [x.alias(name)]

    def encode_keys(self, frame: pl.DataFrame) -> pl.DataFrame:
        """A frame with the plain key columns (e.g. from Spark) in the state's key layout."""
        if not self.float_keys:
            return frame
        return frame.with_columns([x for n in self.float_keys for x in nan_free(pl.col(n), n)])

    def _float_values(self, j: int) -> bool:
        return _is_float(polars_type(self.aggs[j][1].arg.dtype))  # type: ignore[union-attr]

    def encode_values(self, j: int, vals: pl.DataFrame) -> pl.DataFrame:
        """MIN/MAX value counts (``__v`` plain values) in the multiset's layout (doubles as ``float_order_key``)."""
        if not self._float_values(j):
            return vals
        v = vals.get_column(V).cast(pl.Float64).to_numpy()
        return vals.with_columns(pl.Series(V, float_order_key(v), dtype=pl.Int64))

    @staticmethod
    def _pair(j: int, kind: str) -> tuple[str, str]:
        """State columns of an exactly summed float: (sum, compensation)."""
        return (f"__s{j}", f"__c{j}") if kind == "v" else (f"__a{j}", f"__ac{j}")

    def _float_pairs(self) -> list[tuple[str, str]]:
        return [self._pair(j, kind) for (j, kind) in self._src_of]

    # -- state ---------------------------------------------------------------------------------------------------

    def _groups_schema(self) -> dict[str, pl.DataType]:
        schema: dict[str, pl.DataType] = {k: self.key_types[k] for k in self.key_names}
        schema[CNT] = pl.Int64
        for j, (_, a) in enumerate(self.aggs):
            if a.arg is None:
                continue
            schema[f"__n{j}"] = pl.Int64
            if a.func in ("sum", "avg"):
                schema[f"__s{j}"] = acc_dtype(a)
                if j in self.floats:
                    schema[f"__c{j}"] = pl.Float64
                    for sp in SPECIAL:
                        schema[f"{sp}{j}"] = pl.Int64
                    if j in self.bounded:
                        schema[f"__a{j}"] = pl.Float64
                        schema[f"__ac{j}"] = pl.Float64
                elif j in self.bounded:
                    schema[f"__a{j}"] = pl.Decimal(38, 0)  # Σ|x| of an integer AVG
            if a.func in ("min", "max"):
                schema[f"__m{j}"] = polars_type(a.arg.dtype)
        schema[SET] = SET_DTYPE
        return schema

    def _value_type(self, j: int) -> pl.DataType:
        return pl.Int64 if self._float_values(j) else polars_type(self.aggs[j][1].arg.dtype)  # type: ignore[union-attr]

    def reset(self) -> None:
        self.groups = pl.DataFrame(schema=self._groups_schema())
        self.fcounts = pl.DataFrame(schema={**{k: self.key_types[k] for k in self.key_names}, FRAG: FRAG_DTYPE,
                                            N: pl.Int64})
        self.mm: dict[int, pl.DataFrame] = {
            j: pl.DataFrame(schema={**{k: self.key_types[k] for k in self.key_names}, V: self._value_type(j),
                                    N: pl.Int64})
            for j in self.minmax}
        # bounded MIN/MAX buffers: per cut group, the worst value kept (every value up to it is held)
        self.mmb: dict[int, pl.DataFrame] = {
            j: pl.DataFrame(schema={**{k: self.key_types[k] for k in self.key_names}, "__bound": self._value_type(j)})
            for j in self.minmax}
        if self.global_agg:
            # SQL: an aggregation without GROUP BY always returns one row, even over no input.
            row: dict[str, Any] = {DUMMY: [0], CNT: [0], SET: [[]]}
            for name in self._groups_schema():
                if name not in row:
                    # counts and sums start at 0, as for a new group in `apply` (so that deleting every row brings
                    # the state back to exactly this); MIN/MAX have no value
                    row[name] = [None] if name.startswith("__m") else [0]
            self.groups = pl.DataFrame(row, schema=self._groups_schema())

    def state_frames(self) -> tuple[dict[str, Any], dict[str, pl.DataFrame]]:
        frames = {"groups": self.groups, "fcounts": self.fcounts}
        for j, df in self.mm.items():
            frames[f"mm{j}"] = df
            if self.minmax_buffer:
                frames[f"mmb{j}"] = self.mmb[j]
        return {"keys": self.key_names, "aggs": [a.func for _, a in self.aggs], "layout": LAYOUT}, frames

    def set_state_frames(self, meta: dict[str, Any], frames: dict[str, pl.DataFrame]) -> None:
        if meta.get("keys") != self.key_names or meta.get("aggs") != [a.func for _, a in self.aggs]:
            raise StateError(f"operator {self.op_id}: saved state is for a different aggregation; recapture")
        if meta.get("layout") != LAYOUT:
            raise StateError(f"operator {self.op_id}: saved state was written by an older engine (layout "
                             f"{meta.get('layout', 1)}, now {LAYOUT}); recapture the sketch")
        try:
            self.groups = frames["groups"].cast(self._groups_schema())  # type: ignore[arg-type]
            self.fcounts = frames["fcounts"]
            for j in self.minmax:
                self.mm[j] = frames[f"mm{j}"]
                if self.minmax_buffer:
                    self.mmb[j] = frames[f"mmb{j}"]
        except (KeyError, pl.exceptions.PolarsError) as e:
            raise StateError(f"operator {self.op_id}: saved state is incomplete or has the wrong shape; "
                             f"recapture the sketch") from e

    def canonical(self) -> dict[str, pl.DataFrame]:
        """State sorted into a canonical order, to compare the states reached by two routes.

        A float sum is compared as ``fl(s + c)``: two routes reach the same exact sum as different (sum,
        compensation) pairs.
        """
        _, frames = self.state_frames()
        out = {}
        for name, df in frames.items():
            if name == "groups" and self._src_of:
                df = df.with_columns([(pl.col(s) + pl.col(c)).alias(s) for s, c in self._float_pairs()]) \
                    .drop([c for _, c in self._float_pairs()])
            cols = [c for c in df.columns if not isinstance(df.schema[c], pl.List)]
            out[name] = df.sort(cols, nulls_last=True) if df.height else df
        return out

    # -- output --------------------------------------------------------------------------------------------------

    def output_exprs(self, suffix: str = "", value_names: bool = False, intervals: bool = True) -> list[pl.Expr]:
        """Expressions computing the operator's output columns from a ``groups`` frame (whose state columns carry
        ``suffix``): keys (unless ``value_names``), aggregate values, then the intervals of ``bounds`` (unless not
        ``intervals``)."""
        out = [] if value_names else list(self._key_out)

        def c(name: str) -> pl.Expr:
            return pl.col(f"{name}{suffix}")

        bounds: list[pl.Expr] = []
        for j, (name, a) in enumerate(self.aggs):
            if a.arg is None:
                out.append(c(CNT).alias(name))
            elif a.func == "count":
                out.append(c(f"__n{j}").alias(name))
            elif a.func in ("sum", "avg"):
                n = c(f"__n{j}")
                value, exact = self._sum_value(j, a, c)
                value = pl.when(n > 0).then(value).otherwise(None).cast(polars_type(a.dtype))
                out.append(value.alias(name))
                if j in self.bounded and intervals:
                    lo, hi = self._interval(j, value, n, self._abs_sum(j, c), exact)
                    bounds += [lo.alias(lo_name(name)), hi.alias(hi_name(name))]
            else:
                out.append(c(f"__m{j}").alias(name))
        return out + bounds

    def _abs_sum(self, j: int, c: Any) -> pl.Expr:
        return c(f"__a{j}") + c(f"__ac{j}") if j in self.floats else c(f"__a{j}")

    def _interval(self, j: int, value: pl.Expr, n: pl.Expr, abs_sum: pl.Expr,
                  exact: pl.Expr) -> tuple[pl.Expr, pl.Expr]:
        return sum_interval(value, n, abs_sum, exact, self.aggs[j][1].func == "avg",
                            None if j in self.floats else INT53)

    def _sum_value(self, j: int, a: AggCall, c: Any) -> tuple[pl.Expr, pl.Expr]:
        """A SUM/AVG's value (n > 0) and whether it is exact whatever the order of additions."""
        assert a.arg is not None
        n = c(f"__n{j}")
        total = c(f"__s{j}")
        if j in self.floats:
            finite = total + c(f"__c{j}")
            nan, pinf, ninf = (c(f"{sp}{j}") for sp in SPECIAL)
            if a.func == "avg":
                finite = finite / n.cast(pl.Float64)
            value = (pl.when((nan > 0) | ((pinf > 0) & (ninf > 0))).then(NAN)
                     .when(pinf > 0).then(float("inf")).when(ninf > 0).then(float("-inf")).otherwise(finite))
            return value, (nan > 0) | (pinf > 0) | (ninf > 0)
        if a.func == "sum":
            return total, pl.lit(True)
        if pa.types.is_integer(a.arg.dtype):
            return total.cast(pl.Float64) / n.cast(pl.Float64), pl.lit(False)
        return _decimal_avg(total, n, a.arg.dtype, a.dtype), pl.lit(True)

    def current_output(self) -> pl.DataFrame:
        """The operator's current result as an all-insert annotated relation (``Q(D)`` for joins above)."""
        live = self.groups if self.global_agg else self.groups.filter(pl.col(CNT) > 0)
        return live.select([*self.output_exprs(), pl.lit(1, dtype=pl.Int64).alias(MULT), pl.col(SET)])

    # -- incremental maintenance ---------------------------------------------------------------------------------

    def process(self, delta: pl.DataFrame) -> pl.DataFrame:
        """Fold a delta into the state and return the output delta (one Δ−/Δ+ pair per changed group)."""
        if delta.height == 0:
            return self._empty_output()
        return self.apply(*self.prepare(delta))

    def prepare(self, delta: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame, dict[int, pl.DataFrame]]:
        """Fold an annotated delta per group: (partials, F_g count changes, MIN/MAX value-count changes)."""
        d = delta.with_columns([*self._key_exprs, *self._arg_exprs])
        partial = self._partials(d)
        fpairs = (pairs_lazy(d.lazy(), self.key_names).group_by([*self.key_names, FRAG])
                  .agg(pl.col(MULT).sum().alias(N)).collect(engine="in-memory"))
        values = {j: self.encode_values(j, d.select([*self.key_names, pl.col(f"__arg{j}").alias(V), MULT])
                                        .filter(pl.col(V).is_not_null())
                                        .group_by([*self.key_names, V]).agg(pl.col(MULT).sum().alias(N)))
                  for j in self.minmax}
        return partial, fpairs, values

    # -- bounded MIN/MAX buffers (paper 7.2) -----------------------------------------------------------------------

    def _within_bounds(self, j: int, vals: pl.DataFrame) -> pl.DataFrame:
        """Aggregate selection (Liu et al.): value changes beyond a cut group's bound cannot reach its MIN/MAX (an
        insert there is worse than a kept value; a delete there removes a value not kept) and are dropped."""
        keys = self.key_names
        bounded = vals.join(self.mmb[j], on=keys, how="left", nulls_equal=True)
        beyond = (pl.col(V) > pl.col("__bound")) if self.aggs[j][1].func == "min" else (pl.col(V) < pl.col("__bound"))
        return bounded.filter(~beyond.fill_null(False)).drop("__bound")

    def _trim_minmax(self, j: int, touched: pl.DataFrame, new: pl.DataFrame) -> pl.DataFrame:
        """Keep the best ``minmax_buffer`` values of each touched group; fail when a cut group ran out."""
        keys = self.key_names
        mm = self.mm[j]
        descending = self.aggs[j][1].func == "max"
        part = mm.join(touched, on=keys, how="semi", nulls_equal=True)
        rest = mm.join(touched, on=keys, how="anti", nulls_equal=True)
        ranked = part.with_columns(pl.col(V).rank("ordinal", descending=descending).over(keys).alias("__r"))
        kept = ranked.filter(pl.col("__r") <= self.minmax_buffer)
        cut = ranked.filter(pl.col("__r") > self.minmax_buffer).select(keys).unique()
        if cut.height:
            bound = (kept.join(cut, on=keys, how="semi", nulls_equal=True).group_by(keys)
                     .agg((pl.col(V).min() if descending else pl.col(V).max()).alias("__bound")))
            bound = bound.with_columns(pl.col("__bound").cast(self.mmb[j].schema["__bound"]))
            self.mmb[j] = pl.concat([self.mmb[j].join(bound.select(keys), on=keys, how="anti", nulls_equal=True),
                                     bound.select(self.mmb[j].columns)])
        mm = pl.concat([rest, kept.drop("__r")])
        self.mm[j] = mm
        # a cut group whose kept values were all deleted while it still has values: its MIN/MAX is unknown
        held = mm.join(touched, on=keys, how="semi", nulls_equal=True).select(keys).unique()
        live = new.filter(pl.col(f"__n{j}") > 0).select(keys)
        lost = (self.mmb[j].join(touched, on=keys, how="semi", nulls_equal=True)
                .join(held, on=keys, how="anti", nulls_equal=True))
        if lost.join(live, on=keys, how="semi", nulls_equal=True).height:
            raise BufferExhaustedError(f"operator {self.op_id}: deletions emptied a MIN/MAX buffer of "
                                       f"{self.minmax_buffer} values; the sketch must be recaptured")
        # groups that are gone (or fully held again) need no bound any more
        self.mmb[j] = self.mmb[j].join(lost, on=keys, how="anti", nulls_equal=True)
        return mm

    def _partial_exprs(self) -> tuple[list[pl.Expr], list[str]]:
        """Per-row terms of the batch's partial aggregates, and the names of the columns the group-by adds up."""
        if ("partials",) in self._expr_cache:
            return self._expr_cache[("partials",)]
        keys = self.key_names
        m = pl.col(MULT)
        cols = [*[pl.col(k) for k in keys], m.alias(CNT)]
        sums = [CNT]
        for j, (_, a) in enumerate(self.aggs):
            if a.arg is None:
                continue
            arg = pl.col(f"__arg{j}")
            cols.append(pl.when(arg.is_not_null()).then(m).otherwise(0).alias(f"__n{j}"))
            sums.append(f"__n{j}")
            if a.func not in ("sum", "avg"):
                continue
            acc = acc_dtype(a)
            if j in self.floats:
                x = arg.cast(pl.Float64)
                for sp, hit in zip(SPECIAL, (x.is_nan(), x == float("inf"), x == float("-inf"))):
                    cols.append(pl.when(hit).then(m).otherwise(0).alias(f"{sp}{j}"))
                    sums.append(f"{sp}{j}")
            else:
                cols.append((arg.cast(acc) * m.cast(acc)).alias(f"__s{j}"))
                sums.append(f"__s{j}")
                if j in self.bounded:  # Σ|x| of an integer AVG (exact: |−2^63| does not fit a bigint)
                    cols.append((arg.cast(acc).abs() * m.cast(acc)).alias(f"__a{j}"))
                    sums.append(f"__a{j}")
        if self.floats:
            # NULL, NaN and ±inf contribute nothing to the finite part (they are counted apart)
            for i, (e, kind) in enumerate(self._sources):
                x = pl.col(f"__arg{self._src_agg[i]}").cast(pl.Float64)
                x = pl.when(x.is_finite()).then(x.abs() if kind == "a" else x).otherwise(0.0).fill_null(0.0)
                cols.append(x.alias(f"__v{i}"))
            cols.append((pl.col(keys[0]).hash() if len(keys) == 1 else pl.struct(keys).hash()).alias("__h"))
        self._expr_cache[("partials",)] = (cols, sums)
        return cols, sums

    def _partials(self, d: pl.DataFrame) -> pl.DataFrame:
        """Per group of the batch: ``__cnt``, and per aggregate ``__n{j}`` and the signed sum ``__s{j}`` (for floats
        the finite part with its error ``__c{j}``, the NaN/±inf counts, and where an interval is needed Σ|x| as
        ``__a{j}``/``__ac{j}``).

        Every per-row term is computed first, so the group-by only adds columns up (polars evaluates any other
        expression inside an aggregation once per group, which on a batch touching a thousand groups costs more than
        everything else here).
        """
        keys = self.key_names
        cols, sums = self._partial_exprs()
        base = d.select(cols)
        if not self.floats:
            return base.group_by(keys).agg([pl.col(c).sum() for c in sums])
        parts = self._accurate_parts(base)
        levels = [p.name for p in parts]
        out = base.hstack(parts).group_by(keys).agg([pl.col(c).sum() for c in [*sums, *levels]])
        # the exact level sums, largest first, folded into (sum, error) with one TwoSum
        folded = []
        with np.errstate(all="ignore"):
            for (j, kind), i in self._src_of.items():
                head = out.get_column(f"__x{i}_0").to_numpy()
                rest = out.get_column(f"__x{i}_1").to_numpy() + out.get_column(f"__x{i}_2").to_numpy()
                total = head + rest
                back = total - head
                err = np.where(np.isfinite(total), (head - (total - back)) + (rest - back), 0.0)
                s_name, c_name = self._pair(j, kind)
                folded += [pl.Series(s_name, total, dtype=pl.Float64), pl.Series(c_name, err, dtype=pl.Float64)]
        return out.select([*keys, *sums]).hstack(folded)

    def _accurate_parts(self, base: pl.DataFrame) -> list[pl.Series]:
        """For each exactly summed float source ``i`` (an argument's finite values, or their absolute values), split
        every row's contribution ``value * multiplicity`` into ``__x{i}_0`` and ``__x{i}_1``, whose per-group sums
        are exact, and ``__x{i}_2``, each below 2^-67 of the group's largest contribution for batches up to 10^5 rows
        (summing those plainly errs by less than 2^-84 of it).

        A plain sum of a batch holding 1e16, 1.0 and -1e16 is 0.0; summed by parts it is 1.0.

        ``base`` has the multiplicity in ``__cnt``, the values in ``__v{i}`` (0 for NULL, NaN, ±inf) and a 64-bit hash
        of the group keys in ``__h``. Elementwise NumPy: the same steps as polars expressions cost several times more
        on a batch of a thousand rows (a fixed cost per expression), and this runs for every batch.
        """
        # Bounds instead of exact counts and maxima: 2 values (product, error) per row of the batch, a factor 2 for
        # a rounded log2, one σ per group for all float sources, and level 2's σ from level 1's (everything it
        # splits is ≤ 2^-53 σ1).
        n = base.height
        grow = 2.0 ** (math.ceil(math.log2(2 * n + 2)) + 1)
        mult = base.get_column(CNT).to_numpy().astype(np.float64)
        # value * multiplicity is exact when every multiplicity is ±1 (the usual case): no product errors then
        exact_products = n == 0 or float(np.abs(mult).max()) <= 1.0
        splits = range(len(self._sources))
        prods: list[np.ndarray] = []
        errs: list[np.ndarray] = []
        with np.errstate(all="ignore"):
            for i in splits:
                v = base.get_column(f"__v{i}").to_numpy()
                if exact_products:
                    prods.append(v * mult)
                else:
                    p, e = _two_product(v, mult)
                    prods.append(p)
                    errs.append(e)
            # one σ per group, groups told apart by the hash of their keys (two groups sharing a hash would share
            # the larger σ, which is still a valid bound: only the sums below use the real groups)
            gid = np.unique(base.get_column("__h").to_numpy(), return_inverse=True)[1].reshape(-1)
            largest = np.zeros(int(gid.max()) + 1 if n else 0)
            for p in prods:
                np.maximum.at(largest, gid, np.abs(p))
            sigma = (np.exp2(np.ceil(np.log2(largest))) * grow)[gid]
            ok = np.isfinite(sigma) & (sigma > 0)  # else nothing finite to extract: q = v, r = 0
            s1 = np.where(ok, sigma, 0.0)
            s2 = s1 * (_ULP * grow)
            out = []
            for i in splits:
                q0, r0 = _extract(prods[i], s1, ok)
                q1, r1 = _extract(r0, s2, ok)
                if not exact_products:
                    qe, re = _extract(errs[i], s2, ok)
                    q1, r1 = q1 + qe, r1 + re
                out += [pl.Series(f"__x{i}_{level}", x, dtype=pl.Float64) for level, x in enumerate((q0, q1, r1))]
        return out

    def bootstrap(self, partial: Frame, fpairs: Frame, values: dict[int, pl.DataFrame]) -> pl.DataFrame:
        """Initial state from pre-aggregated input computed by the capture on Spark.

        Returns the operator's whole result as an all-insert delta, which is what the operators above start from.
        Without GROUP BY that is always one row, even over an empty input; ``apply`` alone would instead emit the
        change from the reset state's empty-input row (a ``Δ−`` of a row no operator above has seen), or nothing.
        """
        self.reset()
        out = self.apply(partial, fpairs, values)
        return self.current_output().select(out.columns) if self.global_agg else out

    def apply(self, partial: Frame, fpairs: Frame, values: dict[int, pl.DataFrame]) -> pl.DataFrame:
        """Apply per-group partial aggregates (signed), ``F_g`` count changes and MIN/MAX value-count changes.

        ``partial`` has one row per group: key columns, ``__cnt`` and per aggregate ``__n{j}``/``__s{j}``;
        ``fpairs`` one row per (group, fragment): key columns, ``__frag``, ``__n``; ``values[j]`` key columns,
        ``__v``, ``__n``. ``partial`` and ``fpairs`` may be lazy.

        Each batch joins its few touched groups with the state *once* (old and new values then sit side by side in
        one row, so deciding which groups changed needs no second join) and locates the touched state rows by index.
        On deltas of a few thousand rows the fixed cost of each polars step is most of the work, so the number of
        steps is what this keeps small. The state is assigned only after every consistency check passed.
        """
        keys = self.key_names
        partial = partial.collect(engine="in-memory") if isinstance(partial, pl.LazyFrame) else partial
        if self.global_agg and DUMMY not in partial.columns:
            partial = partial.with_columns(pl.lit(0, dtype=pl.Int8).alias(DUMMY))
        partial = _cast_keys(partial, self.key_types, keys)

        # 1. F_g: the batch's (group, fragment) count changes next to the counts before, found by one join
        fp = fpairs.collect(engine="in-memory") if isinstance(fpairs, pl.LazyFrame) else fpairs
        fp = _cast_keys(fp, {**self.key_types, FRAG: FRAG_DTYPE}, [*keys, FRAG])
        fjoined = fp.join(self.fcounts.with_row_index(ROW), on=[*keys, FRAG], how="left", suffix=OLD,
                          nulls_equal=True)
        before = fjoined.get_column(f"{N}{OLD}").fill_null(0).to_numpy()
        after = before + fjoined.get_column(N).to_numpy()
        if after.size and after.min() < 0:
            raise StateError(f"operator {self.op_id}: a fragment count became negative — the change feed deleted rows "
                             f"the state never saw; recapture the sketch")
        fcounts = pl.concat([
            self.fcounts.filter(_untouched(self.fcounts.height, fjoined.get_column(ROW))),
            fjoined.lazy().select([*keys, FRAG, pl.lit(pl.Series(N, after, dtype=pl.Int64))])
            .filter(pl.lit(pl.Series(after > 0))).collect(engine="in-memory"),
        ])
        added_mask, removed_mask = (before == 0) & (after > 0), (before > 0) & (after == 0)
        sets_change = bool(added_mask.any() or removed_mask.any())

        # 2. accumulators: one row per touched group, old state (null for a new group) next to the batch's partials
        state_cols = [c for c in self.groups.columns if c not in keys]
        old_named = self.groups.rename({c: f"{c}{OLD}" for c in state_cols}).with_row_index(ROW)
        joined = partial.join(old_named, on=keys, how="left", nulls_equal=True)
        upd = self._update_exprs(tuple(c in partial.columns for _, c in self._float_pairs()), sets_change)
        new = joined.with_columns(upd)
        lowest = new.get_column(CNT).min()
        if lowest is not None and lowest < 0:  # type: ignore[operator]
            raise StateError(f"operator {self.op_id}: a group's row count became negative — the change feed deleted "
                             f"rows the state never saw; recapture the sketch")

        # 3. MIN/MAX multisets
        if self.minmax:
            new = self._apply_minmax(values, partial.select(keys), new)

        # 4. the group sketches P = {ρ | F_g[ρ] > 0}, where a fragment entered or left a group
        if sets_change:
            added = fjoined.filter(pl.Series(added_mask)).select([*keys, FRAG])
            removed = fjoined.filter(pl.Series(removed_mask)).select([*keys, FRAG])
            sets = (new.lazy().select([*keys, pl.col(f"{SET}{OLD}").alias(FRAG)]).explode(FRAG).drop_nulls(FRAG)
                    .with_columns(pl.col(FRAG).cast(FRAG_DTYPE))
                    .join(removed.lazy(), on=[*keys, FRAG], how="anti", nulls_equal=True))
            sets = (pl.concat([sets, added.lazy()]).group_by(keys)
                    .agg(pl.col(FRAG).unique().sort().alias(SET)).with_columns(pl.col(SET).cast(SET_DTYPE)))
            new = (new.lazy().join(sets, on=keys, how="left", nulls_equal=True)
                   .with_columns(pl.col(SET).fill_null(pl.lit([], dtype=SET_DTYPE))).collect(engine="in-memory"))

        # 5. output delta: Δ− old row, Δ+ new row, for groups whose row or sketch changed (an unchanged pair would
        #    cancel). Old and new values sit in the same row: one step computes both and whether they differ.
        first, second, third = self._compare_exprs(sets_change)
        outs = new.lazy().select(first).with_columns(second).with_columns(third).collect(engine="in-memory")
        had = outs.get_column("__had").to_numpy()
        alive = outs.get_column("__alive").to_numpy()
        unchanged = outs.get_column("__same").to_numpy() & had & alive
        emit_old, emit_new = had & ~unchanged, alive & ~unchanged
        parts = []
        old_rows, new_rows = self._emit_exprs()
        if emit_old.any():
            parts.append(outs.lazy().filter(pl.lit(pl.Series(emit_old))).select(old_rows))
        if emit_new.any():
            parts.append(outs.lazy().filter(pl.lit(pl.Series(emit_new))).select(new_rows))
        out = pl.concat(parts, how="vertical_relaxed").collect(engine="in-memory") if parts else None

        # 6. commit: untouched groups plus the live touched ones
        kept_rows = new.select(self.groups.columns) if alive.all() else \
            new.lazy().filter(pl.lit(pl.Series(alive))).select(self.groups.columns).collect(engine="in-memory")
        untouched = self.groups.filter(_untouched(self.groups.height, new.get_column(ROW)))
        self.groups = pl.concat([untouched, kept_rows]) if kept_rows.height else untouched
        self.fcounts = fcounts
        return out if out is not None and out.height else self._empty_output()

    # -- expressions of `apply`, built once per operator (building polars expressions costs as much as running them
    #    on a small batch) ---------------------------------------------------------------------------------------

    def _update_exprs(self, batch_errors: tuple[bool, ...], sets_change: bool) -> list[pl.Expr]:
        """New state columns from ``X__old`` (the state) and ``X`` (the batch's partials); ``batch_errors`` says per
        exactly summed float (``_float_pairs``) whether the partials carry its error term."""
        key = ("update", batch_errors, sets_change)
        if key in self._expr_cache:
            return self._expr_cache[key]
        carried = dict(zip(self._float_pairs(), batch_errors))

        def add(name: str, zero: Any = 0) -> pl.Expr:
            return (pl.col(f"{name}{OLD}").fill_null(zero) + pl.col(name).fill_null(zero)).alias(name)

        upd = [add(CNT)]
        for j, (_, a) in enumerate(self.aggs):
            if a.arg is None:
                continue
            upd.append(add(f"__n{j}"))
            if a.func in ("sum", "avg"):
                if j in self.floats:
                    upd += [add(f"{sp}{j}") for sp in SPECIAL]
                    for pair in self._float_pairs():
                        if pair[0] in (f"__s{j}", f"__a{j}"):
                            upd += self._neumaier(*pair, carried[pair])
                else:
                    zero = pl.lit(0).cast(acc_dtype(a))
                    upd.append(add(f"__s{j}", zero))
                    if j in self.bounded:
                        upd.append(add(f"__a{j}", pl.lit(0).cast(pl.Decimal(38, 0))))
            if a.func in ("min", "max"):
                upd.append(pl.col(f"__m{j}{OLD}").alias(f"__m{j}"))
        if not sets_change:  # every touched group keeps its sketch
            upd.append(pl.col(f"{SET}{OLD}").fill_null(pl.lit([], dtype=SET_DTYPE)).alias(SET))
        self._expr_cache[key] = upd
        return upd

    @staticmethod
    def _neumaier(s_name: str, c_name: str, carried: bool) -> list[pl.Expr]:
        """Neumaier: carry the rounding error of every batch addition in the compensation column, with the batch's own
        error term (a partial from a backend that sums plainly has none)."""
        s0, d0 = pl.col(f"{s_name}{OLD}").fill_null(0.0), pl.col(s_name).fill_null(0.0)
        dc = pl.col(c_name).fill_null(0.0) if carried else pl.lit(0.0)
        t = s0 + d0
        err = pl.when(s0.abs() >= d0.abs()).then((s0 - t) + d0).otherwise((d0 - t) + s0)
        err = pl.when(t.is_finite()).then(err).otherwise(0.0)
        return [t.alias(s_name), (pl.col(f"{c_name}{OLD}").fill_null(0.0) + err + dc).alias(c_name)]

    def _compare_exprs(self, sets_change: bool) -> tuple[list[pl.Expr], list[pl.Expr], list[pl.Expr]]:
        """Per touched group, in projections of one query: keys, old values ``__o{k}``, new values, both sketches,
        whether the group existed (``__had``) and exists (``__alive``); then the intervals (old and new); then
        whether the output row is unchanged (``__same``), each from the columns made before (an expression per use
        would make the query several times larger)."""
        key = ("compare", sets_change)
        if key not in self._expr_cache:
            old_vals = self.output_exprs(OLD, value_names=True, intervals=False)
            new_vals = self.output_exprs(value_names=True, intervals=False)
            first = [*self._key_out, *[o.alias(f"__o{k}") for k, o in enumerate(old_vals)], *new_vals,
                     pl.col(f"{SET}{OLD}"), pl.col(SET), pl.col(ROW).is_not_null().alias("__had"),
                     (pl.lit(True) if self.global_agg else pl.col(CNT) > 0).alias("__alive")]
            second = []
            k = len(self.aggs)
            for j in self.bounded:
                name, a = self.aggs[j]
                for suffix, tag in (("", ""), (OLD, "o")):
                    def c(col: str, suffix: str = suffix) -> pl.Expr:
                        return pl.col(f"{col}{suffix}")
                    _, exact = self._sum_value(j, a, c)
                    first += [c(f"__n{j}").alias(f"__in{tag}{j}"), self._abs_sum(j, c).alias(f"__ia{tag}{j}"),
                              exact.alias(f"__ie{tag}{j}")]
                    value = pl.col(name if not tag else f"__o{j}")
                    lo, hi = self._interval(j, value, pl.col(f"__in{tag}{j}"), pl.col(f"__ia{tag}{j}"),
                                            pl.col(f"__ie{tag}{j}"))
                    second += [lo.alias(f"__o{k}" if tag else lo_name(name)),
                               hi.alias(f"__o{k + 1}" if tag else hi_name(name))]
                k += 2
            same = pl.lit(True)
            for k, name in enumerate(self._value_names()):
                same = same & pl.col(f"__o{k}").eq_missing(pl.col(name))
            if sets_change:
                same = same & pl.col(SET).eq_missing(pl.col(f"{SET}{OLD}"))
            self._expr_cache[key] = (first, second, [same.alias("__same")])
        return self._expr_cache[key]

    def _emit_exprs(self) -> tuple[list[pl.Expr], list[pl.Expr]]:
        """The ``Δ−`` rows (old values) and ``Δ+`` rows (new values) from ``_compare_exprs``' frame."""
        key = ("emit",)
        if key not in self._expr_cache:
            keys = [pl.col(n) for n, _ in self.keys]
            values = self._value_names()
            self._expr_cache[key] = (
                [*keys, *[pl.col(f"__o{k}").alias(n) for k, n in enumerate(values)],
                 pl.lit(-1, dtype=pl.Int64).alias(MULT), pl.col(f"{SET}{OLD}").alias(SET)],
                [*keys, *[pl.col(n) for n in values], pl.lit(1, dtype=pl.Int64).alias(MULT), pl.col(SET)])
        return self._expr_cache[key]

    def _apply_minmax(self, values: dict[int, pl.DataFrame], touched: pl.DataFrame,
                      new: pl.DataFrame) -> pl.DataFrame:
        """Fold MIN/MAX value-count changes into the per-group multisets; ``new`` gets each touched group's new
        extreme in ``__m{j}``."""
        keys = self.key_names
        for j in self.minmax:
            vals = values.get(j)
            mm = self.mm[j]
            func = self.aggs[j][1].func
            if vals is not None and vals.height:
                vals = vals.cast({k: self.key_types[k] for k in keys})  # type: ignore[arg-type]
                vals = vals.with_columns(pl.col(V).cast(mm.schema[V]))
                if self.minmax_buffer and self.mmb[j].height:
                    vals = self._within_bounds(j, vals)
                merged = (pl.concat([mm.join(vals.select([*keys, V]), on=[*keys, V], how="semi", nulls_equal=True),
                                     vals])
                          .group_by([*keys, V]).agg(pl.col(N).sum()))
                if merged.filter(pl.col(N) < 0).height:
                    raise StateError(f"operator {self.op_id}: MIN/MAX state lost a value the change feed deletes; "
                                     f"recapture the sketch")
                mm = pl.concat([mm.join(vals.select([*keys, V]), on=[*keys, V], how="anti", nulls_equal=True),
                                merged.filter(pl.col(N) > 0).select(mm.columns)])
                self.mm[j] = mm
            if self.minmax_buffer:
                mm = self._trim_minmax(j, touched, new)
            ext = (mm.join(touched, on=keys, how="semi", nulls_equal=True).group_by(keys)
                   .agg((pl.col(V).min() if func == "min" else pl.col(V).max()).alias(f"__m{j}_new")))
            if self._float_values(j):  # back from the order key to the double
                ext = ext.with_columns(pl.Series(f"__m{j}_new", float_from_order_key(
                    ext.get_column(f"__m{j}_new").to_numpy()), dtype=pl.Float64))
            new = (new.join(ext, on=keys, how="left", nulls_equal=True)
                   .with_columns(pl.col(f"__m{j}_new").alias(f"__m{j}")).drop(f"__m{j}_new"))
        return new

    def _value_names(self) -> list[str]:
        """The output's value columns: the aggregates, then the intervals of ``bounds``."""
        names = [n for n, _ in self.aggs]
        for j in self.bounded:
            names += [lo_name(self.aggs[j][0]), hi_name(self.aggs[j][0])]
        return names

    def _out_names(self) -> list[str]:
        return [n for n, _ in self.keys] + self._value_names()

    def _empty_output(self) -> pl.DataFrame:
        schema: dict[str, pl.DataType] = {n: self.key_types[n] for n, _ in self.keys}
        for name, a in self.aggs:
            schema[name] = polars_type(a.dtype)
        for j in self.bounded:
            schema[lo_name(self.aggs[j][0])] = pl.Float64
            schema[hi_name(self.aggs[j][0])] = pl.Float64
        return pl.DataFrame(schema={**schema, MULT: pl.Int64, SET: SET_DTYPE})

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

Integer and decimal sums are exact. Float sums must not drift from a recapture over long insert/delete sequences
(a drift could flip a HAVING or ORDER BY decision), so they are accurate at two levels: within a batch, the partial
sum per group is computed error-free up to a negligible remainder (``_accurate_parts``: Dekker's TwoProduct for
``value * multiplicity``, then Rump-Ogita-Oishi extraction), and arrives as a pair (sum, error); across batches the
state keeps a Neumaier compensation term ``__c{j}`` next to the running sum ``__s{j}``.
"""

from __future__ import annotations

import math
from typing import Any

import polars as pl
import pyarrow as pa

from imp_core.engine.annotation import FRAG, FRAG_DTYPE, MULT, SET, SET_DTYPE, pairs
from imp_core.engine.evaluate import compile_expr, polars_type
from imp_core.engine.operators.base import StatefulOperator
from imp_core.errors import BufferExhaustedError, StateError
from imp_core.plan.expr import AggCall, Expr

CNT = "__cnt"
DUMMY = "__gk"  # constant key for aggregation without GROUP BY
N = "__n"
V = "__v"
_SPLIT = 134217729.0  # 2^27 + 1, Dekker's splitter
_ULP = 2.0 ** -53  # what ExtractVector leaves below σ: |v − q| ≤ 2^-53 σ


def _two_product(a: pl.Expr, b: pl.Expr) -> tuple[pl.Expr, pl.Expr]:
    """``a * b`` as ``p + e``, both doubles, exactly (Dekker); ``e`` is 0 where ``p`` is not finite."""
    p = a * b
    ca, cb = a * _SPLIT, b * _SPLIT
    ah, bh = ca - (ca - a), cb - (cb - b)
    al, bl = a - ah, b - bh
    e = ((ah * bh - p) + ah * bl + al * bh) + al * bl
    return p, pl.when(p.is_finite()).then(e).otherwise(0.0)


def _extract(v: pl.Expr, sigma: pl.Expr) -> tuple[pl.Expr, pl.Expr]:
    """ExtractVector (Rump, Ogita, Oishi, "Accurate floating-point summation", Lemma 3.3): ``v = q + r`` exactly.

    With σ a power of two ≥ 2^⌈log2(n+2)⌉ · max|v| over n values, every ``q = (σ + v) − σ`` is a multiple of
    2^-53 σ and any partial sum of the q's stays within σ, so the q's add up *exactly in any order*, and
    ``|r| ≤ 2^-53 σ``. A null σ (nothing finite to extract) leaves ``q = v``, ``r = 0``.
    """
    q = pl.when(sigma.is_not_null()).then((sigma + v) - sigma).otherwise(v)
    return q, pl.when(sigma.is_not_null()).then(v - q).otherwise(0.0)


def _acc_dtype(arg_type: pa.DataType) -> pl.DataType:
    if pa.types.is_integer(arg_type):
        return pl.Int64
    if pa.types.is_decimal(arg_type):
        return pl.Decimal(38, arg_type.scale)
    return pl.Float64


class Aggregation(StatefulOperator):
    kind = "aggregation"

    def __init__(self, op_id: str, keys: tuple[tuple[str, Expr], ...], aggs: tuple[tuple[str, AggCall], ...],
                 key_types: dict[str, pl.DataType], fingerprint: str = "", minmax_buffer: int = 0) -> None:
        super().__init__(op_id)
        self.minmax_buffer = max(0, minmax_buffer)
        self.keys = keys
        self.aggs = aggs
        self.fingerprint = fingerprint
        self.global_agg = not keys
        self.key_names = [n for n, _ in keys] if keys else [DUMMY]
        self.key_types = dict(key_types) if keys else {DUMMY: pl.Int8}
        self._key_exprs = ([compile_expr(e).alias(n) for n, e in keys] if keys else
                           [pl.lit(0, dtype=pl.Int8).alias(DUMMY)])
        self._arg_exprs = [compile_expr(a.arg).alias(f"__a{j}") for j, (_, a) in enumerate(aggs) if a.arg is not None]
        self.minmax = [j for j, (_, a) in enumerate(aggs) if a.func in ("min", "max")]
        self.sums = [j for j, (_, a) in enumerate(aggs) if a.func in ("sum", "avg")]
        self.floats = [j for j in self.sums if _acc_dtype(aggs[j][1].arg.dtype) == pl.Float64]  # type: ignore[union-attr]
        # float SUM/AVG over the same argument (SUM(x), AVG(x)) share the accurate split of that argument
        args = list(dict.fromkeys(aggs[j][1].arg for j in self.floats))
        self._split_of = {j: args.index(aggs[j][1].arg) for j in self.floats}
        self._split_source = {i: j for j, i in reversed(self._split_of.items())}
        self.reset()

    # -- state ---------------------------------------------------------------------------------------------------

    def _groups_schema(self) -> dict[str, pl.DataType]:
        schema: dict[str, pl.DataType] = {k: self.key_types[k] for k in self.key_names}
        schema[CNT] = pl.Int64
        for j, (_, a) in enumerate(self.aggs):
            if a.arg is None:
                continue
            schema[f"__n{j}"] = pl.Int64
            if a.func in ("sum", "avg"):
                schema[f"__s{j}"] = _acc_dtype(a.arg.dtype)
                if j in self.floats:
                    schema[f"__c{j}"] = pl.Float64
            if a.func in ("min", "max"):
                schema[f"__m{j}"] = polars_type(a.arg.dtype)
        schema[SET] = SET_DTYPE
        return schema

    def reset(self) -> None:
        self.groups = pl.DataFrame(schema=self._groups_schema())
        self.fcounts = pl.DataFrame(schema={**{k: self.key_types[k] for k in self.key_names}, FRAG: FRAG_DTYPE,
                                            N: pl.Int64})
        self.mm: dict[int, pl.DataFrame] = {
            j: pl.DataFrame(schema={**{k: self.key_types[k] for k in self.key_names},
                                    V: polars_type(self.aggs[j][1].arg.dtype), N: pl.Int64})  # type: ignore[union-attr]
            for j in self.minmax}
        # bounded MIN/MAX buffers: per cut group, the worst value kept (every value up to it is held)
        self.mmb: dict[int, pl.DataFrame] = {
            j: pl.DataFrame(schema={**{k: self.key_types[k] for k in self.key_names},
                                    "__bound": polars_type(self.aggs[j][1].arg.dtype)})  # type: ignore[union-attr]
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
        return {"keys": self.key_names, "aggs": [a.func for _, a in self.aggs]}, frames

    def set_state_frames(self, meta: dict[str, Any], frames: dict[str, pl.DataFrame]) -> None:
        if meta.get("keys") != self.key_names or meta.get("aggs") != [a.func for _, a in self.aggs]:
            raise StateError(f"operator {self.op_id}: saved state is for a different aggregation; recapture")
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
        """State sorted into a canonical order, to compare the states reached by two routes."""
        _, frames = self.state_frames()
        out = {}
        for name, df in frames.items():
            cols = [c for c in df.columns if not isinstance(df.schema[c], pl.List)]
            out[name] = df.sort(cols, nulls_last=True) if df.height else df
        return out

    # -- output --------------------------------------------------------------------------------------------------

    def output_exprs(self) -> list[pl.Expr]:
        """Expressions computing the operator's output columns from a ``groups`` frame."""
        out = [pl.col(n) for n, _ in self.keys]
        for j, (name, a) in enumerate(self.aggs):
            if a.arg is None:
                out.append(pl.col(CNT).alias(name))
            elif a.func == "count":
                out.append(pl.col(f"__n{j}").alias(name))
            elif a.func in ("sum", "avg"):
                total = pl.col(f"__s{j}")
                if j in self.floats:
                    total = total + pl.col(f"__c{j}")
                if a.func == "avg":
                    value = total.cast(pl.Float64) / pl.col(f"__n{j}").cast(pl.Float64)
                else:
                    value = total
                out.append(pl.when(pl.col(f"__n{j}") > 0).then(value).otherwise(None)
                           .cast(polars_type(a.dtype)).alias(name))
            else:
                out.append(pl.col(f"__m{j}").alias(name))
        return out

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
        fpairs = pairs(d, self.key_names).group_by([*self.key_names, FRAG]).agg(pl.col(MULT).sum().alias(N))
        values = {j: d.select([*self.key_names, pl.col(f"__a{j}").alias(V), MULT])
                  .filter(pl.col(V).is_not_null())
                  .group_by([*self.key_names, V]).agg(pl.col(MULT).sum().alias(N))
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

    def _partials(self, d: pl.DataFrame) -> pl.DataFrame:
        m = pl.col(MULT)
        aggs = [m.sum().alias(CNT)]
        for j, (_, a) in enumerate(self.aggs):
            if a.arg is None:
                continue
            arg = pl.col(f"__a{j}")
            aggs.append(pl.when(arg.is_not_null()).then(m).otherwise(0).sum().alias(f"__n{j}"))
            if j in self.floats:
                aggs += [pl.col(f"__x{j}_{i}").sum() for i in range(3)]
            elif a.func in ("sum", "avg"):
                acc = _acc_dtype(a.arg.dtype)
                aggs.append((arg.cast(acc) * m.cast(acc)).sum().alias(f"__s{j}"))
        if not self.floats:
            return d.group_by(self.key_names).agg(aggs)
        out = self._accurate_parts(d).group_by(self.key_names).agg(aggs)
        for j in self.floats:
            # the exact level sums, largest first, folded into (sum, error) with one TwoSum
            head, rest = pl.col(f"__x{j}_0"), pl.col(f"__x{j}_1") + pl.col(f"__x{j}_2")
            total = head + rest
            back = total - head
            err = (head - (total - back)) + (rest - back)
            out = out.with_columns(total.alias(f"__s{j}"), pl.when(total.is_finite()).then(err).otherwise(0.0)
                                   .alias(f"__c{j}")).drop([f"__x{j}_{i}" for i in range(3)])
        return out.collect()

    def _accurate_parts(self, d: pl.DataFrame) -> pl.LazyFrame:
        """For each float SUM/AVG, split every row's contribution ``value * multiplicity`` into ``__x{j}_0`` and
        ``__x{j}_1``, whose per-group sums are exact, and ``__x{j}_2``, each below 2^-67 of the group's largest
        contribution for batches up to 10^5 rows (summing those plainly errs by less than 2^-84 of it).

        A plain sum of a batch holding 1e16, 1.0 and -1e16 is 0.0; summed by parts it is 1.0.
        """
        # Bounds instead of exact counts and maxima keep this to one window per batch: 2 values (product, error)
        # per row of the batch, a factor 2 for a rounded log2, one σ per group for all float aggregates, and
        # level 2's σ from level 1's (everything it splits is ≤ 2^-53 σ1).
        grow = 2.0 ** (math.ceil(math.log2(2 * d.height + 2)) + 1)
        # value * multiplicity is exact when every multiplicity is ±1 (the usual case): no product errors then
        exact_products = d.height == 0 or int(d.get_column(MULT).abs().max()) <= 1  # type: ignore[arg-type]
        splits = range(len(self._split_source))
        products = []
        for i in splits:
            value = pl.col(f"__a{self._split_source[i]}").cast(pl.Float64)
            if exact_products:
                products.append((value * pl.col(MULT).cast(pl.Float64)).alias(f"__p{i}"))
            else:
                p, e = _two_product(value, pl.col(MULT).cast(pl.Float64))
                products += [p.alias(f"__p{i}"), e.alias(f"__e{i}")]
        largest = pl.max_horizontal([pl.col(f"__p{i}").abs() for i in splits]).max()
        sigma = (pl.lit(2.0).pow(largest.log(2).ceil()) * grow).over(self.key_names)  # pow once per group
        lazy = d.lazy().with_columns(products).with_columns(
            pl.when(sigma.is_finite() & (sigma > 0)).then(sigma).alias("__g"))
        parts = []
        for i in splits:
            sigma1 = pl.col("__g")
            sigma2 = sigma1 * (_ULP * grow)
            q0, r0 = _extract(pl.col(f"__p{i}"), sigma1)
            q1, r1 = _extract(r0, sigma2)
            if not exact_products:
                qe, re = _extract(pl.col(f"__e{i}"), sigma2)
                q1, r1 = q1 + qe, r1 + re
            parts += [q0.alias(f"__y{i}_0"), q1.alias(f"__y{i}_1"), r1.alias(f"__y{i}_2")]
        lazy = lazy.with_columns(parts)
        return lazy.with_columns([pl.col(f"__y{i}_{level}").alias(f"__x{j}_{level}")
                                  for j, i in self._split_of.items() for level in range(3)])

    def bootstrap(self, partial: pl.DataFrame, fpairs: pl.DataFrame, values: dict[int, pl.DataFrame]) -> pl.DataFrame:
        """Initial state from pre-aggregated input computed by the capture on Spark.

        Returns the operator's whole result as an all-insert delta, which is what the operators above start from.
        Without GROUP BY that is always one row, even over an empty input; ``apply`` alone would instead emit the
        change from the reset state's empty-input row (a ``Δ−`` of a row no operator above has seen), or nothing.
        """
        self.reset()
        out = self.apply(partial, fpairs, values)
        return self.current_output().select(out.columns) if self.global_agg else out

    def apply(self, partial: pl.DataFrame, fpairs: pl.DataFrame, values: dict[int, pl.DataFrame]) -> pl.DataFrame:
        """Apply per-group partial aggregates (signed), ``F_g`` count changes and MIN/MAX value-count changes.

        ``partial`` has key columns, ``__cnt`` and per aggregate ``__n{j}``/``__s{j}``; ``fpairs`` key columns,
        ``__frag``, ``__n``; ``values[j]`` key columns, ``__v``, ``__n``.
        """
        keys = self.key_names
        if self.global_agg and DUMMY not in partial.columns:
            partial = partial.with_columns(pl.lit(0, dtype=pl.Int8).alias(DUMMY))
        partial = partial.cast({k: self.key_types[k] for k in keys})  # type: ignore[arg-type]
        touched = partial.select(keys).unique()
        old = self.groups.join(touched, on=keys, how="semi", nulls_equal=True)

        # 1. accumulators
        new = touched.join(old, on=keys, how="left", nulls_equal=True)
        new = new.join(partial, on=keys, how="left", suffix="_d", nulls_equal=True)
        upd = [(pl.col(CNT).fill_null(0) + pl.col(f"{CNT}_d").fill_null(0)).alias(CNT)]
        for j, (_, a) in enumerate(self.aggs):
            if a.arg is None:
                continue
            upd.append((pl.col(f"__n{j}").fill_null(0) + pl.col(f"__n{j}_d").fill_null(0)).alias(f"__n{j}"))
            if a.func in ("sum", "avg"):
                s, ds = pl.col(f"__s{j}"), pl.col(f"__s{j}_d")
                if j in self.floats:
                    # Neumaier: carry the rounding error of every batch addition in __c, with the batch's own
                    # error term (a partial from a backend that sums plainly has none)
                    s0, d0 = s.fill_null(0.0), ds.fill_null(0.0)
                    dc = pl.col(f"__c{j}_d").fill_null(0.0) if f"__c{j}" in partial.columns else pl.lit(0.0)
                    t = s0 + d0
                    err = pl.when(s0.abs() >= d0.abs()).then((s0 - t) + d0).otherwise((d0 - t) + s0)
                    err = pl.when(t.is_finite()).then(err).otherwise(0.0)
                    upd.append(t.alias(f"__s{j}"))
                    upd.append((pl.col(f"__c{j}").fill_null(0.0) + err + dc).alias(f"__c{j}"))
                else:
                    zero = pl.lit(0).cast(_acc_dtype(a.arg.dtype))
                    upd.append((s.fill_null(zero) + ds.fill_null(zero)).alias(f"__s{j}"))
        new = new.with_columns(upd)
        if new.filter(pl.col(CNT) < 0).height:
            raise StateError(f"operator {self.op_id}: a group's row count became negative — the change feed deleted "
                             f"rows the state never saw; recapture the sketch")

        # 2. MIN/MAX multisets
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
            new = (new.join(ext, on=keys, how="left", nulls_equal=True)
                   .with_columns(pl.col(f"__m{j}_new").alias(f"__m{j}")).drop(f"__m{j}_new"))

        # 3. F_g and the group sketches
        fpairs = fpairs.cast({k: self.key_types[k] for k in keys}).with_columns(  # type: ignore[arg-type]
            pl.col(FRAG).cast(FRAG_DTYPE))
        fpairs = fpairs.group_by([*keys, FRAG]).agg(pl.col(N).sum())
        fold = self.fcounts.join(fpairs.select([*keys, FRAG]), on=[*keys, FRAG], how="semi", nulls_equal=True)
        fnew = fpairs.join(fold, on=[*keys, FRAG], how="left", suffix="_old", nulls_equal=True).with_columns(
            pl.col(f"{N}_old").fill_null(0).alias("__before"),
            (pl.col(f"{N}_old").fill_null(0) + pl.col(N)).alias("__after"))
        if fnew.filter(pl.col("__after") < 0).height:
            raise StateError(f"operator {self.op_id}: a fragment count became negative — the change feed deleted rows "
                             f"the state never saw; recapture the sketch")
        self.fcounts = pl.concat([
            self.fcounts.join(fpairs.select([*keys, FRAG]), on=[*keys, FRAG], how="anti", nulls_equal=True),
            fnew.filter(pl.col("__after") > 0).select([*keys, FRAG, pl.col("__after").alias(N)]),
        ])
        added = fnew.filter((pl.col("__before") == 0) & (pl.col("__after") > 0)).select([*keys, FRAG])
        removed = fnew.filter((pl.col("__before") > 0) & (pl.col("__after") == 0)).select([*keys, FRAG])
        if added.height or removed.height:
            old_sets = old.select([*keys, pl.col(SET).alias(FRAG)]).explode(FRAG).drop_nulls(FRAG)
            old_sets = old_sets.with_columns(pl.col(FRAG).cast(FRAG_DTYPE))
            kept = old_sets.join(removed, on=[*keys, FRAG], how="anti", nulls_equal=True)
            sets = (pl.concat([kept, added]).group_by(keys)
                    .agg(pl.col(FRAG).unique().sort().alias("__sk_new"))
                    .with_columns(pl.col("__sk_new").cast(SET_DTYPE)))
            new = (new.join(sets, on=keys, how="left", nulls_equal=True)
                   .with_columns(pl.col("__sk_new").fill_null(pl.lit([], dtype=SET_DTYPE)).alias(SET))
                   .drop("__sk_new"))
        else:
            new = new.with_columns(pl.col(SET).fill_null(pl.lit([], dtype=SET_DTYPE)))
        new = new.select(self.groups.columns)

        # 4. output delta: Δ− old row, Δ+ new row, for groups whose row or sketch changed
        jk = [DUMMY] if self.global_agg else []
        out_old = old.select([*jk, *self.output_exprs(), pl.col(SET)])
        live_new = new if self.global_agg else new.filter(pl.col(CNT) > 0)
        out_new = live_new.select([*jk, *self.output_exprs(), pl.col(SET)])
        if out_old.height and out_new.height:
            # drop groups whose old and new output (values and sketch) are identical: the pair would cancel
            values = [c for c in out_new.columns if c not in keys]
            both = out_old.join(out_new, on=keys, how="inner", suffix="__new", nulls_equal=True)
            same_mask = pl.lit(True)
            for c in values:
                same_mask = same_mask & pl.col(c).eq_missing(pl.col(f"{c}__new"))
            same = both.filter(same_mask).select(keys)
            if same.height:
                out_old = out_old.join(same, on=keys, how="anti", nulls_equal=True)
                out_new = out_new.join(same, on=keys, how="anti", nulls_equal=True)
        parts = []
        if out_old.height:
            parts.append(out_old.with_columns(pl.lit(-1, dtype=pl.Int64).alias(MULT)))
        if out_new.height:
            parts.append(out_new.with_columns(pl.lit(1, dtype=pl.Int64).alias(MULT)))

        # 5. commit the new group rows into the state
        keep = self.groups.join(touched, on=keys, how="anti", nulls_equal=True)
        alive = new if self.global_agg else new.filter(pl.col(CNT) > 0)
        self.groups = pl.concat([keep, alive]) if alive.height else keep

        if not parts:
            return self._empty_output()
        out = pl.concat(parts, how="vertical_relaxed")
        return out.select([*self._out_names(), MULT, SET])

    def _out_names(self) -> list[str]:
        return [n for n, _ in self.keys] + [n for n, _ in self.aggs]

    def _empty_output(self) -> pl.DataFrame:
        schema: dict[str, pl.DataType] = {n: self.key_types[n] for n, _ in self.keys}
        for name, a in self.aggs:
            schema[name] = polars_type(a.dtype)
        return pl.DataFrame(schema={**schema, MULT: pl.Int64, SET: SET_DTYPE})

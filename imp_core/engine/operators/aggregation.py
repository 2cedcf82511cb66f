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

import numpy as np
import polars as pl
import pyarrow as pa

from imp_core.engine.annotation import FRAG, FRAG_DTYPE, MULT, ROW, SET, SET_DTYPE, pairs_lazy
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
OLD = "__old"  # suffix of a group's state before the batch, next to its new state
Frame = pl.DataFrame | pl.LazyFrame


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
        self._expr_cache: dict[tuple[Any, ...], Any] = {}
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

    def output_exprs(self, suffix: str = "", value_names: bool = False) -> list[pl.Expr]:
        """Expressions computing the operator's output columns from a ``groups`` frame (whose state columns carry
        ``suffix``); with ``value_names`` only the aggregate values, not the keys."""
        out = [] if value_names else [pl.col(n) for n, _ in self.keys]

        def c(name: str) -> pl.Expr:
            return pl.col(f"{name}{suffix}")

        for j, (name, a) in enumerate(self.aggs):
            if a.arg is None:
                out.append(c(CNT).alias(name))
            elif a.func == "count":
                out.append(c(f"__n{j}").alias(name))
            elif a.func in ("sum", "avg"):
                total = c(f"__s{j}")
                if j in self.floats:
                    total = total + c(f"__c{j}")
                if a.func == "avg":
                    value = total.cast(pl.Float64) / c(f"__n{j}").cast(pl.Float64)
                else:
                    value = total
                out.append(pl.when(c(f"__n{j}") > 0).then(value).otherwise(None)
                           .cast(polars_type(a.dtype)).alias(name))
            else:
                out.append(c(f"__m{j}").alias(name))
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
        fpairs = (pairs_lazy(d.lazy(), self.key_names).group_by([*self.key_names, FRAG])
                  .agg(pl.col(MULT).sum().alias(N)).collect(engine="in-memory"))
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
            arg = pl.col(f"__a{j}")
            cols.append(pl.when(arg.is_not_null()).then(m).otherwise(0).alias(f"__n{j}"))
            sums.append(f"__n{j}")
            if a.func in ("sum", "avg") and j not in self.floats:
                acc = _acc_dtype(a.arg.dtype)
                cols.append((arg.cast(acc) * m.cast(acc)).alias(f"__s{j}"))
                sums.append(f"__s{j}")
        if self.floats:
            # a NULL contributes nothing to a SUM (its count is kept apart in __n)
            cols += [pl.col(f"__a{j}").cast(pl.Float64).fill_null(0.0).alias(f"__v{i}")
                     for i, j in self._split_source.items()]
            cols.append((pl.col(keys[0]).hash() if len(keys) == 1 else pl.struct(keys).hash()).alias("__h"))
        self._expr_cache[("partials",)] = (cols, sums)
        return cols, sums

    def _partials(self, d: pl.DataFrame) -> pl.DataFrame:
        """Per group of the batch: ``__cnt``, and per aggregate ``__n{j}`` and the signed sum ``__s{j}`` (with its
        error ``__c{j}`` for floats).

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
            for j in self.floats:
                head = out.get_column(f"__x{j}_0").to_numpy()
                rest = out.get_column(f"__x{j}_1").to_numpy() + out.get_column(f"__x{j}_2").to_numpy()
                total = head + rest
                back = total - head
                err = np.where(np.isfinite(total), (head - (total - back)) + (rest - back), 0.0)
                folded += [pl.Series(f"__s{j}", total, dtype=pl.Float64), pl.Series(f"__c{j}", err, dtype=pl.Float64)]
        return out.select([*keys, *sums]).hstack(folded)

    def _accurate_parts(self, base: pl.DataFrame) -> list[pl.Series]:
        """For each float SUM/AVG, split every row's contribution ``value * multiplicity`` into ``__x{j}_0`` and
        ``__x{j}_1``, whose per-group sums are exact, and ``__x{j}_2``, each below 2^-67 of the group's largest
        contribution for batches up to 10^5 rows (summing those plainly errs by less than 2^-84 of it).

        A plain sum of a batch holding 1e16, 1.0 and -1e16 is 0.0; summed by parts it is 1.0.

        ``base`` has the multiplicity in ``__cnt``, the values in ``__v{i}`` (NULL as 0) and a 64-bit hash of the
        group keys in ``__h``. Elementwise NumPy: the same steps as polars expressions cost several times more on
        a batch of a thousand rows (a fixed cost per expression), and this runs for every batch.
        """
        # Bounds instead of exact counts and maxima: 2 values (product, error) per row of the batch, a factor 2 for
        # a rounded log2, one σ per group for all float aggregates, and level 2's σ from level 1's (everything it
        # splits is ≤ 2^-53 σ1).
        n = base.height
        grow = 2.0 ** (math.ceil(math.log2(2 * n + 2)) + 1)
        mult = base.get_column(CNT).to_numpy().astype(np.float64)
        # value * multiplicity is exact when every multiplicity is ±1 (the usual case): no product errors then
        exact_products = n == 0 or float(np.abs(mult).max()) <= 1.0
        splits = range(len(self._split_source))
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
            levels = {}
            for i in splits:
                q0, r0 = _extract(prods[i], s1, ok)
                q1, r1 = _extract(r0, s2, ok)
                if not exact_products:
                    qe, re = _extract(errs[i], s2, ok)
                    q1, r1 = q1 + qe, r1 + re
                levels[i] = (q0, q1, r1)
        return [pl.Series(f"__x{j}_{level}", levels[i][level], dtype=pl.Float64)
                for j, i in self._split_of.items() for level in range(3)]

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
        upd = self._update_exprs(tuple(f"__c{j}" in partial.columns for j in self.floats), sets_change)
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
        outs = new.select(self._compare_exprs(sets_change))
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
        float aggregate whether the partials carry an error term ``__c{j}``."""
        key = ("update", batch_errors, sets_change)
        if key in self._expr_cache:
            return self._expr_cache[key]
        carried = dict(zip(self.floats, batch_errors))
        upd = [(pl.col(f"{CNT}{OLD}").fill_null(0) + pl.col(CNT).fill_null(0)).alias(CNT)]
        for j, (_, a) in enumerate(self.aggs):
            if a.arg is None:
                continue
            upd.append((pl.col(f"__n{j}{OLD}").fill_null(0) + pl.col(f"__n{j}").fill_null(0)).alias(f"__n{j}"))
            if a.func in ("sum", "avg"):
                s, ds = pl.col(f"__s{j}{OLD}"), pl.col(f"__s{j}")
                if j in self.floats:
                    # Neumaier: carry the rounding error of every batch addition in __c, with the batch's own
                    # error term (a partial from a backend that sums plainly has none)
                    s0, d0 = s.fill_null(0.0), ds.fill_null(0.0)
                    dc = pl.col(f"__c{j}").fill_null(0.0) if carried[j] else pl.lit(0.0)
                    t = s0 + d0
                    err = pl.when(s0.abs() >= d0.abs()).then((s0 - t) + d0).otherwise((d0 - t) + s0)
                    err = pl.when(t.is_finite()).then(err).otherwise(0.0)
                    upd.append(t.alias(f"__s{j}"))
                    upd.append((pl.col(f"__c{j}{OLD}").fill_null(0.0) + err + dc).alias(f"__c{j}"))
                else:
                    zero = pl.lit(0).cast(_acc_dtype(a.arg.dtype))
                    upd.append((s.fill_null(zero) + ds.fill_null(zero)).alias(f"__s{j}"))
            if a.func in ("min", "max"):
                upd.append(pl.col(f"__m{j}{OLD}").alias(f"__m{j}"))
        if not sets_change:  # every touched group keeps its sketch
            upd.append(pl.col(f"{SET}{OLD}").fill_null(pl.lit([], dtype=SET_DTYPE)).alias(SET))
        self._expr_cache[key] = upd
        return upd

    def _compare_exprs(self, sets_change: bool) -> list[pl.Expr]:
        """Per touched group: keys, old values ``__o{k}``, new values, both sketches, whether the group existed
        (``__had``) and exists (``__alive``), and whether its output row is unchanged (``__same``)."""
        key = ("compare", sets_change)
        if key not in self._expr_cache:
            old_vals = self.output_exprs(OLD, value_names=True)
            new_vals = self.output_exprs(value_names=True)
            same = pl.lit(True)
            for o, n in zip(old_vals, new_vals):
                same = same & o.eq_missing(n)
            if sets_change:
                same = same & pl.col(SET).eq_missing(pl.col(f"{SET}{OLD}"))
            self._expr_cache[key] = [
                *[pl.col(n) for n, _ in self.keys],
                *[o.alias(f"__o{k}") for k, o in enumerate(old_vals)], *new_vals, pl.col(f"{SET}{OLD}"),
                pl.col(SET), pl.col(ROW).is_not_null().alias("__had"),
                (pl.lit(True) if self.global_agg else pl.col(CNT) > 0).alias("__alive"), same.alias("__same")]
        return self._expr_cache[key]

    def _emit_exprs(self) -> tuple[list[pl.Expr], list[pl.Expr]]:
        """The ``Δ−`` rows (old values) and ``Δ+`` rows (new values) from ``_compare_exprs``' frame."""
        key = ("emit",)
        if key not in self._expr_cache:
            keys = [pl.col(n) for n, _ in self.keys]
            self._expr_cache[key] = (
                [*keys, *[pl.col(f"__o{k}").alias(n) for k, (n, _) in enumerate(self.aggs)],
                 pl.lit(-1, dtype=pl.Int64).alias(MULT), pl.col(f"{SET}{OLD}").alias(SET)],
                [*keys, *[pl.col(n) for n, _ in self.aggs], pl.lit(1, dtype=pl.Int64).alias(MULT), pl.col(SET)])
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
            new = (new.join(ext, on=keys, how="left", nulls_equal=True)
                   .with_columns(pl.col(f"__m{j}_new").alias(f"__m{j}")).drop(f"__m{j}_new"))
        return new

    def _out_names(self) -> list[str]:
        return [n for n, _ in self.keys] + [n for n, _ in self.aggs]

    def _empty_output(self) -> pl.DataFrame:
        schema: dict[str, pl.DataType] = {n: self.key_types[n] for n, _ in self.keys}
        for name, a in self.aggs:
            schema[name] = polars_type(a.dtype)
        return pl.DataFrame(schema={**schema, MULT: pl.Int64, SET: SET_DTYPE})

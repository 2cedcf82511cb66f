"""The partial-aggregate layout of an aggregation, as data: which accumulator columns exist, their types, and what
each row contributes to them.

An aggregation's state and every batch it folds in share one layout (``PartialLayout``): per group, the row count
and, per aggregate, accumulator columns each of which adds up one ``Term`` of the group's rows times their
multiplicity. Backends compile the layout (the Spark backend maps every ``Term`` to a Spark column); the engine
computes it with polars for deltas, with exact float sums (``imp_core.engine.exact_sum``). See
docs/ARCHITECTURE.md, "Operators".
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple

import numpy as np
import polars as pl
import pyarrow as pa

from imp_core.engine import frames
from imp_core.engine.annotation import FRAG_DTYPE, SMALL_BATCH, pairs_lazy
from imp_core.engine.decimal_sums import is_wide
from imp_core.engine.decimal_sums import split as split_decimal
from imp_core.engine.dense_keys import compact, key_values
from imp_core.engine.evaluate import compile_expr, polars_type
from imp_core.engine.exact_sum import fold_levels, split_contributions
from imp_core.engine.float_keys import float_order_key, nan_free, normalize_float
from imp_core.engine.order_dependence import rounding_bound
from imp_core.engine.schema import COUNT, FRAG, GROUP_ROWS, MULT, NO_GROUP, SET, VALUE, is_annotation, nan_flag
from imp_core.engine.slot_columns import numpy_layout, take
from imp_core.plan.expr import AggCall, Expr, Func

Frame = pl.DataFrame | pl.LazyFrame


class Term(enum.Enum):
    """What one row contributes to an accumulator column, before it is multiplied by the row's multiplicity."""

    ROWS = "rows"  # 1: the group's row count
    NON_NULL = "non_null"  # 1 where the argument is not NULL
    NAN = "nan"  # 1 where the float argument is NaN
    POS_INF = "pos_inf"  # 1 where it is +inf
    NEG_INF = "neg_inf"  # 1 where it is -inf
    FINITE = "finite"  # the float argument where finite (0 otherwise), summed exactly, with a compensation column
    FINITE_ABS = "finite_abs"  # its absolute value, likewise (the interval of an order-dependent sum needs it)
    WRAPPED = "wrapped"  # the integer argument as BIGINT: the sum wraps around like Spark's (non-ANSI) bigint SUM
    EXACT = "exact"  # the argument as DECIMAL(38, s): an exact sum
    EXACT_ABS = "exact_abs"  # its absolute value as DECIMAL(38, s)
    WIDE_LOW = "wide_low"  # a wide decimal's digits below 10^20 units (``decimal_sums.split``), DECIMAL(38, s)
    WIDE_HIGH = "wide_high"  # its count of 10^20 units, DECIMAL(38, 0): the sum may leave 38 digits and come back
    ROUNDING = "rounding"  # not a row's term: what a plain summation rounded away (``order_dependence.grown_bound``)


COUNTS = (Term.ROWS, Term.NON_NULL, Term.NAN, Term.POS_INF, Term.NEG_INF)
DECIMAL_TERMS = (Term.EXACT, Term.EXACT_ABS, Term.WIDE_LOW, Term.WIDE_HIGH)


@dataclass(frozen=True)
class Accumulator:
    """One accumulator column: ``name`` adds up ``term`` of aggregate ``agg``'s argument (None: of the row) times
    the multiplicity. A ``FINITE``/``FINITE_ABS`` sum has a ``compensation`` column next to it in the state (and in
    partials that carry their error term)."""

    name: str
    term: Term
    agg: int | None
    dtype: pl.DataType
    compensation: str | None = None



class AggColumns(NamedTuple):
    """The state columns of aggregate j: its non-NULL count, its sum with the sum's compensation term, Σ|x| with
    its compensation (for the interval of an order-dependent sum), the current MIN/MAX, the float argument's
    NaN, +inf and -inf counts, the error bound of an order-dependent sum (what plain summations rounded away),
    and a wide decimal sum's high part (``decimal_sums``)."""

    non_null: str
    sum: str
    compensation: str
    abs_sum: str
    abs_compensation: str
    extreme: str
    nan: str
    pos_inf: str
    neg_inf: str
    bound: str
    carry: str


class Rounding(NamedTuple):
    """What a backend that sums an order-dependent float aggregate plainly reports besides its accumulators, per
    group: ``terms`` the number of finite terms it added (Σ|m|), ``magnitude`` their Σ|x·m|; ``bound`` is the
    state's error-bound column they give (``order_dependence.rounding_bound``)."""

    agg: int
    bound: str
    terms: str
    magnitude: str


def agg_columns(j: int) -> AggColumns:
    return AggColumns(*(f"__{prefix}{j}" for prefix in ("n", "s", "c", "a", "ac", "m", "nan", "inf", "ninf", "e",
                                                         "ov")))

def accumulator_type(a: AggCall) -> pl.DataType:
    """The accumulator of a SUM/AVG: Int64 (wrapping like Spark's bigint SUM), DECIMAL(38, 0) for an integer AVG
    (exact), DECIMAL(38, s), or Float64 (finite part, with a compensation term)."""
    assert a.arg is not None
    t = a.arg.dtype
    if pa.types.is_integer(t):
        return pl.Decimal(38, 0) if a.func == "avg" else pl.Int64()
    if pa.types.is_decimal(t):
        return pl.Decimal(38, t.scale)
    return pl.Float64()


def is_wide_sum(a: AggCall) -> bool:
    """Whether a SUM/AVG keeps its sum in two parts (its DECIMAL argument's sum can leave 38 digits)."""
    return a.arg is not None and a.func in ("sum", "avg") and not a.distinct and is_wide(a.arg.dtype)


def _accumulators(j: int, a: AggCall, bounded: bool) -> list[Accumulator]:
    if a.arg is None:
        return []
    cols = agg_columns(j)
    out = [Accumulator(cols.non_null, Term.NON_NULL, j, pl.Int64())]
    if a.func not in ("sum", "avg") or a.distinct:  # a DISTINCT aggregate's value comes from its value counts
        return out
    acc = accumulator_type(a)
    if acc == pl.Float64:
        out.append(Accumulator(cols.sum, Term.FINITE, j, pl.Float64(), cols.compensation))
        out += [Accumulator(cols.nan, Term.NAN, j, pl.Int64()), Accumulator(cols.pos_inf, Term.POS_INF, j, pl.Int64()),
                Accumulator(cols.neg_inf, Term.NEG_INF, j, pl.Int64())]
        if bounded:
            out.append(Accumulator(cols.abs_sum, Term.FINITE_ABS, j, pl.Float64(), cols.abs_compensation))
            out.append(Accumulator(cols.bound, Term.ROUNDING, j, pl.Float64()))
    elif acc == pl.Int64:
        out.append(Accumulator(cols.sum, Term.WRAPPED, j, acc))
    elif is_wide_sum(a):
        out += [Accumulator(cols.sum, Term.WIDE_LOW, j, acc),
                Accumulator(cols.carry, Term.WIDE_HIGH, j, pl.Decimal(38, 0))]
    else:
        out.append(Accumulator(cols.sum, Term.EXACT, j, acc))
        if bounded:  # Σ|x| of an integer AVG (exact: |−2^63| does not fit a bigint)
            out.append(Accumulator(cols.abs_sum, Term.EXACT_ABS, j, acc))
    return out


@dataclass
class Partials:
    """A batch (or a capture's whole input) folded per group: ``groups`` (state keys, ``__cnt`` and accumulator
    columns), ``fragments`` (changes of ``F_g``: state keys, ``__frag``, ``__n``) and, per MIN/MAX and DISTINCT
    aggregate, ``values`` (value-count changes: state keys, ``__v``, ``__n``). ``groups`` and ``fragments`` may be
    lazy."""

    groups: Frame
    fragments: Frame
    values: dict[int, pl.DataFrame] = field(default_factory=dict)
    fragment_rows: np.ndarray | None = None  # per ``fragments`` row, its group's row in ``groups`` (when known)


class PartialLayout:
    """The layout of one aggregation's groups: state key columns and accumulator columns.

    Float GROUP BY keys are stored NaN-free (``imp_core.engine.float_keys``); without GROUP BY there is one group
    with the constant key ``__gk``. ``bounded`` are the aggregates whose interval an operator above reads;
    ``guarded`` the wide decimal sums whose Σ|x| the state keeps, as hidden aggregates after ``aggs`` (``guards``).
    """

    def __init__(self, keys: tuple[tuple[str, Expr], ...], aggs: tuple[tuple[str, AggCall], ...],
                 key_types: dict[str, pl.DataType], bounded: frozenset[int] = frozenset(),
                 guarded: frozenset[int] = frozenset()) -> None:
        self.keys = keys
        # per guarded wide decimal sum j, the hidden aggregate SUM(ABS(x)) that keeps its Σ|x| (``running_sums``)
        self.guards = {j: len(aggs) + k for k, j in enumerate(sorted(guarded))}
        hidden = tuple((f"__abs{j}", AggCall("sum", Func("abs", (arg,)))) for j in sorted(guarded)
                       if (arg := aggs[j][1].arg) is not None)
        self.aggs = aggs = aggs + hidden
        self.float_keys = [n for n, _ in keys if key_types[n] in (pl.Float32, pl.Float64)]
        self.plain_keys = [n for n, _ in keys] if keys else [NO_GROUP]
        self.key_names = [*self.plain_keys, *[nan_flag(n) for n in self.float_keys]]
        self.key_types: dict[str, pl.DataType] = ({**key_types, **{nan_flag(n): pl.Boolean() for n in self.float_keys}}
                                                  if keys else {NO_GROUP: pl.Int8()})
        self.minmax = [j for j, (_, a) in enumerate(aggs) if a.func in ("min", "max")]
        self.distinct = [j for j, (_, a) in enumerate(aggs) if a.distinct]
        self.valued = sorted([*self.minmax, *self.distinct])  # the aggregates whose value counts are kept
        # per valued aggregate, the first one over the same argument: their value counts are the same (one is
        # computed per argument, and the multisets share it where they can, ``distinct_values.value_multisets``)
        self.value_owner: dict[int, int] = {}
        for j in self.valued:
            arg = aggs[j][1].arg
            self.value_owner[j] = next(o for o in self.valued if aggs[o][1].arg == arg and (
                self.value_type(o) == self.value_type(j)) and self.float_values(o) == self.float_values(j))
        self.accumulators = [Accumulator(GROUP_ROWS, Term.ROWS, None, pl.Int64())]
        for j, (_, a) in enumerate(aggs):
            self.accumulators += _accumulators(j, a, j in bounded)

    def of_agg(self, j: int) -> list[Accumulator]:
        return [c for c in self.accumulators if c.agg == j]

    @cached_property
    def roundings(self) -> list[Rounding]:
        """The order-dependent float aggregates whose state keeps an error bound, with the columns a backend that
        sums plainly reports for it."""
        return [Rounding(c.agg, c.name, f"__rn{c.agg}", f"__ra{c.agg}") for c in self.accumulators
                if c.term is Term.ROUNDING and c.agg is not None]

    @cached_property
    def wide(self) -> list[int]:
        """The aggregates whose decimal sum is kept in two parts (``decimal_sums``)."""
        return sorted({c.agg for c in self.accumulators if c.term is Term.WIDE_HIGH and c.agg is not None})

    def arg_scale(self, c: Accumulator) -> int | None:
        """The scale of a wide decimal accumulator's argument (None for other accumulators)."""
        return self.scale_of(c.agg) if c.term in (Term.WIDE_LOW, Term.WIDE_HIGH) and c.agg is not None else None

    def scale_of(self, j: int) -> int:
        """The scale of decimal aggregate ``j``'s argument."""
        arg = self.aggs[j][1].arg
        assert arg is not None
        return int(arg.dtype.scale)

    @property
    def compensated(self) -> list[Accumulator]:
        """The exactly summed float accumulators (each with a compensation column)."""
        return [c for c in self.accumulators if c.compensation is not None]

    def float_values(self, j: int) -> bool:
        """Whether MIN/MAX or DISTINCT ``j`` is over floats (its multiset keeps them as order keys)."""
        arg = self.aggs[j][1].arg
        return arg is not None and polars_type(arg.dtype) == pl.Float64

    def value_type(self, j: int) -> pl.DataType:
        """The type of MIN/MAX or DISTINCT ``j``'s multiset values."""
        arg = self.aggs[j][1].arg
        assert arg is not None
        return pl.Int64() if self.float_values(j) else polars_type(arg.dtype)

    def shared_values(self, owned: dict[int, pl.DataFrame]) -> dict[int, pl.DataFrame]:
        """Value counts per valued aggregate from those of each argument's first aggregate (the same frame)."""
        return {j: owned[self.value_owner[j]] for j in self.valued}

    # -- plain values (a backend's output) in the state's layout ----------------------------------------------------

    def encode_keys(self, frame: pl.DataFrame) -> pl.DataFrame:
        """A frame with the plain key columns cast to the state's key types and float keys NaN-free."""
        casts = {k: self.key_types[k] for k in self.plain_keys if frame.schema[k] != self.key_types[k]}
        frame = frame.cast(casts, strict=False) if casts else frame  # type: ignore[arg-type]
        if not self.float_keys:
            return frame
        return frame.with_columns([x for n in self.float_keys for x in nan_free(pl.col(n), n)])

    def encode_values(self, j: int, vals: pl.DataFrame) -> pl.DataFrame:
        """MIN/MAX or DISTINCT value counts (``__v`` plain values) in the multiset's layout (doubles as order
        keys: -0.0 = 0.0 and one NaN, as Spark's DISTINCT and grouping see them)."""
        if not self.float_values(j):
            return vals
        v = vals.get_column(VALUE).cast(pl.Float64).to_numpy()
        return vals.with_columns(pl.Series(VALUE, float_order_key(v), dtype=pl.Int64))

    def from_grouped(self, rows: pl.DataFrame, fragment_columns: list[str],
                     values: dict[int, pl.DataFrame]) -> Partials:
        """Partials from rows a backend grouped by (state keys, fragment columns) with the accumulator columns
        summed plainly: each order-dependent float aggregate's ``Rounding`` columns (its terms and their Σ|x·m|) give
        its error bound, which covers that backend's additions and these."""
        keys = self.key_names
        helpers = [x for r in self.roundings for x in (r.terms, r.magnitude)]
        missing = [h for h in helpers if h not in rows.columns]
        if missing:
            raise ValueError(f"partials summed plainly lack their rounding columns {missing}")
        summed = [c.name for c in self.accumulators if c.name in rows.columns] + helpers
        groups = rows.group_by(keys).agg([pl.col(c).sum() for c in summed])
        if self.roundings:
            groups = groups.with_columns([rounding_bound(pl.col(r.terms), pl.col(r.magnitude)).alias(r.bound)
                                          for r in self.roundings]).drop(helpers)
        parts = [rows.select([*keys, pl.col(c).cast(FRAG_DTYPE).alias(FRAG), pl.col(GROUP_ROWS).alias(COUNT)])
                 .filter(pl.col(FRAG).is_not_null()) for c in fragment_columns]  # NULL: a union row without scan c
        if parts:
            fragments = pl.concat(parts).group_by([*keys, FRAG]).agg(pl.col(COUNT).sum())
        else:
            fragments = pl.DataFrame(schema={**{k: self.key_types[k] for k in keys}, FRAG: FRAG_DTYPE,
                                             COUNT: pl.Int64})
        return Partials(groups, fragments, values)

    # -- partials of an annotated delta, with polars --------------------------------------------------------------

    @cached_property
    def _inputs(self) -> list[pl.Expr]:
        """The state keys and every aggregate's argument (``__arg{j}``) of a delta row."""
        if self.keys:
            keys = [x for n, e in self.keys for x in
                    (nan_free(compile_expr(e), n) if n in self.float_keys else [compile_expr(e).alias(n)])]
        else:
            keys = [pl.lit(0, dtype=pl.Int8).alias(NO_GROUP)]
        args = []
        for j, (_, a) in enumerate(self.aggs):
            if a.arg is None:
                continue
            x = compile_expr(a.arg)
            if j in self.valued and self.float_values(j):
                x = normalize_float(x)
            args.append(x.alias(f"__arg{j}"))
        return keys + args

    @cached_property
    def _input_exprs(self) -> frames.Exprs:
        return frames.Exprs(self._inputs)

    @cached_property
    def _sources(self) -> tuple[list[tuple[int, Term]], dict[str, int]]:
        """The distinct exactly summed float sources (the aggregate whose argument is read, and the term), and the
        source each compensated accumulator adds up: SUM(x) and AVG(x) share the split of x."""
        distinct: list[tuple[Expr | None, Term]] = []
        sources: list[tuple[int, Term]] = []
        source_of: dict[str, int] = {}
        for c in self.compensated:
            assert c.agg is not None
            key = (self.aggs[c.agg][1].arg, c.term)
            if key not in distinct:
                distinct.append(key)
                sources.append((c.agg, c.term))
            source_of[c.name] = distinct.index(key)
        return sources, source_of

    @cached_property
    def _row_terms(self) -> tuple[list[pl.Expr], list[str]]:
        """Per-row terms of the partial aggregates (computed before the group-by, so it only adds columns up: polars
        evaluates any other expression inside an aggregation once per group), and the names it adds up."""
        m = pl.col(MULT)
        cols = [*[pl.col(k) for k in self.key_names]]
        sums = []
        for c in self.accumulators:
            if c.compensation is not None:
                continue
            arg = pl.col(f"__arg{c.agg}")
            x = arg.cast(pl.Float64)
            term = {Term.ROWS: m,
                    Term.NON_NULL: pl.when(arg.is_not_null()).then(m).otherwise(0),
                    Term.NAN: pl.when(x.is_nan()).then(m).otherwise(0),
                    Term.POS_INF: pl.when(x == float("inf")).then(m).otherwise(0),
                    Term.NEG_INF: pl.when(x == float("-inf")).then(m).otherwise(0),
                    Term.ROUNDING: pl.lit(0.0)}.get(c.term)  # the engine's own sums are exact
            if c.term in (Term.WIDE_LOW, Term.WIDE_HIGH):
                assert c.agg is not None
                low, high = split_decimal(arg, self.scale_of(c.agg))
                term = (low if c.term is Term.WIDE_LOW else high) * m.cast(c.dtype)
            if term is None:  # WRAPPED, EXACT, EXACT_ABS: in the accumulator's own type
                v = arg.cast(c.dtype)
                term = (v.abs() if c.term == Term.EXACT_ABS else v) * m.cast(c.dtype)
            cols.append(term.alias(c.name))
            sums.append(c.name)
        if self.compensated:
            # NULL, NaN and ±inf contribute nothing to the finite part (they are counted apart)
            for i, (j, kind) in enumerate(self._sources[0]):
                x = pl.col(f"__arg{j}").cast(pl.Float64)
                x = pl.when(x.is_finite()).then(x.abs() if kind == Term.FINITE_ABS else x).otherwise(0.0)
                cols.append(x.fill_null(0.0).alias(f"__v{i}"))
            keys = self.key_names
            cols.append((pl.col(keys[0]).hash() if len(keys) == 1 else pl.struct(keys).hash()).alias("__h"))
        return cols, sums

    def of_delta(self, delta: pl.DataFrame, numpy: bool = False) -> Partials:
        """Fold an annotated delta per group; ``numpy``: with NumPy where the layout allows (``_folded``), for a
        batch above ``SMALL_BATCH`` rows only where its groups are numbered without a sort (a compact key)."""
        keys = self.key_names
        d = self._input_exprs.with_columns(delta)
        owned = {j: self.encode_values(j, d.select([*keys, pl.col(f"__arg{j}").alias(VALUE), MULT])
                                       .filter(pl.col(VALUE).is_not_null())
                                       .group_by([*keys, VALUE]).agg(pl.col(MULT).sum().alias(COUNT)))
                 for j in self.valued if self.value_owner[j] == j}
        values = self.shared_values(owned)
        folded = self._folded(d, sort=d.height <= SMALL_BATCH) if numpy and self._numpy_terms else None
        if folded is not None:
            groups, fragments, rows = folded
            return Partials(groups, fragments, values, rows)
        fragments = (pairs_lazy(d.lazy(), keys).group_by([*keys, FRAG])
                     .agg(pl.col(MULT).sum().alias(COUNT)).collect(engine="in-memory"))
        return Partials(self._groups_of(d), fragments, values)

    @cached_property
    def _numpy_terms(self) -> bool:
        """Whether every accumulator's term can be summed in NumPy (no DECIMAL sums)."""
        return all(c.term not in DECIMAL_TERMS for c in self.accumulators)

    def _folded(self, d: pl.DataFrame, sort: bool = True) -> tuple[pl.DataFrame, pl.DataFrame, np.ndarray] | None:
        """The batch's partials with NumPy (a polars group-by costs ~0.6 ms on a small batch, NumPy ~0.05 ms): the
        groups, the ``F_g`` changes and each change's group row; None when the batch does not allow it (a key
        that is not integer-like, a row with a fragment set, or groups that need a sort to number when ``sort`` is
        False). Same sums as ``_groups_of``: the exact float levels add up in any order, and integer sums wrap like
        polars'."""
        keys = self.key_names
        columns = [d.get_column(k) for k in keys]
        frag_cols = [c for c in d.columns if is_annotation(c)]
        if not all(_integer_like(s.dtype) for s in columns) or any(
                c == SET or d.get_column(c).null_count() for c in frag_cols):
            return None
        numbered = group_ids(columns, sort)
        if numbered is None:
            return None
        inv, first = numbered
        n = int(first.size)
        m = d.get_column(MULT).to_numpy().astype(np.int64, copy=False)
        out = [take(s, first) for s in columns]
        args = _Arguments(d)
        for c in self.accumulators:
            if c.term is Term.ROUNDING:  # exact sums round nothing away
                out.append(frames.series(c.name, np.zeros(n), pl.Float64()))
            elif c.compensation is None:
                total = np.zeros(n, dtype=np.int64)
                if c.term not in _SPECIAL or not args.all_finite(c.agg):
                    np.add.at(total, inv, args.term(c, m))
                out.append(frames.series(c.name, total, c.dtype))
        if self.compensated:
            sources, source_of = self._sources
            values = []
            for j, term in sources:
                x = args.floats(j)
                with np.errstate(invalid="ignore"):
                    values.append(np.where(np.isfinite(x), np.abs(x) if term == Term.FINITE_ABS else x, 0.0))
            levels = [[np.bincount(inv, weights=x, minlength=n) for x in parts]
                      for parts in split_contributions(values, m, inv, dense=True)]
            for c in self.compensated:
                head, mid, low = levels[source_of[c.name]]
                total, err = fold_levels(head, mid + low)
                assert c.compensation is not None
                out += [frames.series(c.name, total, pl.Float64()), frames.series(c.compensation, err, pl.Float64())]
        groups = frames.frame(out)

        fragments, rows = _fragment_pairs(d, frag_cols, inv, m, [groups.get_column(k) for k in keys])
        return groups, fragments, rows

    def _groups_of(self, d: pl.DataFrame) -> pl.DataFrame:
        keys = self.key_names
        cols, sums = self._row_terms
        base = d.select(cols)
        if not self.compensated:
            return base.group_by(keys).agg([pl.col(c).sum() for c in sums])
        sources, source_of = self._sources
        ids = _compact_ids(base, keys)  # the groups themselves as ids 0.., where a key allows: no sort to number them
        split = split_contributions([base.get_column(f"__v{i}").to_numpy() for i in range(len(sources))],
                                    base.get_column(GROUP_ROWS).to_numpy(),
                                    base.get_column("__h").to_numpy() if ids is None else ids, dense=ids is not None)
        levels = [pl.Series(f"__x{i}_{level}", x, dtype=pl.Float64)
                  for i, parts in enumerate(split) for level, x in enumerate(parts)]
        out = base.hstack(levels).group_by(keys).agg([pl.col(c).sum() for c in [*sums, *(s.name for s in levels)]])
        folded = []
        for c in self.compensated:
            i = source_of[c.name]
            head = out.get_column(f"__x{i}_0").to_numpy()
            rest = out.get_column(f"__x{i}_1").to_numpy() + out.get_column(f"__x{i}_2").to_numpy()
            total, err = fold_levels(head, rest)
            folded += [pl.Series(c.name, total, dtype=pl.Float64),
                       pl.Series(c.compensation, err, dtype=pl.Float64)]
        return out.select([*keys, *sums]).hstack(folded)


_SPECIAL = (Term.NAN, Term.POS_INF, Term.NEG_INF)  # counters of values that are not finite


class _Arguments:
    """A batch's aggregate arguments (``__arg{j}``) as NumPy arrays, each with its validity, read once."""

    def __init__(self, d: pl.DataFrame) -> None:
        self.d = d
        self.read: dict[int, tuple[pl.Series, np.ndarray]] = {}
        self.as_floats: dict[int, np.ndarray] = {}
        self.finite: dict[int, bool] = {}

    def arg(self, j: int | None) -> tuple[pl.Series, np.ndarray]:
        assert j is not None
        if j not in self.read:
            a = self.d.get_column(f"__arg{j}")
            self.read[j] = a, (~a.is_null().to_numpy() if a.null_count() else np.ones(a.len(), dtype=bool))
        return self.read[j]

    def floats(self, j: int | None) -> np.ndarray:
        """Argument ``j`` as doubles, 0 where NULL."""
        assert j is not None
        if j not in self.as_floats:
            a, valid = self.arg(j)
            with np.errstate(invalid="ignore"):
                self.as_floats[j] = np.where(valid, a.cast(pl.Float64).to_numpy(), 0.0)
        return self.as_floats[j]

    def all_finite(self, j: int | None) -> bool:
        """Whether no value of argument ``j`` is NaN or infinite (then its NaN/infinity counters add nothing)."""
        assert j is not None
        if j not in self.finite:
            self.finite[j] = bool(np.isfinite(self.floats(j)).all())
        return self.finite[j]

    def term(self, c: Accumulator, m: np.ndarray) -> np.ndarray:
        """What each row adds to accumulator ``c`` (not a compensated one): its ``Term`` times the multiplicity."""
        if c.term == Term.ROWS:
            return m
        a, valid = self.arg(c.agg)
        if c.term == Term.NON_NULL:
            return np.where(valid, m, 0)
        if c.term == Term.WRAPPED:
            ints = a.cast(pl.Int64)
            return (ints.fill_null(0) if ints.null_count() else ints).to_numpy() * m
        x = self.floats(c.agg)
        with np.errstate(invalid="ignore"):
            hit = {Term.NAN: np.isnan(x), Term.POS_INF: x == np.inf, Term.NEG_INF: x == -np.inf}[c.term]
        return np.where(valid & hit, m, 0)


def _fragment_pairs(d: pl.DataFrame, frag_cols: list[str], inv: np.ndarray, m: np.ndarray,
                    keys: list[pl.Series]) -> tuple[pl.DataFrame, np.ndarray]:
    """``F_g`` changes of a batch: its (group, fragment) pairs over every fragment column, counted (``keys``: the
    groups' key columns), and each change's group row; in (group, fragment) order."""
    groups, mult = np.tile(inv, len(frag_cols)), np.tile(m, len(frag_cols))
    frags = np.concatenate([d.get_column(c).to_numpy() for c in frag_cols]).astype(np.uint64) if frag_cols else \
        np.zeros(0, dtype=np.uint64)
    g_bits = int(groups.max()).bit_length() if groups.size else 0
    f_bits = max(int(frags.max()).bit_length() if frags.size else 0, 1)
    r_bits = max(groups.size.bit_length(), 1)
    if g_bits + f_bits + r_bits <= 64:
        # one sort of (group, fragment, row) packed in a word: the pairs in order with their rows, no argsort
        packed = (groups.astype(np.uint64) << np.uint64(f_bits + r_bits)) | (frags << np.uint64(r_bits)) | \
            np.arange(groups.size, dtype=np.uint64)
        packed.sort()
        pair = packed >> np.uint64(r_bits)
        starts = np.flatnonzero(np.concatenate([[True], pair[1:] != pair[:-1]])) if pair.size else _NO_ROWS
        counts = np.add.reduceat(mult[(packed & np.uint64((1 << r_bits) - 1)).astype(np.intp)], starts) \
            if starts.size else np.zeros(0, dtype=np.int64)
        unique, shift = pair[starts], f_bits
    else:
        unique, at = np.unique((groups.astype(np.uint64) << np.uint64(32)) | frags, return_inverse=True)
        counts = np.zeros(unique.size, dtype=np.int64)
        np.add.at(counts, at.reshape(-1), mult)
        shift = 32
    rows = (unique >> np.uint64(shift)).astype(np.int64)
    fragments = frames.frame([*[take(s, rows) for s in keys],
                              frames.series(FRAG, (unique & np.uint64((1 << shift) - 1)).astype(np.uint32),
                                            FRAG_DTYPE),
                              frames.series(COUNT, counts.astype(np.int64, copy=False), pl.Int64())])
    return fragments, rows


_NO_ROWS = np.zeros(0, dtype=np.intp)


def _compact_ids(d: pl.DataFrame, keys: list[str]) -> np.ndarray | None:
    """Each row's group as ``key - smallest key`` for one integer-like key without NULL over a compact range (as the
    dense key table takes), else None. Equal keys get equal ids and distinct keys distinct ones, as numbering the
    groups by a sort would give, without the sort."""
    return _key_offsets(d.get_column(keys[0])) if len(keys) == 1 else None


def _key_offsets(s: pl.Series) -> np.ndarray | None:
    """A key column's values minus the smallest, where it has no NULL, is integer-like and spans a compact range
    (``dense_keys.compact``); else None."""
    values = key_values(s)
    if values is None or not values.size:
        return None
    lo, hi = int(values.min()), int(values.max())
    return values - lo if compact(lo, hi, values.size) else None


def _integer_like(dtype: pl.DataType) -> bool:
    """Whether a column's values are told apart by their physical integers (NULL apart)."""
    return numpy_layout(dtype) and not dtype.is_float()


def group_ids(columns: list[pl.Series], sort: bool = True) -> tuple[np.ndarray, np.ndarray] | None:
    """Each row's group (0 .. g-1, in key order) over integer-like key columns, and a row of each group. One key
    without NULL over a compact range is numbered by counting its values; other keys by NumPy's sort (which beats a
    polars group-by on a few thousand rows), or None when ``sort`` is False. NULL is a key value of its own."""
    offsets = _key_offsets(columns[0]) if len(columns) == 1 else None
    if offsets is not None:
        present = np.bincount(offsets) > 0
        inv = (np.cumsum(present) - 1)[offsets]
        any_row = np.empty(int(np.count_nonzero(present)), dtype=np.int64)
        any_row[inv] = np.arange(inv.size)  # every row of a group holds its key: any one will do
        return inv, any_row
    if not sort:
        return None
    arrays = []
    for s in columns:
        if s.null_count():
            arrays.append(s.is_null().to_numpy())
            s = s.to_physical().fill_null(False if s.dtype == pl.Boolean else 0)
        values = s.to_numpy()
        arrays.append(values.view(np.int64) if values.dtype.kind in "mM" else values)
    if len(arrays) == 1:
        _, first, inv = np.unique(arrays[0], return_index=True, return_inverse=True)
        return inv.reshape(-1), first
    order = np.lexsort(arrays[::-1])
    starts = np.zeros(order.size, dtype=bool)
    starts[:1] = True
    for a in arrays:
        ordered = a[order]
        starts[1:] |= ordered[1:] != ordered[:-1]
    inv = np.empty(order.size, dtype=np.int64)
    inv[order] = np.cumsum(starts) - 1
    return inv, order[starts]


__all__ = ["COUNTS", "DECIMAL_TERMS", "Accumulator", "AggColumns", "PartialLayout", "Partials", "Rounding", "Term",
           "accumulator_type", "agg_columns", "group_ids", "is_wide_sum"]

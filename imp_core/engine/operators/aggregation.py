"""Aggregation (paper 5.2.5-6): SUM, COUNT, COUNT(*), AVG, MIN, MAX, COUNT/SUM(DISTINCT), with or without GROUP BY.

Values follow Spark (docs/SEMANTICS.md, "Aggregates, grouping and ordering"); see docs/ARCHITECTURE.md, "Operators"
and "Cost of a batch".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from imp_core.engine import decimal_sums, frames, kernels
from imp_core.engine.annotation import FRAG_DTYPE, SET_DTYPE
from imp_core.engine.evaluate import polars_type
from imp_core.engine.exact_sum import neumaier
from imp_core.engine.float_keys import from_nan_free
from imp_core.engine.keyed import KeyIndex, PairCounts, lists_by_slot
from imp_core.engine.operators import group_rows, small_batch
from imp_core.engine.operators.base import OutputStateOperator
from imp_core.engine.operators.context import BuildContext
from imp_core.engine.operators.distinct_values import state_names, stored, value_multisets
from imp_core.engine.operators.minmax import ValueMultiset
from imp_core.engine.operators.minmax_keyed import SLOT, KeyedValueMultiset
from imp_core.engine.operators.partials import DECIMAL_TERMS, PartialLayout, Partials, Term, agg_columns
from imp_core.engine.operators.sum_state import LAYOUT, canonical_groups, check_layout, wide_normalized
from imp_core.engine.order_dependence import grown_bound, is_order_dependent, sum_interval
from imp_core.engine.running_sums import is_order_dependent_decimal, order_dependent
from imp_core.engine.schema import COUNT, FRAG, GROUP_ROWS, MULT, NO_GROUP, ROW, SET, hi_name, lo_name
from imp_core.engine.slot_columns import SlotColumns, nullable_index
from imp_core.engine.state import Parts, Rows
from imp_core.errors import StateError
from imp_core.plan.expr import AggCall, Expr
from imp_core.plan.nodes import Aggregate, Plan

OLD = "__old"  # suffix of a group's state before the batch, next to its new state
NAN = float("nan")
INT53 = float(2 ** 53)  # integers up to this add up exactly in double, in any order


def _untouched(height: int, rows: pl.Series) -> pl.Series:
    """A mask over ``height`` state rows: False at the (non-null) indices in ``rows``."""
    mask = np.ones(height, dtype=bool)
    mask[rows.drop_nulls().to_numpy()] = False
    return pl.Series(mask)


class Aggregation(OutputStateOperator):
    """γ over annotated deltas. State per group ``g`` (the paper's ``S[g] = (SUM, CNT, P, F_g)``), as frames:

    * ``groups``: the state keys, the accumulators of ``layout`` (``PartialLayout``), per MIN/MAX the current
      extreme ``__m{j}``, and the group's sketch ``__sk`` (``{ρ | F_g[ρ] > 0}``);
    * ``group_fragments``: ``F_g`` as rows (state keys, ``__frag``, ``__n``), saved as frame ``fcounts``;
    * ``multisets[j]``: per MIN/MAX and DISTINCT aggregate the group's value counts (``minmax.py``,
      ``minmax_keyed.py``, ``distinct_values.py``), saved as ``mm{j}`` (and ``mmb{j}``); a DISTINCT aggregate's
      value sits in ``__m{j}``.

    A batch is folded per group first, so each changed group emits one ``Δ−old``/``Δ+new`` pair (a new group only
    ``Δ+``, a vanished one only ``Δ−``, an unchanged one nothing). Without GROUP BY there is always one output row.
    ``bounds`` names the order-dependent aggregates whose interval (``__lo__<name>``, ``__hi__<name>``) the output
    carries for an operator above that compares or orders them.
    """

    kind = "aggregation"

    def __init__(self, op_id: str, keys: tuple[tuple[str, Expr], ...], aggs: tuple[tuple[str, AggCall], ...],
                 key_types: dict[str, pl.DataType], fingerprint: str = "", minmax_buffer: int = 0,
                 bounds: frozenset[str] | set[str] = frozenset(), keyed: bool = True,
                 guarded: frozenset[str] | set[str] = frozenset()) -> None:
        super().__init__(op_id)
        self.keyed = keyed
        self.keys = keys
        self.aggs = aggs
        self.fingerprint = fingerprint
        self.global_agg = not keys
        unknown = set(bounds) - {n for n, a in aggs if is_order_dependent(a)}
        if unknown:
            raise StateError(f"operator {op_id}: no interval for {', '.join(sorted(unknown))}")
        self.bounded = [j for j, (n, _) in enumerate(aggs) if n in bounds]
        # guarded wide decimal sums: a plain one keeps its Σ|x| (hidden aggregates), a DISTINCT one is checked when its
        # value is added up again from its values (``distinct_values.distinct_sums``)
        self.guarded = [j for j, (n, a) in enumerate(aggs) if n in guarded and is_order_dependent_decimal(a)]
        plain = frozenset(j for j in self.guarded if not aggs[j][1].distinct)
        self.layout = PartialLayout(keys, aggs, key_types, frozenset(self.bounded), plain)
        self.key_names = self.layout.key_names
        self.key_types = {k: self.layout.key_types[k] for k in self.key_names}
        self._key_out = [from_nan_free(n) if n in self.layout.float_keys else pl.col(n) for n, _ in keys]
        self.floats = sorted({c.agg for c in self.layout.compensated})  # type: ignore[type-var]
        self.numpy_outputs = small_batch.computes_outputs(self)  # output values of small batches in NumPy
        self.minmax_buffer = max(0, minmax_buffer)
        self.multisets = value_multisets(op_id, self.layout, keyed, self.minmax_buffer, self._keys_of,
                                         guarded=frozenset(self.guarded) - plain)
        self._expr_cache: dict[tuple[Any, ...], Any] = {}
        self.reset()

    @classmethod
    def from_node(cls, node: Plan, ctx: BuildContext) -> Aggregation:
        assert isinstance(node, Aggregate)
        return cls(ctx.op_id(cls.kind), node.keys, node.aggs, {n: polars_type(e.dtype) for n, e in node.keys},
                   ctx.fingerprint, minmax_buffer=ctx.minmax_buffer, bounds=ctx.role(node).carry, keyed=ctx.agg_index,
                   guarded=ctx.role(node).guarded)

    # -- state ---------------------------------------------------------------------------------------------------

    def _groups_schema(self) -> dict[str, pl.DataType]:
        schema: dict[str, pl.DataType] = dict(self.key_types)
        schema[GROUP_ROWS] = pl.Int64()
        for j, (_, a) in enumerate(self.layout.aggs):  # with the hidden aggregates of ``guarded``
            for c in self.layout.of_agg(j):
                schema[c.name] = c.dtype
                if c.compensation is not None:
                    schema[c.compensation] = pl.Float64()
            if j in self.multisets:
                schema[agg_columns(j).extreme] = polars_type(a.dtype)  # MIN/MAX: the argument's type
        schema[SET] = SET_DTYPE
        return schema

    def reset(self) -> None:
        schema = self._groups_schema()
        self._groups = pl.DataFrame(schema=schema)
        self._fcounts = pl.DataFrame(schema={**self.key_types, FRAG: FRAG_DTYPE, COUNT: pl.Int64})
        dense = {c.name for c in self.layout.accumulators if c.dtype in (pl.Int64, pl.Float64)}
        dense |= {c.compensation for c in self.layout.compensated if c.compensation is not None}
        self._store = SlotColumns({n: t for n, t in schema.items() if n != SET}, frozenset(dense))
        self._index = KeyIndex(self.key_names)
        self._pairs = PairCounts()
        for multiset in self.multisets.values():
            multiset.reset()
        if self.global_agg:
            # SQL: an aggregation without GROUP BY always returns one row, even over no input. Counts and sums
            # start at 0, as for a new group in `apply_partials` (so that deleting every row brings the state back
            # to exactly this); MIN/MAX and SUM(DISTINCT) have no value, COUNT(DISTINCT) is 0.
            row: dict[str, Any] = {NO_GROUP: [0], SET: [[]]}
            extremes = {agg_columns(j).extreme for j in self.multisets if self.aggs[j][1].func != "count"}
            for name in schema:
                row.setdefault(name, [None] if name in extremes else [0])
            self._load(pl.DataFrame(row, schema=schema), self._fcounts)

    def _load(self, groups: pl.DataFrame | Parts, fcounts: pl.DataFrame | Parts,
              values: dict[int, pl.DataFrame | Parts] | None = None) -> None:
        """State frames (``groups`` with ``__sk``, ``fcounts``, the MIN/MAX ``values``) as the state; keyed state
        takes ``groups`` and ``fcounts`` a part at a time (``group_rows.load``)."""
        values = values or {}
        for j, multiset in self.multisets.items():
            if isinstance(multiset, ValueMultiset) and j in values:
                multiset.values = values[j]  # type: ignore[assignment]
        if not self.keyed:
            assert isinstance(groups, pl.DataFrame) and isinstance(fcounts, pl.DataFrame)
            self._groups, self._fcounts = groups, fcounts
            return
        group_rows.load(self, groups, fcounts)
        for j, multiset in self.multisets.items():
            if isinstance(multiset, KeyedValueMultiset) and j in values:
                multiset.load(values[j], self._slots_in)

    def _slots_in(self, frame: pl.DataFrame) -> np.ndarray:
        """The slot of each row's group in ``frame``, looked up in the index of the groups just loaded."""
        keys = self.key_names
        slots = self._index.lookup(frames.cast(frame, self.key_types, keys).select(keys), self._store)
        if (slots < 0).any():
            raise StateError(f"operator {self.op_id}: saved state names groups it does not hold; recapture the "
                             f"sketch")
        return slots.astype(np.int64, copy=False)

    def _keys_of(self, slots: np.ndarray) -> pl.DataFrame:
        return self._store.gather(slots, self.key_names)

    @property
    def groups(self) -> pl.DataFrame:
        """Every live group's state (``groups`` frame): state keys, accumulators, extremes and its sketch ``__sk``."""
        return group_rows.saved_rows(self)["groups"].frame() if self.keyed else self._groups

    def memory_bytes(self) -> int:
        """Bytes the groups and ``F_g`` state hold in memory (MIN/MAX multisets not included)."""
        if not self.keyed:
            return int(self._groups.estimated_size() + self._fcounts.estimated_size())
        return self._store.nbytes() + self._index.nbytes() + self._pairs.nbytes()

    @property
    def group_fragments(self) -> pl.DataFrame:
        """``F_g`` as rows: state keys, ``__frag``, ``__n`` (positive counts only)."""
        return group_rows.saved_rows(self)["fcounts"].frame() if self.keyed else self._fcounts

    def state_frames(self) -> tuple[dict[str, Any], dict[str, pl.DataFrame]]:
        return self._frames({"groups": self.groups, "fcounts": self.group_fragments})

    def saved_frames(self) -> tuple[dict[str, Any], Mapping[str, pl.DataFrame | Rows]]:
        """Keyed state's ``groups``, ``F_g`` and value counts as :class:`Rows` (a streaming save never builds them)."""
        if not self.keyed:
            return self.state_frames()
        return self._frames(group_rows.saved_rows(self))

    def _frames(self, frames: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """The state's metadata, and ``frames`` with the value multisets' frames."""
        for j, multiset in stored(self.multisets).items():
            if f"mm{j}" not in frames:
                frames[f"mm{j}"] = multiset.values
            if isinstance(multiset, ValueMultiset) and self.minmax_buffer:
                frames[f"mmb{j}"] = multiset.bounds
        return {"keys": self.key_names, "aggs": state_names(self.layout.aggs), "layout": LAYOUT}, frames

    @property
    def streamed_frames(self) -> frozenset[str]:
        keyed = {f"mm{j}" for j, m in stored(self.multisets).items() if isinstance(m, KeyedValueMultiset)}
        return frozenset({"groups", "fcounts", *keyed}) if self.keyed else frozenset()

    def set_state_frames(self, meta: dict[str, Any], frames: dict[str, Any]) -> None:
        if meta.get("keys") != self.key_names or meta.get("aggs") != state_names(self.layout.aggs):
            raise StateError(f"operator {self.op_id}: saved state is for a different aggregation; recapture")
        check_layout(self.op_id, self.layout, meta.get("layout"))
        try:
            self._load(frames["groups"], frames["fcounts"], {j: frames[f"mm{j}"] for j in stored(self.multisets)})
            for j, multiset in self.multisets.items():
                if isinstance(multiset, ValueMultiset) and self.minmax_buffer:
                    multiset.bounds = frames[f"mmb{j}"]
        except (KeyError, pl.exceptions.PolarsError) as e:
            raise StateError(f"operator {self.op_id}: saved state is incomplete or has the wrong shape; "
                             f"recapture the sketch") from e

    def canonical(self) -> dict[str, pl.DataFrame]:
        """State sorted into a canonical order, sums compared by value (``sum_state.canonical_groups``)."""
        _, frames = self.state_frames()
        out = {}
        for name, df in frames.items():
            df = canonical_groups(self.layout, df) if name == "groups" else df
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
                out.append(c(GROUP_ROWS).alias(name))
            elif a.distinct:  # kept by its value counts (``DistinctValues``)
                out.append(c(agg_columns(j).extreme).alias(name))
            elif a.func == "count":
                out.append(c(agg_columns(j).non_null).alias(name))
            elif a.func in ("sum", "avg"):
                n = c(agg_columns(j).non_null)
                value, exact = self._sum_value(j, a, c)
                value = pl.when(n > 0).then(value).otherwise(None).cast(polars_type(a.dtype))
                out.append(self._checked(j, value, c).alias(name) if j in self.layout.guards else value.alias(name))
                if j in self.bounded and intervals:
                    lo, hi = self._interval(j, value, n, self._abs_sum(j, c), exact, self._bound(j, c))
                    bounds += [lo.alias(lo_name(name)), hi.alias(hi_name(name))]
            else:
                out.append(c(agg_columns(j).extreme).alias(name))
        return out + bounds

    def _checked(self, j: int, value: pl.Expr, c: Any) -> pl.Expr:
        """A guarded wide decimal sum's value, refusing a group whose Σ|x| leaves 38 digits: Spark's value may then
        be NULL or not depending on the order of the rows (``running_sums``)."""
        h = agg_columns(self.layout.guards[j])
        magnitude = decimal_sums.value(c(h.sum), c(h.carry), self.layout.scale_of(j))
        unsure = magnitude.is_null() & (c(agg_columns(j).non_null) > 0)
        arg, op_id = self.aggs[j][1].arg, self.op_id

        def check(s: pl.Series) -> pl.Series:
            if s.struct.field("unsure").any():
                raise order_dependent(f"operator {op_id}: {self.aggs[j][1].func.upper()}({arg})")
            return s.struct.field("value")

        dtype = polars_type(self.aggs[j][1].dtype)
        return pl.struct(value.alias("value"), unsure.alias("unsure")).map_batches(check, return_dtype=dtype)

    def _abs_sum(self, j: int, c: Any) -> pl.Expr:
        cols = agg_columns(j)
        return c(cols.abs_sum) + c(cols.abs_compensation) if j in self.floats else c(cols.abs_sum)

    def _interval(self, j: int, value: pl.Expr, n: pl.Expr, abs_sum: pl.Expr, exact: pl.Expr,
                  bound: pl.Expr | None) -> tuple[pl.Expr, pl.Expr]:
        return sum_interval(value, n, abs_sum, exact, self.aggs[j][1].func == "avg",
                            None if j in self.floats else INT53, bound)

    def _bound(self, j: int, c: Any) -> pl.Expr | None:  # a float sum's error bound, where its interval is read
        return c(agg_columns(j).bound) if j in self.floats and j in self.bounded else None

    def _sum_value(self, j: int, a: AggCall, c: Any) -> tuple[pl.Expr, pl.Expr]:
        """A SUM/AVG's value (n > 0) and whether it is exact whatever the order of additions."""
        assert a.arg is not None
        cols = agg_columns(j)
        n = c(cols.non_null)
        total = c(cols.sum)
        if j in self.floats:
            finite = total + c(cols.compensation)
            nan, pinf, ninf = c(cols.nan), c(cols.pos_inf), c(cols.neg_inf)
            if a.func == "avg":
                finite = finite / n.cast(pl.Float64)
            value = (pl.when((nan > 0) | ((pinf > 0) & (ninf > 0))).then(NAN)
                     .when(pinf > 0).then(float("inf")).when(ninf > 0).then(float("-inf")).otherwise(finite))
            return value, (nan > 0) | (pinf > 0) | (ninf > 0)
        total = decimal_sums.value(total, c(cols.carry), self.layout.scale_of(j)) if j in self.layout.wide else total
        if a.func == "sum":
            return total, pl.lit(True)
        if pa.types.is_integer(a.arg.dtype):
            return total.cast(pl.Float64) / n.cast(pl.Float64), pl.lit(False)
        return kernels.decimal_avg(total, n, a.arg.dtype, a.dtype), pl.lit(True)

    def output_relation(self) -> pl.DataFrame:
        """The operator's current result as an all-insert annotated relation (``Q(D)`` for joins above)."""
        groups = self.groups
        live = groups if self.global_agg or self.keyed else groups.filter(pl.col(GROUP_ROWS) > 0)
        return live.select([*self.output_exprs(), pl.lit(1, dtype=pl.Int64).alias(MULT), pl.col(SET)])

    # -- incremental maintenance ---------------------------------------------------------------------------------

    def process(self, delta: pl.DataFrame) -> pl.DataFrame:
        """Fold a delta into the state and return the output delta (one Δ−/Δ+ pair per changed group)."""
        if delta.height == 0:
            return self.empty_delta()
        return self.apply_partials(self.layout.of_delta(delta, numpy=self.keyed))

    def bootstrap(self, partials: Partials) -> pl.DataFrame:
        """Initial state from the whole input's partials (a capture); returns the output relation.

        Without GROUP BY that is always one row, even over an empty input; ``apply_partials`` alone would instead
        emit the change from the reset state's empty-input row (a ``Δ−`` of a row no operator above has seen).
        """
        self.reset()
        out = self.apply_partials(partials)
        return self.output_relation().select(out.columns) if self.global_agg else out

    def apply_partials(self, partials: Partials) -> pl.DataFrame:
        """Fold per-group partials (signed), ``F_g`` count changes and MIN/MAX value-count changes into the state;
        return the output delta. The state is assigned only after every consistency check passed."""
        keys = self.key_names
        partial = partials.groups
        partial = partial.collect(engine="in-memory") if isinstance(partial, pl.LazyFrame) else partial
        if self.global_agg and NO_GROUP not in partial.columns:
            partial = partial.with_columns(pl.lit(0, dtype=pl.Int8).alias(NO_GROUP))
        partial = frames.cast(partial, self.key_types, keys)
        fp = partials.fragments
        fp = fp.collect(engine="in-memory") if isinstance(fp, pl.LazyFrame) else fp
        fp = frames.cast(fp, {**self.key_types, FRAG: FRAG_DTYPE}, [*keys, FRAG])
        return self._apply_keyed(partials, partial, fp) if self.keyed else self._apply_frames(partials, partial, fp)

    def _apply_keyed(self, partials: Partials, partial: pl.DataFrame, fp: pl.DataFrame) -> pl.DataFrame:
        """The batch against keyed state: its groups' slots by hash lookup, their state gathered, updated with the
        same expressions as the frames below, scattered back in place; new groups appended."""
        keys, store = self.key_names, self._store
        found, hashes, taken = self._index.probe(partial, store)
        rows = store.column(GROUP_ROWS, found)
        had = found >= 0 if self.global_agg else np.nan_to_num(rows, nan=0) > 0
        old_slots = np.where(had, found, -1)

        def with_old(frame: pl.DataFrame) -> pl.DataFrame:  # the old state next to it (``X__old``), for expressions
            return frame.hstack([c.alias(f"{c.name}{OLD}") for c in store.gather(old_slots).get_columns()])

        # NumPy reads the old state from the slots' buffers: the gathered copy is only made for the expressions
        joined = partial.hstack([nullable_index(old_slots).alias(ROW)])
        lean = self.numpy_outputs
        if not lean:
            joined = with_old(joined)
        new = small_batch.updated(self, partial, joined, old_slots)
        if new is None:
            if lean:
                joined, lean = with_old(joined), False
            new = self._updated(partials, partial, joined, sets_change=True)
        alive = np.ones(new.height, dtype=bool) if self.global_agg else new.get_column(GROUP_ROWS).to_numpy() > 0

        # F_g: the batch's (slot, fragment) count changes against the counts before; a new group takes the next slot
        slots = found.copy()
        fresh = (found < 0) & alive
        slots[fresh] = store.size + np.arange(int(fresh.sum()), dtype=np.int64)
        new, commits = self._keyed_extremes(partials, partial, slots, new)
        fslots = self._fragment_slots(partials, partial, fp, slots)
        frags = fp.get_column(FRAG).to_numpy()
        touched = self._pairs.of_slots(found[found >= 0])  # every (slot, fragment) entry of the touched groups
        pos, before = touched.find(PairCounts.key(np.maximum(fslots, 0), frags), fslots >= 0)
        after = before + fp.get_column(COUNT).to_numpy()
        if after.size and after.min() < 0:
            raise StateError(f"operator {self.op_id}: a fragment count became negative — the change feed deleted rows "
                             f"the state never saw; recapture the sketch")
        sets_change = bool(((before == 0) & (after > 0)).any() or ((before > 0) & (after == 0)).any())

        # the group sketches before and after, from F_g's entries of the touched groups
        old_s, old_f = touched.live()  # an emptied group's counts are all 0: these are the groups that had rows
        new_s, new_f = old_s, old_f
        if sets_change:
            changed = PairCounts.key(old_s, old_f)
            upd = PairCounts.key(np.maximum(fslots, 0), frags)
            keep = ~np.isin(changed, upd[fslots >= 0]) if changed.size else np.ones(0, dtype=bool)
            live = (fslots >= 0) & (after > 0)
            new_s, new_f = np.concatenate([old_s[keep], fslots[live]]), np.concatenate([old_f[keep], frags[live]])
        old_sets = lists_by_slot(old_slots, old_s, old_f, f"{SET}{OLD}")
        same_rows = not sets_change and np.array_equal(old_slots, slots)  # then the sketches are the old ones
        new = frames.with_series(new, old_sets, old_sets.alias(SET) if same_rows else
                                 lists_by_slot(slots, new_s, new_f, SET))
        out = small_batch.emit(self, new, alive, sets_change, old_slots)
        if out is None:
            out = self._emit(with_old(new) if lean else new, alive, sets_change)

        # commit: touched slots in place, new groups appended and indexed, F_g's counts
        state = frames.columns(new, list(store.schema))
        existing = found >= 0
        store.scatter(found[existing], frames.rows(state, existing))
        if fresh.any():
            added = frames.rows(state, fresh)
            store.append(added)
            self._index.insert(frames.columns(added, keys), slots[fresh], store,
                               None if hashes is None else hashes[fresh], taken[fresh])
        self._pairs.commit(pos, after, fslots, frags)
        for commit in commits:
            commit()
        return out

    def _keyed_extremes(self, partials: Partials, partial: pl.DataFrame, slots: np.ndarray,
                        new: pl.DataFrame) -> tuple[pl.DataFrame, list[Callable[[], None]]]:
        """The touched groups' new MIN/MAX extremes from the keyed multisets, and the multisets' commits."""
        keys = self.key_names
        commits = []
        for j, multiset in self.multisets.items():
            if isinstance(multiset, KeyedValueMultiset):
                changes = partials.values.get(j)
                if changes is not None and changes.height:  # the rows of a new group left empty net to nothing
                    changes = frames.cast(changes, self.key_types, keys).join(
                        partial.select(keys).with_columns(pl.Series(SLOT, slots)), on=keys, how="left",
                        nulls_equal=True, maintain_order="left").filter(pl.col(SLOT) >= 0)
                cols = agg_columns(j)
                value, commit = multiset.prepare(changes, slots, new.get_column(cols.extreme),
                                                 new.get_column(cols.non_null).to_numpy())
                new = new.with_columns(value.alias(cols.extreme))
                commits.append(commit)
        return new, commits

    def _fragment_slots(self, partials: Partials, partial: pl.DataFrame, fp: pl.DataFrame,
                        slots: np.ndarray) -> np.ndarray:
        """The slot of each ``F_g`` change's group: known from a NumPy fold, else found by a join on the keys."""
        if partials.fragment_rows is not None:
            return slots[partials.fragment_rows]
        keys = self.key_names
        return fp.select(keys).join(partial.select(keys).with_columns(pl.Series(ROW, slots)), on=keys, how="left",
                                    nulls_equal=True, maintain_order="left").get_column(ROW).to_numpy()

    def _apply_frames(self, partials: Partials, partial: pl.DataFrame, fp: pl.DataFrame) -> pl.DataFrame:
        """The first engine's state (switch ``-aggindex``): each batch joins its few touched groups with the whole
        state frames once and rewrites them (a batch costs the state's size)."""
        keys = self.key_names

        # 1. F_g: the batch's (group, fragment) count changes next to the counts before, found by one join
        fjoined = fp.join(self._fcounts.with_row_index(ROW), on=[*keys, FRAG], how="left", suffix=OLD,
                          nulls_equal=True)
        before = fjoined.get_column(f"{COUNT}{OLD}").fill_null(0).to_numpy()
        after = before + fjoined.get_column(COUNT).to_numpy()
        if after.size and after.min() < 0:
            raise StateError(f"operator {self.op_id}: a fragment count became negative — the change feed deleted rows "
                             f"the state never saw; recapture the sketch")
        group_fragments = pl.concat([
            self._fcounts.filter(_untouched(self._fcounts.height, fjoined.get_column(ROW))),
            fjoined.lazy().select([*keys, FRAG, pl.lit(pl.Series(COUNT, after, dtype=pl.Int64))])
            .filter(pl.lit(pl.Series(after > 0))).collect(engine="in-memory"),
        ])
        added_mask, removed_mask = (before == 0) & (after > 0), (before > 0) & (after == 0)
        sets_change = bool(added_mask.any() or removed_mask.any())

        # 2. accumulators: one row per touched group, old state (null for a new group) next to the batch's partials
        state_cols = [c for c in self._groups.columns if c not in keys]
        old_named = self._groups.rename({c: f"{c}{OLD}" for c in state_cols}).with_row_index(ROW)
        joined = partial.join(old_named, on=keys, how="left", nulls_equal=True)
        new = self._updated(partials, partial, joined, sets_change)

        # 3. the group sketches P = {ρ | F_g[ρ] > 0}, where a fragment entered or left a group
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
        alive = np.ones(new.height, dtype=bool) if self.global_agg else new.get_column(GROUP_ROWS).to_numpy() > 0
        out = self._emit(new, alive, sets_change)

        # 4. commit: untouched groups plus the live touched ones
        kept_rows = new.select(self._groups.columns) if alive.all() else \
            new.lazy().filter(pl.lit(pl.Series(alive))).select(self._groups.columns).collect(engine="in-memory")
        untouched = self._groups.filter(_untouched(self._groups.height, new.get_column(ROW)))
        self._groups = pl.concat([untouched, kept_rows]) if kept_rows.height else untouched
        self._fcounts = group_fragments
        return out

    def _updated(self, partials: Partials, partial: pl.DataFrame, joined: pl.DataFrame,
                 sets_change: bool) -> pl.DataFrame:
        """The touched groups' new accumulators and MIN/MAX extremes, next to the old state (``X__old``)."""
        carried = tuple(c.compensation in partial.columns for c in self.layout.compensated)
        new = joined.with_columns(self._update_exprs(carried, sets_change))
        new = new.with_columns(wide_normalized(self.layout)) if self.layout.wide else new
        lowest = new.get_column(GROUP_ROWS).min()
        if lowest is not None and lowest < 0:  # type: ignore[operator]
            raise StateError(f"operator {self.op_id}: a group's row count became negative — the change feed deleted "
                             f"rows the state never saw; recapture the sketch")
        touched = partial.select(self.key_names)
        for j, multiset in self.multisets.items():
            if isinstance(multiset, ValueMultiset):  # keyed multisets: `_apply_keyed` (they need the slots)
                new = multiset.apply(partials.values.get(j), touched, new)
        return new

    def _emit(self, new: pl.DataFrame, alive: np.ndarray, sets_change: bool) -> pl.DataFrame:
        """The output delta: Δ− old row, Δ+ new row, for groups whose row or sketch changed (an unchanged pair would
        cancel). Old and new values sit in the same row: one step computes both and whether they differ."""
        first, second, third = self._compare_exprs(sets_change)
        outs = new.lazy().select(first).with_columns(second).with_columns(third).collect(engine="in-memory")
        had = outs.get_column("__had").to_numpy()
        unchanged = outs.get_column("__same").to_numpy() & had & alive
        emit_old, emit_new = had & ~unchanged, alive & ~unchanged
        keys, values = [n for n, _ in self.keys], self._value_names()
        parts = []
        for mask, sign, names in ((emit_old, -1, [*keys, *(f"__o{k}" for k in range(len(values))), f"{SET}{OLD}"]),
                                  (emit_new, 1, [*keys, *values, SET])):
            if mask.any():  # the Δ− rows (old values) and the Δ+ rows (new values): column picks, no polars run
                keep = pl.Series(mask)
                cols = [outs.get_column(c).filter(keep).alias(n) for c, n in zip(names, [*keys, *values, SET])]
                parts.append(pl.DataFrame([*cols[:-1], pl.Series(MULT, np.full(int(mask.sum()), sign, np.int64)),
                                           cols[-1]]))
        if not parts:
            return self.empty_delta()
        return pl.concat(parts, how="vertical_relaxed") if len(parts) > 1 else parts[0]

    # -- expressions of `apply_partials`, built once per operator (building polars expressions costs as much as
    #    running them on a small batch) ----------------------------------------------------------------------------

    def _update_exprs(self, carried: tuple[bool, ...], sets_change: bool) -> list[pl.Expr]:
        """New state columns from ``X__old`` (the state) and ``X`` (the batch's partials); ``carried`` says per
        compensated accumulator whether the partials carry its error term."""
        key = ("update", carried, sets_change)
        if key in self._expr_cache:
            return self._expr_cache[key]
        errors = dict(zip((c.name for c in self.layout.compensated), carried))

        def add(name: str, zero: Any = 0) -> pl.Expr:
            return (pl.col(f"{name}{OLD}").fill_null(zero) + pl.col(name).fill_null(zero)).alias(name)

        upd = []
        for j in [None, *range(len(self.layout.aggs))]:
            for c in self.layout.of_agg(j) if j is not None else self.layout.accumulators[:1]:
                if c.compensation is not None:
                    upd += neumaier(c.name, c.compensation, OLD, errors[c.name])
                elif c.term is Term.ROUNDING:
                    upd.append(grown_bound(pl.col(f"{c.name}{OLD}"), pl.col(c.name)).alias(c.name))
                else:
                    upd.append(add(c.name, pl.lit(0).cast(c.dtype) if c.term in (*DECIMAL_TERMS, Term.WRAPPED) else 0))
            if j in self.multisets:
                extreme = agg_columns(j).extreme
                upd.append(pl.col(extreme + OLD).alias(extreme))
        if not sets_change:  # every touched group keeps its sketch
            upd.append(pl.col(f"{SET}{OLD}").fill_null(pl.lit([], dtype=SET_DTYPE)).alias(SET))
        self._expr_cache[key] = upd
        return upd

    def _compare_exprs(self, sets_change: bool) -> tuple[list[pl.Expr], list[pl.Expr], list[pl.Expr]]:
        """Per touched group, in projections of one query: keys, old values ``__o{k}``, new values, both sketches,
        whether the group existed (``__had``); then the intervals (old and new); then
        whether the output row is unchanged (``__same``), each from the columns made before (an expression per use
        would make the query several times larger)."""
        key = ("compare", sets_change)
        if key not in self._expr_cache:
            old_vals = self.output_exprs(OLD, value_names=True, intervals=False)
            new_vals = self.output_exprs(value_names=True, intervals=False)
            first = [*self._key_out, *[o.alias(f"__o{k}") for k, o in enumerate(old_vals)], *new_vals,
                     pl.col(f"{SET}{OLD}"), pl.col(SET), pl.col(ROW).is_not_null().alias("__had")]
            second = []
            k = len(self.aggs)
            for j in self.bounded:
                name, a = self.aggs[j]
                for suffix, tag in (("", ""), (OLD, "o")):
                    def c(col: str, suffix: str = suffix) -> pl.Expr:
                        return pl.col(f"{col}{suffix}")
                    _, exact = self._sum_value(j, a, c)
                    first += [c(agg_columns(j).non_null).alias(f"__in{tag}{j}"),
                              self._abs_sum(j, c).alias(f"__ia{tag}{j}"), exact.alias(f"__ie{tag}{j}"),
                              *([] if (bound := self._bound(j, c)) is None else [bound.alias(f"__ib{tag}{j}")])]
                    value = pl.col(name if not tag else f"__o{j}")
                    lo, hi = self._interval(j, value, pl.col(f"__in{tag}{j}"), pl.col(f"__ia{tag}{j}"), pl.col(
                        f"__ie{tag}{j}"), bound if bound is None else pl.col(f"__ib{tag}{j}"))
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

    def _value_names(self) -> list[str]:
        """The output's value columns: the aggregates, then the intervals of ``bounds``."""
        names = [n for n, _ in self.aggs]
        for j in self.bounded:
            names += [lo_name(self.aggs[j][0]), hi_name(self.aggs[j][0])]
        return names

    def empty_delta(self) -> pl.DataFrame:
        return pl.DataFrame(schema=self.delta_schema())

    def delta_schema(self) -> dict[str, pl.DataType]:
        """The output delta's columns and types (built once: a polars schema costs Python work per type)."""
        if ("schema",) not in self._expr_cache:
            schema: dict[str, pl.DataType] = {n: self.key_types[n] for n, _ in self.keys}
            for name, a in self.aggs:
                schema[name] = polars_type(a.dtype)
            for j in self.bounded:
                schema[lo_name(self.aggs[j][0])] = schema[hi_name(self.aggs[j][0])] = pl.Float64()
            self._expr_cache[("schema",)] = {**schema, MULT: pl.Int64, SET: SET_DTYPE}
        return self._expr_cache[("schema",)]


__all__ = ["LAYOUT", "Aggregation"]

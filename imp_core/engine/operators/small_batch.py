"""The keyed aggregation's small-batch paths in NumPy: the accumulator update and the output rows, computed from the
slot columns' arrays with the same arithmetic as the aggregation's polars expressions (a polars run costs a fixed
0.1-0.6 ms on a small frame; these steps cost microseconds). Each returns None where it does not apply, and the
aggregation then takes its expressions. See docs/ARCHITECTURE.md, "Small batches in NumPy".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import polars as pl
import pyarrow as pa

from imp_core.engine import frames
from imp_core.engine.evaluate import polars_type
from imp_core.engine.operators.minmax import ValueMultiset
from imp_core.engine.operators.partials import Term, agg_columns
from imp_core.engine.order_dependence import UNIT
from imp_core.engine.schema import GROUP_ROWS, MULT, SET
from imp_core.engine.slot_columns import Gather
from imp_core.errors import StateError

if TYPE_CHECKING:
    from imp_core.engine.operators.aggregation import Aggregation

OLD = "__old"
NAN = float("nan")


def updated(op: Aggregation, partial: pl.DataFrame, joined: pl.DataFrame,
            old_slots: np.ndarray) -> pl.DataFrame | None:
    """``Aggregation._updated`` with NumPy on the keyed state's arrays (the same sums and Neumaier steps as
    ``_update_exprs``, without a polars run); None where that does not apply: a DECIMAL sum, a NULL partial, a
    bounded MIN/MAX multiset."""
    if not op.layout._numpy_terms or any(isinstance(m, ValueMultiset) for m in op.multisets.values()):
        return None
    updated: dict[str, pl.Series] = {}
    at = Gather(old_slots)
    for c in op.layout.accumulators:
        part = partial.get_column(c.name)
        old = op._store.zero_filled(c.name, at)
        if part.null_count() or old is None:
            return None
        if c.compensation is None:
            step = part.to_numpy()
            if c.term is Term.ROUNDING:  # ``order_dependence.grown_bound``: never shrinks
                step = np.maximum(step, 0.0)
            updated[c.name] = frames.series(c.name, old + step, c.dtype)
            continue
        err_old = op._store.zero_filled(c.compensation, at)
        if err_old is None:
            return None
        d0 = part.to_numpy()
        carried = partial.get_column(c.compensation).to_numpy() if c.compensation in partial.columns else 0.0
        with np.errstate(all="ignore"):
            t = old + d0
            err = np.where(np.abs(old) >= np.abs(d0), (old - t) + d0, (d0 - t) + old)
            err = np.where(np.isfinite(t), err, 0.0)
            updated[c.name] = frames.series(c.name, t, pl.Float64())
            updated[c.compensation] = frames.series(c.compensation, err_old + err + carried, pl.Float64())
    rows = updated[GROUP_ROWS].to_numpy()
    if rows.size and rows.min() < 0:
        raise StateError(f"operator {op.op_id}: a group's row count became negative — the change feed deleted "
                         f"rows the state never saw; recapture the sketch")
    columns = [updated.pop(c.name, c) for c in joined.get_columns()]
    columns += [*updated.values(),
                *[joined.get_column(agg_columns(j).extreme + OLD).alias(agg_columns(j).extreme)
                  for j in op.multisets]]
    return frames.frame(columns)

def computes_outputs(op: Aggregation) -> bool:
    """Whether ``emit`` computes this aggregation's output values: no float key, and only COUNT, and SUM
    and AVG over doubles (their intervals too) or SUM over integers (none of them DISTINCT)."""
    if op.layout.float_keys or not op.layout._numpy_terms:
        return False
    for j, (_, a) in enumerate(op.aggs):
        if a.arg is None or (a.func == "count" and not a.distinct):
            continue
        if a.func not in ("sum", "avg") or a.distinct:
            return False
        if j in op.floats:
            if polars_type(a.dtype) != pl.Float64:
                return False
        elif a.func != "sum" or j in op.bounded or polars_type(a.dtype) != pl.Int64:
            return False
    return True


Values = list[tuple[np.ndarray, np.ndarray | None]]  # per output value column: the values and their validity


def output_values(op: Aggregation, get: Callable[[str], np.ndarray]) -> Values:
    """``Aggregation.output_exprs``' values (aggregates, then the intervals of ``bounded``) in NumPy, from the state
    columns ``get`` returns; each with its validity (None: never NULL). The same IEEE operations in the same order
    as the expressions, so the same doubles."""
    values: list[tuple[np.ndarray, np.ndarray | None]] = []
    intervals: dict[int, list[tuple[np.ndarray, np.ndarray | None]]] = {}
    for j, (_, a) in enumerate(op.aggs):
        cols = agg_columns(j)
        if a.arg is None:
            values.append((get(GROUP_ROWS), None))
            continue
        if a.func == "count":
            values.append((get(cols.non_null), None))
            continue
        n = get(cols.non_null)
        valid = n > 0
        if j not in op.floats:
            values.append((get(cols.sum), valid))
            continue
        nan, pinf, ninf = get(cols.nan) > 0, get(cols.pos_inf) > 0, get(cols.neg_inf) > 0
        exact = nan | pinf | ninf  # a NaN or infinite value: its interval is the value itself
        some_exact = bool(exact.any())
        with np.errstate(all="ignore"):
            finite = get(cols.sum) + get(cols.compensation)
            if a.func == "avg":
                finite = finite / n.astype(np.float64)
            value = np.where(nan | (pinf & ninf), NAN, np.where(pinf, np.inf, np.where(ninf, -np.inf, finite))) \
                if some_exact else finite
            values.append((value, valid))
            if j in op.bounded:
                bound = get(cols.bound)  # ``order_dependence.sum_interval``, in the same operations
                total = get(cols.abs_sum) + get(cols.abs_compensation) + bound
                m = (n.astype(np.float64) * 2.0 + 8.0) * UNIT
                g = m / (1.0 - m)
                err = g * total + bound
                if a.func == "avg":
                    err = err / n.astype(np.float64)
                unknown = ~np.isfinite(total * (1.0 + g))
                if some_exact or unknown.any():
                    lo = np.where(exact, value, np.where(unknown, -np.inf, value - err))
                    hi = np.where(exact, value, np.where(unknown, NAN, value + err))
                else:
                    lo, hi = value - err, value + err
                intervals[j] = [(lo, valid), (hi, valid)]
    for j in op.bounded:
        values += intervals[j]
    return values

def emit(op: Aggregation, new: pl.DataFrame, alive: np.ndarray, sets_change: bool,
         old_slots: np.ndarray) -> pl.DataFrame | None:
    """``Aggregation._emit`` with the output values computed in NumPy, the old ones from the keyed state's buffers (the
    state is committed after this); None where ``computes_outputs`` says no or a column holds NULL."""
    if not op.numpy_outputs or any(new.get_column(c.name).null_count() for c in op.layout.accumulators):
        return None
    store, at = op._store, Gather(old_slots)
    old_columns: dict[str, np.ndarray | None] = {}

    def old(name: str) -> np.ndarray:
        if name not in old_columns:
            old_columns[name] = store.zero_filled(name, at)
        got = old_columns[name]
        if got is None:
            raise LookupError(name)
        return got

    try:
        before = output_values(op, old)
    except LookupError:
        return None
    after = output_values(op, lambda name: new.get_column(name).to_numpy())
    had = old_slots >= 0
    same = had & alive & _equal(before, after, had.size)
    if sets_change:
        same &= new.get_column(SET).eq_missing(new.get_column(f"{SET}{OLD}")).to_numpy()
    sides = ((had & ~same, -1, before, f"{SET}{OLD}"), (alive & ~same, 1, after, SET))  # the Δ− rows, the Δ+ rows
    parts = [_rows(op, new, mask, sign, values, sketch) for mask, sign, values, sketch in sides if mask.any()]
    if not parts:
        return op.empty_delta()
    # the Δ+ rows after the Δ− rows, column by column (a frame concat costs a polars step; a Series append does not)
    return frames.frame(parts[0] if len(parts) == 1 else [a.append(b) for a, b in zip(*parts)])


def _equal(before: Values, after: Values, groups: int) -> np.ndarray:
    """Per group, whether every output value is unchanged (as polars' ``eq_missing``: NULL equals NULL, NaN NaN)."""
    same = np.ones(groups, dtype=bool)
    for (a, va), (b, vb) in zip(before, after):
        with np.errstate(invalid="ignore"):
            equal = (a == b) | (np.isnan(a) & np.isnan(b)) if a.dtype.kind == "f" else a == b
        same &= equal if va is None else np.where(va & vb, equal, va == vb)
    return same


def _rows(op: Aggregation, new: pl.DataFrame, mask: np.ndarray, sign: int, values: Values,
          sketch: str) -> list[pl.Series]:
    """The output columns of the groups in ``mask`` (fresh Series): keys, ``values``, multiplicity ``sign`` and
    sketch column."""
    schema = op.delta_schema()
    keep = frames.series("", mask)
    cols = [new.get_column(k).filter(keep) for k, _ in op.keys]
    for name, (v, valid) in zip(op._value_names(), values):
        picked = v[mask] if valid is None or valid[mask].all() else pa.array(v[mask], mask=~valid[mask])
        s = frames.series(name, picked) if isinstance(picked, np.ndarray) else pl.Series(name, picked)
        cols.append(s if s.dtype == schema[name] else s.cast(schema[name]))
    cols += [frames.series(MULT, np.full(int(mask.sum()), sign, dtype=np.int64)),
             new.get_column(sketch).filter(keep).alias(SET)]
    return cols

__all__ = ["computes_outputs", "emit", "output_values", "updated"]

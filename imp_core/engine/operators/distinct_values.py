"""The value counts behind one COUNT(DISTINCT x) or SUM(DISTINCT x) aggregate.

The paper's annotation semantics for aggregation is unchanged: a group's output row depends on all of the group's
rows (its sketch is ``{ρ | F_g[ρ] > 0}`` as for every aggregate); only how the value is maintained differs. Per
(group, value) the count of the group's rows with that non-NULL value, so a deletion is exact: a value belongs to
the group's distinct set while its count is positive, and leaves it when the count falls to 0. For a change:

* inserting a value the group already holds raises its count: COUNT(DISTINCT) and SUM(DISTINCT) stay;
* inserting a new value adds 1 to COUNT(DISTINCT) and the value to SUM(DISTINCT);
* deleting one of several copies lowers the count: both stay; deleting the last copy removes the value;
* NULL is not counted (Spark); a group without values has COUNT(DISTINCT) 0 and SUM(DISTINCT) NULL.

On keyed state (``KeyedDistinctValues``, the keyed multiset of ``operators/minmax_keyed.py``) a batch costs its own
values: COUNT(DISTINCT) and an integer SUM(DISTINCT) change by the values that enter (count 0 → positive) and leave
(positive → 0); a decimal SUM(DISTINCT) is added up again over the touched groups' values (exact, NULL beyond 38
digits). The whole-frame state (switch ``-aggindex``) folds the changes into the counts frame (``DistinctValues``,
the frame multiset of ``operators/minmax.py``) and recomputes the touched groups. See docs/ARCHITECTURE.md,
"Operators".
"""

from __future__ import annotations

import decimal
import functools
import weakref
from collections.abc import Callable

import numpy as np
import polars as pl
import pyarrow as pa

from imp_core.engine.evaluate import polars_type
from imp_core.engine.operators.minmax import ValueMultiset
from imp_core.engine.operators.minmax_keyed import SLOT, KeyedValueMultiset, Probe
from imp_core.engine.operators.partials import PartialLayout, agg_columns
from imp_core.engine.running_sums import order_dependent
from imp_core.engine.schema import VALUE
from imp_core.errors import StateError
from imp_core.plan.expr import AggCall


class DistinctValues(ValueMultiset):
    """COUNT(DISTINCT) or SUM(DISTINCT) ``j`` (``func`` "count" or "sum") of an aggregation: ``values`` (state
    keys, ``__v``, ``__n`` positive) as saved state; the group's value is kept in ``__m{j}`` of the groups frame,
    of type ``out_type``."""

    def __init__(self, op_id: str, j: int, func: str, key_types: dict[str, pl.DataType], value_type: pl.DataType,
                 float_values: bool, out_type: pa.DataType, guard: str | None = None) -> None:
        super().__init__(op_id, j, func, key_types, value_type, float_values)
        self.label = f"{func.upper()}(DISTINCT)"
        self.out_type = polars_type(out_type)
        self.scale: int | None = out_type.scale if func == "sum" and pa.types.is_decimal(out_type) else None
        self.guard = guard  # a guarded wide decimal sum, as its refusal names it (``distinct_sums``)

    def apply(self, changes: pl.DataFrame | None, touched: pl.DataFrame, groups: pl.DataFrame) -> pl.DataFrame:
        """Fold value-count ``changes`` into the counts; ``groups`` (one row per ``touched`` group) comes back with
        each group's new COUNT(DISTINCT) / SUM(DISTINCT) in ``__m{j}``."""
        keys = self.keys
        values = self.fold(changes)
        new = agg_columns(self.j).extreme + "_new"
        of_touched = values.join(touched, on=keys, how="semi", nulls_equal=True).group_by(keys)
        if self.func == "count":
            per_group = of_touched.agg(pl.len().cast(pl.Int64).alias(new))
            value = pl.col(new).fill_null(0)  # a group without values (all NULL) counts 0
        else:  # values are integers (BIGINT, wrapping like Spark's) or decimals (exact); floats are refused
            per_group = distinct_sums(values.join(touched, on=keys, how="semi", nulls_equal=True), keys, self.scale,
                                      new, self.guard)
            value = pl.col(new).cast(self.out_type, strict=False)  # a group without values: NULL
        return (groups.join(per_group, on=keys, how="left", nulls_equal=True, maintain_order="left")
                .with_columns(value.alias(agg_columns(self.j).extreme)).drop(new))



class KeyedDistinctValues(KeyedValueMultiset):
    """COUNT(DISTINCT) or SUM(DISTINCT) ``j`` on keyed state: a count per (group slot, value) (saved as
    ``DistinctValues`` saves them); the group's value is kept in ``__m{j}``, of type ``out_type``."""

    def __init__(self, op_id: str, j: int, func: str, value_type: pl.DataType, float_values: bool,
                 keys_of: Callable[[np.ndarray], pl.DataFrame], out_type: pa.DataType,
                 guard: str | None = None) -> None:
        super().__init__(op_id, j, func, value_type, float_values, keys_of)
        self.label = f"{func.upper()}(DISTINCT)"
        self.scale: int | None = out_type.scale if func == "sum" and pa.types.is_decimal(out_type) else None
        self.guard = guard  # a guarded wide decimal sum, as its refusal names it (``distinct_sums``)

    def prepare(self, changes: pl.DataFrame | None, slots: np.ndarray, old: pl.Series,
                non_null: np.ndarray) -> tuple[pl.Series, Callable[[], None]]:
        """The new value of each touched group (``slots``: its slot, -1 for a new group left empty; ``old``: its
        value before, ``non_null``: its count of non-NULL values after) and the commit of ``changes`` (``__slot``,
        ``__v``, ``__n`` signed), which the caller runs once every check of the batch passed.

        Raises:
            StateError: A count would become negative, or a group's values and its non-NULL count disagree.
        """
        batch = self.probe(changes)
        if self.scale is not None:
            value = self._decimal_sums(batch, slots)
        else:
            value = self._stepped(batch, slots, old)
        empty = non_null <= 0
        if self.func == "sum":
            return value.set(pl.Series(empty), None), lambda: self.commit(batch)
        counts = value.to_numpy()
        if (counts[empty] != 0).any() or (counts[~empty] <= 0).any():
            raise StateError(f"operator {self.op_id}: a group's {self.label} state disagrees with its non-NULL "
                             f"count; recapture the sketch")
        return value, lambda: self.commit(batch)

    def _stepped(self, batch: Probe, slots: np.ndarray, old: pl.Series) -> pl.Series:
        """Old values plus what the batch's entering values add and its leaving values take away (BIGINT sums wrap
        around, as Spark's)."""
        step = ((batch.before == 0) & (batch.after > 0)).astype(np.int64) - \
            ((batch.before > 0) & (batch.after == 0)).astype(np.int64)
        if self.func == "sum":
            step = step * batch.changes.get_column(VALUE).to_numpy().astype(np.int64)
        total = old.cast(pl.Int64).fill_null(0).to_numpy().copy()
        if step.size:
            order = np.argsort(slots, kind="stable")
            at = order[np.searchsorted(slots[order], batch.changes.get_column(SLOT).to_numpy())]
            np.add.at(total, at, step)
        return pl.Series(old.name, total, dtype=pl.Int64)

    def _decimal_sums(self, batch: Probe, slots: np.ndarray) -> pl.Series:
        """The touched groups' decimal sums, added up again over the values they hold after the batch."""
        new = (batch.pos < 0) & (batch.after > 0)
        values = pl.concat([self.held(slots[slots >= 0], batch),
                            batch.changes.filter(pl.Series(new)).select(SLOT, VALUE)])
        sums = distinct_sums(values, [SLOT], self.scale, "__sum", self.guard)
        return pl.DataFrame([pl.Series(SLOT, slots, dtype=pl.Int64)]).join(
            sums, on=SLOT, how="left", maintain_order="left").get_column("__sum")


def distinct_sums(values: pl.DataFrame, keys: list[str], scale: int | None, new: str,
                  guard: str | None = None) -> pl.DataFrame:
    """Per ``keys`` the sum of ``values``' ``__v`` in ``new``. A decimal sum (``scale``) beyond 38 digits is NULL, as
    Spark's non-ANSI SUM gives it (below 38 digits, DECIMAL(p + 10, s) holds the sum of 10^10 values of
    DECIMAL(p, s)).

    ``guard`` (the aggregate, as an error names it) refuses a group whose values' absolute sum reaches 10^38 units
    while their sum does not: Spark's running sum over them may then be NULL or not depending on their order
    (``running_sums``).

    Raises:
        OrderDependentValueError: ``guard`` is given and a group's value depends on the order of the values.
    """
    if scale is None:
        return values.group_by(keys).agg(pl.col(VALUE).sum().alias(new))
    # polars adds decimals in 128 bits and wraps around beyond 1.7 * 10^38 units: groups whose absolute sum may
    # come near 10^38 units (10^(38 - scale) in value) are added up exactly in Python (a few huge values)
    near = 10.0 ** (37 - scale)
    sums = values.group_by(keys).agg(pl.col(VALUE).sum().alias(new), pl.col(VALUE).cast(pl.Float64).abs().sum()
                                     .alias("__size")).with_columns(pl.col("__size") >= near)
    if not sums.get_column("__size").any():
        return sums.drop("__size")
    exact = sums.filter("__size").drop(new).join(values, on=keys, how="left", nulls_equal=True).group_by(
        keys).agg(pl.col(VALUE))
    wide, limit = decimal.Context(prec=100), decimal.Decimal(10) ** (38 - scale)
    groups = exact.get_column(VALUE).to_list()
    totals = [functools.reduce(wide.add, v, decimal.Decimal(0)) for v in groups]
    # ``wide.abs``: the built-in abs() rounds to the default context's 28 digits (38 nines would become 10^38)
    if guard is not None and any(wide.abs(t) < limit <= functools.reduce(wide.add, map(wide.abs, v), decimal.Decimal(0))
                                 for t, v in zip(totals, groups, strict=True)):
        raise order_dependent(guard)
    exact = exact.drop(VALUE).with_columns(pl.Series(new, [t if wide.abs(t) < limit else None for t in totals],
                                                     dtype=sums.schema[new]))
    return pl.concat([sums.filter(~pl.col("__size")).drop("__size"), exact])


def _weakly(method: Callable[[np.ndarray], pl.DataFrame]) -> Callable[[np.ndarray], pl.DataFrame]:
    """``method`` called through a weak reference to its object."""
    ref = weakref.WeakMethod(method)

    def call(slots: np.ndarray) -> pl.DataFrame:
        bound = ref()
        if bound is None:
            raise StateError("the aggregation that owns these value counts is gone; build the pipeline again")
        return bound(slots)
    return call


def value_multisets(op_id: str, layout: PartialLayout, keyed: bool, buffer: int,
                    keys_of: Callable[[np.ndarray], pl.DataFrame],
                    guarded: frozenset[int] = frozenset()) -> dict[int, ValueMultiset | KeyedValueMultiset]:
    """The value counts of an aggregation's MIN/MAX (keyed, or frames when ``buffer`` or not ``keyed``) and DISTINCT
    aggregates, by aggregate index; ``guarded`` the wide decimal SUM(DISTINCT)s that refuse an order-dependent value
    (``running_sums``).

    ``keys_of`` (the aggregation's bound method) is held weakly: the multisets must not point back at their operator,
    a cycle that kept a dropped pipeline's whole state alive until a full garbage collection.

    Aggregates over one argument (``layout.value_owner``) keep one copy of its counts: the later ones share the
    first one's (``share``) when both keep them the same way (keyed, or frames without a buffer: a buffer keeps
    each MIN or MAX its own best values). Only the first one's counts are saved (``stored``).
    """
    key_types = {k: layout.key_types[k] for k in layout.key_names}
    keys_of = _weakly(keys_of)
    guards = {j: f"operator {op_id}: {layout.aggs[j][1].func.upper()}(DISTINCT {layout.aggs[j][1].arg})"
              for j in guarded}
    out: dict[int, ValueMultiset | KeyedValueMultiset] = {}
    for j in layout.valued:
        a = layout.aggs[j][1]
        value_type, floats = layout.value_type(j), layout.float_values(j)
        if a.distinct and keyed:
            out[j] = KeyedDistinctValues(op_id, j, a.func, value_type, floats, keys_of, a.dtype, guards.get(j))
        elif a.distinct:
            out[j] = DistinctValues(op_id, j, a.func, key_types, value_type, floats, a.dtype, guards.get(j))
        elif keyed and not buffer:
            out[j] = KeyedValueMultiset(op_id, j, a.func, value_type, floats, keys_of)
        else:
            out[j] = ValueMultiset(op_id, j, a.func, key_types, value_type, floats, buffer)
        owner = out[layout.value_owner[j]]
        if owner is not out[j]:
            mine = out[j]
            if isinstance(mine, KeyedValueMultiset) and isinstance(owner, KeyedValueMultiset):
                mine.share(owner)
            elif isinstance(mine, ValueMultiset) and isinstance(owner, ValueMultiset) and not (mine.buffer or
                                                                                              owner.buffer):
                mine.share(owner)
    return out


def stored(multisets: dict[int, ValueMultiset | KeyedValueMultiset]) -> dict[int, ValueMultiset | KeyedValueMultiset]:
    """The multisets that hold their own counts (the others read an earlier one's): the ones state saves."""
    return {j: m for j, m in multisets.items() if m.owner is None}


def state_names(aggs: tuple[tuple[str, AggCall], ...]) -> list[str]:
    """The aggregates as saved state names them (``count``, ``count distinct``, ...)."""
    return [f"{a.func} distinct" if a.distinct else a.func for _, a in aggs]


__all__ = ["DistinctValues", "KeyedDistinctValues", "distinct_sums", "state_names", "stored", "value_multisets"]

"""The value counts behind one COUNT(DISTINCT x) or SUM(DISTINCT x) aggregate.

The paper's annotation semantics for aggregation is unchanged: a group's output row depends on all of the group's
rows (its sketch is ``{ρ | F_g[ρ] > 0}`` as for every aggregate); only how the value is maintained differs. Per
(group, value) the count of the group's rows with that non-NULL value, so a deletion is exact: a value belongs to
the group's distinct set while its count is positive, and leaves it when the count falls to 0. For a change:

* inserting a value the group already holds raises its count: COUNT(DISTINCT) and SUM(DISTINCT) stay;
* inserting a new value adds 1 to COUNT(DISTINCT) and the value to SUM(DISTINCT);
* deleting one of several copies lowers the count: both stay; deleting the last copy removes the value;
* NULL is not counted (Spark); a group without values has COUNT(DISTINCT) 0 and SUM(DISTINCT) NULL.

Each batch folds its value changes into the counts and recomputes the touched groups' values from them: the frame
multiset of ``operators/minmax.py`` (without a buffer), so a batch costs the counts held, also on keyed state. See
docs/ARCHITECTURE.md, "Operators".
"""

from __future__ import annotations

import decimal
import functools
from collections.abc import Callable

import numpy as np
import polars as pl
import pyarrow as pa

from imp_core.engine.evaluate import polars_type
from imp_core.engine.operators.minmax import ValueMultiset
from imp_core.engine.operators.minmax_keyed import KeyedValueMultiset
from imp_core.engine.operators.partials import PartialLayout, agg_columns
from imp_core.engine.schema import VALUE
from imp_core.plan.expr import AggCall


class DistinctValues(ValueMultiset):
    """COUNT(DISTINCT) or SUM(DISTINCT) ``j`` (``func`` "count" or "sum") of an aggregation: ``values`` (state
    keys, ``__v``, ``__n`` positive) as saved state; the group's value is kept in ``__m{j}`` of the groups frame,
    of type ``out_type``."""

    def __init__(self, op_id: str, j: int, func: str, key_types: dict[str, pl.DataType], value_type: pl.DataType,
                 float_values: bool, out_type: pa.DataType) -> None:
        super().__init__(op_id, j, func, key_types, value_type, float_values)
        self.label = f"{func.upper()}(DISTINCT)"
        self.out_type = polars_type(out_type)
        self.scale: int | None = out_type.scale if func == "sum" and pa.types.is_decimal(out_type) else None

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
            per_group = self._sums(values.join(touched, on=keys, how="semi", nulls_equal=True), new)
            value = pl.col(new).cast(self.out_type, strict=False)  # a group without values: NULL
        return (groups.join(per_group, on=keys, how="left", nulls_equal=True, maintain_order="left")
                .with_columns(value.alias(agg_columns(self.j).extreme)).drop(new))

    def _sums(self, values: pl.DataFrame, new: str) -> pl.DataFrame:
        """Per group the sum of its distinct values in ``new``. A decimal sum beyond 38 digits is NULL, as Spark's
        non-ANSI SUM gives it (below 38 digits, DECIMAL(p + 10, s) holds the sum of 10^10 values of DECIMAL(p, s)).
        """
        keys = self.keys
        if self.scale is None:
            return values.group_by(keys).agg(pl.col(VALUE).sum().alias(new))
        # polars adds decimals in 128 bits and wraps around: groups whose sum may come near 38 digits are added up
        # exactly in Python (a rare case, of a few huge values)
        sums = values.group_by(keys).agg(pl.col(VALUE).sum().alias(new), pl.col(VALUE).cast(pl.Float64).abs().sum()
                                         .alias("__size")).with_columns(pl.col("__size") >= 1e37)
        if not sums.get_column("__size").any():
            return sums.drop("__size")
        exact = sums.filter("__size").drop(new).join(values, on=keys, how="left", nulls_equal=True).group_by(
            keys).agg(pl.col(VALUE))
        wide, limit = decimal.Context(prec=100), decimal.Decimal(10) ** (38 - self.scale)
        totals = [functools.reduce(wide.add, v, decimal.Decimal(0)) for v in exact.get_column(VALUE).to_list()]
        exact = exact.drop(VALUE).with_columns(pl.Series(new, [t if abs(t) < limit else None for t in totals],
                                                         dtype=sums.schema[new]))
        return pl.concat([sums.filter(~pl.col("__size")).drop("__size"), exact])

def value_multisets(op_id: str, layout: PartialLayout, keyed: bool, buffer: int,
                    keys_of: Callable[[np.ndarray], pl.DataFrame]) -> dict[int, ValueMultiset | KeyedValueMultiset]:
    """The value counts of an aggregation's MIN/MAX (keyed, or frames when ``buffer`` or not ``keyed``) and DISTINCT
    aggregates, by aggregate index."""
    key_types = {k: layout.key_types[k] for k in layout.key_names}
    out: dict[int, ValueMultiset | KeyedValueMultiset] = {}
    for j in layout.valued:
        a = layout.aggs[j][1]
        value_type, floats = layout.value_type(j), layout.float_values(j)
        if a.distinct:
            out[j] = DistinctValues(op_id, j, a.func, key_types, value_type, floats, a.dtype)
        elif keyed and not buffer:
            out[j] = KeyedValueMultiset(op_id, j, a.func, value_type, floats, keys_of)
        else:
            out[j] = ValueMultiset(op_id, j, a.func, key_types, value_type, floats, buffer)
    return out


def state_names(aggs: tuple[tuple[str, AggCall], ...]) -> list[str]:
    """The aggregates as saved state names them (``count``, ``count distinct``, ...)."""
    return [f"{a.func} distinct" if a.distinct else a.func for _, a in aggs]


__all__ = ["DistinctValues", "state_names", "value_multisets"]

"""The value multiset behind one MIN or MAX aggregate (paper 5.2.6), optionally cut to a bounded buffer (paper 7.2).

Per group the multiset of values with their counts (the paper's balanced tree, as a frame), so deleting the current
extreme is exact. With a buffer of ``l`` values per group only the best ``l`` are kept, and the worst kept value
of a cut group is its bound: value changes beyond it cannot reach the group's MIN/MAX and are dropped (aggregate
selection, Liu et al.). See docs/ARCHITECTURE.md, "Optimizations".
"""

from __future__ import annotations

import polars as pl

from imp_core.engine.float_keys import float_from_order_key
from imp_core.engine.operators.partials import agg_columns
from imp_core.engine.schema import COUNT, VALUE
from imp_core.errors import BufferExhaustedError, StateError

BOUND = "__bound"


class ValueMultiset:
    """MIN/MAX ``j`` of an aggregation: ``values`` (state keys, ``__v``, ``__n``) and, with a buffer, ``bounds``
    (state keys, ``__bound``: the worst value kept of every cut group)."""

    def __init__(self, op_id: str, j: int, func: str, key_types: dict[str, pl.DataType], value_type: pl.DataType,
                 float_values: bool, buffer: int = 0) -> None:
        self.op_id, self.j, self.func = op_id, j, func
        self.label = "MIN/MAX"  # for messages
        self.keys = list(key_types)
        self.key_types = key_types
        self.value_type = value_type
        self.float_values = float_values  # values are doubles as order keys (``float_order_key``)
        self.buffer = buffer
        self.owner: ValueMultiset | None = None  # the multiset whose counts this one reads (``share``)
        self._counts: list[pl.DataFrame] = [pl.DataFrame()]
        self.reset()

    @property
    def values(self) -> pl.DataFrame:
        """The counts: state keys, ``__v``, ``__n`` (positive)."""
        return self._counts[0]

    @values.setter
    def values(self, frame: pl.DataFrame) -> None:
        self._counts[0] = frame

    def share(self, owner: ValueMultiset) -> None:
        """Read ``owner``'s counts (an earlier aggregate over the same argument, without a buffer) instead of keeping
        a copy: ``owner`` folds each batch's changes, which are this one's too, before this one reads them."""
        assert not self.buffer and not owner.buffer and owner.value_type == self.value_type
        self.owner, self._counts = owner, owner._counts

    def reset(self) -> None:
        self.values = pl.DataFrame(schema={**self.key_types, VALUE: self.value_type, COUNT: pl.Int64})
        self.bounds = pl.DataFrame(schema={**self.key_types, BOUND: self.value_type})

    def apply(self, changes: pl.DataFrame | None, touched: pl.DataFrame, groups: pl.DataFrame) -> pl.DataFrame:
        """Fold value-count ``changes`` into the multiset; ``groups`` (one row per ``touched`` group, with its
        non-NULL count ``__n{j}``) comes back with each group's new extreme in ``__m{j}``."""
        keys = self.keys
        j = self.j
        values = self.fold(changes)
        if self.buffer:
            values = self._trim(touched, groups)
        new = agg_columns(j).extreme + "_new"
        ext = (values.join(touched, on=keys, how="semi", nulls_equal=True).group_by(keys)
               .agg((pl.col(VALUE).min() if self.func == "min" else pl.col(VALUE).max()).alias(new)))
        if self.float_values:  # back from the order key to the double
            ext = ext.with_columns(pl.Series(new, float_from_order_key(ext.get_column(new).to_numpy()),
                                             dtype=pl.Float64))
        return (groups.join(ext, on=keys, how="left", nulls_equal=True, maintain_order="left")
                .with_columns(pl.col(new).alias(agg_columns(j).extreme)).drop(new))

    def fold(self, changes: pl.DataFrame | None) -> pl.DataFrame:
        """Fold value-count ``changes`` (state keys, ``__v``, ``__n`` signed) into ``values``; a value whose count
        falls to 0 leaves it. Returns the new ``values``.

        Raises:
            StateError: A count would become negative (the change feed deletes a value the state never saw).
        """
        keys = self.keys
        values = self.values
        if changes is None or not changes.height or self.owner is not None:  # a shared multiset: folded by its owner
            return values
        changes = changes.cast(self.key_types)  # type: ignore[arg-type]
        # in the multiset's column order: a backend's changes may carry the float keys' NaN flags last
        changes = changes.with_columns(pl.col(VALUE).cast(self.value_type)).select(values.columns)
        if self.buffer and self.bounds.height:
            changes = self._within_bounds(changes)
        merged = (pl.concat([values.join(changes.select([*keys, VALUE]), on=[*keys, VALUE], how="semi",
                                         nulls_equal=True), changes])
                  .group_by([*keys, VALUE]).agg(pl.col(COUNT).sum()))
        if merged.filter(pl.col(COUNT) < 0).height:
            raise StateError(f"operator {self.op_id}: {self.label} state lost a value the change feed "
                             f"deletes; recapture the sketch")
        self.values = pl.concat([values.join(changes.select([*keys, VALUE]), on=[*keys, VALUE], how="anti",
                                             nulls_equal=True),
                                 merged.filter(pl.col(COUNT) > 0).select(values.columns)])
        return self.values

    def _within_bounds(self, changes: pl.DataFrame) -> pl.DataFrame:
        """The value changes that can reach a group's MIN/MAX: beyond a cut group's bound an insert is worse than a
        kept value and a delete removes a value not kept."""
        bounded = changes.join(self.bounds, on=self.keys, how="left", nulls_equal=True)
        beyond = (pl.col(VALUE) > pl.col(BOUND)) if self.func == "min" else (pl.col(VALUE) < pl.col(BOUND))
        return bounded.filter(~beyond.fill_null(False)).drop(BOUND)

    def _trim(self, touched: pl.DataFrame, groups: pl.DataFrame) -> pl.DataFrame:
        """Keep the best ``buffer`` values of each touched group; fail when a cut group ran out."""
        keys = self.keys
        descending = self.func == "max"
        part = self.values.join(touched, on=keys, how="semi", nulls_equal=True)
        rest = self.values.join(touched, on=keys, how="anti", nulls_equal=True)
        ranked = part.with_columns(pl.col(VALUE).rank("ordinal", descending=descending).over(keys).alias("__r"))
        kept = ranked.filter(pl.col("__r") <= self.buffer)
        cut = ranked.filter(pl.col("__r") > self.buffer).select(keys).unique()
        if cut.height:
            bound = (kept.join(cut, on=keys, how="semi", nulls_equal=True).group_by(keys)
                     .agg((pl.col(VALUE).min() if descending else pl.col(VALUE).max()).alias(BOUND)))
            bound = bound.with_columns(pl.col(BOUND).cast(self.value_type))
            self.bounds = pl.concat([self.bounds.join(bound.select(keys), on=keys, how="anti", nulls_equal=True),
                                     bound.select(self.bounds.columns)])
        self.values = pl.concat([rest, kept.drop("__r")])
        # a cut group whose kept values were all deleted while it still has values: its MIN/MAX is unknown
        held = self.values.join(touched, on=keys, how="semi", nulls_equal=True).select(keys).unique()
        live = groups.filter(pl.col(agg_columns(self.j).non_null) > 0).select(keys)
        lost = (self.bounds.join(touched, on=keys, how="semi", nulls_equal=True)
                .join(held, on=keys, how="anti", nulls_equal=True))
        if lost.join(live, on=keys, how="semi", nulls_equal=True).height:
            raise BufferExhaustedError(f"operator {self.op_id}: deletions emptied a MIN/MAX buffer of "
                                       f"{self.buffer} values; the sketch must be recaptured")
        # groups that are gone (or fully held again) need no bound any more
        self.bounds = self.bounds.join(lost, on=keys, how="anti", nulls_equal=True)
        return self.values


__all__ = ["BOUND", "ValueMultiset"]

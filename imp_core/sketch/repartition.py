"""Range split and merge (paper 7.4): which fragments of a partition over- or underflow, the new bounds, and how the
old fragment ids map to the new ones.

A fragment holding more than ``factor`` times the mean rows is split into equi-depth pieces at its values'
quantiles; a run of neighbouring fragments each below ``1 / factor`` of the mean is merged while the run stays
below the mean. The paper's rule rewrites a sketch without looking at data: one holding a split fragment holds all
its pieces, one holding any fragment of a merged run holds the merged fragment (:meth:`Repartition.rule`).

Ids change in two steps so that operator state can follow by renaming alone (``Pipeline.repartitioned``): first
the merges (the rows of a run's later fragments are moved to its first by the caller, then ids are renamed
``old -> mid``), then the splits (ids renamed ``mid -> new``, a split fragment keeping the id of its first piece,
then the rows of the other pieces are moved). See docs/ARCHITECTURE.md, "Range split and merge".
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl

from imp_core.errors import UsageError
from imp_core.sketch.partition import Bound, Partition, PartitionSet

DEFAULT_FACTOR = 4.0
"""A fragment is split above this many times the mean rows; neighbours below the mean divided by it are merged."""

MAX_PIECES = 64
"""A split makes at most this many pieces of one fragment."""


@dataclass(frozen=True)
class Repartition:
    """A split-and-merge of one partition: ``merges`` (runs ``(first, last)`` of old fragment ids) give ``mid``;
    ``splits`` (mid fragment id -> the new inner bounds inside it) give ``new``."""

    old: Partition
    mid: Partition
    new: Partition
    merges: tuple[tuple[int, int], ...]
    splits: Mapping[int, tuple[Bound, ...]]

    @property
    def changed(self) -> bool:
        return bool(self.merges or self.splits)

    def old_to_mid(self) -> np.ndarray:
        """Local id map of the merge step: a run's fragments all map to the run's one mid fragment."""
        return _merge_map(self.old.fragments, self.merges)

    def mid_to_new(self) -> np.ndarray:
        """Local id map of the split step: a split fragment keeps the id of its first piece."""
        grow = np.zeros(self.mid.fragments, dtype=np.int64)
        for frag, inner in self.splits.items():
            grow[frag] = len(inner)
        shift: np.ndarray = np.concatenate([[0], np.cumsum(grow)[:-1]])
        ids: np.ndarray = np.arange(self.mid.fragments, dtype=np.int64) + shift
        return ids

    def moved_by_merge(self) -> list[tuple[int, int]]:
        """Old fragments whose rows move in the merge step, with the old id they move to (the run's first)."""
        return [(f, first) for first, last in self.merges for f in range(first + 1, last + 1)]

    def rule(self, fragments: Sequence[int]) -> list[int]:
        """The paper's rewrite of a sketch (local old ids -> local new ids): a split fragment becomes all its
        pieces, a merged run the merged fragment. Sufficient for any query the old sketch was sufficient for."""
        to_mid, to_new = self.old_to_mid(), self.mid_to_new()
        out: set[int] = set()
        for f in fragments:
            m = int(to_mid[f])
            first = int(to_new[m])
            out.update(range(first, first + len(self.splits.get(m, ())) + 1))
        return sorted(out)

    def new_rows(self, rows: Sequence[int], split_rows: Mapping[int, Sequence[int]]) -> list[int]:
        """Rows per new fragment: merged runs add up, a split fragment's pieces take ``split_rows[mid id]``."""
        mid = np.zeros(self.mid.fragments, dtype=np.int64)
        np.add.at(mid, self.old_to_mid(), np.asarray(rows, dtype=np.int64))
        out: list[int] = []
        for m, n in enumerate(mid.tolist()):
            out.extend(split_rows[m] if m in self.splits else [n])
        return out


def plan(partition: Partition, rows: Sequence[int], factor: float, values: Mapping[int, pl.Series]) -> Repartition:
    """The split-and-merge of ``partition`` given its ``rows`` per fragment and, for every fragment
    :func:`overflowing` names, its values (``values``, NULL and NaN included as the table has them).

    Raises:
        UsageError: ``rows`` does not have one count per fragment, or ``factor`` is not above 1.
    """
    check(partition, rows, factor)
    merges = _merge_runs(rows, factor, set(overflowing(rows, factor)))
    mid = _merged(partition, merges)
    to_mid = _merge_map(partition.fragments, merges)
    mean = sum(rows) / len(rows)
    splits: dict[int, tuple[Bound, ...]] = {}
    for frag in overflowing(rows, factor):
        pieces = min(MAX_PIECES, math.ceil(rows[frag] / mean)) if mean else 1
        inner = split_bounds(partition, frag, values[frag], pieces)
        if inner:
            splits[int(to_mid[frag])] = inner
    return Repartition(partition, mid, _split(mid, splits), tuple(merges), splits)


def check(partition: Partition, rows: Sequence[int], factor: float) -> None:
    if len(rows) != partition.fragments:
        raise UsageError(f"partition on {partition.table}.{partition.column} has {partition.fragments} fragments, "
                         f"got {len(rows)} row counts")
    if not factor > 1:
        raise UsageError(f"the split/merge factor must be above 1 (a fragment above factor x the mean rows is "
                         f"split), got {factor}")


def overflowing(rows: Sequence[int], factor: float) -> list[int]:
    """Fragments holding more than ``factor`` times the mean rows."""
    mean = sum(rows) / len(rows) if rows else 0
    return [i for i, n in enumerate(rows) if mean and n > factor * mean]


def needs_change(rows: Sequence[int], factor: float) -> bool:
    """Whether some fragment over- or underflows: what :func:`plan` would split or merge (from the counts alone)."""
    return bool(overflowing(rows, factor) or _merge_runs(rows, factor, set(overflowing(rows, factor))))


def _merge_map(fragments: int, merges: Sequence[tuple[int, int]]) -> np.ndarray:
    out = np.arange(fragments, dtype=np.int64)
    shift = 0
    for first, last in merges:  # in increasing order
        out[first:last + 1] = first - shift
        out[last + 1:] -= last - first
        shift += last - first
    return out


def _merge_runs(rows: Sequence[int], factor: float, keep: set[int]) -> list[tuple[int, int]]:
    """Maximal runs of neighbours each below ``mean / factor``, cut where the run would reach the mean."""
    mean = sum(rows) / len(rows) if rows else 0
    small = [n < mean / factor and i not in keep for i, n in enumerate(rows)]
    runs: list[tuple[int, int]] = []
    i = 0
    while i < len(rows):
        if not small[i]:
            i += 1
            continue
        j, total = i, rows[i]
        while j + 1 < len(rows) and small[j + 1] and total + rows[j + 1] < mean:
            j += 1
            total += rows[j]
        if j > i:
            runs.append((i, j))
        i = j + 1
    if len(runs) == 1 and runs[0] == (0, len(rows) - 1) and len(rows) > 1:
        return []  # every fragment small: the partition is fine as it is (an empty or tiny table)
    return runs


def split_bounds(partition: Partition, frag: int, values: pl.Series, pieces: int) -> tuple[Bound, ...]:
    """Inner bounds cutting fragment ``frag`` into up to ``pieces`` pieces of about equal rows: quantiles of its
    non-NULL, non-NaN ``values``, above the fragment's lowest value and below the next fragment's bound (fewer
    when values repeat)."""
    clean = values.drop_nulls()
    if clean.dtype.is_float():
        clean = clean.filter(~clean.is_nan())
    if pieces < 2 or clean.len() < 2:
        return ()
    ordered = clean.sort()
    lo = ordered[0]
    upper = partition.bounds[frag + 1] if frag + 1 < partition.fragments else None
    out: list[Bound] = []
    for k in range(1, pieces):
        q = ordered[min(ordered.len() - 1, (k * ordered.len()) // pieces)]
        if q > lo and (upper is None or q < upper) and (not out or q > out[-1]):
            out.append(q)
    return tuple(out)


def _merged(partition: Partition, merges: Sequence[tuple[int, int]]) -> Partition:
    drop = {b for first, last in merges for b in range(first + 1, last + 1)}  # bound i starts fragment i
    bounds = [b for i, b in enumerate(partition.bounds) if i not in drop]
    return Partition(partition.table, partition.column, tuple(bounds), partition.kind, partition.dtype)


def _split(partition: Partition, splits: Mapping[int, Sequence[Bound]]) -> Partition:
    """``partition`` with the cuts; the first and last bound, which only describe the data, widen to stay outside
    cuts made in the open first and last fragment."""
    bounds: list[Bound] = [partition.bounds[0]]
    for i in range(partition.fragments):
        if i:
            bounds.append(partition.bounds[i])
        bounds.extend(splits.get(i, ()))
    bounds.append(partition.bounds[-1])
    if len(bounds) > 2:
        bounds[0] = min(bounds[0], bounds[1])
        bounds[-1] = max(bounds[-1], bounds[-2])
        if bounds[0] == bounds[1]:
            bounds[0] = _below(bounds[1])
        if bounds[-1] == bounds[-2]:
            bounds[-1] = _above(bounds[-2])
    return Partition(partition.table, partition.column, tuple(bounds), partition.kind, partition.dtype)


def _below(value: Bound) -> Bound:
    """A value of the same kind below ``value`` (a descriptive end bound)."""
    if isinstance(value, dt.datetime):
        return value - dt.timedelta(microseconds=1)
    if isinstance(value, dt.date):
        return value - dt.timedelta(days=1)
    if isinstance(value, str):
        return ""  if value else value
    return value - 1


def _above(value: Bound) -> Bound:
    if isinstance(value, dt.datetime):
        return value + dt.timedelta(microseconds=1)
    if isinstance(value, dt.date):
        return value + dt.timedelta(days=1)
    if isinstance(value, str):
        return value + "\x00"
    return value + 1


def global_map(partitions: PartitionSet, table: str, local: np.ndarray, fragments_after: int) -> np.ndarray:
    """A local id map of ``table``'s partition extended to every global id of ``partitions``: the ids of the
    tables after it shift by the change in its number of fragments (to ``fragments_after``)."""
    out: list[np.ndarray] = []
    shift = 0
    for p in partitions.partitions:
        off = partitions.offset(p.table)
        if p.table == table:
            out.append(local + off)
            shift = fragments_after - p.fragments
        else:
            out.append(np.arange(off, off + p.fragments, dtype=np.int64) + shift)
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def replaced(partitions: PartitionSet, partition: Partition) -> PartitionSet:
    """``partitions`` with ``partition`` in place of the one of its table."""
    return PartitionSet(tuple(partition if p.table == partition.table else p for p in partitions.partitions))


__all__ = ["DEFAULT_FACTOR", "MAX_PIECES", "Repartition", "check", "global_map", "needs_change", "overflowing", "plan",
           "replaced", "split_bounds"]

"""Range partitions (paper Definition 4.1) and the fragment a value belongs to.

A partition of one table is a column and sorted bounds ``b0 < b1 < ... < bn``; fragment ``i`` is ``[b_i, b_{i+1})``.
The first and last fragments are open-ended so that the whole domain is covered: values below ``b0`` fall in
fragment 0 and values at or above ``bn`` in fragment ``n-1``. SQL NULLs in the partition column also belong to
fragment 0, and the use rewrite adds ``col IS NULL`` to fragment 0's range, so no row is ever outside every fragment.

With several partitioned tables in one query, fragments get *global* ids: table ``k``'s fragment ``i`` is
``offset_k + i``. Annotations inside the engine always carry global ids, so a union of annotations from different
tables is a plain set union.
"""

from __future__ import annotations

import datetime as dt
import decimal
import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from imp_core.errors import UsageError

Bound = Any  # int | float | decimal.Decimal | date | datetime | str

_KINDS = ("int", "float", "decimal", "date", "timestamp", "string")


def kind_of_value(value: Bound) -> str:
    if isinstance(value, bool):
        raise UsageError("partition bounds cannot be booleans; partition on a numeric, date, timestamp or string column")
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, decimal.Decimal):
        return "decimal"
    if isinstance(value, dt.datetime):
        return "timestamp"
    if isinstance(value, dt.date):
        return "date"
    if isinstance(value, str):
        return "string"
    raise UsageError(f"unsupported partition bound {value!r} of type {type(value).__name__}")


def parse_bound(text: str, kind: str) -> Bound:
    """Parse one ``--bounds`` item for a column of the given kind."""
    text = text.strip()
    try:
        if kind == "int":
            return int(text)
        if kind == "float":
            return float(text)
        if kind == "decimal":
            return decimal.Decimal(text)
        if kind == "date":
            return dt.date.fromisoformat(text)
        if kind == "timestamp":
            return dt.datetime.fromisoformat(text)
        if kind == "string":
            return text
    except (ValueError, decimal.InvalidOperation) as e:
        raise UsageError(f"bound {text!r} is not a valid {kind} value for the partition column") from e
    raise UsageError(f"cannot partition a column of kind {kind!r}; use a numeric, date, timestamp or string column")


@dataclass(frozen=True)
class Partition:
    """A range partition of one table on one column: ``len(bounds) - 1`` fragments."""

    table: str
    column: str
    bounds: tuple[Bound, ...]
    kind: str

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise UsageError(f"partition on {self.table}.{self.column}: unsupported column kind {self.kind!r}")
        if len(self.bounds) < 2:
            raise UsageError(f"partition on {self.table}.{self.column} needs at least two bounds (one fragment), "
                             f"got {len(self.bounds)}")
        for lo, hi in zip(self.bounds, self.bounds[1:]):
            if not lo < hi:
                raise UsageError(f"partition bounds on {self.table}.{self.column} must be strictly increasing; "
                                 f"{lo!r} is followed by {hi!r}")

    @property
    def fragments(self) -> int:
        return len(self.bounds) - 1

    @functools.cached_property
    def _inner_bounds(self) -> dict[pl.DataType, pl.Series]:
        return {}

    def fragment_of(self, values: pl.Series) -> np.ndarray:
        """Fragment id (0-based, local) of every value; vectorized binary search over the inner bounds."""
        if self.fragments <= 1:
            return np.zeros(len(values), dtype=np.int32)
        inner = self._inner_bounds.get(values.dtype)
        if inner is None:  # built once per value type: a thousand bounds cost more to convert than to search
            inner = self._inner_bounds[values.dtype] = pl.Series(list(self.bounds[1:-1]), dtype=values.dtype)
        idx = inner.search_sorted(values, side="right")
        frag = idx.to_numpy().astype(np.int32, copy=False)
        if values.null_count():
            frag = np.where(values.is_null().to_numpy(), 0, frag).astype(np.int32)
        return frag

    def ranges(self, fragments: Iterable[int]) -> list[tuple[Bound | None, Bound | None, bool]]:
        """Merged ranges ``(lo, hi, with_nulls)`` covering the given fragments; ``None`` means unbounded.

        Adjacent fragments are merged into one range, so a sketch {3, 4, 5} becomes one ``[b3, b6)`` predicate.
        """
        frags = sorted(set(fragments))
        out: list[tuple[Bound | None, Bound | None, bool]] = []
        start = prev = None
        for f in frags:
            if f < 0 or f >= self.fragments:
                raise UsageError(f"fragment {f} is outside the partition of {self.table}.{self.column} "
                                 f"(0..{self.fragments - 1})")
            if start is None:
                start = prev = f
            elif f == prev + 1:  # type: ignore[operator]
                prev = f
            else:
                out.append(self._range(start, prev))  # type: ignore[arg-type]
                start = prev = f
        if start is not None:
            out.append(self._range(start, prev))  # type: ignore[arg-type]
        return out

    def _range(self, first: int, last: int) -> tuple[Bound | None, Bound | None, bool]:
        lo = None if first == 0 else self.bounds[first]
        hi = None if last == self.fragments - 1 else self.bounds[last + 1]
        return lo, hi, first == 0

    def to_json(self) -> dict[str, Any]:
        return {"table": self.table, "column": self.column, "kind": self.kind,
                "bounds": [bound_to_json(b) for b in self.bounds]}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Partition:
        kind = obj["kind"]
        return cls(obj["table"], obj["column"], tuple(bound_from_json(b, kind) for b in obj["bounds"]), kind)


def bound_to_json(value: Bound) -> Any:
    if isinstance(value, (dt.date, dt.datetime)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, float) and not np.isfinite(value):
        return str(value)
    return value


def bound_from_json(value: Any, kind: str) -> Bound:
    if kind == "float":
        return float(value)
    if kind == "int":
        return int(value)
    if kind in ("date", "timestamp", "decimal"):
        return parse_bound(str(value), kind)
    return value


@dataclass(frozen=True)
class PartitionSet:
    """The partitions of one sketch, one per partitioned table, with their global fragment offsets."""

    partitions: tuple[Partition, ...]

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for p in self.partitions:
            if p.table in seen:
                raise UsageError(f"table {p.table} is partitioned twice; a sketch has one partition per table")
            seen.add(p.table)

    @property
    def total_fragments(self) -> int:
        return sum(p.fragments for p in self.partitions)

    def offset(self, table: str) -> int:
        off = 0
        for p in self.partitions:
            if p.table == table:
                return off
            off += p.fragments
        raise KeyError(table)

    def get(self, table: str) -> Partition | None:
        for p in self.partitions:
            if p.table == table:
                return p
        return None

    @property
    def tables(self) -> tuple[str, ...]:
        return tuple(p.table for p in self.partitions)

    def split_global(self, global_ids: Sequence[int]) -> dict[str, list[int]]:
        """Global fragment ids -> local ids per table."""
        out: dict[str, list[int]] = {p.table: [] for p in self.partitions}
        bounds = []
        off = 0
        for p in self.partitions:
            bounds.append((off, off + p.fragments, p.table))
            off += p.fragments
        for g in sorted(global_ids):
            for lo, hi, table in bounds:
                if lo <= g < hi:
                    out[table].append(g - lo)
                    break
            else:
                raise UsageError(f"global fragment {g} is outside every partition")
        return out

    def to_json(self) -> list[dict[str, Any]]:
        return [p.to_json() for p in self.partitions]

    @classmethod
    def from_json(cls, obj: list[dict[str, Any]]) -> PartitionSet:
        return cls(tuple(Partition.from_json(p) for p in obj))

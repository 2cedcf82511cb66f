"""Range partitions (paper Definition 4.1) and the fragment a value belongs to, with global fragment ids over the
partitions of one sketch.

The comparison rule is in docs/SEMANTICS.md, "Partitions, bounds and file statistics"; global ids in
docs/ARCHITECTURE.md, "Annotated deltas".
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
import pyarrow as pa

from imp_core.errors import StateError, UsageError
from imp_core.sketch.bounds import (
    KINDS,
    Bound,
    default_type,
    kind_of,
    micros,
    normalize_bound,
    parse_bound,
    parse_bounds,
    sql_type_name,
    type_from_json,
    type_to_json,
)

__all__ = ["Bound", "Partition", "PartitionSet", "parse_bound", "parse_bounds"]


@dataclass(frozen=True)
class Partition:
    """A range partition of one table on one column: ``len(bounds) - 1`` fragments.

    ``dtype`` is the column's Arrow type; every bound is a value of that type (``imp_core.sketch.bounds`` parses
    and rounds given bounds). Partitions recorded without a type get the kind's default (BIGINT, DOUBLE, a
    DECIMAL(38, s) wide enough for the bounds, DATE, TIMESTAMP with or without zone as the bounds are, STRING).
    """

    table: str
    column: str
    bounds: tuple[Bound, ...]
    kind: str
    dtype: pa.DataType | None = None

    def __post_init__(self) -> None:
        where = f"{self.table}.{self.column}"
        if self.kind not in KINDS:
            raise UsageError(f"partition on {where}: unsupported column kind {self.kind!r}")
        dtype = self.dtype if self.dtype is not None else default_type(self.kind, self.bounds)
        if kind_of(dtype) != self.kind:
            raise UsageError(f"partition on {where}: column type {dtype} is not of kind {self.kind!r}")
        if len(self.bounds) < 2:
            raise UsageError(f"partition on {where} needs at least two bounds (one fragment), got {len(self.bounds)}")
        exact = []
        for b in self.bounds:
            value, note = normalize_bound(b, dtype, where)
            if note is not None:
                raise UsageError(f"partition on {where}: bound {b!r} is not a {sql_type_name(dtype)} value; "
                                 f"normalize bounds with imp_core.sketch.bounds.parse_bounds first")
            exact.append(value)
        for lo, hi in zip(exact, exact[1:]):
            if not lo < hi:
                raise UsageError(f"partition bounds on {where} must be strictly increasing; {lo!r} is followed by "
                                 f"{hi!r}")
        object.__setattr__(self, "bounds", tuple(exact))
        object.__setattr__(self, "dtype", dtype)

    @property
    def column_type(self) -> pa.DataType:
        """The partition column's Arrow type (always set after construction)."""
        assert self.dtype is not None
        return self.dtype

    @property
    def fragments(self) -> int:
        return len(self.bounds) - 1

    @property
    def inner_bounds(self) -> tuple[Bound, ...]:
        """The bounds that separate fragments (the first and last bound only describe the data: open-ended)."""
        return self.bounds[1:-1]

    @functools.cached_property
    def _inner_bounds(self) -> dict[pl.DataType, pl.Series]:
        return {}

    @functools.cached_property
    def _lookup(self) -> dict[pl.DataType, np.ndarray | None]:
        return {}

    def fragment_of(self, values: pl.Series) -> np.ndarray:
        """Fragment id (0-based, local) of every value: a lookup table for integer-like values between close
        bounds, else a vectorized binary search over the inner bounds.

        Spark's order: NULL goes to fragment 0, NaN above every number (the last fragment), -0.0 equals 0.0.
        """
        if self.fragments <= 1 or values.dtype == pl.Null:
            return np.zeros(len(values), dtype=np.int32)
        inner = self._inner_bounds.get(values.dtype)
        if inner is None:  # built once per value type: a thousand bounds cost more to convert than to search
            inner = pl.Series(list(self.inner_bounds), dtype=values.dtype, strict=False)
            if inner.null_count() or not all(map(_same_value, inner.to_list(), self.inner_bounds)):
                raise StateError(f"partition on {self.table}.{self.column}: its bounds are not values of the "
                                 f"column's type {values.dtype} here; recapture the sketch")
            self._inner_bounds[values.dtype] = inner
        dtype = values.dtype
        if not values.null_count() and (dtype.is_numeric() and not dtype.is_decimal() or dtype == pl.Date or
                                         isinstance(dtype, (pl.Datetime, pl.Duration))):
            # NumPy's search (a polars search_sorted is an expression run, ~0.2 ms on any batch); NaN sorts last in
            # both, and -0.0 == 0.0
            lo, v = inner.to_numpy(), values.to_numpy()
            if v.dtype.kind in "mM":
                lo, v = lo.view(np.int64), v.view(np.int64)
            if dtype not in self._lookup:  # built once per value type, like the bounds
                self._lookup[dtype] = _dense_fragments(lo) if v.dtype.kind == "i" or v.dtype.kind == "u" and \
                    v.dtype.itemsize < 8 else None
            table = self._lookup[dtype]
            if table is not None and v.size > 64:  # a lookup per value, not a binary search (~60 ns, mispredicted)
                first = int(lo[0]) - 1
                looked_up: np.ndarray = table[np.clip(v, first, int(lo[-1])).astype(np.int64) - first]
                return looked_up
            return np.searchsorted(lo, v, side="right").astype(np.int32)
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
        return {"table": self.table, "column": self.column, "kind": self.kind, "type": type_to_json(self.column_type),
                "bounds": [bound_to_json(b) for b in self.bounds]}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Partition:
        kind = obj["kind"]
        dtype = type_from_json(obj["type"]) if obj.get("type") else None
        return cls(obj["table"], obj["column"], tuple(bound_from_json(b, kind) for b in obj["bounds"]), kind, dtype)


def _same_value(a: Any, b: Any) -> bool:
    if isinstance(a, dt.datetime) and isinstance(b, dt.datetime):
        return bool(micros(a) == micros(b))  # polars reads a naive bound for a zoned column as UTC, like Spark here
    return bool(a == b)


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
    if kind == "decimal":
        return decimal.Decimal(str(value))
    if kind == "date":
        return dt.date.fromisoformat(str(value))
    if kind == "timestamp":
        return dt.datetime.fromisoformat(str(value))
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


DENSE_SPAN = 1 << 20  # the widest integer range between a partition's inner bounds given a lookup table (4 MB)


def _dense_fragments(inner: np.ndarray) -> np.ndarray | None:
    """The fragment of every integer from ``inner[0] - 1`` to ``inner[-1]`` (values beyond are clipped to those
    ends, whose fragments are the first and the last), or None when that range is too wide or ``inner[0]`` is the
    type's smallest value."""
    lo, hi = int(inner[0]), int(inner[-1])
    if hi - lo >= DENSE_SPAN or lo <= np.iinfo(inner.dtype).min:
        return None
    return np.searchsorted(inner.astype(np.int64), np.arange(lo - 1, hi + 1, dtype=np.int64),
                           side="right").astype(np.int32)

"""Change feeds shared by the sketches of one maintenance job: each table's pending range read once.

A grouped job (:mod:`imp_core.maintenance.groups`) first plans, for every sketch, which version range of which
table it still has to process and which columns its query uses; the first sketch that asks for a table's changes
then reads the union of those ranges and columns in one read, and every sketch gets its own slice of it (its
versions, its columns). The selection push-down predicate is not applied to the shared read: it is only a pre-filter
hint, and :func:`imp_core.maintenance.changes.read_changes` applies each sketch's exact filter to its slice, so a
slice is row for row what a sketch's own read would give. See docs/ARCHITECTURE.md "Grouped maintenance".

A request the shared read does not cover (a commit that arrived after planning, a column nobody planned) is read
directly, as is a range whose estimated size exceeds ``max_rows`` (the union of several sketches' ranges is held in
memory while the job runs) and a table whose shared read failed (each sketch then meets the error on its own read
and handles it as it would alone, e.g. by recapturing).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from imp_core.engine.schema import MULT
from imp_core.errors import ImpError
from imp_core.sources.delta import VERSION, DeltaSource

DEFAULT_MAX_ROWS = 5_000_000
"""Largest estimated change range (rows) read once and held for the job's sketches."""


@dataclass
class _Planned:
    """The union of the ranges and columns the job's sketches need from one table, and its read once done."""

    after: int
    upto: int
    columns: set[str] | None  # None: every column
    read: pa.Table | None = None
    shared: bool = True  # False once the shared read was refused (too large) or failed
    sketches: set[str] = field(default_factory=set)


class ChangeFeeds:
    """The change feeds of one job's tables: plan every sketch's needs, then read each table once.

    Attributes:
        reads: Reads made from each table (keyed by table name), shared and direct; what tests count.
    """

    def __init__(self, max_rows: int = DEFAULT_MAX_ROWS) -> None:
        self.max_rows = max_rows
        self.reads: Counter[str] = Counter()
        self._planned: dict[tuple[str, str], _Planned] = {}

    def plan(self, source: DeltaSource, after: int, upto: int, columns: Iterable[str] | None, sketch: str = "") -> None:
        """Record that a sketch will read versions ``(after, upto]`` of ``source`` (``columns``; None: all)."""
        if upto <= after:
            return
        key = (source.name, source.path)
        wanted = None if columns is None else set(columns)
        planned = self._planned.get(key)
        if planned is None:
            self._planned[key] = _Planned(after, upto, wanted, sketches={sketch})
            return
        if planned.read is not None:
            return  # already read: later needs are served directly when not covered
        planned.after, planned.upto = min(planned.after, after), max(planned.upto, upto)
        planned.columns = None if planned.columns is None or wanted is None else planned.columns | wanted
        planned.sketches.add(sketch)

    def sharing(self) -> dict[str, int]:
        """Tables planned for by more than one sketch, with how many sketches share each read."""
        return {name: len(p.sketches) for (name, _), p in self._planned.items() if len(p.sketches) > 1}

    def changes(
        self, source: DeltaSource, after: int, upto: int, columns: list[str] | None = None, predicate: str | None = None
    ) -> pa.Table:
        """``source.changes(after, upto, columns, predicate)``, served from the table's shared read when it covers
        the request (``predicate`` is a pre-filter hint; a slice of the shared read ignores it)."""
        planned = self._planned.get((source.name, source.path))
        if planned is not None and planned.shared and self._covers(planned, after, upto, columns):
            if planned.read is None:
                self._read(source, planned)
            if planned.read is not None:
                return _slice(planned.read, after, upto, columns if columns is not None else _data(planned.read))
        self.reads[source.name] += 1
        return source.changes(after, upto, columns, predicate=predicate)

    @staticmethod
    def _covers(planned: _Planned, after: int, upto: int, columns: list[str] | None) -> bool:
        if not (planned.after <= after and upto <= planned.upto):
            return False
        if planned.columns is None:
            return True
        return columns is not None and set(columns) <= planned.columns

    def _read(self, source: DeltaSource, planned: _Planned) -> None:
        try:
            estimated = sum(c.rows or 0 for c in source.commits(planned.after, planned.upto))
            if estimated > self.max_rows:
                planned.shared = False
                return
            self.reads[source.name] += 1
            cols = None if planned.columns is None else sorted(planned.columns)
            planned.read = source.changes(planned.after, planned.upto, cols)
        except ImpError:
            planned.shared = False  # each sketch reads (and fails, or recaptures) on its own


def _data(table: pa.Table) -> list[str]:
    return [c for c in table.column_names if c not in (MULT, VERSION)]


def _slice(table: pa.Table, after: int, upto: int, columns: list[str]) -> pa.Table:
    versions = table.column(VERSION)
    keep = pc.and_(pc.greater(versions, after), pc.less_equal(versions, upto))
    return table.filter(keep).select([*columns, MULT, VERSION])

"""Sketch use: find a sketch that can answer a query and load it for use (lazily maintained first, without waiting
long on another maintainer; IMP paper Fig. 2). The query then runs through Spark's SQL, where imp's extension
applies the published version (:mod:`imp_core.use.sketched`).

See docs/ARCHITECTURE.md, "Sketch use and reuse".
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field

from imp_core.catalog import VersionRecord
from imp_core.errors import (
    ImpError,
    MaintainerBusyError,
    SketchUnusableError,
    UnsafeSketchError,
    UsageError,
)
from imp_core.maintenance import guards
from imp_core.maintenance.context import ServiceContext
from imp_core.maintenance.loading import stored_query, version_partitions
from imp_core.maintenance.maintain import maintain
from imp_core.maintenance.registration import ParsedSql, analyze, create_sketch
from imp_core.maintenance.statistics import sign_oracle
from imp_core.maintenance.strategy import Strategy
from imp_core.plan.columns import narrowed
from imp_core.plan.reuse import can_reuse
from imp_core.plan.safety import safe_columns
from imp_core.plan.sql import Query
from imp_core.sketch.partition import Partition, PartitionSet
from imp_core.sketch.sketch import Sketch
from imp_core.sources.delta import DeltaSource
from imp_core.sources.schema import schema_from_json
from imp_core.use.rewrite import ranges_sql

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SketchInUse:
    """A sketch version a query may apply: its fragments, partitions and the table versions it reflects."""

    name: str
    version: VersionRecord
    partitions: PartitionSet

    @property
    def sketch(self) -> Sketch:
        return Sketch({t: tuple(f) for t, f in self.version.fragments.items()})

    def fragments(self, table: str) -> list[int]:
        return list(self.version.fragments.get(table, []))


@dataclass
class PreparedQuery:
    """A query ready to run: its plan, tables and the versions to read, and the sketch applied (if any)."""

    query: Query
    sources: dict[str, DeltaSource]
    versions: dict[str, int]
    found: str | None = None  # the sketch that can answer it
    applied: SketchInUse | None = None  # what is applied of it (None: unusable, or its maintainer was busy)
    notes: list[str] = field(default_factory=list)  # what happened on the way (registered, maintained, busy)
    unusable: SketchUnusableError | None = None  # why the sketch found must not be applied


def find_sketch(parts: ServiceContext, parsed: ParsedSql, query: Query) -> str | None:
    """A live sketch that can answer the query: same template, and the same constants or constants that the reuse
    check proves only tighten the query's result (:mod:`imp_core.plan.reuse`). Usable sketches come first; an
    unusable one is still returned (the query then says it ran without it)."""
    key, constants = parsed.template
    wanted = [str(c) for c in constants]
    candidates = sorted((r for r in parts.catalog.list_sketches() if r.template_key == key),
                        key=lambda r: not r.usable)
    for record in candidates:
        if (record.plan_json or {}).get("constants") == wanted:
            return record.name
    for record in candidates:
        schemas = {t: schema_from_json(s) for t, s in (record.plan_json or {}).get("schemas", {}).items()}
        try:
            captured = stored_query(record, schemas).plan
        except ImpError:
            continue
        keep = {p.table: {p.column} for p in PartitionSet.from_json(record.partitions).partitions}
        ok, why = can_reuse(narrowed(captured, keep), narrowed(query.plan, keep))  # stored plans read fewer columns
        log.info("sketch %s for %s: %s", record.name, parsed.sql, why)
        if ok:
            return record.name
    return None


def usable_version(parts: ServiceContext, name: str, current: dict[str, int], trigger: str,
                   notes: list[str]) -> VersionRecord | None:
    """The sketch version a query at table versions ``current`` may use, without waiting on a maintainer for long.

    The latest committed version when it reflects ``current`` or later table versions (the query then runs at the
    sketch's versions, one consistent snapshot); otherwise the sketch is maintained lazily, waiting at most
    ``IMP_QUERY_WAIT`` seconds for another process holding its maintenance lock. None (and a note) when that wait
    ran out: the query then runs without the sketch, which is always correct.

    Raises:
        SketchUnusableError: The sketch is (or has just been found) unusable: it must not be applied.
    """
    record, latest = guards.check_usable(parts, name)
    if _covers(latest, current):
        return latest
    wait = parts.settings.query_wait
    try:
        result = maintain(parts, name, Strategy.LAZY, trigger=trigger, wait=wait)
    except MaintainerBusyError:
        latest = parts.catalog.latest_version(record.id)
        if _covers(latest, current):
            return latest  # the other maintainer finished meanwhile
        notes.append(f"sketch {name} is being maintained by another process (waited {wait:g} s, IMP_QUERY_WAIT); "
                     f"ran the query without it")
        return None
    if result.versions:
        notes.append(f"maintained sketch {name} to version {result.versions[-1].version}"
                     + (f" (recaptured: {result.recaptured})" if result.recaptured else ""))
    return parts.catalog.latest_version(record.id)


def sketch_for_use(parts: ServiceContext, name: str, current: dict[str, int], *, maintain_first: bool = True,
                   trigger: str = "api", notes: list[str] | None = None) -> SketchInUse | None:
    """The one way a sketch is loaded for use: checked usable, maintained lazily first (``maintain_first``) or taken
    as it is, with its partitions. None when another maintainer held it past ``IMP_QUERY_WAIT``.

    Raises:
        SketchUnusableError: The sketch is (or has just been found) unusable.
    """
    if maintain_first:
        version = usable_version(parts, name, current, trigger, notes if notes is not None else [])
        record = parts.catalog.get_sketch(name)
    else:
        record, version = guards.check_usable(parts, name)
    if version is None:
        return None
    return SketchInUse(name, version, version_partitions(record, version))


def prepare(parts: ServiceContext, sql: str, dialect: str = "spark", *, use_sketch: bool = True, capture: bool = False,
            on: list[str] | None = None, fragments: int = 100, maintain_first: bool = True,
            trigger: str = "cli") -> PreparedQuery:
    """Parse ``sql`` once, find a sketch that can answer it (registering one with ``capture``) and load it for use."""
    parsed = ParsedSql.parse(sql, dialect)
    query = analyze(parts, parsed)
    sources = parts.sources(query.plan.tables())
    prepared = PreparedQuery(query, sources, {t: s.current_version() for t, s in sources.items()})
    name = find_sketch(parts, parsed, query) if use_sketch else None
    if name is None and use_sketch and capture:
        targets = on or [_safe_column(query, sources, prepared.versions)]
        name = _auto_name(parts, sql)
        create_sketch(parts, name, parsed, targets, fragments=fragments, trigger=trigger)
        prepared.notes.append(f"registered sketch {name} on {', '.join(targets)}")
    prepared.found = name
    if name is not None:
        try:
            prepared.applied = sketch_for_use(parts, name, prepared.versions, maintain_first=maintain_first,
                                              trigger=trigger, notes=prepared.notes)
        except SketchUnusableError as e:  # marked now or before: the answer must not depend on it
            prepared.unusable = e
    if prepared.applied is not None:
        prepared.versions = {t: prepared.applied.version.table_versions[t] for t in sources}
    return prepared


def sketch_for_table(parts: ServiceContext, sketch: str, table: str, *, maintain_first: bool = True,
                     trigger: str = "api",
                     notes: list[str] | None = None) -> tuple[SketchInUse | None, Partition]:
    """Sketch ``sketch`` loaded for use (:func:`sketch_for_use`) and its partition of ``table``.

    Raises:
        SketchUnusableError: The sketch is (or has just been found) unusable.
        UsageError: The sketch does not partition ``table``.
    """
    record = parts.catalog.get_sketch(sketch)
    tables = parts.catalog.latest_version(record.id).table_versions  # every table the sketch depends on
    current = {t: s.current_version() for t, s in parts.sources(tables).items()}
    applied = sketch_for_use(parts, sketch, current, maintain_first=maintain_first, trigger=trigger, notes=notes)
    partitions = applied.partitions if applied is not None else \
        version_partitions(record, parts.catalog.latest_version(record.id))
    part = partitions.get(table)
    if part is None:
        raise UsageError(f"sketch {sketch} does not partition table {table} (it partitions "
                         f"{', '.join(partitions.tables)})")
    return applied, part


@dataclass(frozen=True)
class SketchPredicate:
    """A sketch's range predicate on one table, as Spark SQL text: the rows of the fragments of the sketch's latest
    usable version, for the table at ``table_version`` (the version that sketch version reflects)."""

    sketch: str
    version: int
    table: str
    table_version: int
    column: str
    predicate: str
    fragments: int  # fragments in the sketch
    fragment_count: int  # fragments of the partition


def sketch_predicate(parts: ServiceContext, sketch: str, table: str | None = None) -> SketchPredicate:
    """The predicate of ``sketch``'s latest usable version on ``table`` (the one table it partitions by default); the
    sketch is not maintained first.

    Raises:
        SketchUnusableError: The sketch is unusable.
        UsageError: No ``table`` given for a sketch over several tables, or one the sketch does not partition.
    """
    if table is None:
        tables = PartitionSet.from_json(parts.catalog.get_sketch(sketch).partitions).tables
        if len(tables) != 1:
            raise UsageError(f"sketch {sketch} partitions several tables ({', '.join(tables)}); say which with "
                             f"--table")
        table = tables[0]
    applied, part = sketch_for_table(parts, sketch, table, maintain_first=False, trigger="predicate")
    assert applied is not None  # taken as it is: nothing to wait for
    fragments = applied.fragments(table)
    return SketchPredicate(sketch, applied.version.version, table, applied.version.table_versions[table], part.column,
                           ranges_sql(f"`{part.column}`", part.ranges(fragments)), len(fragments), part.fragments)


def _safe_column(query: Query, sources: dict[str, DeltaSource], versions: dict[str, int]) -> str:
    safe = safe_columns(query.plan, sign_oracle(sources, versions))
    if not safe:
        raise UnsafeSketchError("no column of the query's tables is safe for a sketch; run the query without "
                                "--capture")
    return safe[0]


def _auto_name(parts: ServiceContext, sql: str) -> str:
    base = "q_" + hashlib.sha256(sql.encode()).hexdigest()[:8]
    existing = {r.name for r in parts.catalog.list_sketches()}
    name, i = base, 2
    while name in existing:
        name, i = f"{base}_{i}", i + 1
    return name


def _covers(version: VersionRecord, current: dict[str, int]) -> bool:
    """Whether a sketch version is valid for (or past) every table version of ``current``."""
    return all(version.table_versions.get(t, -1) >= v for t, v in current.items())


__all__ = ["PreparedQuery", "SketchInUse", "find_sketch", "prepare", "sketch_for_table",
           "sketch_for_use", "usable_version"]

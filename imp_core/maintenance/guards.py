"""Lifecycle guards: a sketch whose safety or sign assumptions stopped holding, or whose table changed identity or
went back to an older version, is marked unusable; maintenance refuses it and queries run without it.

See docs/SEMANTICS.md, "Lifecycle", and docs/ARCHITECTURE.md, "Data flow".
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import NoReturn

import polars as pl

from imp_core.catalog import Catalog, SketchRecord, VersionRecord, unusable_message
from imp_core.errors import SketchUnusableError
from imp_core.maintenance.context import ServiceContext
from imp_core.maintenance.loading import LoadedSketch
from imp_core.maintenance.statistics import broken_by_changes, sign_oracle, violated_assumption
from imp_core.plan.safety import SafetyReport, check
from imp_core.sources.delta import DeltaSource
from imp_core.sources.schema import incompatibility

log = logging.getLogger(__name__)


def refuse_unusable(record: SketchRecord) -> None:
    """Raise the one-line error for maintaining (or using) a sketch marked unusable."""
    if record.unusable_reason is not None:
        raise SketchUnusableError(unusable_message(record.name, record.unusable_reason))


def invalidate(catalog: Catalog, record: SketchRecord, reason: str) -> NoReturn:
    """Mark the sketch unusable with ``reason`` (the first reason stays) and stop with the one-line error."""
    if catalog.mark_unusable(record.id, reason):
        log.warning("sketch %s marked unusable: %s", record.name, reason)
    current = catalog.get_sketch_by_id(record.id).unusable_reason or reason
    raise SketchUnusableError(unusable_message(record.name, current))


def identity_problem(sources: Mapping[str, DeltaSource], latest: VersionRecord,
                     current: Mapping[str, int]) -> str | None:
    """Why ``latest`` no longer describes the tables ``sources`` point at now (None if it does).

    Per table: the registered path and the Delta metadata id now against those recorded with ``latest``, and the
    current Delta version against the one ``latest`` reflects (going backwards means another table, or a rolled-back
    log). Versions recorded before identities were kept are checked by version only.
    """
    recorded = latest.table_identities or {}
    for table in sorted(sources):
        source = sources[table]
        had = latest.table_versions.get(table)
        ident = recorded.get(table)
        if ident is not None and ident.get("path") != source.path:
            return (f"table {table} is now registered at {source.path}, but sketch version {latest.version} refers "
                    f"to the table at {ident.get('path')}")
        if ident is not None and ident.get("id") != source.table_id():
            return (f"table {table} at {source.path} was re-created (its Delta table id is {source.table_id()}, "
                    f"sketch version {latest.version} refers to table id {ident.get('id')})")
        if had is not None and current[table] < had:
            return (f"table {table} is at version {current[table]}, older than version {had} that sketch version "
                    f"{latest.version} reflects (the table was re-created or its log rolled back)")
    return None


def check_identity(catalog: Catalog, record: SketchRecord, sources: Mapping[str, DeltaSource],
                   latest: VersionRecord, current: Mapping[str, int]) -> None:
    """Invalidate the sketch if a table it reflects is not the table its versions refer to any more."""
    problem = identity_problem(sources, latest, current)
    if problem:
        invalidate(catalog, record, problem)


def check_usable(parts: ServiceContext, name: str) -> tuple[SketchRecord, VersionRecord]:
    """The sketch and its latest version, if it may be applied: not marked unusable, and every table it reflects
    the same table at the same or a later version (otherwise it is marked now).

    Raises:
        SketchUnusableError: With the reason and what to do.
    """
    catalog = parts.catalog
    record = catalog.get_sketch(name)
    refuse_unusable(record)
    latest = catalog.latest_version(record.id)
    sources = parts.sources(latest.table_versions)
    check_identity(catalog, record, sources, latest, parts.observe(sources))
    return record, latest


def check_schemas(catalog: Catalog, loaded: LoadedSketch, target: Mapping[str, int]) -> None:
    """Mark the sketch unusable when a column its query reads disappeared (dropped or renamed) or changed type since
    registration; other columns may change (its plan reads only the columns it uses)."""
    for table, source in loaded.sources.items():
        registered = loaded.schemas.get(table)
        if registered is None:
            continue
        problem = incompatibility(table, registered, source.schema(target[table]), set(loaded.used_columns(table)))
        if problem:
            invalidate(catalog, loaded.record, f"{problem} at version {target[table]}")


def check_changes(catalog: Catalog, loaded: LoadedSketch, table: str, changes: pl.DataFrame) -> None:
    """The safety verdict relied on column signs: an inserted row that breaks one makes the sketch unusable."""
    broken = broken_by_changes(loaded.assumptions, table, changes)
    if broken:
        invalidate(catalog, loaded.record, broken)


def recheck_safety(parts: ServiceContext, loaded: LoadedSketch, target: Mapping[str, int]) -> SafetyReport:
    """The safety verdict at ``target``: the check against the statistics there, then its sign assumptions against
    the data there (a recapture must not commit a sketch that is no longer safe)."""
    targets = {p.table: p.column for p in loaded.partitions.partitions}
    report = check(loaded.plan, targets, sign_oracle(loaded.sources, target))
    if not report.safe:
        invalidate(parts.catalog, loaded.record, f"a recapture at table versions {dict(target)} found it no longer "
                                                 f"safe on {', '.join(f'{t}.{c}' for t, c in targets.items())} "
                                                 f"({report.reason})")
    violation = violated_assumption(parts.spark, loaded.sources, target, report.assumptions)
    if violation:
        invalidate(parts.catalog, loaded.record, f"a recapture at table versions {dict(target)} found {violation}")
    return report


def mark_changed_identities(catalog: Catalog, opened: Mapping[str, DeltaSource],
                            current: Mapping[str, int | str]) -> None:
    """Mark every live sketch unusable whose latest version refers to a table that changed identity or went back in
    version (so `imp sketch list` and the catalog page say so before anyone maintains it)."""
    for record in catalog.list_sketches():
        if not record.usable:
            continue
        latest = catalog.latest_version(record.id)
        sources = {t: opened[t] for t in latest.table_versions if t in opened}
        versions = {t: v for t, v in current.items() if t in sources and isinstance(v, int)}
        if set(versions) != set(latest.table_versions):
            continue  # a table could not be read: say nothing about the sketch
        problem = identity_problem(sources, latest, versions)
        if problem and catalog.mark_unusable(record.id, problem):
            log.warning("sketch %s marked unusable: %s", record.name, problem)


__all__ = ["check_changes", "check_identity", "check_schemas", "check_usable", "identity_problem", "invalidate",
           "mark_changed_identities", "recheck_safety", "refuse_unusable"]

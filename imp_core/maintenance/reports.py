"""Read models: what the CLI (``show``, ``list``, ``history``), the catalog page and the DAGs' run reports show,
read from the catalog (and, for freshness, the tables' Delta logs).

The dictionaries' keys are a contract other tools parse. See docs/ARCHITECTURE.md, "State and versions".
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from imp_core.catalog import Catalog, SketchRecord, VersionRecord
from imp_core.errors import ImpError, first_line
from imp_core.maintenance.context import ServiceContext
from imp_core.maintenance.guards import mark_changed_identities
from imp_core.sketch.partition import PartitionSet
from imp_core.sketch.sketch import Sketch
from imp_core.sources.delta import DeltaSource

log = logging.getLogger(__name__)


def tables(catalog: Catalog) -> list[dict[str, Any]]:
    """``imp table list``: every registered table and the latest version observed."""
    return [{"name": t.name, "path": t.path, "observed_version": t.observed_version} for t in catalog.list_tables()]


def partitions_shown(partitions_json: Any, fragments: Mapping[str, Sequence[int]] | None,
                     bounds: bool = False) -> list[dict[str, Any]]:
    """Per partitioned table: the sketch's fragments (ids, or their number without ``bounds``), how many the
    partition has, and the share of the column's range they cover."""
    partitions = PartitionSet.from_json(partitions_json)
    sketch = Sketch({t: tuple(f) for t, f in (fragments or {}).items()})
    share = sketch.covered_share(partitions)
    out = []
    for p in partitions.partitions:
        held = list(sketch.fragments.get(p.table, ()))
        row: dict[str, Any] = {"table": p.table, "column": p.column}
        if bounds:
            row.update({"bounds": p.to_json()["bounds"], "fragments": held})
        else:
            row["fragments"] = len(held)
        row.update({"fragment_count": p.fragments, "covered_share": share[p.table]})
        out.append(row)
    return out


def describe(catalog: Catalog, name: str, version: int | None = None,
             as_of: tuple[str, int] | None = None) -> dict[str, Any]:
    """``imp sketch show --json``: one version of a sketch (the latest, a numbered one, or the one as of a table
    version)."""
    record = catalog.get_sketch(name)
    if version is not None:
        v = catalog.get_version(record.id, version)
    elif as_of is not None:
        v = catalog.version_as_of_table_version(record.id, as_of[0], as_of[1])
    else:
        v = catalog.latest_version(record.id)
    return {
        "name": record.name,
        "sql": record.sql,
        "version": v.version,
        "method": v.method,
        "reason": v.reason,
        "table_versions": dict(v.table_versions),
        "partitions": partitions_shown(_partitions(record, v), v.fragments, bounds=True),
        "strategy": record.strategy,
        "template_key": record.template_key,
        "safety": record.safety,
        "usable": record.usable,
        "unusable_reason": record.unusable_reason,
        "unusable_since": _iso(record.unusable_at),
        "table_identities": v.table_identities,
        "state_options": v.state_options,
        "state": state_shown(v.state_placement),
        "delta_rows": v.delta_rows,
        "duration_ms": v.duration_ms,
        "created_at": _iso(v.created_at),
    }


def state_shown(placement: Mapping[str, Mapping[str, Any]] | None) -> list[dict[str, Any]]:
    """Where each operator's state lives and how big it is (a version from before placements were recorded: every
    operator in memory, sizes unknown)."""
    return [{"operator": op, "where": p.get("where", "memory"), "bytes": p.get("bytes"), "rows": p.get("rows")}
            for op, p in sorted((placement or {}).items())]


def history(catalog: Catalog, name: str) -> list[dict[str, Any]]:
    """``imp sketch history --json``: every version of a sketch, oldest first."""
    record = catalog.get_sketch(name)
    return [{"version": v.version, "method": v.method, "reason": v.reason, "table_versions": dict(v.table_versions),
             "fragments": v.fragments,
             "fragment_counts": {p["table"]: len(p["bounds"]) - 1 for p in _partitions(record, v)},
             "delta_rows": v.delta_rows, "duration_ms": v.duration_ms, "run_id": v.run_id,
             "has_state": catalog.has_states(record.id, v.version), "created_at": _iso(v.created_at)}
            for v in catalog.versions(record.id)]


def _partitions(record: SketchRecord, version: VersionRecord) -> Any:
    """The partitions (JSON) a version's fragment ids refer to."""
    return version.partitions if version.partitions is not None else record.partitions


def refresh_observations(catalog: Catalog, strict: bool = True) -> dict[str, int | str]:
    """Record the current Delta version of every registered table, so the ``sketch_catalog`` view is current.

    Reads only Delta logs (no Spark). With ``strict=False`` a table that cannot be read is reported by its error
    message instead of failing the whole refresh (the plugin page shows what it can). Sketches whose tables changed
    identity or went back in version are marked unusable on the way.

    Returns:
        Table name -> observed version (or, with ``strict=False``, the error message for unreadable tables).
    """
    out: dict[str, int | str] = {}
    opened: dict[str, DeltaSource] = {}
    for table in catalog.list_tables():
        try:
            source = DeltaSource(table.name, table.path)
            version = source.current_version()
            catalog.observe_table_version(table.name, version, source.table_id())
            out[table.name] = version
            opened[table.name] = source
        except ImpError as e:
            if strict:
                raise
            log.warning("could not observe table %s: %s", table.name, first_line(e))
            out[table.name] = first_line(e)
    mark_changed_identities(catalog, opened, out)
    return out


def sketch_list(catalog: Catalog) -> list[dict[str, Any]]:
    """``imp sketch list --json``: the ``sketch_catalog`` view's rows after observing the tables (non-strict)."""
    refresh_observations(catalog, strict=False)
    return catalog.sketch_catalog()


def stale_sketches(catalog: Catalog) -> list[str]:
    """Names of live sketches behind the current version of one of their tables (observations refreshed), and of
    those reading a table that cannot be read now (their maintenance fails on its own and is recorded, instead of
    one dropped table stopping every other sketch's); also clears capture runs left by dead processes (the nightly
    DAG calls this)."""
    catalog.clear_abandoned_captures()
    observed = refresh_observations(catalog, strict=False)
    unreadable = {table for table, version in observed.items() if isinstance(version, str)}
    stale = catalog.stale_sketches()
    for row in catalog.sketch_catalog() if unreadable else ():
        if row["usable"] and row["name"] not in stale and unreadable.intersection(row["table_versions"] or {}):
            stale.append(row["name"])
    return sorted(stale)


def overview(parts: ServiceContext, refresh: bool = True) -> list[dict[str, Any]]:
    """One row per live sketch for the catalog page: ``sketch_catalog`` plus sketch size and covered share.

    Args:
        parts: The service's parts.
        refresh: Observe the tables' current Delta versions first (cheap: log reads only); tables that cannot be
            read are skipped with a warning.
    """
    catalog = parts.catalog
    if refresh:
        refresh_observations(catalog, strict=False)
    records: dict[str, SketchRecord] = {r.name: r for r in catalog.list_sketches()}
    out = []
    for row in catalog.sketch_catalog():
        record = records.get(row["name"])
        shown = partitions_shown(row.get("partitions") or record.partitions, row.get("fragments")) \
            if record is not None else []
        out.append({
            "name": row["name"],
            "sql": row["sql"],
            "strategy": row["strategy"],
            "latest_version": row["latest_version"],
            "latest_method": row["latest_method"],
            "table_versions": dict(row["table_versions"] or {}),
            "current_table_versions": dict(row["current_table_versions"] or {}),
            "stale": bool(row["is_stale"]),
            "usable": bool(row["usable"]),
            "unusable_reason": row["unusable_reason"],
            "version_created_at": _iso(row.get("version_created_at")),
            "last_run": {"id": row["last_run_id"], "status": row["last_run_status"],
                         "finished_at": _iso(row.get("last_run_finished_at")), "error": row["last_run_error"]},
            "partitions": shown,
            "sketch_fragments": sum(p["fragments"] for p in shown),
            "total_fragments": sum(p["fragment_count"] for p in shown),
            "state": state_shown(row.get("state_placement")),
        })
    return out


def run_report(catalog: Catalog, trigger: str, expected: Sequence[str] | None = None) -> dict[str, Any]:
    """What the runs recorded under ``trigger`` (e.g. ``airflow:DAG/RUN``) did.

    Args:
        catalog: The catalog.
        trigger: The trigger string the jobs were given.
        expected: Sketches that should have been maintained; one without a succeeded run counts as failed.

    Returns:
        ``{"trigger", "runs": [...], "versions_made", "delta_rows", "succeeded": [names], "failed": [names]}``;
        a sketch retried after a failure counts by its latest run.
    """
    names = {r.id: r.name for r in catalog.list_sketches()}
    runs = sorted((r for r in catalog.runs(limit=100_000) if r.trigger == trigger), key=lambda r: r.id)
    rows, latest = [], {}
    made = consumed = 0
    for r in runs:
        name = names.get(r.sketch_id) if r.sketch_id is not None else None
        if name is None and r.sketch_id is not None:
            name = catalog.get_sketch_by_id(r.sketch_id).name
        made_here = r.to_version - (r.from_version or 0) if r.status == "succeeded" and r.to_version else 0
        made += made_here
        consumed += r.delta_rows or 0
        rows.append({"run_id": r.id, "sketch": name, "strategy": r.strategy, "status": r.status,
                     "from_version": r.from_version, "to_version": r.to_version, "versions_made": made_here,
                     "delta_rows": r.delta_rows or 0, "error": r.error})
        if name is not None:
            latest[name] = r.status
    for name in expected or ():
        latest.setdefault(name, "missing")
    return {"trigger": trigger, "runs": rows, "versions_made": made, "delta_rows": consumed,
            "succeeded": sorted(n for n, s in latest.items() if s == "succeeded"),
            "failed": sorted(n for n, s in latest.items() if s != "succeeded")}


def _iso(value: Any) -> str | None:
    return value.isoformat() if hasattr(value, "isoformat") else value


__all__ = ["describe", "history", "overview", "partitions_shown", "refresh_observations", "run_report",
           "sketch_list", "stale_sketches", "tables"]

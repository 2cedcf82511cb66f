"""How fresh each sketch is, for the catalog page: table versions behind, the commits it missed, its last
maintenance, a plot of its recent maintenance, and how often the optimizer applied it.

Pure functions over what the page reads (no I/O here): the catalog page's rows (``overview``), each sketch's recent
versions (``Catalog.recent_versions``), and the commits the Delta commit trigger reported (asset events on the table
assets: version and commit time). A table's current version is the newest of its catalog observation and the
trigger's last event, so the page is as current as the watch without a GET opening any Delta log.

The optimizer's figures (``applied``, ``last_applied``, ``version``) are what the Spark session extension's drivers
reported (:mod:`imp_core.airflow.applications`); for a sketch no driver reported, :data:`NOT_REPORTED` stands in and
the page says so.
"""

from __future__ import annotations

import html
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

PLOT_VERSIONS = 20
"""Versions shown in a sketch's maintenance plot (the newest)."""


@dataclass(frozen=True)
class TableCommit:
    """A version of a registered table the commit trigger reported, and when it was committed (epoch seconds)."""

    table: str
    version: int
    committed_at: float


NOT_REPORTED: dict[str, Any] = {"applied": None, "last_applied": None}
"""How often and when last the optimizer applied a sketch that no driver of the Spark extension reported."""


def annotate(rows: list[dict[str, Any]], history: Mapping[str, Sequence[Mapping[str, Any]]],
             commits: Sequence[TableCommit], now: float | None = None,
             optimizer: Mapping[str, Mapping[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Add ``freshness``, ``last_maintenance``, ``history`` and ``optimizer`` to each page row (in place).

    ``freshness``: per table the sketch's version, the current one and the versions behind; in all, ``behind``
    (versions), ``first_missed_at`` and ``last_missed_at`` (commit times of the oldest and newest version the
    sketch does not reflect, when the trigger reported them) and their ages in seconds.
    """
    now = time.time() if now is None else now
    by_table: dict[str, list[TableCommit]] = {}
    for c in commits:
        by_table.setdefault(c.table, []).append(c)
    for row in rows:
        tables: dict[str, dict[str, int]] = {}
        missed: list[TableCommit] = []
        for table, version in sorted((row.get("table_versions") or {}).items()):
            seen = by_table.get(table, [])
            observed = (row.get("current_table_versions") or {}).get(table)
            current = max([v for v in (observed, *(c.version for c in seen)) if v is not None], default=version)
            tables[table] = {"sketch": version, "current": current, "behind": max(0, current - version)}
            missed += [c for c in seen if c.version > version]
        first = min((c.committed_at for c in missed), default=None)
        last = max((c.committed_at for c in missed), default=None)
        row["freshness"] = {
            "tables": tables, "behind": sum(t["behind"] for t in tables.values()),
            "first_missed_at": first, "last_missed_at": last,
            "first_missed_age": None if first is None else max(0.0, now - first),
            "last_missed_age": None if last is None else max(0.0, now - last),
        }
        versions = list(history.get(row["name"], ()))[-PLOT_VERSIONS:]
        row["history"] = [{"version": v["version"], "method": v["method"], "delta_rows": v.get("delta_rows") or 0,
                           "duration_ms": v.get("duration_ms"), "created_at": _iso(v.get("created_at"))}
                          for v in versions]
        maintained = [v for v in row["history"] if v["method"] != "capture"]
        row["last_maintenance"] = maintained[-1] if maintained else None
        row["optimizer"] = dict((optimizer or {}).get(row["name"], NOT_REPORTED))
    return rows


def age(seconds: float | None) -> str:
    """``42 s``, ``3 min``, ``5 h``, ``2 d``; ``-`` for None."""
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"


def plot_svg(history: Sequence[Mapping[str, Any]], width: int = 200, height: int = 48) -> str:
    """An inline SVG of the recent versions: change rows as bars, maintenance time as a line (each scaled to its
    own maximum, named in the tooltip and the caption); empty history gives an empty string."""
    if not history:
        return ""
    n = len(history)
    rows = [max(0, int(v.get("delta_rows") or 0)) for v in history]
    times = [float(v.get("duration_ms") or 0.0) for v in history]
    top_rows, top_time = max(rows) or 1, max(times) or 1.0
    slot = width / n
    inner = height - 4
    parts = []
    for i, (v, r) in enumerate(zip(history, rows)):
        h = inner * r / top_rows
        tip = (f"v{v['version']} {v.get('method')}: {r:,} change rows, "
               f"{'-' if v.get('duration_ms') is None else f'{times[i]:.0f} ms'}")
        parts.append(f'<rect class="rows" x="{i * slot + 1:.1f}" y="{height - 2 - h:.1f}" '
                     f'width="{max(1.0, slot - 2):.1f}" height="{h:.1f}"><title>{html.escape(tip)}</title></rect>')
    points = " ".join(f"{(i + 0.5) * slot:.1f},{height - 2 - inner * t / top_time:.1f}" for i, t in enumerate(times))
    parts.append(f'<polyline class="time" points="{points}" fill="none"/>')
    label = (f"last {n} versions: change rows (bars, max {top_rows:,}) and maintenance time (line, max "
             f"{top_time:.0f} ms)")
    legend = (f'<div class="legend"><span class="rows">&#9646;</span> change rows (max {top_rows:,}) '
              f'<span class="time">&#9472;</span> time (max {top_time:.0f} ms)</div>')
    return (f'<svg class="plot" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
            f'aria-label="{html.escape(label)}"><title>{html.escape(label)}</title>{"".join(parts)}</svg>{legend}')


def _iso(value: Any) -> str | None:
    return value.isoformat() if hasattr(value, "isoformat") else value


__all__ = ["NOT_REPORTED", "PLOT_VERSIONS", "TableCommit", "age", "annotate", "plot_svg"]

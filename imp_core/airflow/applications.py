"""How often imp's Spark extension applied each sketch, and when last: read from the files its drivers write, for the
catalog page (no Spark session in the webserver).

Every driver that loads the extension counts, per sketch, the queries its optimizer rule restricted and writes them
now and then as one small JSON file, replaced atomically, under ``<publish location>/_applications/<driver>.json``:
``{"driver": ID, "sketches": {NAME: {"count": N, "last_ms": EPOCH_MS, "version": V}}}`` (``version``: the sketch
version applied last). The publish location is ``IMP_PUBLISH_LOCATION`` when set, else ``_imp_sketches`` beside the
sketch's first table by name, as the publisher and the extension agree (docs/ARCHITECTURE.md, "Queries from any
client"). A sketch's figures are the sum of its counts over the drivers' files and the latest of their times.

Files that do not parse, or do not have that shape, are skipped (a driver being replaced mid-write leaves its
previous file whole; a file from another tool is not ours to judge). A location that cannot be read gives no
figures: the page then says "not reported" for its sketches.
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from imp_core.airflow.delta_log import s3_client
from imp_core.errors import first_line
from imp_core.security.redact import scrub
from imp_core.sources import storage

log = logging.getLogger(__name__)

ENV_PUBLISH_LOCATION = "IMP_PUBLISH_LOCATION"
DEFAULT_DIR = "_imp_sketches"
APPLICATIONS_DIR = "_applications"
MAX_FILES = 1000
"""Driver files read per location (the newest names first on S3 are not knowable: the first ones listed)."""


def publish_location(table_paths: Iterable[str], configured: str | None = None) -> str | None:
    """Where a sketch is published: ``configured`` (``IMP_PUBLISH_LOCATION`` when None), else ``_imp_sketches``
    beside the first of ``table_paths`` (the sketch's tables' paths in the order of their names); None without
    tables."""
    configured = os.environ.get(ENV_PUBLISH_LOCATION) if configured is None else configured
    if configured:
        return configured.rstrip("/")
    first = next(iter(table_paths), None)
    if first is None:
        return None
    return posixpath.join(posixpath.dirname(first.rstrip("/")), DEFAULT_DIR)


def applications(sketch_tables: Mapping[str, Iterable[str]], table_paths: Mapping[str, str],
                 configured: str | None = None) -> dict[str, dict[str, Any]]:
    """Per sketch (name -> the tables it reads) the optimizer's figures, for the sketches some driver reported:
    ``applied`` (queries), ``last_applied`` (ISO time, UTC), ``version`` (the sketch version applied last) and
    ``drivers`` (how many drivers applied it). Each location is read once."""
    where: dict[str, str] = {}
    for sketch, tables in sketch_tables.items():
        location = publish_location([table_paths[t] for t in sorted(tables) if t in table_paths], configured)
        if location is not None:
            where[sketch] = location
    per_location = {location: read_counts(location) for location in sorted(set(where.values()))}
    out = {}
    for sketch, location in where.items():
        found = per_location[location].get(sketch)
        if found is not None:
            out[sketch] = found
    return out


def read_counts(location: str) -> dict[str, dict[str, Any]]:
    """The drivers' figures at ``location``, summed per sketch (see :func:`applications`)."""
    try:
        bodies = _read_files(location)
    except Exception as e:  # noqa: BLE001 - unreadable storage: no figures, the page says so
        log.warning("cannot read the optimizer's application counts at %s: %s", scrub(location),
                    scrub(first_line(e)))
        return {}
    out: dict[str, dict[str, Any]] = {}
    last_ms: dict[str, int] = {}
    for body in bodies:
        sketches = _parse(body)
        for sketch, c in sketches.items():
            entry = out.setdefault(sketch, {"applied": 0, "last_applied": None, "version": None, "drivers": 0})
            entry["applied"] += c["count"]
            entry["drivers"] += 1
            if c["last_ms"] >= last_ms.get(sketch, -1):
                last_ms[sketch] = c["last_ms"]
                entry["version"] = c["version"]
                entry["last_applied"] = datetime.fromtimestamp(c["last_ms"] / 1000, timezone.utc).isoformat()
    return out


def _parse(body: bytes) -> dict[str, dict[str, int]]:
    """One driver file's counts; empty when it does not have the extension's shape."""
    try:
        doc = json.loads(body)
    except ValueError:
        return {}
    sketches = doc.get("sketches") if isinstance(doc, dict) else None
    if not isinstance(sketches, dict):
        return {}
    out = {}
    for name, c in sketches.items():
        if isinstance(c, dict) and all(isinstance(c.get(k), int) and not isinstance(c.get(k), bool) and c[k] >= 0
                                       for k in ("count", "last_ms", "version")):
            out[str(name)] = {k: c[k] for k in ("count", "last_ms", "version")}
    return out


def _read_files(location: str) -> list[bytes]:
    """The bodies of the driver files under ``location/_applications`` (hidden and temporary files left out)."""
    if storage.is_s3(location):
        bucket, _, prefix = location[len("s3://"):].partition("/")
        prefix = f"{prefix.rstrip('/')}/{APPLICATIONS_DIR}/" if prefix else f"{APPLICATIONS_DIR}/"
        client = s3_client()
        keys: list[str] = []
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            keys += [o["Key"] for o in page.get("Contents", ()) if _wanted(posixpath.basename(o["Key"]))]
            if len(keys) >= MAX_FILES:
                break
        return [client.get_object(Bucket=bucket, Key=k)["Body"].read() for k in keys[:MAX_FILES]]
    folder = Path(location[len("file://"):] if location.startswith("file://") else
                  location[len("file:"):] if location.startswith("file:") else location) / APPLICATIONS_DIR
    if not folder.is_dir():
        return []
    files = sorted(p for p in folder.iterdir() if p.is_file() and _wanted(p.name))[:MAX_FILES]
    out = []
    for p in files:
        try:
            out.append(p.read_bytes())
        except OSError:  # replaced between the listing and the read: its successor is counted next time
            continue
    return out


def _wanted(name: str) -> bool:
    return name.endswith(".json") and not name.startswith(".")


__all__ = ["APPLICATIONS_DIR", "DEFAULT_DIR", "ENV_PUBLISH_LOCATION", "applications", "publish_location",
           "read_counts"]

"""Publish committed sketch versions for imp's Spark extension: after every commit (capture, maintenance, recapture,
repartition, group jobs and the DAGs all commit through :mod:`imp_core.maintenance.runs` or registration), and on
demand (``imp sketch publish``). A publish never fails the commit it follows: an error is logged with what to do,
the sketch's ``published_version`` stays behind, and the next commit or ``imp sketch publish`` catches up.

Manifests of a sketch older than the latest ``IMP_STATE_RETENTION`` versions are deleted; a dropped sketch's are
all deleted (:func:`withdraw`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from imp_core.catalog import Catalog, SketchRecord, VersionRecord
from imp_core.config import Settings
from imp_core.errors import first_line
from imp_core.publish import manifest, store
from imp_core.sketch.partition import PartitionSet

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Published:
    """A manifest written: its sketch, version and file."""

    sketch: str
    version: int
    file: str
    usable: bool


def location(settings: Settings, version: VersionRecord) -> str:
    """Where a sketch version is published: the setting, else beside its first table (by name)."""
    identities = version.table_identities or {}
    paths = [identities[t]["path"] for t in sorted(version.table_versions) if t in identities]
    return store.location_for(settings.publish_location, paths)


def publish_version(catalog: Catalog, settings: Settings, record: SketchRecord, version: VersionRecord) -> Published:
    """Write ``version``'s manifest, record it as published and delete the manifests past retention.

    Raises:
        ImpError, OSError: The location cannot be written.
    """
    where = location(settings, version)
    partitions = PartitionSet.from_json(version.partitions if version.partitions is not None else record.partitions)
    content = manifest.body(record, version, partitions)
    file = store.write(where, store.file_name(record.id, version.version), manifest.encode(content))
    catalog.mark_published(record.id, version.version)
    keep_from = version.version - settings.state_retention + 1
    old = [n for n in store.names(where) if (p := store.parse_name(n)) and p[0] == record.id and p[1] < keep_from]
    store.delete(where, old)
    return Published(record.name, version.version, file, bool(content["usable"]))


def publish_latest(catalog: Catalog, settings: Settings, name: str) -> Published:
    """Publish the latest version of sketch ``name`` (again, if it was published: files are replaced whole)."""
    record = catalog.get_sketch(name)
    return publish_version(catalog, settings, record, catalog.latest_version(record.id))


def after_commit(catalog: Catalog, sketch_id: int, version: VersionRecord, settings: Settings | None = None) -> None:
    """Publish a version just committed; an error is logged, never raised (the commit stands)."""
    try:
        record = catalog.get_sketch_by_id(sketch_id)
        publish_version(catalog, settings or Settings.from_env(), record, version)
    except Exception as e:  # noqa: BLE001 - publishing must never fail a committed version
        log.warning("could not publish version %s of sketch %s for the Spark extension: %s; queries outside imp "
                    "run without it until `imp sketch publish` succeeds", version.version, sketch_id, first_line(e))


def pending(catalog: Catalog) -> list[str]:
    """Live sketches whose latest version is not published yet."""
    out = []
    for record in catalog.list_sketches():
        latest = catalog.latest_version(record.id).version
        if record.published_version is None or record.published_version < latest:
            out.append(record.name)
    return out


def withdraw(settings: Settings, record: SketchRecord, version: VersionRecord) -> None:
    """Delete every manifest of a dropped sketch (its queries then run without it)."""
    where = location(settings, version)
    store.delete(where, [n for n in store.names(where) if (p := store.parse_name(n)) and p[0] == record.id])


def withdraw_quietly(settings: Settings, record: SketchRecord, version: VersionRecord) -> None:
    """:func:`withdraw`, an error logged (the drop stands; the extension then still finds the old manifests, which
    stay correct for the table versions they name)."""
    try:
        withdraw(settings, record, version)
    except Exception as e:  # noqa: BLE001 - a drop must not fail on the publish location
        log.warning("could not delete the manifests of dropped sketch %s: %s", record.name, first_line(e))


__all__ = ["Published", "after_commit", "location", "pending", "publish_latest", "publish_version", "withdraw",
           "withdraw_quietly"]

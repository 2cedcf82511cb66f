"""Airflow assets of imp: every registered table is the asset of its storage location, every sketch the asset
``imp://<catalog>/<sketch>``.

* A table's asset URI is its Delta table's location as Airflow writes it: ``file:///abs/path`` for a local table,
  ``s3://bucket/key`` for object storage (``s3a://`` registered tables too). The asset's name is its URI, so any DAG
  that declares ``Asset("s3://bucket/sales")`` (as a producer's outlet, say) means the same asset.
* A sketch's asset URI uses the ``imp`` scheme, which this package registers with Airflow through its provider
  entry point (:mod:`imp_core.airflow.provider`): :func:`sanitize_uri` validates it, :func:`create_asset` builds
  one, :func:`convert_asset_to_openlineage` names it for OpenLineage. ``<catalog>`` is ``IMP_CATALOG_NAME``
  (default ``imp``); a user's DAG schedules on a sketch with ``schedule=[sketch_asset("top")]``.

:func:`watched` reads what the ``imp_maintain_on_commit`` DAG declares when the DAG processor parses it: the
registered tables by location and the sketches with the tables they read. See docs/AIRFLOW.md, "Maintenance on
commit".
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import SplitResult, quote, unquote, urlsplit

from airflow.providers.common.compat.openlineage.facet import Dataset  # a placeholder without OpenLineage
from airflow.sdk import Asset, AssetWatcher

from imp_core.config import WatchSettings
from imp_core.inputs import SKETCH_NAME
from imp_core.sources import storage

if TYPE_CHECKING:
    from imp_core.maintenance.service import SketchService

SCHEME = "imp"
TABLE_GROUP = "imp-table"
SKETCH_GROUP = "imp-sketch"


def table_uri(path: str) -> str:
    """The asset URI of a registered table's location: ``file:///abs/path`` or ``s3://bucket/key``."""
    if storage.is_s3(path):
        return storage.normalize(path)
    if path.startswith("file:"):
        return "file://" + quote(unquote(urlsplit(path).path).rstrip("/") or "/", safe="/")
    if storage.is_local(path):
        return "file://" + quote(os.path.abspath(path), safe="/")
    return path.rstrip("/")  # another scheme (abfss://, gs://): as registered


def location_of(uri: str) -> str:
    """The location a table asset's URI names, as the Delta readers take it (``table_uri`` reversed)."""
    if uri.startswith("file://"):
        return unquote(urlsplit(uri).path)
    return uri


def catalog_name() -> str:
    """The ``<catalog>`` of the sketches' asset URIs (``IMP_CATALOG_NAME``)."""
    return WatchSettings.from_env().catalog_name


def sketch_uri(sketch: str, catalog: str | None = None) -> str:
    """``imp://<catalog>/<sketch>``."""
    return f"{SCHEME}://{catalog or catalog_name()}/{sketch}"


def sketch_asset(sketch: str, catalog: str | None = None) -> Asset:
    """The asset of ``sketch`` (for a user's ``schedule=`` or ``inlets=``)."""
    uri = sketch_uri(sketch, catalog)
    return Asset(name=uri, uri=uri, group=SKETCH_GROUP, extra={"sketch": sketch})


def table_asset(uri: str, tables: list[str], watchers: list[AssetWatcher] | None = None) -> Asset:
    """The asset of the registered tables at ``uri`` (several names may be registered for one location)."""
    extra: dict[str, Any] = {"tables": sorted(tables)}
    return Asset(name=uri, uri=uri, group=TABLE_GROUP, extra=extra, watchers=watchers or [])


def sketch_of_uri(uri: str) -> tuple[str, str] | None:
    """``(catalog, sketch)`` of an ``imp://`` URI, None for any other."""
    parts = urlsplit(uri)
    if parts.scheme != SCHEME or not parts.netloc:
        return None
    return parts.netloc, parts.path.lstrip("/")


# -- what Airflow calls for the imp scheme (registered by imp_core.airflow.provider) ------------------------------


def sanitize_uri(parts: SplitResult) -> SplitResult:
    """Airflow's URI check for ``imp://<catalog>/<sketch>`` (lower-case scheme, no query or fragment left).

    Raises:
        ValueError: Not a sketch URI (Airflow reports it as an invalid asset).
    """
    name = parts.path.lstrip("/")
    if not parts.netloc:
        raise ValueError("an imp asset URI names its catalog: imp://<catalog>/<sketch>")
    if not SKETCH_NAME.match(name):
        raise ValueError(f"an imp asset URI names one sketch: imp://<catalog>/<sketch>, got path {parts.path!r}")
    if parts.query:
        raise ValueError("an imp asset URI takes no query: imp://<catalog>/<sketch>")
    return parts._replace(path="/" + name)


def create_asset(*, sketch: str, catalog: str | None = None, extra: Mapping[str, Any] | None = None) -> Asset:
    """The asset factory Airflow registers for the ``imp`` scheme."""
    uri = sketch_uri(sketch, catalog)
    return Asset(name=uri, uri=uri, group=SKETCH_GROUP, extra={"sketch": sketch, **(extra or {})})


def convert_asset_to_openlineage(asset: Asset, lineage_context: Any) -> Any:
    """The OpenLineage dataset of a sketch asset: namespace ``imp://<catalog>``, name the sketch."""
    catalog, sketch = sketch_of_uri(asset.uri) or ("", asset.uri)
    return Dataset(namespace=f"{SCHEME}://{catalog}", name=sketch)


# -- what the on-commit DAG declares -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Watched:
    """The registered tables by asset URI (the names registered for each location) and the live sketches with
    the tables their latest versions read."""

    tables: dict[str, list[str]] = field(default_factory=dict)
    sketches: dict[str, list[str]] = field(default_factory=dict)

    def table_names(self, uris: list[str]) -> set[str]:
        """The registered tables at these asset URIs."""
        return {name for uri in uris for name in self.tables.get(uri, ())}


def watched(service: SketchService) -> Watched:
    """The tables and sketches the on-commit DAG declares as assets, read from the catalog (two queries)."""
    tables: dict[str, list[str]] = {}
    for record in service.catalog.list_tables():
        tables.setdefault(table_uri(record.path), []).append(record.name)
    sketches = {row["name"]: sorted(row["table_versions"] or {}) for row in service.catalog.sketch_catalog()}
    return Watched(tables, sketches)


__all__ = ["SCHEME", "SKETCH_GROUP", "TABLE_GROUP", "Watched", "catalog_name", "convert_asset_to_openlineage",
           "create_asset", "location_of", "sanitize_uri", "sketch_asset", "sketch_of_uri", "sketch_uri",
           "table_asset", "table_uri", "watched"]

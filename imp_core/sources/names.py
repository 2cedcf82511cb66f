"""Tables by the name users know them by in their Spark catalog (``CATALOG.DB.TABLE``, ``DB.TABLE`` or ``TABLE``):
resolved to a location and Delta table id at registration, and re-checked on every maintenance.

See docs/ARCHITECTURE.md, "Data flow".
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Protocol
from urllib.parse import unquote, urlsplit

from imp_core.errors import SourceError, UsageError, first_line
from imp_core.sources.storage import normalize, redact

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from imp_core.sources.delta import DeltaSource


class TableIdentities(Protocol):
    """What :func:`check_identity` asks of the sketch catalog (``catalog.store.Catalog``; sources/ and catalog/ do not
    import each other)."""

    def table_identity(self, name: str) -> tuple[str | None, str] | None: ...


_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*){0,2}$")


def quoted(name: str) -> str:
    """``name`` with each part back-quoted; refuses anything but 1-3 dot-separated identifiers."""
    if not _NAME.match(name or ""):
        raise UsageError(f"--table {name!r}: write CATALOG.DB.TABLE, DB.TABLE or TABLE (letters, digits, "
                         f"underscores)")
    return ".".join(f"`{part}`" for part in name.split("."))


def location_uri(location: str) -> str:
    """A catalog location as imp stores table URIs (local paths plain, ``s3a`` as ``s3``)."""
    if location.startswith("file:"):
        return unquote(urlsplit(location).path).rstrip("/")
    return normalize(location)


def resolve(spark: SparkSession, name: str) -> tuple[str, str]:
    """``(location, Delta table id)`` of the catalog table ``name``.

    Raises:
        SourceError: The name is unknown to the Spark catalog, or names a table that is not a Delta table.
    """
    try:
        rows = spark.sql(f"DESCRIBE DETAIL {quoted(name)}").collect()
    except UsageError:
        raise
    except Exception as e:  # AnalysisException and friends
        raise SourceError(f"table {name} cannot be resolved in the Spark catalog ({redact(first_line(e))}); check the "
                          f"name and that the session's metastore is the one that defines it") from e
    detail = rows[0].asDict() if rows else {}
    if str(detail.get("format", "")).lower() != "delta":
        raise SourceError(f"table {name} is a {detail.get('format') or 'non-Delta'} table; imp maintains sketches "
                          f"over Delta tables only")
    return location_uri(str(detail["location"])), str(detail["id"])


def check_identity(catalog: TableIdentities, sources: Mapping[str, DeltaSource],
                   spark: Callable[[], SparkSession]) -> None:
    """Fail unless every table registered by a catalog name still resolves to the location it was registered at.

    Raises:
        SourceError: A catalog name now points elsewhere.
    """
    for table, source in sources.items():
        identity = catalog.table_identity(table)
        if identity is None:
            continue
        catalog_name, _ = identity
        if catalog_name is None:
            continue
        location, _ = resolve(spark(), catalog_name)
        if location != source.path:
            raise SourceError(f"table {table} was registered as {catalog_name} at {source.path}, but that name now "
                              f"points at {location}; re-register it (imp table register {table} --table "
                              f"{catalog_name} --replace) and register its sketches again")


__all__ = ["TableIdentities", "check_identity", "location_uri", "quoted", "resolve"]

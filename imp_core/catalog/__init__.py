"""The sketch catalog (Postgres): registered tables, sketches, immutable versions, operator state, runs."""

from __future__ import annotations

from imp_core.catalog.store import (
    Catalog,
    NewVersion,
    RunRecord,
    SketchRecord,
    StateBlob,
    TableRecord,
    VersionRecord,
)

__all__ = ["Catalog", "NewVersion", "RunRecord", "SketchRecord", "StateBlob", "TableRecord", "VersionRecord"]

"""The sketch catalog (Postgres): registered tables, sketches, immutable versions, operator state, runs.

See docs/ARCHITECTURE.md, "State and versions".
"""

from __future__ import annotations

from imp_core.catalog.records import (
    NewVersion,
    PartSink,
    RunRecord,
    SketchRecord,
    StateBlob,
    StateWriter,
    TableRecord,
    VersionRecord,
    unusable_message,
)
from imp_core.catalog.store import Catalog

__all__ = ["Catalog", "NewVersion", "PartSink", "RunRecord", "SketchRecord", "StateBlob", "StateWriter", "TableRecord",
           "VersionRecord", "unusable_message"]

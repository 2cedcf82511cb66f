"""The sketch catalog: registered tables, sketches, their immutable versions and operator state, maintenance runs.

Everything the platform remembers between runs lives in Postgres, behind :class:`Catalog`. Each write method is one
transaction, so a crashed run leaves either the whole new version (row and state) or nothing; see
docs/ARCHITECTURE.md, "State and versions".
"""

from __future__ import annotations

from imp_core.catalog.runs import RunStore
from imp_core.catalog.sketches import SketchStore
from imp_core.catalog.tables import TableStore
from imp_core.catalog.versions import VersionStore


class Catalog(TableStore, SketchStore, VersionStore, RunStore):
    """Handle on one catalog database (:meth:`connect`); thread-safe, a connection pool underneath.

    Its methods come from one module per part of the schema: :mod:`~imp_core.catalog.tables`,
    :mod:`~imp_core.catalog.sketches`, :mod:`~imp_core.catalog.versions` (and operator state),
    :mod:`~imp_core.catalog.runs` and :mod:`~imp_core.catalog.locks`; opening the database and its errors are
    :mod:`~imp_core.catalog.connection`'s.
    """


__all__ = ["Catalog"]

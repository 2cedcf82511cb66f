"""Registered tables in the catalog: names, locations, identities and the latest versions observed.

Part of :class:`imp_core.catalog.store.Catalog`; see docs/ARCHITECTURE.md, "State and versions".
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from imp_core.catalog.connection import FOREIGN_KEY_VIOLATION, CatalogConnection, as_json, listed, sqlstate
from imp_core.catalog.records import TableRecord, table_record
from imp_core.errors import CatalogError, NotFoundError, UsageError

_TABLE_SELECT = (
    "SELECT t.name, t.path, t.registered_at, t.schema_json, t.layout_maintenance, o.version AS observed_version, "
    "o.observed_at "
    "FROM source_table t LEFT JOIN table_observation o ON o.table_name = t.name"
)


class TableStore(CatalogConnection):
    """The ``source_table``, ``table_identity`` and ``table_observation`` tables."""

    def register_table(self, name: str, path: str, schema_json: Any = None, *, replace: bool = False) -> TableRecord:
        """Register a Delta table under ``name``; re-registering the same path is a no-op (schema refreshed if given).

        Args:
            name: Name queries use for the table.
            path: Location of the Delta table.
            schema_json: The table schema as JSON, to detect incompatible schema changes later.
            replace: Point an existing name at a different path (its observed version is forgotten: versions of a
                different Delta table are not comparable). Live sketches that read the table are marked unusable
                in the same transaction, for the same reason.

        Returns:
            The registered table.

        Raises:
            UsageError: ``name`` is registered with another path and ``replace`` is false.
        """
        with self._transaction(f"register table {name!r}") as conn:
            inserted = conn.execute(
                sa.text("INSERT INTO source_table (name, path, schema_json) VALUES (:n, :p, CAST(:s AS jsonb)) "
                        "ON CONFLICT (name) DO NOTHING RETURNING name"),
                {"n": name, "p": path, "s": as_json(schema_json)},
            ).first()
            if inserted is None:
                existing: str = conn.execute(sa.text("SELECT path FROM source_table WHERE name = :n FOR UPDATE"),
                                        {"n": name}).scalar_one()
                if existing == path:
                    if schema_json is not None:
                        conn.execute(sa.text("UPDATE source_table SET schema_json = CAST(:s AS jsonb) WHERE name = :n"),
                                     {"n": name, "s": as_json(schema_json)})
                elif replace:
                    conn.execute(
                        sa.text("UPDATE source_table SET path = :p, schema_json = CAST(:s AS jsonb), "
                                "registered_at = now() WHERE name = :n"),
                        {"n": name, "p": path, "s": as_json(schema_json)},
                    )
                    conn.execute(sa.text("DELETE FROM table_observation WHERE table_name = :n"), {"n": name})
                    # the sketches' versions refer to the table at the old path: they cannot be maintained or used
                    conn.execute(
                        sa.text("UPDATE sketch s SET unusable_reason = :r, unusable_at = now() "
                                "WHERE s.dropped_at IS NULL AND s.unusable_reason IS NULL AND EXISTS ("
                                "SELECT 1 FROM sketch_version v WHERE v.sketch_id = s.id "
                                "AND (v.table_versions ->> :n) IS NOT NULL)"),
                        {"n": name, "r": f"table {name} was re-registered from {existing} to {path}; the sketch's "
                                         f"versions refer to the table at {existing}"},
                    )
                else:
                    raise UsageError(f"table {name!r} is already registered at {existing}; pass replace=True "
                                     f"(--replace) to point it at {path}, or register it under another name")
            return self._table(conn, name)

    def unregister_table(self, name: str) -> None:
        """Forget table ``name`` (its observations and identity with it); the Delta table itself is not touched.

        Raises:
            NotFoundError: No table is registered under that name.
            UsageError: A live sketch reads the table (drop those sketches first).
        """
        with self._transaction(f"unregister table {name!r}") as conn:
            readers = list(conn.execute(sa.text(
                "SELECT s.name FROM sketch s WHERE s.dropped_at IS NULL AND EXISTS (SELECT 1 FROM sketch_version v "
                "WHERE v.sketch_id = s.id AND (v.table_versions ->> :n) IS NOT NULL) ORDER BY s.name"),
                {"n": name}).scalars())
            if readers:
                raise UsageError(f"table {name!r} is read by sketch(es) {listed(readers)}; drop them first "
                                 f"(`imp sketch drop NAME`), then unregister the table")
            if conn.execute(sa.text("DELETE FROM source_table WHERE name = :n RETURNING name"), {"n": name}).first() \
                    is None:
                raise self._table_not_found(name, conn)

    def set_table_identity(self, name: str, delta_table_id: str, catalog_name: str | None = None) -> None:
        """Record which Delta table (``metaData.id``) ``name`` means, and the catalog name it was registered by."""
        with self._transaction(f"record the identity of table {name!r}") as conn:
            conn.execute(sa.text(
                "INSERT INTO table_identity (table_name, catalog_name, delta_table_id) VALUES (:n, :c, :i) "
                "ON CONFLICT (table_name) DO UPDATE SET catalog_name = :c, delta_table_id = :i"),
                {"n": name, "c": catalog_name, "i": delta_table_id})

    def table_identity(self, name: str) -> tuple[str | None, str] | None:
        """``(catalog name or None, Delta table id)`` recorded for ``name``, or None (registered before ids were
        kept)."""
        with self._transaction(f"read the identity of table {name!r}") as conn:
            row = conn.execute(sa.text("SELECT catalog_name, delta_table_id FROM table_identity WHERE table_name = :n"),
                               {"n": name}).first()
            return (row[0], row[1]) if row is not None else None

    def get_table(self, name: str) -> TableRecord:
        """The registered table ``name``.

        Raises:
            NotFoundError: No table is registered under that name.
        """
        with self._transaction(f"read table {name!r}") as conn:
            return self._table(conn, name)

    def list_tables(self) -> list[TableRecord]:
        """Every registered table, by name."""
        with self._transaction("list tables") as conn:
            rows = conn.execute(sa.text(_TABLE_SELECT + " ORDER BY t.name")).mappings()
            return [table_record(r) for r in rows]

    def set_layout_maintenance(self, name: str, on: bool) -> TableRecord:
        """Let the nightly layout task re-cluster table ``name`` (``on``) or leave it alone.

        Raises:
            NotFoundError: The table is not registered.
        """
        with self._transaction(f"switch layout maintenance of table {name!r}") as conn:
            done = conn.execute(sa.text("UPDATE source_table SET layout_maintenance = :on WHERE name = :n "
                                        "RETURNING name"), {"n": name, "on": on}).first()
            if done is None:
                raise self._table_not_found(name, conn)
            return self._table(conn, name)

    def observe_table_version(self, name: str, version: int, table_id: str | None = None) -> None:
        """Record that Delta version ``version`` of table ``name`` exists (drives ``is_stale`` in the catalog view).

        Keeps the highest version seen, so a slow process reporting an older version cannot make a table look
        older than it is, unless ``table_id`` (the Delta metadata id) differs from the one observed before: a table
        re-created at the same path starts its versions again.

        Raises:
            NotFoundError: The table is not registered.
        """
        try:
            with self._transaction(f"record version {version} of table {name!r}") as conn:
                conn.execute(
                    sa.text("INSERT INTO table_observation (table_name, version, table_id) VALUES (:n, :v, :id) "
                            "ON CONFLICT (table_name) DO UPDATE SET "
                            "version = CASE WHEN excluded.table_id IS NOT NULL AND table_observation.table_id "
                            "IS DISTINCT FROM excluded.table_id THEN excluded.version "
                            "ELSE greatest(table_observation.version, excluded.version) END, "
                            "table_id = coalesce(excluded.table_id, table_observation.table_id), observed_at = now()"),
                    {"n": name, "v": version, "id": table_id},
                )
        except CatalogError as e:
            if sqlstate(e.__cause__) == FOREIGN_KEY_VIOLATION:
                raise self._table_not_found(name) from e
            raise

    def _table(self, conn: sa.Connection, name: str) -> TableRecord:
        row = conn.execute(sa.text(_TABLE_SELECT + " WHERE t.name = :n"), {"n": name}).mappings().first()
        if row is None:
            raise self._table_not_found(name, conn)
        return table_record(row)

    def _table_not_found(self, name: str, conn: sa.Connection | None = None) -> NotFoundError:
        if conn is None:
            with self._engine.connect() as own:
                return self._table_not_found(name, own)
        names: list[str] = list(conn.execute(sa.text("SELECT name FROM source_table ORDER BY name")).scalars())
        known = f"registered tables: {listed(names)}" if names else "no tables are registered yet"
        return NotFoundError(f"table {name!r} is not registered ({known}); register it with `imp table register`")


__all__ = ["TableStore"]

"""The sketch catalog: registered tables, sketches, their immutable versions and operator state, maintenance runs.

Everything the platform remembers between runs lives here, in Postgres. Each write method is one transaction, so a
crashed run leaves either the whole new version (row and state) or nothing. The database itself refuses to change or
delete a committed version (triggers in the ``0001_initial`` migration); the only sanctioned removal is deleting the
operator state of versions older than the retention window.

A sketch whose assumptions stopped holding is marked unusable (``mark_unusable``; also done by ``register_table`` when
a name is re-pointed at another path): it keeps its versions, takes no new ones, and is left out of
``stale_sketches``, until it is dropped.

Concurrency: ``commit_version`` is optimistic (it names the version it builds on and fails with
``ConcurrentMaintenanceError`` if another maintainer committed first); ``sketch_lock`` lets maintainers of one
sketch queue up instead of racing, while different sketches proceed in parallel.
"""

from __future__ import annotations

import dataclasses
import getpass
import hashlib
import json
import socket
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from imp_core.catalog.migrations import upgrade_to_head
from imp_core import faults
from imp_core.config import redact_url
from imp_core.security import integrity
from imp_core.security.redact import register_url, scrub, scrub_urls
from imp_core.errors import (
    CatalogError,
    ConcurrentMaintenanceError,
    ImpError,
    MaintainerBusyError,
    NotFoundError,
    SketchUnusableError,
    StateError,
    UsageError,
)

if TYPE_CHECKING:
    from imp_core.config import Settings

METHODS = ("capture", "incremental", "recapture")
FINAL_RUN_STATUSES = ("succeeded", "failed")

# First half of the two-int advisory lock key for sketch locks ("imps"); the second half is the sketch id. A fixed
# namespace keeps our locks apart from other applications' advisory locks in a shared database.
_SKETCH_LOCK_NAMESPACE = 0x696D7073
# ... and for captures ("impc"), keyed by run id: held while a capture runs, so a capture run whose lock is free
# belongs to a dead process (see clear_abandoned_captures)
_CAPTURE_LOCK_NAMESPACE = 0x696D7063

# Postgres SQLSTATEs we turn into user-facing errors.
_UNIQUE_VIOLATION = "23505"
_FOREIGN_KEY_VIOLATION = "23503"
_LOCK_NOT_AVAILABLE = "55P03"


# --------------------------------------------------------------------------------------------------------- records


@dataclass(frozen=True)
class TableRecord:
    """A registered Delta table and the latest version of it the platform has observed."""

    name: str
    path: str
    registered_at: datetime
    schema_json: Any
    observed_version: int | None
    observed_at: datetime | None


@dataclass(frozen=True)
class SketchRecord:
    """A registered sketch: the query and how its provenance is partitioned and maintained."""

    id: int
    name: str
    sql: str
    dialect: str | None
    template_key: str
    plan_json: Any
    partitions: Any
    safety: Any
    strategy: str
    created_at: datetime
    unusable_reason: str | None = None
    unusable_at: datetime | None = None

    @property
    def usable(self) -> bool:
        """False once the sketch was marked unusable (``Catalog.mark_unusable``)."""
        return self.unusable_reason is None


@dataclass(frozen=True)
class NewVersion:
    """A sketch version about to be committed (the catalog assigns its number).

    Attributes:
        table_versions: Delta version of each input table this sketch version reflects.
        bits: One bitset per partitioned table (``Sketch.bits``).
        fragments: Fragment ids per partitioned table (``Sketch.to_json``).
        method: ``capture``, ``incremental`` or ``recapture``.
        reason: Why a recapture happened (e.g. the change feed was vacuumed).
        delta_rows: Change rows processed to produce this version.
        duration_ms: Wall time of the capture or maintenance.
        run_id: The maintenance run that produced it.
        table_identities: Per table, ``{"id": Delta metadata id, "path": registered path}`` the table versions
            refer to.
        state_options: Engine options that shaped the operator state (``imp_core.maintenance.options``).
    """

    table_versions: Mapping[str, int]
    bits: Mapping[str, bytes]
    fragments: Mapping[str, Sequence[int]]
    method: str
    reason: str | None = None
    delta_rows: int = 0
    duration_ms: float | None = None
    run_id: int | None = None
    table_identities: Mapping[str, Mapping[str, str]] | None = None
    state_options: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise UsageError(f"unknown sketch version method {self.method!r}; use one of {', '.join(METHODS)}")


@dataclass(frozen=True)
class VersionRecord:
    """A committed, immutable sketch version."""

    sketch_id: int
    version: int
    table_versions: dict[str, int]
    bits: dict[str, bytes]
    fragments: dict[str, list[int]]
    method: str
    reason: str | None
    delta_rows: int
    duration_ms: float | None
    run_id: int | None
    created_at: datetime
    table_identities: dict[str, dict[str, str]] | None = None  # None: committed before identities were recorded
    state_options: dict[str, Any] | None = None  # None: committed before options were recorded


@dataclass(frozen=True)
class StateBlob:
    """Serialized state of one stateful operator, as handed back by the operator.

    ``checksum``, when given, is the sha256 hex of ``payload`` and is checked before writing. The catalog stores a
    keyed checksum instead (:mod:`imp_core.security.integrity`); a blob read back has been verified against it and
    carries the sha256 of its payload.
    """

    operator_id: str
    format: str
    format_version: int
    payload: bytes
    checksum: str | None = None


@dataclass(frozen=True)
class RunRecord:
    """One capture or maintenance attempt."""

    id: int
    sketch_id: int | None
    strategy: str | None
    trigger: str | None
    triggered_by: str | None
    from_version: int | None
    to_version: int | None
    table_versions_from: dict[str, int] | None
    table_versions_to: dict[str, int] | None
    delta_rows: int | None
    status: str
    error: str | None
    started_at: datetime
    finished_at: datetime | None
    timings: dict[str, Any] | None


# --------------------------------------------------------------------------------------------------------- catalog


class Catalog:
    """Handle on one catalog database; thread-safe (a connection pool underneath)."""

    def __init__(self, engine: sa.Engine, state_key: bytes | Callable[[], bytes] | None = None) -> None:
        """Wrap an engine whose database is already at the head schema revision; use :meth:`connect` instead.

        ``state_key`` (or a function loading it on first use) seals operator state (HMAC); without one (tools that
        never touch state) state checksums are plain SHA-256 and cannot detect forgery.
        """
        self._engine = engine
        self._key_source = state_key
        self._key: bytes | None = None
        self._key_lock = threading.Lock()

    @property
    def _state_key(self) -> bytes | None:
        if not callable(self._key_source):
            return self._key_source
        with self._key_lock:
            if self._key is None:
                self._key = self._key_source()
            return self._key

    # -- lifecycle

    @classmethod
    def connect(cls, settings: Settings) -> Catalog:
        """Open the catalog the settings point at and bring its schema up to date.

        ``settings.catalog_url`` if set, else the embedded Postgres under ``IMP_HOME`` (started if needed).

        Args:
            settings: Resolved settings.

        Returns:
            A connected catalog at the head schema revision.

        Raises:
            CatalogError: The URL is invalid or unreachable (the message shows it with the password as ``***``),
                the embedded server cannot start, or the schema was written by a newer imp.
        """
        if settings.catalog_url:
            url = settings.catalog_url
        else:
            from imp_core.catalog.embedded import embedded_url

            url = embedded_url(settings)
        register_url(url)
        shown = redact_url(url)
        home = settings.home
        try:
            parsed = sa.make_url(url)
            connect_args: dict[str, Any] = {}
            if parsed.get_backend_name() == "postgresql" and parsed.get_driver_name() == "psycopg2":
                # Fail within seconds on an unreachable host instead of the OS default of minutes.
                connect_args = {"connect_timeout": 10, "application_name": "imp"}
            engine = sa.create_engine(parsed, pool_pre_ping=True, connect_args=connect_args)
        except (sa.exc.ArgumentError, sa.exc.NoSuchModuleError, ValueError, ImportError) as e:
            raise CatalogError(f"invalid catalog URL {shown}: {_scrub(str(e), url)}; set IMP_CATALOG_URL "
                               f"(--catalog-url) to postgresql+psycopg2://USER:PASSWORD@HOST:PORT/DATABASE") from e
        if engine.dialect.name != "postgresql":
            engine.dispose()
            raise CatalogError(f"catalog URL {shown} is not a Postgres URL; the sketch catalog needs Postgres "
                               f"(postgresql+psycopg2://...), or unset IMP_CATALOG_URL to use the embedded one")
        try:
            with engine.begin() as conn:
                upgrade_to_head(conn)
        except ImpError:
            engine.dispose()
            raise
        except sa.exc.OperationalError as e:
            engine.dispose()
            raise CatalogError(
                f"cannot reach the sketch catalog at {shown}: {_db_message(e, url)}; check that the server is "
                f"running and IMP_CATALOG_URL (--catalog-url) is right, or unset it to use the embedded catalog "
                f"under IMP_HOME"
            ) from e
        except sa.exc.SQLAlchemyError as e:
            engine.dispose()
            raise CatalogError(f"could not bring the sketch catalog at {shown} to the current schema: "
                               f"{_db_message(e, url)}") from e
        return cls(engine, lambda: integrity.load_state_key(home))  # loaded when state is first read or written

    @property
    def url(self) -> str:
        """The catalog URL with the password redacted (for display)."""
        return redact_url(self._engine.url.render_as_string(hide_password=False))

    @property
    def engine(self) -> sa.Engine:
        """The SQLAlchemy engine (for read-only tooling such as ``imp catalog sql``)."""
        return self._engine

    def close(self) -> None:
        """Close every pooled connection."""
        self._engine.dispose()

    def __enter__(self) -> Catalog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- tables

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
                {"n": name, "p": path, "s": _json(schema_json)},
            ).first()
            if inserted is None:
                existing = conn.execute(sa.text("SELECT path FROM source_table WHERE name = :n FOR UPDATE"),
                                        {"n": name}).scalar_one()
                if existing == path:
                    if schema_json is not None:
                        conn.execute(sa.text("UPDATE source_table SET schema_json = CAST(:s AS jsonb) WHERE name = :n"),
                                     {"n": name, "s": _json(schema_json)})
                elif replace:
                    conn.execute(
                        sa.text("UPDATE source_table SET path = :p, schema_json = CAST(:s AS jsonb), "
                                "registered_at = now() WHERE name = :n"),
                        {"n": name, "p": path, "s": _json(schema_json)},
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

    def set_table_identity(self, name: str, delta_table_id: str, catalog_name: str | None = None) -> None:
        """Record which Delta table (``metaData.id``) ``name`` means, and the catalog name it was registered by."""
        with self._transaction(f"record the identity of table {name!r}") as conn:
            conn.execute(sa.text(
                "INSERT INTO table_identity (table_name, catalog_name, delta_table_id) VALUES (:n, :c, :i) "
                "ON CONFLICT (table_name) DO UPDATE SET catalog_name = :c, delta_table_id = :i"),
                {"n": name, "c": catalog_name, "i": delta_table_id})

    def table_identity(self, name: str) -> tuple[str | None, str] | None:
        """``(catalog name or None, Delta table id)`` recorded for ``name``, or None (registered before ids were kept)."""
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
            return [_table_record(r) for r in rows]

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
            if _sqlstate(e.__cause__) == _FOREIGN_KEY_VIOLATION:
                raise self._table_not_found(name) from e
            raise

    # -- sketches

    def create_sketch(
        self,
        name: str,
        sql: str,
        dialect: str | None,
        template_key: str,
        plan_json: Any,
        partitions: Any,
        safety: Any,
        strategy: str,
        first_version: NewVersion,
        states: Sequence[StateBlob],
        run_id: int | None = None,
    ) -> SketchRecord:
        """Register a sketch together with its captured version 1 and that version's operator state, atomically.

        Args:
            name: Unique among live sketches.
            sql: The query.
            dialect: SQL dialect of ``sql`` (sqlglot name).
            template_key: Key of the query template the sketch answers.
            plan_json: The analysed plan, for display and debugging.
            partitions: The partition set (JSON).
            safety: Result of the safety check (JSON).
            strategy: Maintenance strategy (``lazy`` or ``eager``).
            first_version: The captured sketch, committed as version 1.
            states: Operator state of version 1.
            run_id: The maintenance run that captured it (also linked to the new sketch); defaults to
                ``first_version.run_id``.

        Returns:
            The new sketch.

        Raises:
            UsageError: A live sketch named ``name`` exists (the catalog is left unchanged).
        """
        run_id = run_id if run_id is not None else first_version.run_id
        blobs = _prepared_states(states, name, 1, self._state_key)
        with self._transaction(f"create sketch {name!r}") as conn:
            try:
                row = conn.execute(
                    sa.text("INSERT INTO sketch (name, sql, dialect, template_key, plan_json, partitions, safety, "
                            "strategy) VALUES (:name, :sql, :dialect, :tk, CAST(:plan AS jsonb), "
                            "CAST(:parts AS jsonb), CAST(:safety AS jsonb), :strategy) RETURNING *"),
                    {"name": name, "sql": sql, "dialect": dialect, "tk": template_key, "plan": _json(plan_json),
                     "parts": _json(partitions), "safety": _json(safety), "strategy": strategy},
                ).mappings().one()
            except sa.exc.IntegrityError as e:
                if _sqlstate(e) == _UNIQUE_VIOLATION:
                    raise UsageError(f"sketch {name!r} already exists; pick another name or drop it "
                                     f"(`imp sketch drop {name}`)") from e
                raise
            sketch = _sketch_record(row)
            if run_id is not None:
                conn.execute(sa.text("UPDATE maintenance_run SET sketch_id = :s WHERE id = :r AND sketch_id IS NULL"),
                             {"s": sketch.id, "r": run_id})
            self._insert_version(conn, sketch.id, 1, dataclasses.replace(first_version, run_id=run_id), blobs)
            return sketch

    def get_sketch(self, name: str) -> SketchRecord:
        """The live sketch ``name``.

        Raises:
            NotFoundError: No live sketch has that name.
        """
        with self._transaction(f"read sketch {name!r}") as conn:
            row = conn.execute(sa.text("SELECT * FROM sketch WHERE name = :n AND dropped_at IS NULL"),
                               {"n": name}).mappings().first()
            if row is None:
                raise self._sketch_not_found(conn, name)
            return _sketch_record(row)

    def get_sketch_by_id(self, sketch_id: int) -> SketchRecord:
        """The sketch with internal id ``sketch_id`` (dropped ones included: their versions stay readable).

        Raises:
            NotFoundError: No sketch has that id.
        """
        with self._transaction(f"read sketch {sketch_id}") as conn:
            row = conn.execute(sa.text("SELECT * FROM sketch WHERE id = :i"), {"i": sketch_id}).mappings().first()
            if row is None:
                raise NotFoundError(f"no sketch has id {sketch_id}; see `imp sketch list`")
            return _sketch_record(row)

    def list_sketches(self) -> list[SketchRecord]:
        """Every live sketch, by name."""
        with self._transaction("list sketches") as conn:
            rows = conn.execute(sa.text("SELECT * FROM sketch WHERE dropped_at IS NULL ORDER BY name")).mappings()
            return [_sketch_record(r) for r in rows]

    def drop_sketch(self, name: str) -> None:
        """Drop the live sketch ``name``: its name becomes free, its versions stay for the record.

        Its operator state is deleted (a dropped sketch is never maintained again).

        Raises:
            NotFoundError: No live sketch has that name.
        """
        with self._transaction(f"drop sketch {name!r}") as conn:
            sketch_id = conn.execute(
                sa.text("UPDATE sketch SET dropped_at = now() WHERE name = :n AND dropped_at IS NULL RETURNING id"),
                {"n": name},
            ).scalar()
            if sketch_id is None:
                raise self._sketch_not_found(conn, name)
            conn.execute(sa.text("DELETE FROM operator_state WHERE sketch_id = :s"), {"s": sketch_id})

    def mark_unusable(self, sketch_id: int, reason: str) -> bool:
        """Mark a sketch unusable: queries run without it, maintenance refuses it, until it is dropped.

        The first reason is kept (a later one does not overwrite it).

        Returns:
            True if this call marked it, False if it was already unusable.

        Raises:
            NotFoundError: No sketch has that id.
        """
        with self._transaction(f"mark sketch {sketch_id} unusable") as conn:
            marked = conn.execute(
                sa.text("UPDATE sketch SET unusable_reason = :r, unusable_at = now() "
                        "WHERE id = :s AND unusable_reason IS NULL RETURNING id"),
                {"s": sketch_id, "r": reason},
            ).scalar()
            if marked is None:
                self._sketch_label(conn, sketch_id)  # raises NotFoundError for an unknown id
            return marked is not None

    def sketch_catalog(self) -> list[dict[str, Any]]:
        """The rows of the ``sketch_catalog`` view (one per live sketch, by name)."""
        with self._transaction("read the sketch catalog view") as conn:
            return [dict(r) for r in conn.execute(sa.text("SELECT * FROM sketch_catalog ORDER BY name")).mappings()]

    def stale_sketches(self) -> list[str]:
        """Names of live, usable sketches whose latest version is behind an observed table version."""
        with self._transaction("list stale sketches") as conn:
            return list(conn.execute(sa.text("SELECT name FROM sketch_catalog WHERE is_stale AND usable "
                                             "ORDER BY name")).scalars())

    # -- versions

    def latest_version(self, sketch_id: int) -> VersionRecord:
        """The latest committed version of a sketch.

        Raises:
            NotFoundError: The sketch does not exist.
        """
        with self._transaction(f"read the latest version of sketch {sketch_id}") as conn:
            row = conn.execute(
                sa.text("SELECT * FROM sketch_version WHERE sketch_id = :s ORDER BY version DESC LIMIT 1"),
                {"s": sketch_id},
            ).mappings().first()
            if row is None:
                raise NotFoundError(f"sketch {self._sketch_label(conn, sketch_id)} has no versions")
            return _version_record(row)

    def get_version(self, sketch_id: int, version: int) -> VersionRecord:
        """Version ``version`` of a sketch.

        Raises:
            NotFoundError: The sketch or the version does not exist (the message gives the valid range).
        """
        with self._transaction(f"read version {version} of sketch {sketch_id}") as conn:
            row = conn.execute(sa.text("SELECT * FROM sketch_version WHERE sketch_id = :s AND version = :v"),
                               {"s": sketch_id, "v": version}).mappings().first()
            if row is None:
                raise self._version_not_found(conn, sketch_id, f"version {version}")
            return _version_record(row)

    def versions(self, sketch_id: int) -> list[VersionRecord]:
        """Every version of a sketch, oldest first."""
        with self._transaction(f"list versions of sketch {sketch_id}") as conn:
            rows = conn.execute(sa.text("SELECT * FROM sketch_version WHERE sketch_id = :s ORDER BY version"),
                                {"s": sketch_id}).mappings()
            return [_version_record(r) for r in rows]

    def version_as_of_table_version(self, sketch_id: int, table: str, table_version: int) -> VersionRecord:
        """The latest sketch version that reflects table ``table`` at Delta version ``table_version`` or earlier.

        Raises:
            NotFoundError: The sketch does not read ``table``, or its first version is already past
                ``table_version``.
        """
        with self._transaction(f"find the version of sketch {sketch_id} as of {table}@{table_version}") as conn:
            row = conn.execute(
                sa.text("SELECT * FROM sketch_version WHERE sketch_id = :s AND (table_versions ->> :t) IS NOT NULL "
                        "AND (table_versions ->> :t)::bigint <= :tv ORDER BY version DESC LIMIT 1"),
                {"s": sketch_id, "t": table, "tv": table_version},
            ).mappings().first()
            if row is None:
                first = conn.execute(
                    sa.text("SELECT table_versions FROM sketch_version WHERE sketch_id = :s ORDER BY version LIMIT 1"),
                    {"s": sketch_id},
                ).scalar()
                label = self._sketch_label(conn, sketch_id)
                if first is None:
                    raise NotFoundError(f"sketch {label} has no versions")
                if table not in first:
                    raise NotFoundError(f"sketch {label} does not read table {table!r}; it reads "
                                        f"{', '.join(sorted(first)) or 'no tables'}")
                raise NotFoundError(f"sketch {label} has no version as of {table} version {table_version}: its first "
                                    f"version reflects {table} version {first[table]}")
            return _version_record(row)

    def commit_version(
        self, sketch_id: int, expected_previous: int, new: NewVersion, states: Sequence[StateBlob], retention: int,
        safety: Any = None,
    ) -> VersionRecord:
        """Commit version ``expected_previous + 1`` of a sketch with its operator state, then apply retention.

        One transaction: the version row, its state, and deleting operator state of versions older than the latest
        ``retention`` (their version rows stay). Serialized per sketch by a row lock on the sketch, so the check
        "nobody committed since ``expected_previous``" and the insert cannot interleave with another committer.

        Args:
            sketch_id: The sketch.
            expected_previous: The version this one was computed from.
            new: The new version.
            states: Operator state of the new version.
            retention: Keep operator state for this many latest versions (at least 1).
            safety: A safety verdict re-checked for this version (a recapture's), stored with the sketch in the
                same transaction so the sign assumptions later batches check always belong to the latest version.

        Returns:
            The committed version.

        Raises:
            ConcurrentMaintenanceError: Another maintainer already committed after ``expected_previous``.
            NotFoundError: The sketch does not exist or was dropped.
            SketchUnusableError: The sketch was marked unusable meanwhile (nothing is committed).
            UsageError: ``retention`` is below 1, or two state blobs share an operator id.
        """
        if retention < 1:
            raise UsageError(f"state retention must be at least 1 (keep state of the latest version), got {retention}")
        version = expected_previous + 1
        with self._transaction(f"commit version {version} of sketch {sketch_id}") as conn:
            sketch = conn.execute(sa.text("SELECT name, dropped_at, unusable_reason FROM sketch WHERE id = :s "
                                          "FOR UPDATE"), {"s": sketch_id}).first()
            if sketch is None:
                raise NotFoundError(f"no sketch has id {sketch_id}; see `imp sketch list`")
            if sketch.dropped_at is not None:
                raise NotFoundError(f"sketch {sketch.name!r} was dropped while it was being maintained; "
                                    f"nothing was committed")
            if sketch.unusable_reason is not None:
                raise SketchUnusableError(unusable_message(sketch.name, sketch.unusable_reason))
            latest = conn.execute(sa.text("SELECT max(version) FROM sketch_version WHERE sketch_id = :s"),
                                  {"s": sketch_id}).scalar()
            if latest != expected_previous:
                raise ConcurrentMaintenanceError(
                    f"sketch {sketch.name!r}: cannot commit version {version} on top of version {expected_previous}, "
                    f"the latest committed version is {latest} (another maintainer got there first); "
                    f"maintain again from version {latest}"
                )
            blobs = _prepared_states(states, sketch.name, version, self._state_key)
            try:
                record = self._insert_version(conn, sketch_id, version, new, blobs)
            except sa.exc.IntegrityError as e:
                # Only reachable if a writer bypassed the row lock; the primary key still keeps versions unique.
                if _sqlstate(e) == _UNIQUE_VIOLATION:
                    raise ConcurrentMaintenanceError(f"sketch {sketch.name!r}: version {version} was committed by "
                                                     f"another maintainer; maintain again") from e
                raise
            if safety is not None:
                conn.execute(sa.text("UPDATE sketch SET safety = CAST(:j AS jsonb) WHERE id = :s"),
                             {"s": sketch_id, "j": _json(safety)})
            faults.point("in_commit")
            conn.execute(sa.text("DELETE FROM operator_state WHERE sketch_id = :s AND version <= :v"),
                         {"s": sketch_id, "v": version - retention})
            return record

    # -- operator state

    def load_states(self, sketch_id: int, version: int) -> dict[str, StateBlob]:
        """Operator state of a sketch version, by operator id, each verified against its checksum.

        Returns:
            Possibly empty (stateless plan, or state removed by retention; see :meth:`has_states`).

        Raises:
            StateError: A payload does not match its checksum.
        """
        with self._transaction(f"load operator state of sketch {sketch_id} version {version}") as conn:
            rows = conn.execute(
                sa.text("SELECT operator_id, format, format_version, payload, checksum FROM operator_state "
                        "WHERE sketch_id = :s AND version = :v ORDER BY operator_id"),
                {"s": sketch_id, "v": version},
            ).all()
            out: dict[str, StateBlob] = {}
            name = self._sketch_name(conn, sketch_id) if rows else ""
            for row in rows:
                payload = bytes(row.payload)
                if not _verify(self._state_key, name, version, row.operator_id, payload, row.checksum):
                    raise StateError(
                        f"operator state of sketch {name} version {version} is corrupt (checksum mismatch for "
                        f"operator {row.operator_id}: changed after it was written, or sealed with another state "
                        f"key); run `imp sketch recapture {name}`"
                    )
                out[row.operator_id] = StateBlob(row.operator_id, row.format, row.format_version, payload,
                                                 checksum(payload))
            return out

    def has_states(self, sketch_id: int, version: int) -> bool:
        """Whether any operator state is stored for this sketch version."""
        with self._transaction(f"check operator state of sketch {sketch_id} version {version}") as conn:
            return bool(conn.execute(
                sa.text("SELECT EXISTS (SELECT 1 FROM operator_state WHERE sketch_id = :s AND version = :v)"),
                {"s": sketch_id, "v": version},
            ).scalar())

    # -- locks

    @contextmanager
    def sketch_lock(self, sketch_id: int, timeout: float | None = None) -> Iterator[None]:
        """Hold the maintenance lock of a sketch for the ``with`` block, waiting while another process holds it.

        A Postgres session-level advisory lock on a dedicated connection: released when the block ends, or by the
        server if this process dies. Outside any transaction, so a long maintenance does not hold one open.

        Args:
            sketch_id: The sketch.
            timeout: Wait at most this many seconds (the server's ``lock_timeout``); None waits as long as it takes.

        Raises:
            MaintainerBusyError: ``timeout`` passed while another process held the lock.
        """
        with self._advisory(sketch_id, wait=True, timeout=timeout):
            yield

    @contextmanager
    def try_sketch_lock(self, sketch_id: int) -> Iterator[bool]:
        """Like :meth:`sketch_lock` but never waits: yields False (holding nothing) if another holder has it."""
        with self._advisory(sketch_id, wait=False) as acquired:
            yield acquired

    @contextmanager
    def capture_run(self, trigger: str, table_versions_from: Mapping[str, int] | None = None) -> Iterator[int]:
        """Start a capture run (no sketch yet) and hold its capture lock for the ``with`` block; yields the run id.

        The run id is drawn and locked before the row exists, so :meth:`clear_abandoned_captures` never mistakes a
        starting capture for a dead one. The lock is a session advisory lock: the server drops it when the
        capturing process dies, which is how a dead capture is recognised.
        """
        conn: sa.Connection | None = None
        run_id = 0
        try:
            conn = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            run_id = int(conn.execute(sa.text("SELECT nextval(pg_get_serial_sequence('maintenance_run', 'id'))"))
                         .scalar_one())
            conn.execute(sa.text("SELECT pg_advisory_lock(:ns, :r)"), {"ns": _CAPTURE_LOCK_NAMESPACE, "r": run_id})
            conn.execute(sa.text("INSERT INTO maintenance_run (id, sketch_id, strategy, trigger, triggered_by, "
                                 "table_versions_from) VALUES (:r, NULL, 'capture', :tr, :by, CAST(:tvf AS jsonb))"),
                         {"r": run_id, "tr": trigger, "by": default_triggered_by(), "tvf": _json(table_versions_from)})
        except sa.exc.SQLAlchemyError as e:
            if conn is not None:
                conn.invalidate()
            raise CatalogError(f"could not start a capture run in the catalog at {self.url}: {_db_message(e)}") from e
        try:
            yield run_id
        finally:
            try:
                conn.execute(sa.text("SELECT pg_advisory_unlock(:ns, :r)"),
                             {"ns": _CAPTURE_LOCK_NAMESPACE, "r": run_id})
                conn.close()
            except sa.exc.SQLAlchemyError:
                conn.invalidate()

    @contextmanager
    def _advisory(self, sketch_id: int, *, wait: bool, namespace: int = _SKETCH_LOCK_NAMESPACE,
                  timeout: float | None = None) -> Iterator[bool]:
        key = {"ns": namespace, "s": sketch_id}
        conn: sa.Connection | None = None
        try:
            conn = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            if wait and timeout is not None:
                conn.execute(sa.text("SELECT set_config('lock_timeout', :t, false)"),
                             {"t": f"{max(1, int(timeout * 1000))}ms"})
                try:
                    conn.execute(sa.text("SELECT pg_advisory_lock(:ns, :s)"), key)
                except sa.exc.OperationalError as e:
                    if _sqlstate(e) != _LOCK_NOT_AVAILABLE:
                        raise
                    conn.invalidate()  # its session still has the lock_timeout: never back to the pool
                    raise MaintainerBusyError(f"another process is maintaining sketch {sketch_id} (waited "
                                              f"{timeout:g} s for it)") from e
                conn.execute(sa.text("SELECT set_config('lock_timeout', '0', false)"))
                acquired = True
            elif wait:
                conn.execute(sa.text("SELECT pg_advisory_lock(:ns, :s)"), key)
                acquired = True
            else:
                acquired = bool(conn.execute(sa.text("SELECT pg_try_advisory_lock(:ns, :s)"), key).scalar())
        except sa.exc.SQLAlchemyError as e:
            if conn is not None:
                conn.invalidate()
            raise CatalogError(f"could not take the maintenance lock of sketch {sketch_id} in the catalog at "
                               f"{self.url}: {_db_message(e)}") from e
        assert conn is not None
        try:
            yield acquired
        finally:
            try:
                if acquired:
                    conn.execute(sa.text("SELECT pg_advisory_unlock(:ns, :s)"), key)
                conn.close()
            except sa.exc.SQLAlchemyError:
                # The lock may still be held by this session: never hand the connection back to the pool.
                conn.invalidate()

    # -- maintenance runs

    def start_run(
        self,
        sketch_id: int | None,
        strategy: str | None,
        trigger: str,
        triggered_by: str | None = None,
        from_version: int | None = None,
        table_versions_from: Mapping[str, int] | None = None,
    ) -> int:
        """Record the start of a capture or maintenance run (committed at once, so a crash leaves it ``running``).

        Args:
            sketch_id: The sketch, or None for a capture that will create it (``create_sketch(run_id=...)`` links it).
            strategy: The maintenance strategy in effect.
            trigger: What started it: ``cli``, ``airflow:<dag_id>/<run_id>``, ...
            triggered_by: Who started it; defaults to ``user@host``.
            from_version: Sketch version the run starts from.
            table_versions_from: Table versions of that sketch version.

        Returns:
            The run id.
        """
        with self._transaction("start a maintenance run") as conn:
            return int(conn.execute(
                sa.text("INSERT INTO maintenance_run (sketch_id, strategy, trigger, triggered_by, from_version, "
                        "table_versions_from) VALUES (:s, :st, :tr, :by, :fv, CAST(:tvf AS jsonb)) RETURNING id"),
                {"s": sketch_id, "st": strategy, "tr": trigger, "by": triggered_by or default_triggered_by(),
                 "fv": from_version, "tvf": _json(table_versions_from)},
            ).scalar_one())

    def finish_run(
        self,
        run_id: int,
        status: str,
        to_version: int | None = None,
        table_versions_to: Mapping[str, int] | None = None,
        delta_rows: int | None = None,
        error: str | None = None,
        timings: Mapping[str, Any] | None = None,
    ) -> RunRecord:
        """Record how a run ended.

        Args:
            run_id: From :meth:`start_run`.
            status: ``succeeded`` or ``failed``.
            to_version: Sketch version the run committed.
            table_versions_to: Table versions of that sketch version.
            delta_rows: Change rows processed.
            error: The error message of a failed run.
            timings: Phase name -> milliseconds.

        Returns:
            The finished run.

        Raises:
            UsageError: ``status`` is not a final status.
            NotFoundError: No such run.
            CatalogError: The run has already finished.
        """
        if status not in FINAL_RUN_STATUSES:
            raise UsageError(f"a run finishes as {' or '.join(FINAL_RUN_STATUSES)}, not {status!r}")
        with self._transaction(f"finish maintenance run {run_id}") as conn:
            row = conn.execute(
                sa.text("UPDATE maintenance_run SET status = :st, to_version = :tv, "
                        "table_versions_to = CAST(:tvt AS jsonb), delta_rows = :dr, error = :err, "
                        "timings = CAST(:tim AS jsonb), finished_at = now() "
                        "WHERE id = :r AND status = 'running' RETURNING *"),
                {"r": run_id, "st": status, "tv": to_version, "tvt": _json(table_versions_to), "dr": delta_rows,
                 "err": error, "tim": _json(timings)},
            ).mappings().first()
            if row is None:
                current = conn.execute(sa.text("SELECT status FROM maintenance_run WHERE id = :r"),
                                       {"r": run_id}).scalar()
                if current is None:
                    raise NotFoundError(f"no maintenance run has id {run_id}; see `imp runs`")
                raise CatalogError(f"maintenance run {run_id} already finished ({current})")
            return _run_record(row)

    def abandon_running(self, sketch_id: int) -> int:
        """Mark the sketch's runs still ``running`` as failed: their process died (call with the sketch lock held).

        Returns:
            How many runs were marked.
        """
        with self._transaction("mark abandoned runs") as conn:
            return conn.execute(
                sa.text("UPDATE maintenance_run SET status = 'failed', finished_at = now(), error = 'the process "
                        "running it stopped before finishing (crashed or killed); nothing of it was committed' "
                        "WHERE sketch_id = :s AND status = 'running'"), {"s": sketch_id}).rowcount

    def discard_capture_run(self, run_id: int) -> bool:
        """Delete a capture run that created no sketch (a failed ``sketch create`` leaves nothing behind).

        Returns:
            Whether a row was deleted (False once the run is linked to a sketch).
        """
        with self._transaction(f"discard capture run {run_id}") as conn:
            return bool(conn.execute(sa.text("DELETE FROM maintenance_run WHERE id = :r AND sketch_id IS NULL"),
                                     {"r": run_id}).rowcount)

    def clear_abandoned_captures(self) -> int:
        """Delete capture runs still ``running`` without a sketch whose process died (their capture lock is free).

        Returns:
            How many runs were deleted.
        """
        with self._transaction("list running captures") as conn:
            ids = list(conn.execute(sa.text("SELECT id FROM maintenance_run WHERE sketch_id IS NULL "
                                            "AND status = 'running' ORDER BY id")).scalars())
        cleared = 0
        for run_id in ids:
            with self._advisory(run_id, wait=False, namespace=_CAPTURE_LOCK_NAMESPACE) as free:
                if free:
                    cleared += self.discard_capture_run(run_id)
        return cleared

    def get_run(self, run_id: int) -> RunRecord:
        """One maintenance run.

        Raises:
            NotFoundError: No such run.
        """
        with self._transaction(f"read maintenance run {run_id}") as conn:
            row = conn.execute(sa.text("SELECT * FROM maintenance_run WHERE id = :r"), {"r": run_id}).mappings().first()
            if row is None:
                raise NotFoundError(f"no maintenance run has id {run_id}; see `imp runs`")
            return _run_record(row)

    def runs(self, sketch_id: int | None = None, limit: int = 50) -> list[RunRecord]:
        """The most recent runs, newest first, of one sketch or of all."""
        with self._transaction("list maintenance runs") as conn:
            rows = conn.execute(
                sa.text("SELECT * FROM maintenance_run WHERE CAST(:s AS integer) IS NULL OR sketch_id = :s "
                        "ORDER BY id DESC LIMIT :lim"),
                {"s": sketch_id, "lim": limit},
            ).mappings()
            return [_run_record(r) for r in rows]

    # -- internals

    @contextmanager
    def _transaction(self, action: str) -> Iterator[sa.Connection]:
        """One transaction; database failures become CatalogError saying what we were doing."""
        try:
            with self._engine.begin() as conn:
                yield conn
        except sa.exc.SQLAlchemyError as e:
            raise CatalogError(f"could not {action} in the catalog at {self.url}: {_db_message(e)}") from e

    def _insert_version(
        self, conn: sa.Connection, sketch_id: int, version: int, new: NewVersion, blobs: list[dict[str, Any]]
    ) -> VersionRecord:
        row = conn.execute(
            sa.text("INSERT INTO sketch_version (sketch_id, version, table_versions, bits, fragments, method, reason, "
                    "delta_rows, duration_ms, run_id, table_identities, state_options) VALUES (:s, :v, "
                    "CAST(:tv AS jsonb), CAST(:bits AS jsonb), CAST(:frags AS jsonb), :m, :reason, :dr, :dur, :run, "
                    "CAST(:ids AS jsonb), CAST(:opts AS jsonb)) RETURNING *"),
            {"s": sketch_id, "v": version,
             "tv": _json({t: int(v) for t, v in new.table_versions.items()}),
             "bits": _json({t: bytes(b).hex() for t, b in new.bits.items()}),
             "frags": _json({t: sorted(int(f) for f in frags) for t, frags in new.fragments.items()}),
             "m": new.method, "reason": new.reason, "dr": new.delta_rows, "dur": new.duration_ms, "run": new.run_id,
             "ids": _json({t: dict(i) for t, i in new.table_identities.items()}
                          if new.table_identities is not None else None),
             "opts": _json(dict(new.state_options) if new.state_options is not None else None)},
        ).mappings().one()
        if blobs:
            conn.execute(
                sa.text("INSERT INTO operator_state (sketch_id, version, operator_id, format, format_version, "
                        "payload, checksum, size_bytes) VALUES (:s, :v, :op, :fmt, :fv, :payload, :sum, :size)"),
                [{"s": sketch_id, "v": version, **b} for b in blobs],
            )
        return _version_record(row)

    def _table(self, conn: sa.Connection, name: str) -> TableRecord:
        row = conn.execute(sa.text(_TABLE_SELECT + " WHERE t.name = :n"), {"n": name}).mappings().first()
        if row is None:
            raise self._table_not_found(name, conn)
        return _table_record(row)

    def _table_not_found(self, name: str, conn: sa.Connection | None = None) -> NotFoundError:
        if conn is None:
            with self._engine.connect() as own:
                return self._table_not_found(name, own)
        names = list(conn.execute(sa.text("SELECT name FROM source_table ORDER BY name")).scalars())
        known = f"registered tables: {_names(names)}" if names else "no tables are registered yet"
        return NotFoundError(f"table {name!r} is not registered ({known}); register it with `imp table register`")

    def _sketch_not_found(self, conn: sa.Connection, name: str) -> NotFoundError:
        names = list(conn.execute(sa.text("SELECT name FROM sketch WHERE dropped_at IS NULL ORDER BY name")).scalars())
        known = f"existing sketches: {_names(names)}" if names else "no sketches exist yet"
        return NotFoundError(f"no sketch named {name!r} ({known}); create one with `imp sketch create`")

    def _version_not_found(self, conn: sa.Connection, sketch_id: int, what: str) -> NotFoundError:
        label = self._sketch_label(conn, sketch_id)
        latest = conn.execute(sa.text("SELECT max(version) FROM sketch_version WHERE sketch_id = :s"),
                              {"s": sketch_id}).scalar()
        have = f"it has versions 1 to {latest}" if latest else "it has no versions"
        return NotFoundError(f"sketch {label} has no {what}; {have}")

    def _sketch_name(self, conn: sa.Connection, sketch_id: int) -> str:
        name = conn.execute(sa.text("SELECT name FROM sketch WHERE id = :s"), {"s": sketch_id}).scalar()
        return str(name) if name is not None else f"#{sketch_id}"

    def _sketch_label(self, conn: sa.Connection, sketch_id: int) -> str:
        name = conn.execute(sa.text("SELECT name FROM sketch WHERE id = :s"), {"s": sketch_id}).scalar()
        if name is None:
            raise NotFoundError(f"no sketch has id {sketch_id}; see `imp sketch list`")
        return repr(name)


# --------------------------------------------------------------------------------------------------------- helpers


_TABLE_SELECT = (
    "SELECT t.name, t.path, t.registered_at, t.schema_json, o.version AS observed_version, o.observed_at "
    "FROM source_table t LEFT JOIN table_observation o ON o.table_name = t.name"
)


def unusable_message(name: str, reason: str) -> str:
    """The one-line error for using or maintaining an unusable sketch: what happened and what to do."""
    return (f"sketch {name} is unusable: {reason}; queries run without it until it is registered again "
            f"(`imp sketch drop {name}`, then `imp sketch create {name} ...`)")


def default_triggered_by() -> str:
    """``user@host`` of this process, for ``maintenance_run.triggered_by``."""
    try:
        user = getpass.getuser()
    except Exception:  # no login name in some containers
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def checksum(payload: bytes) -> str:
    """The plain checksum of a payload: sha256, hex (what :class:`StateBlob` carries)."""
    return hashlib.sha256(payload).hexdigest()


def _seal(key: bytes | None, sketch: str, version: int, operator_id: str, payload: bytes) -> str:
    """What ``operator_state.checksum`` stores: the keyed checksum, or sha256 for a catalog opened without a key."""
    return integrity.seal(key, sketch, version, operator_id, payload) if key else checksum(payload)


def _verify(key: bytes | None, sketch: str, version: int, operator_id: str, payload: bytes, stored: str) -> bool:
    if key:
        return integrity.verify(key, sketch, version, operator_id, payload, stored)
    return checksum(payload) == stored


def _prepared_states(states: Sequence[StateBlob], sketch: str, version: int,
                     key: bytes | None = None) -> list[dict[str, Any]]:
    seen: set[str] = set()
    out = []
    for blob in states:
        if blob.operator_id in seen:
            raise UsageError(f"two operator states for operator {blob.operator_id!r} of sketch {sketch!r} "
                             f"version {version}; operator ids must be unique")
        seen.add(blob.operator_id)
        payload = bytes(blob.payload)
        digest = checksum(payload)
        if blob.checksum is not None and blob.checksum != digest:
            raise StateError(f"operator state {blob.operator_id!r} of sketch {sketch!r} version {version} does not "
                             f"match the checksum it came with; it was changed after it was produced")
        out.append({"op": blob.operator_id, "fmt": blob.format, "fv": blob.format_version, "payload": payload,
                    "sum": _seal(key, sketch, version, blob.operator_id, payload), "size": len(payload)})
    return out


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value)


def _names(names: list[str], limit: int = 20) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")


def _sqlstate(e: BaseException | None) -> str | None:
    return getattr(getattr(e, "orig", None), "pgcode", None)


def _db_message(e: BaseException, url: str | None = None) -> str:
    orig = getattr(e, "orig", None)
    text = str(orig if orig is not None else e).strip()
    joined = ""
    for line in (line.strip() for line in text.splitlines()):
        if line:
            # libpq puts its hint on a second line without punctuation before it.
            joined += line if not joined else (" " if joined[-1] in ".?!:;" else ". ") + line
    joined = joined or type(e).__name__
    return _scrub(joined, url) if url else scrub(joined)


def _scrub(text: str, url: str) -> str:
    """``text`` with the URL redacted and its secrets masked (drivers sometimes echo connection strings)."""
    return scrub_urls(text, url)


def _table_record(row: Mapping[str, Any]) -> TableRecord:
    return TableRecord(row["name"], row["path"], row["registered_at"], row["schema_json"], row["observed_version"],
                       row["observed_at"])


def _sketch_record(row: Mapping[str, Any]) -> SketchRecord:
    return SketchRecord(row["id"], row["name"], row["sql"], row["dialect"], row["template_key"], row["plan_json"],
                        row["partitions"], row["safety"], row["strategy"], row["created_at"],
                        row.get("unusable_reason"), row.get("unusable_at"))


def _version_record(row: Mapping[str, Any]) -> VersionRecord:
    return VersionRecord(
        sketch_id=row["sketch_id"],
        version=row["version"],
        table_versions={t: int(v) for t, v in row["table_versions"].items()},
        bits={t: bytes.fromhex(h) for t, h in row["bits"].items()},
        fragments={t: [int(f) for f in frags] for t, frags in row["fragments"].items()},
        method=row["method"],
        reason=row["reason"],
        delta_rows=row["delta_rows"],
        duration_ms=row["duration_ms"],
        run_id=row["run_id"],
        created_at=row["created_at"],
        table_identities=row.get("table_identities"),
        state_options=row.get("state_options"),
    )


def _run_record(row: Mapping[str, Any]) -> RunRecord:
    return RunRecord(**{f: row[f] for f in RunRecord.__dataclass_fields__})

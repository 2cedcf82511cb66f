"""The connection to the catalog database: opening it (schema brought to head), transactions, database errors.

The base of :class:`imp_core.catalog.store.Catalog`; see docs/ARCHITECTURE.md, "State and versions".
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Self

import sqlalchemy as sa

from imp_core.catalog.embedded import embedded_url
from imp_core.catalog.migrations import upgrade_to_head
from imp_core.config import Settings, redact_url
from imp_core.errors import CatalogError, ImpError, NotFoundError
from imp_core.security import integrity
from imp_core.security.redact import register_url, scrub, scrub_urls

# Postgres SQLSTATEs we turn into user-facing errors.
UNIQUE_VIOLATION = "23505"
FOREIGN_KEY_VIOLATION = "23503"
LOCK_NOT_AVAILABLE = "55P03"


class CatalogConnection:
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

    @classmethod
    def connect(cls, settings: Settings) -> Self:
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
        url = settings.catalog_url or embedded_url(settings)
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
            raise CatalogError(f"invalid catalog URL {shown}: {scrub_urls(str(e), url)}; set IMP_CATALOG_URL "
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
                f"cannot reach the sketch catalog at {shown}: {db_message(e, url)}; check that the server is "
                f"running and IMP_CATALOG_URL (--catalog-url) is right, or unset it to use the embedded catalog "
                f"under IMP_HOME"
            ) from e
        except sa.exc.SQLAlchemyError as e:
            engine.dispose()
            raise CatalogError(f"could not bring the sketch catalog at {shown} to the current schema: "
                               f"{db_message(e, url)}") from e
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

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _transaction(self, action: str) -> Iterator[sa.Connection]:
        """One transaction; database failures become CatalogError saying what we were doing."""
        try:
            with self._engine.begin() as conn:
                yield conn
        except sa.exc.SQLAlchemyError as e:
            raise CatalogError(f"could not {action} in the catalog at {self.url}: {db_message(e)}") from e

    def _sketch_name(self, conn: sa.Connection, sketch_id: int) -> str | None:
        """The name of sketch ``sketch_id`` (dropped ones included), None for an unknown id."""
        name = conn.execute(sa.text("SELECT name FROM sketch WHERE id = :s"), {"s": sketch_id}).scalar()
        return None if name is None else str(name)

    def _sketch_label(self, conn: sa.Connection, sketch_id: int) -> str:
        """How messages name a sketch: ``'name'``.

        Raises:
            NotFoundError: No sketch has that id.
        """
        name = self._sketch_name(conn, sketch_id)
        if name is None:
            raise NotFoundError(f"no sketch has id {sketch_id}; see `imp sketch list`")
        return repr(name)


def as_json(value: Any) -> str | None:
    """``value`` as a JSON parameter (``CAST(:p AS jsonb)``), None as SQL NULL."""
    return None if value is None else json.dumps(value)


def listed(names: list[str], limit: int = 20) -> str:
    """Names for a message, cut after ``limit``."""
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")


def sqlstate(e: BaseException | None) -> str | None:
    """The Postgres SQLSTATE behind a SQLAlchemy error, if any."""
    return getattr(getattr(e, "orig", None), "pgcode", None)


def db_message(e: BaseException, url: str | None = None) -> str:
    """The database's message on one line, with URLs and secrets redacted."""
    orig = getattr(e, "orig", None)
    text = str(orig if orig is not None else e).strip()
    joined = ""
    for line in (line.strip() for line in text.splitlines()):
        if line:
            # libpq puts its hint on a second line without punctuation before it.
            joined += line if not joined else (" " if joined[-1] in ".?!:;" else ". ") + line
    joined = joined or type(e).__name__
    return scrub_urls(joined, url) if url else scrub(joined)


__all__ = ["FOREIGN_KEY_VIOLATION", "LOCK_NOT_AVAILABLE", "UNIQUE_VIOLATION", "CatalogConnection", "as_json",
           "db_message", "listed", "sqlstate"]

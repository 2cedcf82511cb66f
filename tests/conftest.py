"""Shared fixtures (one SparkSession per test session, temp IMP homes, Delta table helpers) and the test markers.

Spark, the catalog and the S3 server are imported inside their fixtures, so a run of the pure tests imports none of
them. Markers say what a test starts; see docs/ARCHITECTURE.md, "Tests".
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from hypothesis import settings

from imp_core.config import Settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from imp_core.maintenance.service import SketchService

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

# `make unit` loads this profile (--hypothesis-profile=unit): each property test runs a share of its examples
# (tests/engine/generators.py, PROFILE_SHARE); the full suite runs the default profile, every example.
settings.register_profile("unit", settings.get_profile("default"))


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    from imp_core.spark.session import get_spark  # starts nothing yet, but imports pyspark

    home = tmp_path_factory.mktemp("spark-home")
    settings = Settings.from_env({}, home=home, spark_master="local[2]", shuffle_partitions=2)
    session = get_spark(settings)
    yield session
    session.stop()


def write_delta(path: Path | str, table: pa.Table | dict, mode: str = "append", cdf: bool = True,
                **kw: Any) -> None:
    if isinstance(table, dict):
        table = pa.table(table)
    config = {"delta.enableChangeDataFeed": "true"} if cdf else None
    write_deltalake(str(path), table, mode=mode, configuration=config if mode != "append" or not Path(
        path, "_delta_log").exists() else None, **kw)


@pytest.fixture(scope="session")
def imp_settings(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    """Settings with a private IMP_HOME (embedded Postgres catalog) for the whole test session."""
    from imp_core.catalog.embedded import stop_embedded

    home = tmp_path_factory.mktemp("imp-home")
    settings = Settings.from_env({}, home=home, spark_master="local[2]", shuffle_partitions=2)
    yield settings
    stop_embedded(settings)


@pytest.fixture(scope="session")
def service(imp_settings: Settings, spark: SparkSession) -> Iterator[SketchService]:
    """A SketchService on the session's Spark and the embedded catalog."""
    from imp_core.maintenance.service import SketchService

    svc = SketchService(imp_settings, spark=spark)
    yield svc
    svc.catalog.close()


def write_in_files(path: Path | str, table: pa.Table, files: int) -> None:
    """Write ``table`` as a Delta table (CDF on) of ``files`` data files, one per commit, in row order.

    delta-rs decides file sizes itself; committing slices separately gives tests a known file layout.
    """
    step = -(-table.num_rows // files)
    for i in range(files):
        part = table.slice(i * step, step)
        if i == 0:
            write_deltalake(str(path), part, mode="overwrite",
                            configuration={"delta.enableChangeDataFeed": "true"})
        elif part.num_rows:
            write_deltalake(str(path), part, mode="append")


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real S3-compatible HTTP server (moto's standalone server) on 127.0.0.1 with a bucket ``lake``.

    Its address and credentials are put into the ``IMP_S3_*`` environment variables for the rest of the session,
    as a user would configure them; delta-rs and Spark's S3A both read them (imp_core.sources.storage).
    """
    from tests.s3server import S3Server

    with S3Server(tmp_path_factory.mktemp("s3-server")) as server:
        yield server.endpoint


@pytest.fixture(scope="session")
def spark_connect(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A running Spark Connect server on 127.0.0.1 (``imp_core.cli.connect_server``) that admits clients with its
    token; its ``sc://localhost:PORT/;token=...`` URL."""
    import secrets

    from imp_core.cli import connect_server

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    settings = Settings.from_env({}, home=tmp_path_factory.mktemp("spark-connect"), spark_master="local[2]",
                                 shuffle_partitions=2)
    token = secrets.token_hex(16)
    saved = os.environ.get(connect_server.ENV_TOKEN)
    os.environ[connect_server.ENV_TOKEN] = token
    try:
        url = connect_server.start(settings, port=port)
    finally:
        if saved is None:
            os.environ.pop(connect_server.ENV_TOKEN)
        else:
            os.environ[connect_server.ENV_TOKEN] = saved
    try:
        yield f"sc://localhost:{url.rsplit(':', 1)[1]}/;token={token}"
    finally:
        assert connect_server.stop(settings), "the Spark Connect server was gone before the tests ended"


def s3_write_options() -> dict[str, str]:
    """delta-rs storage options for tests that write tables to the S3 server (reads need none: imp configures)."""
    from imp_core.sources.storage import s3_config

    return {**s3_config().delta_rs_options(), "AWS_S3_ALLOW_UNSAFE_RENAME": "true"}


# --- markers: what a test starts -------------------------------------------------------------------------------------
# A test that uses one of these fixtures (directly or through another fixture) gets its marker at collection, so
# `-m "not spark"` runs no JVM and `-m "postgres and not spark"` the catalog tests alone. The guard below fails a test
# that starts Spark, Postgres or Airflow some other way without carrying the marker.

FIXTURE_MARKERS: dict[str, tuple[str, ...]] = {
    "spark": ("spark",),  # the session's SparkSession (a JVM)
    "imp_settings": ("postgres",),  # the embedded catalog of the shared IMP home
    "embedded_settings": ("postgres",),  # tests/catalog: the embedded server alone
    "imp": ("postgres",),  # tests/airflow: an IMP home with its catalog (and Spark, through `spark`)
    "spark_connect": ("spark",),  # a Spark Connect server (a JVM)
    "lab": ("postgres",),  # tests/security: an IMP home with its embedded catalog
    "fresh_home": ("postgres",),  # tests/security: homes with catalogs of their own
}


# The files that take minutes, longest first: `./dev test` hands whole files to two processes in collection order
# (`--no-loadscope-reorder`: xdist would otherwise start the files with the most tests first), so these start first
# and the short files fill in around them (started last, one of them would end the run alone).
LONG_FILES = ("tests/sources/test_lakehouse_matrix.py", "tests/test_benchmarks_smoke.py",
              "tests/airflow/test_cluster.py", "tests/airflow/test_on_commit.py", "tests/spark/test_state_store.py",
              "tests/maintenance/test_external_placement.py", "tests/airflow/test_dags_e2e.py",
              "tests/maintenance/test_capped_driver.py", "tests/engine/test_properties.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for name in getattr(item, "fixturenames", ()):
            for marker in FIXTURE_MARKERS.get(name, ()):
                if item.get_closest_marker(marker) is None:
                    item.add_marker(marker)
    rank = {path: i for i, path in enumerate(LONG_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(LONG_FILES)))  # stable: the rest in order


# What is watched: the processes a test starts (a JVM through spark-submit or java, the Postgres server programs, the
# airflow CLI), a SparkSession obtained in the test process, a connection to Postgres; and fixtures that did any of it
# (learned when they are set up), since a session fixture is set up once but used by every test that asks for it.

_PROGRAMS = {"spark-submit": "spark", "spark-class": "spark", "java": "spark", "initdb": "postgres",
             "pg_ctl": "postgres", "postgres": "postgres", "psql": "postgres", "airflow": "airflow"}


class _Guard:
    """What the running test (and the fixtures being set up for it) started, and what each fixture starts."""

    def __init__(self) -> None:
        self.item: pytest.Item | None = None
        self.used: set[str] = set()
        self.fixtures: list[str] = []  # being set up now, innermost last
        self.starts: dict[str, set[str]] = {}  # fixture name -> what setting it up started
        self.patched: set[str] = set()

    def saw(self, what: str) -> None:
        if self.item is None:
            return  # collection, or a session fixture's finalizer after the last test
        self.used.add(what)
        for name in self.fixtures:
            self.starts.setdefault(name, set()).add(what)

    def patch_loaded_modules(self) -> None:
        """Watch SparkSession and psycopg2 once their modules are loaded (importing them here would slow the pure
        tests)."""
        session = sys.modules.get("pyspark.sql.session")
        if session is not None and "spark" not in self.patched:
            self.patched.add("spark")
            builder = session.SparkSession.Builder
            builder.getOrCreate = self._wrap(builder.getOrCreate, "spark")
        psycopg2 = sys.modules.get("psycopg2")
        if psycopg2 is not None and "postgres" not in self.patched:
            self.patched.add("postgres")
            psycopg2.connect = self._wrap(psycopg2.connect, "postgres")

    def _wrap(self, fn: Callable[..., Any], what: str) -> Callable[..., Any]:
        def watched(*args: Any, **kwargs: Any) -> Any:
            self.saw(what)
            return fn(*args, **kwargs)

        return watched


def _missing(item: pytest.Item, started: set[str]) -> list[str]:
    return sorted(w for w in started if item.get_closest_marker(w) is None)


def _fail_unmarked(item: pytest.Item, missing: list[str], how: str) -> None:
    pytest.fail(f"{item.nodeid} {how} {', '.join(missing)} without the marker: add "
                f"{', '.join(f'@pytest.mark.{m}' for m in missing)} (or a pytestmark, or the fixture to "
                "FIXTURE_MARKERS in tests/conftest.py) so that `-m` selects it right", pytrace=False)


_guard = _Guard()
_popen_init = subprocess.Popen.__init__


def _watched_popen_init(self: subprocess.Popen, args: Any, *rest: Any, **kwargs: Any) -> None:
    argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
    words = [os.path.basename(os.fsdecode(a)) for a in argv[:3]]
    what = _PROGRAMS.get(words[0]) if words else None
    if what is None and len(words) == 3 and words[1] == "-m" and words[2] == "airflow":
        what = "airflow"
    if what is not None:
        _guard.saw(what)
    _popen_init(self, args, *rest, **kwargs)


subprocess.Popen.__init__ = _watched_popen_init  # type: ignore[method-assign]


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest) -> Iterator[Any]:
    _guard.fixtures.append(fixturedef.argname)
    try:
        return (yield)
    finally:
        _guard.fixtures.pop()
        _guard.patch_loaded_modules()


def _guarded_phase(item: pytest.Item) -> Iterator[None]:
    _guard.patch_loaded_modules()
    _guard.item, _guard.used = item, set()
    try:
        yield
    finally:
        _guard.item = None
    missing = _missing(item, _guard.used)
    if missing:
        _fail_unmarked(item, missing, "started")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    needed = {w for name in getattr(item, "fixturenames", ()) for w in _guard.starts.get(name, ())}
    missing = _missing(item, needed)
    if missing:
        _fail_unmarked(item, missing, "uses fixtures that start")
    yield from _guarded_phase(item)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    yield from _guarded_phase(item)

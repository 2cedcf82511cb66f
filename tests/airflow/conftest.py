"""Fixtures for the Airflow tests: one imp home (embedded catalog), one Airflow home for ``airflow dags test``, one
running Airflow (api-server + scheduler + dag-processor on 127.0.0.1) and small Delta tables with sketches.

Everything is session-scoped and shared: starting Airflow or Postgres costs seconds, so tests use their own table
and sketch names in one catalog instead of their own catalogs. A sketch a test leaves stale is dropped when the test
ends (``_no_stale_sketch_left``), so the nightly DAG (which maintains every stale sketch) sees only the ones its test
made stale.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

# Airflow reads AIRFLOW_HOME when first imported and writes airflow.cfg there: keep it out of the user's home.
os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="imp-test-airflow-home-"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")

REPO = Path(__file__).resolve().parents[2]
DAGS = REPO / "dags"
PLUGINS = REPO / "plugins"
ARTIFACTS = REPO / "artifacts" / "airflow"
BIN = Path(sys.executable).parent

TOP_SQL = ("SELECT brand, SUM(price*numSold) AS rev FROM {t} GROUP BY brand HAVING SUM(price*numSold) > 5000")
UNSAFE_SQL = "SELECT brand, SUM(price*numSold) AS rev FROM {t} GROUP BY brand HAVING SUM(price*numSold) < 5000"
COUNT_SQL = "SELECT brand, COUNT(*) AS n FROM {t} GROUP BY brand HAVING COUNT(*) > 1"
BOUNDS = "1,601,1001,1501,10001"

# The paper's running example (Example 1.1 style): HP qualifies, Lenovo and Apple do not.
BASE_ROWS = {"id": [1, 2, 3, 4, 5], "brand": ["Lenovo", "Lenovo", "HP", "HP", "Apple"],
             "price": [600, 1200, 500, 1000, 2000], "numSold": [3, 2, 5, 4, 1]}
# After this row Apple's revenue is 6500 > 5000: the sketch gains fragments 2 and 3.
APPLE_ROW = {"id": [6], "brand": ["Apple"], "price": [1500], "numSold": [3]}
APPLE_ROW_2 = {"id": [7], "brand": ["Apple"], "price": [700], "numSold": [1]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"<no {path}>"


# -------------------------------------------------------------------------------------------------- the imp side


@dataclass
class Imp:
    """The imp home shared by all Airflow tests: embedded catalog, Delta tables, an in-process service."""

    home: Path
    data: Path
    env: dict[str, str]
    service: Any  # SketchService with the session's local[2] SparkSession

    @property
    def catalog(self) -> Any:
        return self.service.catalog

    def table(self, name: str, rows: dict | None = None) -> Path:
        """Create a Delta table with Change Data Feed from ``rows`` (default: the running example), register it."""
        from deltalake import write_deltalake

        path = self.data / name
        write_deltalake(str(path), pa.table(rows or BASE_ROWS), configuration={"delta.enableChangeDataFeed": "true"})
        self.service.register_table(name, str(path))
        return path

    def append(self, table: str, rows: dict) -> None:
        from deltalake import write_deltalake

        write_deltalake(str(self.data / table), pa.table(rows), mode="append")

    def sketch(self, name: str, table: str, sql: str = TOP_SQL, strategy: str = "lazy") -> Any:
        record, _ = self.service.create_sketch(name, sql.format(t=table), [f"{table}.price"], bounds=[BOUNDS],
                                               strategy=strategy, trigger="test-setup")
        return record

    def latest(self, sketch: str) -> Any:
        return self.catalog.latest_version(self.catalog.get_sketch(sketch).id)

    def runs(self, sketch: str | None = None) -> list[Any]:
        sketch_id = self.catalog.get_sketch(sketch).id if sketch else None
        return self.catalog.runs(sketch_id, limit=10_000)

    def assert_equals_recapture(self, sketch: str) -> None:
        """The oracle: the latest version equals a full recomputation at the current table versions."""
        latest = self.latest(sketch)
        assert not self.service.is_stale(sketch), f"sketch {sketch} is still stale"
        again = self.service.recapture(sketch, trigger="test-oracle")
        assert again.method == "recapture"
        assert dict(again.table_versions) == dict(latest.table_versions)
        assert again.fragments == latest.fragments, (sketch, latest.version, latest.fragments, again.fragments)


@pytest.fixture(scope="session")
def imp(tmp_path_factory: pytest.TempPathFactory, spark: Any) -> Iterator[Imp]:
    from imp_core.catalog.embedded import stop_embedded
    from imp_core.config import Settings
    from imp_core.maintenance.service import SketchService

    # Under /tmp like the catalog tests: short unix socket paths for the embedded Postgres.
    home = Path(tempfile.mkdtemp(prefix="imp-airflow-test-", dir="/tmp"))
    data = tmp_path_factory.mktemp("delta")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("IMP_", "AIRFLOW", "PYSPARK_GATEWAY"))}
    env.update({
        "IMP_HOME": str(home),
        "IMP_SHUFFLE_PARTITIONS": "2",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PATH": os.pathsep.join([str(BIN), env.get("PATH", "")]),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYTHONWARNINGS": "ignore",
    })
    settings = Settings.from_env({"IMP_HOME": str(home)}, spark_master="local[2]", shuffle_partitions=2)
    service = SketchService(settings, spark=spark)
    try:
        yield Imp(home, data, env, service)
    finally:
        service.catalog.close()
        stop_embedded(settings)
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(autouse=True)
def _no_stale_sketch_left(request: pytest.FixtureRequest) -> Iterator[None]:
    """A sketch a test left stale (it failed half-way, say) is dropped when the test ends, so a later test's nightly
    run (which maintains every stale sketch) cannot pick it up. Fresh sketches stay.

    It only reads the ``imp`` the test set up (asking for it here would make this fixture start the catalog for
    tests that do not use it)."""
    yield
    imp: Imp | None = (request.node.funcargs or {}).get("imp")
    if imp is None:
        return
    imp.service.refresh_observations(strict=False)  # what the nightly run observes first
    for name in imp.catalog.stale_sketches():
        imp.service.drop_sketch(name)


# -------------------------------------------------------------------------------------------------- Airflow homes


def airflow_database(imp: Imp, home: Path) -> str:
    """A fresh metadata database for the Airflow home ``home`` in the embedded Postgres (as in production: several
    components write at once, which SQLite answers with "database is locked" errors under load)."""
    import psycopg2
    from sqlalchemy.engine import make_url

    from imp_core.catalog.embedded import embedded_url

    url = make_url(embedded_url(imp.service.settings))
    name = f"airflow_{abs(hash(str(home))):x}"
    conn = psycopg2.connect(dbname=url.database, user=url.username, host=url.query["host"],
                            passfile=url.query["passfile"])
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}"')
            cur.execute(f'CREATE DATABASE "{name}"')
    finally:
        conn.close()
    return url.set(database=name).render_as_string(hide_password=False)


def airflow_env(home: Path, imp: Imp, **extra: str) -> dict[str, str]:
    env = dict(imp.env)
    env.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(PLUGINS),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": airflow_database(imp, home),
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
        "AIRFLOW__CORE__FERNET_KEY": "",
    })
    env.update(extra)
    return env


@dataclass
class AirflowCli:
    """An Airflow home with a migrated metadata DB (in the embedded Postgres), for ``airflow dags test``."""

    home: Path
    env: dict[str, str]
    outputs: list[Path] = field(default_factory=list)

    def run(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(BIN / "airflow"), *args], env=self.env, cwd=self.home, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout, check=False)

    def dags_test(self, dag_id: str, conf: dict | None = None) -> subprocess.CompletedProcess[str]:
        args = ["dags", "test", dag_id]
        if conf is not None:
            args += ["-c", json.dumps(conf)]
        done = self.run(*args)
        out = self.home / f"dags-test-{dag_id}-{len(self.outputs)}.log"
        out.write_text(done.stdout)
        self.outputs.append(out)
        return done


@pytest.fixture(scope="session")
def airflow_cli(imp: Imp, tmp_path_factory: pytest.TempPathFactory) -> AirflowCli:
    from imp_core.catalog.embedded import embedded_url

    home = tmp_path_factory.mktemp("airflow-cli")
    # Here the catalog comes from the Airflow connection `imp_catalog` (the server fixture uses the IMP_HOME fallback)
    conn = {"conn_type": "postgres", "extra": {"url": embedded_url(imp.service.settings)}}
    cli = AirflowCli(home, airflow_env(home, imp, AIRFLOW_CONN_IMP_CATALOG=json.dumps(conn)))
    done = cli.run("db", "migrate", timeout=300)
    assert done.returncode == 0, done.stdout[-3000:]
    return cli


@dataclass
class AirflowServer:
    """A running api-server + scheduler + dag-processor on 127.0.0.1 (LocalExecutor, Postgres, simple auth)."""

    home: Path
    env: dict[str, str]
    base_url: str
    username: str
    password: str
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    _token: str | None = None

    def token(self) -> str:
        import requests

        if self._token is None:
            r = requests.post(f"{self.base_url}/auth/token", json={"username": self.username,
                                                                  "password": self.password}, timeout=30)
            assert r.status_code in (200, 201), r.text
            self._token = r.json()["access_token"]
        return self._token

    def api(self, method: str, path: str, **kw: Any) -> Any:
        import requests

        headers = {"Authorization": f"Bearer {self.token()}", **kw.pop("headers", {})}
        return requests.request(method, f"{self.base_url}{path}", headers=headers, timeout=60, **kw)

    def trigger(self, dag_id: str, conf: dict) -> Any:
        return self.api("POST", f"/api/v2/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": conf})

    def wait_run(self, dag_id: str, run_id: str, timeout: float = 240) -> str:
        from urllib.parse import quote

        deadline = time.monotonic() + timeout
        state = None
        while time.monotonic() < deadline:
            r = self.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}")
            assert r.status_code == 200, r.text
            state = r.json()["state"]
            if state in ("success", "failed"):
                return state
            self.check_alive()
            time.sleep(1)
        raise AssertionError(f"run {dag_id}/{run_id} still {state} after {timeout}s; scheduler log:\n"
                             f"{tail(self.home / 'scheduler.out')}")

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str | None]:
        from urllib.parse import quote

        r = self.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/taskInstances")
        assert r.status_code == 200, r.text
        return {ti["task_id"]: ti["state"] for ti in r.json()["task_instances"]}

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1, map_index: int = -1) -> str:
        from urllib.parse import quote

        r = self.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/taskInstances/{task_id}/logs/"
                            f"{try_number}", params={"full_content": "true", "map_index": map_index},
                     headers={"Accept": "application/json"})
        assert r.status_code == 200, r.text
        lines = []
        for entry in r.json().get("content") or []:  # structured log events; exceptions come as error_detail
            if not isinstance(entry, dict):
                lines.append(str(entry))
                continue
            lines.append(str(entry.get("event", "")))
            for error in entry.get("error_detail") or []:
                lines.append(f"{error.get('exc_type')}: {error.get('exc_value')}")
        return "\n".join(lines)

    def start(self, name: str) -> None:
        """Start one component (``api-server``, ``scheduler``, ``dag-processor``, ``triggerer``), its output
        appended to ``<name>.out``."""
        out = open(self.home / f"{name}.out", "a")  # noqa: SIM115 - closed when the process ends
        self.procs[name] = subprocess.Popen([str(BIN / "airflow"), name], env=self.env, cwd=self.home, stdout=out,
                                            stderr=subprocess.STDOUT, start_new_session=True)

    def stop_component(self, name: str) -> None:
        """SIGTERM one component and wait for it (SIGKILL after 30 s)."""
        proc = self.procs.pop(name)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)

    def reparse(self, dag_id: str) -> None:
        """Ask the DAG processor to parse ``dag_id``'s file now (the catalog's tables and sketches are read then)."""
        token = self.api("GET", f"/api/v2/dags/{dag_id}/details").json()["file_token"]
        r = self.api("PUT", f"/api/v2/parseDagFile/{token}")
        assert r.status_code == 201, r.text

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise AssertionError(f"airflow {name} exited with {proc.returncode}:\n"
                                     f"{tail(self.home / f'{name}.out')}")

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


def start_airflow(imp: Imp, home: Path, components: tuple[str, ...] = ("api-server", "scheduler", "dag-processor"),
                  wanted: tuple[str, ...] = ("imp_maintain_on_demand", "imp_register_sketch"),
                  **extra: str) -> AirflowServer:
    """A migrated Airflow home with ``components`` running on 127.0.0.1, once the DAGs ``wanted`` are parsed (and
    unpaused). The caller stops it (``AirflowServer.stop``)."""
    import requests

    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    password = secrets.token_urlsafe(12)
    passwords = home / "passwords.json"
    passwords.write_text(json.dumps({"admin": password}))
    env = airflow_env(home, imp, **{
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__API__BASE_URL": base_url,
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{base_url}/execution/",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
        "AIRFLOW__CORE__LAZY_LOAD_PLUGINS": "False",
        "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
        **extra,
    })
    migrate = subprocess.run([str(BIN / "airflow"), "db", "migrate"], env=env, cwd=home, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300, check=False)
    assert migrate.returncode == 0, migrate.stdout[-3000:]
    server = AirflowServer(home, env, base_url, "admin", password)
    try:
        for name in components:
            server.start(name)
        # The DAG processor parses one file after another: wait for every DAG the tests unpause, not only the first.
        deadline = time.monotonic() + 180
        while True:
            server.check_alive()
            try:
                if requests.get(f"{base_url}/api/v2/monitor/health", timeout=5).status_code == 200 and all(
                        server.api("GET", f"/api/v2/dags/{dag_id}").status_code == 200 for dag_id in wanted):
                    break
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"Airflow did not come up at {base_url} with the DAGs {wanted}:\n"
                                     f"{tail(home / 'api-server.out')}\n{tail(home / 'dag-processor.out')}")
            time.sleep(1)
        for dag_id in wanted:
            r = server.api("PATCH", f"/api/v2/dags/{dag_id}", json={"is_paused": False})
            assert r.status_code == 200, r.text
    except BaseException:
        server.stop()
        raise
    return server


@pytest.fixture(scope="session")
def airflow_server(imp: Imp, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AirflowServer]:
    server = start_airflow(imp, tmp_path_factory.mktemp("airflow-server"))
    try:
        yield server
    finally:
        server.stop()


CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Debian's headless Chromium, driven by Playwright (one per test module)."""
    if not Path(CHROMIUM).exists():
        pytest.fail("chromium is not installed (./dev test installs it with apt-get)")
    from playwright.sync_api import expect, sync_playwright

    # as patient as the pages' own 30 s default: a loaded CI machine renders the plugin's iframe in seconds, not ms
    expect.set_options(timeout=30_000)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
        yield b
        b.close()


def log_in(page: Any, server: AirflowServer, screenshot: Path | None = None) -> None:
    """Log in to the Airflow UI through the simple auth manager's form."""
    page.goto(f"{server.base_url}/")
    page.wait_for_url("**/auth/login**")
    page.get_by_label("Username").fill(server.username)
    page.get_by_label("Password").fill(server.password)
    if screenshot is not None:
        page.screenshot(path=str(screenshot))
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(lambda url: "/auth/login" not in url)


@pytest.fixture(scope="session")
def artifacts() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


@pytest.fixture(scope="session", autouse=True)
def _quiet_logging_at_exit() -> Iterator[None]:
    """Importing Airflow points log handlers at pytest's captured streams; at interpreter exit py4j and pgserver
    still log through them after pytest closed those streams. Drop such late records instead of printing tracebacks."""
    yield
    import logging

    logging.raiseExceptions = False

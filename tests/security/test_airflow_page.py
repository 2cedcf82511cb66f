"""The "Sketch catalog" page in a real Airflow api-server (findings 3 and 4 of issue 15).

Finding 4: the plugin checked the login but not authorization (every role saw every sketch's SQL, run errors with
file paths, table versions), a plain GET wrote ``table_observation`` rows and opened every table's Delta log, and
its links were absolute (broken under a base path). Finding 3, on the page: a catalog error showed the password.

One api-server runs under the base path ``/airflow`` with :class:`tests.security.airflow_auth.RestrictedAuthManager`
and an ``imp_catalog`` connection whose password is a sentinel.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

import pytest
import requests

from tests.security.conftest import REPO, SENTINEL_CORE, TOP_SQL, Lab

pytestmark = [pytest.mark.airflow, pytest.mark.postgres, pytest.mark.spark, pytest.mark.slow]

BASE_PATH = "/airflow"
USERS = {"admin": "admin", "operator": "user", "viewer": "viewer", "reader": "viewer", "outsider": "viewer"}
BIN = Path(sys.executable).parent
APPLE_ROW = {"id": [6], "brand": ["Apple"], "price": [1500], "numSold": [3]}


@dataclass
class PageServer:
    root: str
    home: Path
    passwords: dict[str, str]
    proc: subprocess.Popen | None = None
    tokens: dict[str, str] = field(default_factory=dict)

    @property
    def base(self) -> str:
        return self.root + BASE_PATH

    def token(self, user: str) -> str:
        if user not in self.tokens:
            r = requests.post(f"{self.base}/auth/token", json={"username": user, "password": self.passwords[user]},
                              timeout=30)
            assert r.status_code in (200, 201), r.text
            self.tokens[user] = r.json()["access_token"]
        return self.tokens[user]

    def request(self, method: str, path: str, user: str | None = None, **kw: Any) -> requests.Response:
        headers = kw.pop("headers", {})
        if user is not None:
            headers["Authorization"] = f"Bearer {self.token(user)}"
        return requests.request(method, f"{self.base}{path}", headers=headers, timeout=60, allow_redirects=False,
                                **kw)

    def log(self) -> str:
        return (self.home / "api-server.out").read_text(errors="replace")[-4000:]


@pytest.fixture(scope="session")
def page_server(lab: Lab, sentinel_urls: dict[str, str]) -> Iterator[PageServer]:
    from tests.airflow.conftest import free_port

    home = Path(tempfile.mkdtemp(prefix="imp-sec-airflow-"))
    port = free_port()
    passwords = {user: secrets.token_urlsafe(12) for user in USERS}
    (home / "passwords.json").write_text(json.dumps(passwords))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("IMP_", "AIRFLOW", "PYSPARK_GATEWAY"))}
    env.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__LAZY_LOAD_PLUGINS": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__FERNET_KEY": "",
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}{BASE_PATH}",
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
        "AIRFLOW__CORE__AUTH_MANAGER": "tests.security.airflow_auth.RestrictedAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(f"{u}:{r}" for u, r in USERS.items()),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
        # the page's catalog: the lab's, through a role whose password is the sentinel, given as ?password=
        "AIRFLOW_CONN_IMP_CATALOG": json.dumps({"conn_type": "postgres", "extra": {"url": sentinel_urls["query"]}}),
        "IMP_HOME": str(lab.home),
        "PYTHONPATH": str(REPO),
        "PYTHONWARNINGS": "ignore",
    })
    migrate = subprocess.run([str(BIN / "airflow"), "db", "migrate"], env=env, cwd=home, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600, check=False)
    assert migrate.returncode == 0, migrate.stdout[-3000:]
    server = PageServer(f"http://127.0.0.1:{port}", home, passwords)
    out = open(home / "api-server.out", "w")  # noqa: SIM115 - closed with the process
    server.proc = subprocess.Popen([str(BIN / "airflow"), "api-server"], env=env, cwd=home, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while True:
            assert server.proc.poll() is None, f"the api-server exited:\n{server.log()}"
            try:
                if requests.get(f"{server.base}/api/v2/monitor/health", timeout=5).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            assert time.monotonic() < deadline, f"the api-server did not come up:\n{server.log()}"
            time.sleep(1)
        yield server
    finally:
        os.killpg(server.proc.pid, signal.SIGTERM)
        try:
            server.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.proc.pid, signal.SIGKILL)
        out.close()
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module")
def page_sketch(lab: Lab) -> str:
    lab.table("page_sales")
    lab.sketch("page_top", "page_sales")
    return TOP_SQL.format(t="page_sales")


def _observed(lab: Lab, table: str) -> int | None:
    rows = lab.sql("SELECT version FROM table_observation WHERE table_name = :t", t=table)
    return rows[0][0] if rows else None


def test_the_page_asks_airflows_auth_manager(page_server: PageServer, page_sketch: str) -> None:
    for path in ("/imp/catalog", "/imp/api/sketches"):
        assert page_server.request("GET", path).status_code in (401, 403)
        denied = page_server.request("GET", path, "outsider")
        assert denied.status_code == 403, (path, denied.status_code)
        assert "page_top" not in denied.text and "numSold" not in denied.text

    reader = page_server.request("GET", "/imp/catalog", "reader")
    assert reader.status_code == 200, reader.text
    assert 'data-sketch="page_top"' in reader.text
    assert "numSold" not in reader.text and "SQL hidden" in reader.text  # the SQL is DAG code to this user
    rows = {r["name"]: r for r in page_server.request("GET", "/imp/api/sketches", "reader").json()["sketches"]}
    assert rows["page_top"]["sql"] is None

    admin = page_server.request("GET", "/imp/catalog", "admin")
    assert admin.status_code == 200 and "SUM(price*numSold)" in admin.text


def test_get_only_reads_and_refresh_is_an_authorized_post(lab: Lab, page_server: PageServer,
                                                          page_sketch: str) -> None:
    lab.append("page_sales", APPLE_ROW)  # version 1; the catalog has observed version 0
    assert _observed(lab, "page_sales") == 0
    for user in ("admin", "viewer"):
        assert page_server.request("GET", "/imp/catalog", user).status_code == 200
        assert page_server.request("GET", "/imp/api/sketches", user).status_code == 200
    assert _observed(lab, "page_sales") == 0, "a GET wrote a table observation"

    assert page_server.request("POST", "/imp/refresh", "viewer").status_code == 403  # may look, not write
    cross_site = page_server.request("POST", "/imp/refresh", "operator", headers={"Origin": "https://evil.example"})
    assert cross_site.status_code == 403
    assert _observed(lab, "page_sales") == 0

    done = page_server.request("POST", "/imp/refresh", "operator")
    assert done.status_code == 303 and done.headers["location"] == "catalog"
    assert _observed(lab, "page_sales") == 1
    rows = {r["name"]: r for r in page_server.request("GET", "/imp/api/sketches", "operator").json()["sketches"]}
    assert rows["page_top"]["stale"] is True
    lab.service.maintain("page_top", trigger="test-cleanup")


def test_links_work_under_the_base_path(page_server: PageServer, page_sketch: str) -> None:
    page_url = f"{page_server.base}/imp/catalog"
    page = page_server.request("GET", "/imp/catalog", "operator")
    assert page.status_code == 200
    links = re.findall(r'(?:href|action)="([^"]*)"', page.text)
    assert any("imp_maintain_on_demand" in link for link in links) and "refresh" in links
    for link in links:
        target = urlsplit(urljoin(page_url, link)).path
        assert target.startswith(f"{BASE_PATH}/"), f"{link!r} leads to {target}, outside {BASE_PATH}"

    # the UI frames the plugin's view by its href, resolved against the UI's <base href="/airflow/">
    plugins = page_server.request("GET", "/api/v2/plugins", "operator").json()["plugins"]
    [view] = [v for p in plugins if p["name"] == "imp" for v in p["external_views"]]
    framed = urlsplit(urljoin(f"{page_server.base}/", view["href"])).path
    assert framed == f"{BASE_PATH}/imp/catalog"
    assert page_server.request("GET", framed[len(BASE_PATH):], "operator").status_code == 200
    index = page_server.request("GET", "/imp/", "operator")
    assert index.status_code in (302, 307)
    assert urlsplit(urljoin(f"{page_server.base}/imp/", index.headers["location"])).path == f"{BASE_PATH}/imp/catalog"


def test_a_catalog_error_on_the_page_shows_no_password(lab: Lab, page_server: PageServer, page_sketch: str) -> None:
    # the catalog turns the page's role away (as after a password rotation): the page reports the error
    lab.sql("ALTER ROLE imp_sentinel NOLOGIN")
    lab.sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'imp_sentinel'")
    try:
        page = page_server.request("GET", "/imp/catalog", "admin")
        assert page.status_code == 200 and "Cannot read the sketch catalog" in page.text, page.text[-2000:]
        assert "imp_sentinel" in page.text  # it does say which catalog and role
        assert SENTINEL_CORE not in page.text
        assert SENTINEL_CORE not in page_server.log()
    finally:
        lab.sql("ALTER ROLE imp_sentinel LOGIN")

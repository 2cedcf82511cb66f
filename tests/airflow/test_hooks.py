"""The catalog hook: the Airflow connection `imp_catalog` first, then IMP_CATALOG_URL, then the embedded catalog."""

from __future__ import annotations

import json
import sys

import pytest

from imp_core.airflow.hooks import ImpCatalogHook
from imp_core.errors import ConfigError

pytestmark = pytest.mark.airflow


def test_connection_uri_becomes_a_psycopg2_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_IMP_CATALOG", "postgresql://imp:s3cret@db.example:5433/catalog")
    monkeypatch.setenv("IMP_CATALOG_URL", "postgresql+psycopg2://other@elsewhere/x")
    hook = ImpCatalogHook()
    assert hook.catalog_url() == "postgresql+psycopg2://imp:s3cret@db.example:5433/catalog"
    assert hook.settings().catalog_url == "postgresql+psycopg2://imp:s3cret@db.example:5433/catalog"
    env = hook.job_env()
    # the job's environment holds no secret: the operator hands the URL over in a private file
    assert "IMP_CATALOG_URL" not in env and "s3cret" not in json.dumps(env)
    assert env["PYSPARK_PYTHON"] and env["IMP_HOME"]


def test_url_in_extra_and_fallbacks(monkeypatch: pytest.MonkeyPatch) -> None:
    url = "postgresql+psycopg2://postgres@/imp?host=/tmp/sock"
    monkeypatch.setenv("AIRFLOW_CONN_IMP_CATALOG", json.dumps({"conn_type": "postgres", "extra": {"url": url}}))
    assert ImpCatalogHook().catalog_url() == url

    monkeypatch.delenv("AIRFLOW_CONN_IMP_CATALOG")
    monkeypatch.setenv("IMP_CATALOG_URL", "postgresql+psycopg2://u@h/db")
    assert ImpCatalogHook().catalog_url() is None  # no connection: the environment decides
    assert ImpCatalogHook().settings().catalog_url == "postgresql+psycopg2://u@h/db"

    monkeypatch.delenv("IMP_CATALOG_URL")
    monkeypatch.setenv("IMP_HOME", "/tmp/some-imp-home")
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    settings = ImpCatalogHook().settings()
    assert settings.catalog_url is None and str(settings.home) == "/tmp/some-imp-home"  # embedded catalog
    env = ImpCatalogHook().job_env()
    assert "IMP_CATALOG_URL" not in env and env["IMP_HOME"] == "/tmp/some-imp-home"
    assert env["PYSPARK_PYTHON"] == sys.executable


def test_a_connection_of_another_type_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_IMP_CATALOG", "mysql://u:p@h/db")
    with pytest.raises(ConfigError, match="needs a Postgres connection"):
        ImpCatalogHook().catalog_url()

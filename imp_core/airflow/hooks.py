"""The catalog hook: which catalog an Airflow task (or the plugin page) talks to, from an Airflow connection.

Resolution order: the Airflow connection ``imp_catalog`` (a Postgres connection, or a full SQLAlchemy URL in its extra
field ``{"url": ...}``), then ``IMP_CATALOG_URL``, then the embedded Postgres under ``IMP_HOME`` (one host only). The
hook also builds the environment of the ``spark-submit`` jobs (no catalog secret in it: the operator hands the URL over
in a private file) and carries the tables' object-storage credentials from the connection ``imp_storage``. URLs and
passwords are registered with Airflow's secrets masker. See docs/AIRFLOW.md and docs/SECURITY.md.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import sqlalchemy as sa
from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException
from airflow.sdk.log import mask_secret

from imp_core.airflow import CATALOG_CONN_ID, STORAGE_CONN_ID
from imp_core.catalog import Catalog
from imp_core.config import ENV_HOME, ENV_WAREHOUSE, Settings
from imp_core.errors import ConfigError
from imp_core.security.redact import register_url, url_secrets
from imp_core.sources import storage
from imp_core.sources.storage import S3Config

if TYPE_CHECKING:
    from imp_core.maintenance.service import SketchService


class ImpCatalogHook(BaseHook):
    """Settings, catalog and service for the catalog named by an Airflow connection (default ``imp_catalog``)."""

    conn_name_attr = "imp_catalog_conn_id"
    default_conn_name = CATALOG_CONN_ID
    conn_type = "postgres"
    hook_name = "imp sketch catalog"

    def __init__(self, imp_catalog_conn_id: str = CATALOG_CONN_ID, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.imp_catalog_conn_id = imp_catalog_conn_id

    def catalog_url(self) -> str | None:
        """The catalog URL from the connection, or None when the connection is not defined.

        Raises:
            ConfigError: The connection exists but does not describe a Postgres database.
        """
        try:
            conn = self.get_connection(self.imp_catalog_conn_id)
        except AirflowNotFoundException:
            return None
        extra = conn.extra_dejson or {}
        if extra.get("url"):
            return _masked(str(extra["url"]))
        if conn.conn_type not in ("postgres", "postgresql"):
            raise ConfigError(f"Airflow connection {self.imp_catalog_conn_id!r} has type {conn.conn_type!r}; the "
                              f"sketch catalog needs a Postgres connection (postgresql://USER:PASSWORD@HOST:PORT/DB)")
        if not conn.host:
            raise ConfigError(f"Airflow connection {self.imp_catalog_conn_id!r} names no host")
        url = sa.URL.create("postgresql+psycopg2", username=conn.login or None, password=conn.password or None,
                            host=conn.host, port=conn.port or None, database=conn.schema or None)
        return _masked(url.render_as_string(hide_password=False))

    def storage_config(self) -> S3Config | None:
        """The S3 settings of the connection ``imp_storage`` over the environment (None when it is not defined)."""
        try:
            conn = self.get_connection(STORAGE_CONN_ID)
        except AirflowNotFoundException:
            return None
        extra = conn.extra_dejson or {}
        path_style = extra.get("path_style")
        return S3Config(endpoint=extra.get("endpoint_url") or None, region=extra.get("region_name") or None,
                        access_key_id=conn.login or None, secret_access_key=conn.password or None,
                        session_token=extra.get("aws_session_token") or None,
                        path_style=None if path_style is None else str(path_style).lower() in ("1", "true", "yes"))

    def settings(self) -> Settings:
        """Settings from the environment, with the catalog URL of the connection when there is one."""
        return Settings.from_env(catalog_url=self.catalog_url())

    _shared: ClassVar[dict[str, Catalog]] = {}
    _shared_lock: ClassVar[threading.Lock] = threading.Lock()

    def get_conn(self, *, shared: bool = False) -> SketchService:
        """A :class:`SketchService` on this catalog (Spark starts only if a step needs it).

        ``shared``: on a catalog connected once per process and URL (the plugin page: connecting checks the schema).
        """
        # the lazy start of the catalog: DAG files and the plugin import this module, the service loads on first use
        from imp_core.maintenance.service import SketchService

        storage.configure(self.storage_config())
        settings = self.settings()
        catalog = None
        if shared:
            key = f"{settings.catalog_url or ''}|{settings.home}"
            with self._shared_lock:
                catalog = self._shared.get(key)
                if catalog is None:
                    catalog = self._shared[key] = Catalog.connect(settings)
        return SketchService(settings, catalog=catalog, progress=self.log.info)

    def job_env(self) -> dict[str, str]:
        """Environment for a ``spark-submit`` job reading the same catalog as this hook, without secrets.

        Passes ``IMP_HOME``, ``IMP_WAREHOUSE`` (when set), the ``IMP_*`` settings that are no secret and are set in
        this process (``IMP_STATE_KEY_FILE`` is a path), ``PYSPARK_PYTHON`` (this interpreter unless already set,
        so the driver and executors import ``imp_core``), and puts this interpreter's directory on ``PATH`` when
        ``spark-submit`` is not already there (a virtualenv install). The catalog URL is not in it: see
        :meth:`catalog_url` and the operator, which hands it over in a private file.
        """
        settings = self.settings()
        env = {ENV_HOME: str(settings.home)}
        for name in _PASSED_SETTINGS:
            if os.environ.get(name):
                env[name] = os.environ[name]
        if settings.warehouse is not None:
            env[ENV_WAREHOUSE] = str(settings.warehouse)
        env.update(_storage_env(self.storage_config()))
        python = os.environ.get("PYSPARK_PYTHON") or sys.executable
        env["PYSPARK_PYTHON"] = python
        env["PYSPARK_DRIVER_PYTHON"] = os.environ.get("PYSPARK_DRIVER_PYTHON") or python
        if shutil.which("spark-submit") is None:
            bindir = str(Path(sys.executable).parent)
            if (Path(bindir) / "spark-submit").exists():
                env["PATH"] = os.pathsep.join([bindir, os.environ.get("PATH", "")])
        return env


# settings a job inherits from the task's environment (never IMP_CATALOG_URL: it may hold a password)
_PASSED_SETTINGS = ("IMP_STATE_KEY_FILE", "IMP_SHUFFLE_PARTITIONS", "IMP_STATE_RETENTION", "IMP_OPTIMIZATIONS",
                    "IMP_MAX_FRAGMENTS", "IMP_QUERY_WAIT", "IMP_SPARK_JARS", "IMP_SPARK_SCAN", "IMP_CDF_SPARK_ROWS",
                    "IMP_SPARK_METASTORE", "IMP_HIVE_METASTORE_URIS", "IMP_SPARK_DRIVER_MEMORY")


def _masked(url: str) -> str:
    """``url``, with it and its secrets registered with Airflow's masker and imp's redaction first."""
    register_url(url)
    for secret in url_secrets(url):
        mask_secret(secret)
    if url_secrets(url):
        mask_secret(url)
    return url


def _storage_env(config: S3Config | None) -> dict[str, str]:
    """``IMP_S3_*`` variables for a job from the connection's S3 settings (empty without the connection)."""
    if config is None:
        return {}
    values = {"IMP_S3_ENDPOINT": config.endpoint, "IMP_S3_REGION": config.region,
              "IMP_S3_ACCESS_KEY_ID": config.access_key_id, "IMP_S3_SECRET_ACCESS_KEY": config.secret_access_key,
              "IMP_S3_SESSION_TOKEN": config.session_token,
              "IMP_S3_PATH_STYLE": None if config.path_style is None else str(config.path_style).lower()}
    return {k: v for k, v in values.items() if v}


__all__ = ["ImpCatalogHook"]

"""The catalog hook: which catalog an Airflow task (or the plugin page) talks to, from an Airflow connection.

Resolution order:

1. the Airflow connection ``imp_catalog`` (any Postgres connection: ``postgresql://USER:PASSWORD@HOST:PORT/DB``, or
   a full SQLAlchemy URL in the extra field ``{"url": "postgresql+psycopg2://..."}``);
2. the ``IMP_CATALOG_URL`` environment variable;
3. the embedded Postgres under ``IMP_HOME`` (one host only: tasks and jobs must share that directory).

The hook also builds the environment of the ``spark-submit`` jobs, so the job reads the same catalog as the task
that submitted it.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from imp_core.airflow import CATALOG_CONN_ID
from imp_core.config import ENV_CATALOG_URL, ENV_HOME, ENV_WAREHOUSE, Settings
from imp_core.errors import ConfigError

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
            return str(extra["url"])
        if conn.conn_type not in ("postgres", "postgresql"):
            raise ConfigError(f"Airflow connection {self.imp_catalog_conn_id!r} has type {conn.conn_type!r}; the "
                              f"sketch catalog needs a Postgres connection (postgresql://USER:PASSWORD@HOST:PORT/DB)")
        if not conn.host:
            raise ConfigError(f"Airflow connection {self.imp_catalog_conn_id!r} names no host")
        import sqlalchemy as sa

        url = sa.URL.create("postgresql+psycopg2", username=conn.login or None, password=conn.password or None,
                            host=conn.host, port=conn.port or None, database=conn.schema or None)
        return url.render_as_string(hide_password=False)

    def settings(self) -> Settings:
        """Settings from the environment, with the catalog URL of the connection when there is one."""
        return Settings.from_env(catalog_url=self.catalog_url())

    def get_conn(self) -> SketchService:
        """A :class:`SketchService` on this catalog (Spark starts only if a step needs it)."""
        from imp_core.maintenance.service import SketchService

        return SketchService(self.settings(), progress=self.log.info)

    def job_env(self) -> dict[str, str]:
        """Environment for a ``spark-submit`` job reading the same catalog as this hook.

        Passes ``IMP_HOME``, ``IMP_CATALOG_URL`` (when set), ``IMP_WAREHOUSE`` (when set), ``PYSPARK_PYTHON`` (this
        interpreter unless already set, so the driver and executors import ``imp_core``), and puts this
        interpreter's directory on ``PATH`` when ``spark-submit`` is not already there (a virtualenv install).
        """
        settings = self.settings()
        env = {ENV_HOME: str(settings.home)}
        if settings.catalog_url:
            env[ENV_CATALOG_URL] = settings.catalog_url
        if settings.warehouse is not None:
            env[ENV_WAREHOUSE] = str(settings.warehouse)
        python = os.environ.get("PYSPARK_PYTHON") or sys.executable
        env["PYSPARK_PYTHON"] = python
        env["PYSPARK_DRIVER_PYTHON"] = os.environ.get("PYSPARK_DRIVER_PYTHON") or python
        if shutil.which("spark-submit") is None:
            bindir = str(Path(sys.executable).parent)
            if (Path(bindir) / "spark-submit").exists():
                env["PATH"] = os.pathsep.join([bindir, os.environ.get("PATH", "")])
        return env


__all__ = ["ImpCatalogHook"]

"""Airflow helpers for imp: the catalog hook, the spark-submit operator, task callables and the catalog page.

The DAGs in ``dags/`` and the plugin in ``plugins/`` only wire these together; the work itself is done by
:class:`imp_core.maintenance.service.SketchService` (in Airflow tasks) and by :mod:`imp_core.jobs.submit` (under
``spark-submit``). Importing this package does not import Airflow.
"""

from __future__ import annotations

import os
from datetime import timedelta

from imp_core.errors import ConfigError  # imports nothing: DAG files stay light

CATALOG_CONN_ID = "imp_catalog"
"""Airflow connection naming the catalog Postgres; without it, ``IMP_CATALOG_URL`` or the embedded catalog."""

SPARK_CONN_ID = "spark_default"
"""Airflow connection naming the Spark master (``{"conn_type": "spark", "host": "local[*]"}``)."""

SPARK_CONNECT_CONN_ID = "spark_connect_default"
"""The Spark provider's Spark Connect connection (``conn_type`` ``spark_connect``, host and port of the server; a
token as its password), used when ``IMP_MAINTENANCE_RUNNER=connect``."""

ENV_GROUP_SIZE = "IMP_MAINTENANCE_GROUP_SIZE"
DEFAULT_GROUP_SIZE = 25


def group_size() -> int:
    """Most sketches one maintenance job (one Spark application) maintains: ``IMP_MAINTENANCE_GROUP_SIZE``, default
    25; 1 gives one job per sketch."""
    raw = os.environ.get(ENV_GROUP_SIZE) or str(DEFAULT_GROUP_SIZE)
    if not raw.strip().isdigit() or int(raw) < 1:
        raise ConfigError(f"{ENV_GROUP_SIZE} must be an integer of at least 1 (sketches per job), got {raw!r}")
    return int(raw)


STORAGE_CONN_ID = "imp_storage"
"""Optional Airflow connection (type ``aws``) with the object-storage credentials of the tables: login = access key
id, password = secret key, extra ``{"endpoint_url": ..., "region_name": ..., "path_style": true}``."""

CHECK_TIMEOUT = timedelta(minutes=float(os.environ.get("IMP_CHECK_TIMEOUT_MINUTES") or 15))
"""``execution_timeout`` of the DAGs' Python tasks (checks, listings, reports: catalog and Delta log reads only)."""

JOB_TIMEOUT = timedelta(minutes=float(os.environ.get("IMP_JOB_TIMEOUT_MINUTES") or 360))
"""``execution_timeout`` of a spark-submit job (a capture or maintenance); a task past it is failed and retried."""

__all__ = ["CATALOG_CONN_ID", "CHECK_TIMEOUT", "DEFAULT_GROUP_SIZE", "ENV_GROUP_SIZE", "JOB_TIMEOUT",
           "SPARK_CONNECT_CONN_ID", "SPARK_CONN_ID", "STORAGE_CONN_ID", "group_size"]

"""Airflow helpers for imp: the catalog hook, the spark-submit operator, task callables and the catalog page.

The DAGs in ``dags/`` and the plugin in ``plugins/`` only wire these together; the work itself is done by
:class:`imp_core.maintenance.service.SketchService` (in Airflow tasks) and by :mod:`imp_core.jobs.submit` (under
``spark-submit``). Importing this package does not import Airflow.
"""

from __future__ import annotations

CATALOG_CONN_ID = "imp_catalog"
"""Airflow connection naming the catalog Postgres; without it, ``IMP_CATALOG_URL`` or the embedded catalog."""

SPARK_CONN_ID = "spark_default"

STORAGE_CONN_ID = "imp_storage"
"""Optional Airflow connection (type ``aws``) with the object-storage credentials of the tables: login = access key
id, password = secret key, extra ``{"endpoint_url": ..., "region_name": ..., "path_style": true}``."""
"""Airflow connection naming the Spark master (``{"conn_type": "spark", "host": "local[*]"}``)."""

__all__ = ["CATALOG_CONN_ID", "SPARK_CONN_ID", "STORAGE_CONN_ID"]

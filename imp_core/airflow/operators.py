"""A thin ``SparkSubmitOperator`` for imp's job entry point.

It is the provider's ``SparkSubmitOperator`` (the Spark connection, default ``spark_default``, picks the master and
the hook runs ``spark-submit``) with these defaults: the application is :data:`imp_core.jobs.SUBMIT_PATH`; Spark's
own logging is quiet and its UI off; the connector jars (Delta Lake, S3A) go with ``--jars`` and Delta's session
extension is set (:mod:`imp_core.spark.connector`, resolved at run time); the job's environment comes from
:class:`ImpCatalogHook` at run time, so the job reads the same catalog as the task (the ``imp_catalog`` connection,
``IMP_CATALOG_URL``, or the embedded catalog under ``IMP_HOME``); and an ``execution_timeout``
(``IMP_JOB_TIMEOUT_MINUTES``).

The catalog URL, which may hold a password, never goes into the job's argv or ``--conf`` (the provider logs both,
and turns a YARN or Kubernetes job's environment into ``--conf``): it is written to a 0600 file under
``IMP_HOME/secrets`` for the duration of the job, and only that file's path (``IMP_CATALOG_URL_FILE``) is passed.
In client deploy mode the driver runs here and reads it; cluster deploy mode is refused (the imp driver needs
Python with ``imp_core``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk.exceptions import AirflowFailException

from imp_core.airflow import CATALOG_CONN_ID, JOB_TIMEOUT, SPARK_CONN_ID
from imp_core.airflow.hooks import ImpCatalogHook
from imp_core.config import ENV_CATALOG_URL, ENV_CATALOG_URL_FILE
from imp_core.jobs import SUBMIT_PATH
from imp_core.security.secrets import private_file
from imp_core.spark import connector
from imp_core.spark.session import LOG4J_CONF

SPARK_AUTH_SECRET_ENV = "_SPARK_AUTH_SECRET"
"""Spark's own variable for the ``spark.authenticate`` secret (so the secret never appears in ``--conf``)."""

DEFAULT_CONF: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    # only Spark errors reach the task log; the job logs what it does itself
    "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{LOG4J_CONF}",
}


CLUSTER_MODE_REFUSED = ("imp jobs run in client deploy mode (the driver needs Python with imp_core; executors need "
                        "neither): set deploy-mode to client in the Spark connection or operator")


class ImpSparkSubmitOperator(SparkSubmitOperator):
    """``spark-submit imp_core/jobs/submit.py <application_args>`` against the imp catalog.

    Args:
        imp_catalog_conn_id: Airflow connection of the catalog (falls back to ``IMP_CATALOG_URL`` / embedded).
        conf: Spark properties, merged over :data:`DEFAULT_CONF`.
        env_vars: Extra environment for the job, merged over :meth:`ImpCatalogHook.job_env`.
        **kwargs: Everything ``SparkSubmitOperator`` takes (``application_args``, ``conn_id``, ...).
    """

    ui_color = "#e8f4fd"

    def __init__(self, *, imp_catalog_conn_id: str = CATALOG_CONN_ID, application: str = SUBMIT_PATH,
                 conf: Mapping[str, Any] | None = None, conn_id: str = SPARK_CONN_ID, name: str = "imp",
                 **kwargs: Any) -> None:
        kwargs.setdefault("execution_timeout", JOB_TIMEOUT)
        super().__init__(application=application, conf={**DEFAULT_CONF, **(conf or {})}, conn_id=conn_id,
                         name=name, **kwargs)
        self.imp_catalog_conn_id = imp_catalog_conn_id

    def execute(self, context: Any) -> Any:
        jvm = connector.session_conf()
        self.jars = ",".join(j for j in (jvm.pop("spark.jars"), self.jars) if j)
        self.conf = {**jvm, **(self.conf or {})}
        if os.environ.get(SPARK_AUTH_SECRET_ENV):
            # Spark reads the shared secret from this variable itself; only the switch goes on the command line
            self.conf = {"spark.authenticate": "true", **self.conf}
        hook = ImpCatalogHook(self.imp_catalog_conn_id)
        env = {**hook.job_env(), **(self.env_vars or {})}
        url = env.pop(ENV_CATALOG_URL, None) or hook.settings().catalog_url
        with contextlib.ExitStack() as stack:
            if url:
                path = stack.enter_context(private_file(hook.settings().home, "job-catalog-url-", url))
                env[ENV_CATALOG_URL_FILE] = str(path)
            self.env_vars = env
            return super().execute(context)

    def _get_hook(self) -> Any:
        """The provider's hook, refusing cluster deploy mode before anything is submitted.

        The imp driver needs Python with ``imp_core`` and the catalog's network; in client mode that is this Airflow
        worker. (Executors need neither Python nor imp: they run only JVM code.)
        """
        hook = super()._get_hook()
        if "cluster" in (self._deploy_mode, hook._connection.get("deploy_mode")):
            raise AirflowFailException(CLUSTER_MODE_REFUSED)
        return hook


__all__ = ["CLUSTER_MODE_REFUSED", "DEFAULT_CONF", "ImpSparkSubmitOperator"]

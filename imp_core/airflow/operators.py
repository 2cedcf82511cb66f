"""The operators that run imp's jobs: a thin ``SparkSubmitOperator``, and a runner for a Spark Connect server.

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

:class:`ImpConnectJobOperator` runs the same job argv as a plain Python process that connects to a running Spark
Connect server (the provider's ``spark_connect`` connection) instead of starting a JVM; ``IMP_MAINTENANCE_RUNNER``
chooses between them in the maintenance DAGs (:func:`job_operator`). After a maintenance job, either operator logs
what each of its sketches did (read back from the catalog's runs) and returns it as the task's XCom; the sketches it
committed become the task's outlets (one asset event each, :func:`imp_core.airflow.lineage.announce`) and its
OpenLineage events' outputs, the tables at their versions the inputs. With OpenLineage configured, spark-submit gets
the provider's parent-job properties (``spark.openlineage.parent*``), so the Spark-level events of the job link to
the task (docs/AIRFLOW.md, "Lineage").
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from imp_core.airflow import CATALOG_CONN_ID, JOB_TIMEOUT, SPARK_CONN_ID, SPARK_CONNECT_CONN_ID, tasks
from imp_core.airflow.hooks import ImpCatalogHook
from imp_core.airflow.lineage import JobLineage, announce, job_lineage, openlineage_enabled
from imp_core.config import ENV_CATALOG_URL, ENV_CATALOG_URL_FILE
from imp_core.errors import ConfigError
from imp_core.jobs import SUBMIT_PATH
from imp_core.security.redact import register_secret, scrub
from imp_core.security.secrets import private_file
from imp_core.spark import connector
from imp_core.spark.session import ENV_REMOTE, LOG4J_CONF, connect_address, driver_memory

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

    def launch_settings(self) -> None:
        """The worker's launch settings on this task: connector jars and conf, the driver's heap (the task's own
        ``driver_memory`` wins), and Spark's authentication switch when its secret is in the environment."""
        jvm = connector.session_conf()
        self._driver_memory = self._driver_memory or driver_memory()
        self.jars = ",".join(j for j in (jvm.pop("spark.jars"), self.jars) if j)
        self.conf = {**jvm, **(self.conf or {})}
        if os.environ.get(SPARK_AUTH_SECRET_ENV):
            # Spark reads the shared secret from this variable itself; only the switch goes on the command line
            self.conf = {"spark.authenticate": "true", **self.conf}

    def execute(self, context: Any) -> Any:
        self.launch_settings()
        # Spark-level OpenLineage events (the job's listener, when installed) name this task as their parent
        self._openlineage_inject_parent_job_info = self._openlineage_inject_parent_job_info or openlineage_enabled()
        if self._openlineage_inject_transport_info:  # it would put the transport's API key into --conf (logged)
            self.log.warning("not injecting the OpenLineage transport into the job's --conf (it can hold an API key, "
                             "and spark-submit's command line is logged): configure the Spark listener's transport "
                             "in spark-defaults.conf")
            self._openlineage_inject_transport_info = False
        with job_environment(self.imp_catalog_conn_id, self.env_vars) as env:
            self.env_vars = env
            try:
                super().execute(context)
            except BaseException:
                tasks.report_job(self.application_args or [], self.imp_catalog_conn_id)
                self._lineage = job_lineage(self.application_args or [], self.imp_catalog_conn_id)
                raise
        report = tasks.report_job(self.application_args or [], self.imp_catalog_conn_id)
        self._lineage = job_lineage(self.application_args or [], self.imp_catalog_conn_id)
        announce(self, context, self._lineage)
        return report

    _lineage: JobLineage | None = None

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """Inputs: the tables at the versions the job's sketches reached; outputs: the sketch versions it made."""
        return self._lineage.to_openlineage() if self._lineage is not None else None

    get_openlineage_facets_on_failure = get_openlineage_facets_on_complete

    def _get_hook(self) -> Any:
        """The provider's hook, refusing cluster deploy mode before anything is submitted.

        The imp driver needs Python with ``imp_core`` and the catalog's network; in client mode that is this Airflow
        worker. (Executors need neither Python nor imp: they run only JVM code.)
        """
        hook = super()._get_hook()
        if "cluster" in (self._deploy_mode, hook._connection.get("deploy_mode")):  # noqa: SLF001 - the provider's resolved connection
            raise AirflowFailException(CLUSTER_MODE_REFUSED)
        return hook


class ImpConnectJobOperator(BaseOperator):
    """``python imp_core/jobs/submit.py <application_args>`` against a running Spark Connect server.

    The job starts no JVM: its Spark work runs on the server named by the ``spark_connect`` connection (its URL, with
    a token when the connection has one, reaches the job through the environment, never the argv). Output is
    streamed to the task log, secrets scrubbed.

    Args:
        application_args: The job's argv (a job value's ``argv()``).
        spark_connect_conn_id: The provider's Spark Connect connection.
        imp_catalog_conn_id: Airflow connection of the catalog (falls back to ``IMP_CATALOG_URL`` / embedded).
        env_vars: Extra environment for the job.
    """

    template_fields: Sequence[str] = ("application_args", "env_vars")
    ui_color = "#e8fdf0"

    def __init__(self, *, application_args: list[str], spark_connect_conn_id: str = SPARK_CONNECT_CONN_ID,
                 imp_catalog_conn_id: str = CATALOG_CONN_ID, env_vars: Mapping[str, str] | None = None,
                 **kwargs: Any) -> None:
        kwargs.setdefault("execution_timeout", JOB_TIMEOUT)
        super().__init__(**kwargs)
        self.application_args = application_args
        self.spark_connect_conn_id = spark_connect_conn_id
        self.imp_catalog_conn_id = imp_catalog_conn_id
        self.env_vars = env_vars

    def execute(self, context: Any) -> Any:
        url = SparkConnectHook(self.spark_connect_conn_id).get_connection_url()
        for param in url.partition("/;")[2].split(";"):
            if param.startswith("token="):
                register_secret(param[len("token="):])
        with job_environment(self.imp_catalog_conn_id, self.env_vars) as env:
            argv = [sys.executable, SUBMIT_PATH, *self.application_args]
            self.log.info("imp job on Spark Connect %s: %s", connect_address(url), " ".join(argv))
            process = subprocess.Popen(argv, env={**os.environ, **env, ENV_REMOTE: url}, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True)
            last_error = ""
            assert process.stdout is not None
            for line in process.stdout:
                line = scrub(line.rstrip("\n"))
                if line.startswith("imp-job: "):
                    last_error = line
                self.log.info("%s", line)
            code = process.wait()
        report = tasks.report_job(self.application_args, self.imp_catalog_conn_id)
        self._lineage = job_lineage(self.application_args, self.imp_catalog_conn_id)
        if code != 0:
            raise AirflowException(f"the imp job failed with exit code {code}: {last_error or 'see the log above'}")
        announce(self, context, self._lineage)
        return report

    _lineage: JobLineage | None = None

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """Inputs: the tables at the versions the job's sketches reached; outputs: the sketch versions it made."""
        return self._lineage.to_openlineage() if self._lineage is not None else None

    get_openlineage_facets_on_failure = get_openlineage_facets_on_complete

    def on_kill(self) -> None:
        self.log.info("the task was killed; the job's process ends with it")


@contextlib.contextmanager
def job_environment(catalog_conn_id: str, extra: Mapping[str, str] | None) -> Iterator[dict[str, str]]:
    """The environment of a job reading the task's catalog; the catalog URL in a private file for the block."""
    hook = ImpCatalogHook(catalog_conn_id)
    env = {**hook.job_env(), **(extra or {})}
    url = env.pop(ENV_CATALOG_URL, None) or hook.settings().catalog_url
    with contextlib.ExitStack() as stack:
        if url:
            path = stack.enter_context(private_file(hook.settings().home, "job-catalog-url-", url))
            env[ENV_CATALOG_URL_FILE] = str(path)
        yield env


RUNNERS = ("spark-submit", "connect")
ENV_RUNNER = "IMP_MAINTENANCE_RUNNER"


def job_operator() -> type[BaseOperator]:
    """The operator the maintenance DAGs run their jobs with: ``IMP_MAINTENANCE_RUNNER`` is ``spark-submit``
    (default: a JVM per job) or ``connect`` (a running Spark Connect server)."""
    runner = (os.environ.get(ENV_RUNNER) or "spark-submit").strip().lower()
    if runner not in RUNNERS:
        raise ConfigError(f"{ENV_RUNNER} must be one of {', '.join(RUNNERS)}, got {runner!r}")
    return ImpSparkSubmitOperator if runner == "spark-submit" else ImpConnectJobOperator


__all__ = ["CLUSTER_MODE_REFUSED", "DEFAULT_CONF", "ENV_RUNNER", "RUNNERS", "ImpConnectJobOperator",
           "ImpSparkSubmitOperator", "job_environment", "job_operator"]

"""The SparkSession, started only when a step needs it: local mode by default, a cluster by ``IMP_SPARK_MASTER``, or
the session ``spark-submit`` configured; with Delta Lake's connector, S3A, the object-storage settings and the
settings the engine's semantics rely on (non-ANSI arithmetic, UTC, Arrow transfer). See docs/DEPLOYMENT.md.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from imp_core.config import Settings
from imp_core.errors import ConfigError, first_line
from imp_core.security.redact import register_secret
from imp_core.sources import storage
from imp_core.spark import connector

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

LOG4J_CONF = Path(__file__).parent / "conf" / "log4j2.properties"
ENV_METASTORE = "IMP_SPARK_METASTORE"  # in-memory (default) | hive: where `imp table register --table` names live
ENV_REMOTE = "IMP_SPARK_REMOTE"  # sc://host:port of a running Spark Connect server: no JVM in this process
ENV_DRIVER_MEMORY = "IMP_SPARK_DRIVER_MEMORY"  # the driver JVM's heap (a session, a spark-submit job, Connect server)
DEFAULT_DRIVER_MEMORY = "4g"

_SEMANTICS = {
    **connector.RESULT_SEMANTICS,
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.execution.arrow.pyspark.fallback.enabled": "false",
}


def get_spark(settings: Settings | None = None) -> SparkSession:
    """Return the active session or start one for ``settings.spark_master``."""
    from pyspark.sql import SparkSession  # this module imports without starting (or loading) Spark

    _quiet_query_context_logs()
    remote = remote_url()
    if remote:
        return _connect(remote)  # the session on that server, checked with one quick call
    active = SparkSession.getActiveSession()
    if active is not None:
        connector.require_loaded(active.conf.get)
        require_client_mode(active.conf.get)
        apply_semantics(active)
        return active
    settings = settings or Settings.from_env()
    jvm_conf = {} if under_spark_submit() else connector.session_conf()
    os.environ.setdefault("PYSPARK_PYTHON", os.environ.get("PYSPARK_PYTHON", "python3"))
    builder = (SparkSession.builder.appName("imp")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", str(settings.shuffle_partitions))
               .config("spark.sql.adaptive.enabled", "true")
               # Delta rebuilds a pinned version's file list with a shuffle of this many partitions (default 50:
               # 50 tasks per time-travel read of a small table)
               .config("spark.databricks.delta.snapshotPartitions", str(settings.shuffle_partitions))
               .config("spark.driver.memory", driver_memory())
               .config("spark.sql.warehouse.dir", str(settings.home / "spark-warehouse"))
               # PySpark 4 records the Python call site of every DataFrame call for error contexts: five extra
               # JVM round trips per call, 75% of the ~700 it takes to build a sketched query (0.1-0.2 s of a
               # 0.35 s query). Our errors are one line anyway; the JVM-side query context stays.
               .config("spark.python.sql.dataFrameDebugging.enabled", "false")
               .config("spark.driver.extraJavaOptions",
                       f"-Dderby.system.home={settings.home} -Dlog4j2.configurationFile={LOG4J_CONF}"))
    if not under_spark_submit():  # spark-submit chose the master (and its conf) already
        builder = builder.master(settings.spark_master)
    metastore = (os.environ.get(ENV_METASTORE) or "in-memory").lower()
    if metastore not in ("in-memory", "hive"):
        raise ConfigError(f"{ENV_METASTORE} must be in-memory or hive, got {metastore!r}")
    if metastore == "hive":
        # Spark's Hive metastore: a metastore service (IMP_HIVE_METASTORE_URIS, thrift://host:9083), else Spark's
        # built-in Derby database under IMP_HOME
        builder = builder.enableHiveSupport()
        uris = os.environ.get("IMP_HIVE_METASTORE_URIS")
        if uris:
            builder = builder.config("spark.hadoop.hive.metastore.uris", uris)
        else:
            builder = builder.config("spark.hadoop.javax.jdo.option.ConnectionURL",
                                     f"jdbc:derby:;databaseName={settings.home / 'metastore_db'};create=true")
    for key, value in {**_SEMANTICS, **jvm_conf}.items():
        builder = builder.config(key, value)
    log.info("starting Spark (%s)", "master chosen by spark-submit" if under_spark_submit() else settings.spark_master)
    spark = builder.getOrCreate()
    connector.require_loaded(spark.conf.get)
    require_client_mode(spark.conf.get)
    spark.sparkContext.setLogLevel("ERROR")
    storage.configure_spark(spark)
    apply_semantics(spark)
    return spark


def driver_memory() -> str:
    """The driver's heap (``IMP_SPARK_DRIVER_MEMORY``, default 4g): Spark's own default of 1g runs out on a capture of
    10M rows. Under spark-submit it only takes effect as ``--driver-memory`` (the JVM is already running when the
    job's session is built), so every place that starts a driver JVM passes this value."""
    return os.environ.get(ENV_DRIVER_MEMORY) or DEFAULT_DRIVER_MEMORY


def _quiet_query_context_logs() -> None:
    """PySpark logs each error of a query's analysis or execution, stack trace and all, as one JSON line before it
    raises it; imp reports those errors itself, in one line (``errors.first_line``), so the two loggers stay quiet.
    They must be PySpark's own logger class (it logs with keyword context), hence its ``getLogger``."""
    from pyspark.logger import PySparkLogger

    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
        PySparkLogger.getLogger(name).setLevel(logging.CRITICAL)


def remote_url() -> str | None:
    """The Spark Connect server this process uses (``IMP_SPARK_REMOTE``), or None for a JVM of its own."""
    return os.environ.get(ENV_REMOTE) or None


def connect_address(url: str) -> str:
    """``sc://host:port`` of a Spark Connect URL, without its parameters (a token among them)."""
    return url.partition("/;")[0].partition(";")[0].rstrip("/")


def is_remote(spark: SparkSession) -> bool:
    """True for a Spark Connect session (no JVM in this process: no Py4J handles, no SparkContext)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def _connect(url: str) -> SparkSession:
    """A session on a running Spark Connect server (``docs/AIRFLOW.md`` "Spark Connect").

    The server was started with the connector jars and the object-storage settings (``python -m
    imp_core.cli.connect_server``); this process only checks that Delta's connector is loaded there and sets the
    session's semantics.
    """
    from pyspark.sql import SparkSession
    from pyspark.sql.connect.client.retries import DefaultPolicy

    shown = connect_address(url)
    for param in url.partition("/;")[2].split(";"):  # ;token=...;user_id=...: the token is a secret
        if param.startswith("token="):
            register_secret(param[len("token="):])
    if not url.startswith("sc://"):
        raise ConfigError(f"{ENV_REMOTE} must be a Spark Connect URL (sc://host:port), got {shown!r}")
    host, _, port = shown[len("sc://"):].rpartition(":")
    try:  # Spark Connect's client retries an unreachable server for minutes: fail fast instead
        socket.create_connection((host or "localhost", int(port or 15002)), timeout=5).close()
    except (OSError, ValueError) as e:
        raise ConfigError(f"no Spark Connect server answers at {shown} ({e}); start it with `python -m "
                          f"imp_core.cli.connect_server start` or unset {ENV_REMOTE}") from e
    spark = SparkSession.builder.remote(url).getOrCreate()
    client = spark.client
    patient = client.get_retry_policies()
    # the first call says whether the server admits us: fail in seconds, not after the client's 10 minutes of retries
    client.set_retry_policies([DefaultPolicy(max_retries=2, max_backoff=1000)])
    try:
        connector.require_loaded(spark.conf.get)
    except ConfigError:
        raise
    except Exception as e:  # gRPC and Spark Connect raise many kinds
        text = str(e)
        hint = ("the server refused the token (IMP_SPARK_CONNECT_TOKEN of the server, token= of the URL)"
                if "UNAUTHENTICATED" in text or "authentication token" in text else
                "with a token, pyspark uses TLS unless the host is localhost" if "SSL" in text else
                first_line(text))
        raise ConfigError(f"cannot use the Spark Connect server at {shown}: {hint}; start it with `python -m "
                          f"imp_core.cli.connect_server start` or unset {ENV_REMOTE}") from e
    finally:
        client.set_retry_policies(patient)
    apply_semantics(spark)
    log.info("using Spark Connect at %s", shown)
    return spark


def require_client_mode(conf_get: Callable[[str, str], str | None]) -> None:
    """Refuse a driver started in cluster deploy mode (imp's driver runs where the job was submitted)."""
    if str(conf_get("spark.submit.deployMode", "client") or "client").lower() == "cluster":
        raise ConfigError("imp jobs run in client deploy mode (the driver needs Python with imp_core; executors "
                          "need neither): submit with --deploy-mode client")


def under_spark_submit() -> bool:
    """True when this Python driver was launched by ``spark-submit`` (the JVM gateway already exists)."""
    return bool(os.environ.get("PYSPARK_GATEWAY_PORT"))


_RESULT_SHAPING = tuple(connector.RESULT_SEMANTICS)


def semantics_differences(conf_get: Callable[[str, str], str | None]) -> dict[str, tuple[str, str]]:
    """The settings of a session that can change a query's result and differ from the ones sketches are computed
    under: setting -> (the session's value, the engine's). Reads only."""
    out = {}
    for key in _RESULT_SHAPING:
        value = str(conf_get(key, _SEMANTICS[key]) or "")
        if value.lower() != _SEMANTICS[key].lower():
            out[key] = (value, _SEMANTICS[key])
    return out


def apply_semantics(spark: SparkSession) -> None:
    for key, value in _SEMANTICS.items():
        try:
            spark.conf.set(key, value)
        except Exception:  # noqa: BLE001 - static confs cannot be changed on a running session
            pass

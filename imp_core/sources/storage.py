"""Where tables live: local paths or object storage, and how each reader reaches them.

delta-rs wants ``s3://`` and options (:meth:`S3Config.delta_rs_options`); Spark reads through Hadoop's S3A
(``s3a://``, :func:`configure_spark`); both from one set of values: what :func:`configure` installed, over the
``IMP_S3_*`` and standard ``AWS_*`` variables. Secrets never reach a command line, and :func:`redact` hides them in
messages. See docs/DEPLOYMENT.md, "Object storage".
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from imp_core.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

S3_SCHEMES = ("s3", "s3a")
_TRUE = ("1", "true", "yes", "on")


def scheme(uri: str) -> str:
    """The URI's scheme, ``file`` for local paths."""
    if "://" not in uri:
        return "file"
    return urlsplit(uri).scheme.lower()


def is_local(uri: str) -> bool:
    return scheme(uri) == "file"


def is_s3(uri: str) -> bool:
    return scheme(uri) in S3_SCHEMES


def spark_uri(uri: str) -> str:
    """The URI as Spark's Hadoop file systems want it (``s3://`` becomes ``s3a://``)."""
    if scheme(uri) == "s3":
        return "s3a://" + uri.split("://", 1)[1]
    return uri


def delta_rs_uri(uri: str) -> str:
    """The URI as delta-rs wants it (``s3a://`` becomes ``s3://``)."""
    if scheme(uri) == "s3a":
        return "s3://" + uri.split("://", 1)[1]
    return uri


def normalize(uri: str) -> str:
    """The form stored in the catalog: ``s3://`` for S3 (either scheme accepted), else unchanged."""
    return delta_rs_uri(uri).rstrip("/") if is_s3(uri) else uri


@dataclass(frozen=True)
class S3Config:
    """How to reach S3 (or an S3-compatible server). ``None`` values are left to the readers' default chains."""

    endpoint: str | None = None
    region: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None
    path_style: bool | None = None

    def __repr__(self) -> str:  # never print secrets
        shown = {f.name: getattr(self, f.name) for f in fields(self)}
        for key in ("access_key_id", "secret_access_key", "session_token"):
            if shown[key]:
                shown[key] = "***"
        return "S3Config(" + ", ".join(f"{k}={v!r}" for k, v in shown.items() if v is not None) + ")"

    __str__ = __repr__

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> S3Config:
        env = os.environ if env is None else env

        def first(*names: str) -> str | None:
            for name in names:
                if env.get(name):
                    return env[name]
            return None

        path_style = first("IMP_S3_PATH_STYLE")
        config = cls(
            endpoint=first("IMP_S3_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),
            region=first("IMP_S3_REGION", "AWS_REGION", "AWS_DEFAULT_REGION"),
            access_key_id=first("IMP_S3_ACCESS_KEY_ID", "AWS_ACCESS_KEY_ID"),
            secret_access_key=first("IMP_S3_SECRET_ACCESS_KEY", "AWS_SECRET_ACCESS_KEY"),
            session_token=first("IMP_S3_SESSION_TOKEN", "AWS_SESSION_TOKEN"),
            path_style=None if path_style is None else path_style.lower() in _TRUE,
        )
        if (config.access_key_id is None) != (config.secret_access_key is None):
            raise ConfigError("S3 credentials are incomplete: set both IMP_S3_ACCESS_KEY_ID and "
                              "IMP_S3_SECRET_ACCESS_KEY (or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY), or neither")
        return config

    def over(self, base: S3Config) -> S3Config:
        """This config's values where set, ``base``'s elsewhere."""
        return replace(base, **{f.name: v for f in fields(self) if (v := getattr(self, f.name)) is not None})

    @property
    def plain_http(self) -> bool:
        return bool(self.endpoint and self.endpoint.lower().startswith("http://"))

    def delta_rs_options(self) -> dict[str, str]:
        """delta-rs (object_store) storage options."""
        out: dict[str, str] = {}
        if self.endpoint:
            out["AWS_ENDPOINT_URL"] = self.endpoint
        if self.region:
            out["AWS_REGION"] = self.region
        if self.access_key_id and self.secret_access_key:
            out["AWS_ACCESS_KEY_ID"] = self.access_key_id
            out["AWS_SECRET_ACCESS_KEY"] = self.secret_access_key
        if self.session_token:
            out["AWS_SESSION_TOKEN"] = self.session_token
        if self.plain_http:
            out["AWS_ALLOW_HTTP"] = "true"
        if self.path_style is not None:
            out["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] = "false" if self.path_style else "true"
        return out

    def hadoop_conf(self) -> dict[str, str]:
        """Hadoop S3A settings (keys without the ``spark.hadoop.`` prefix)."""
        out: dict[str, str] = {}
        if self.endpoint:
            out["fs.s3a.endpoint"] = self.endpoint
            out["fs.s3a.connection.ssl.enabled"] = "false" if self.plain_http else "true"
        if self.region:
            out["fs.s3a.endpoint.region"] = self.region
        if self.path_style is not None:
            out["fs.s3a.path.style.access"] = "true" if self.path_style else "false"
        if self.access_key_id and self.secret_access_key:
            out["fs.s3a.access.key"] = self.access_key_id
            out["fs.s3a.secret.key"] = self.secret_access_key
            if self.session_token:
                out["fs.s3a.session.token"] = self.session_token
                out["fs.s3a.aws.credentials.provider"] = \
                    "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
            else:
                out["fs.s3a.aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
        return out

    def secrets(self) -> list[str]:
        return [s for s in (self.secret_access_key, self.session_token, self.access_key_id) if s]


_configured: S3Config | None = None


def configure(config: S3Config | None) -> None:
    """Install ``config`` for this process (over the environment); ``None`` goes back to the environment only."""
    global _configured
    _configured = config


def s3_config() -> S3Config:
    """The S3 settings in force: what :func:`configure` installed, over the environment."""
    env = S3Config.from_env()
    return _configured.over(env) if _configured is not None else env


def delta_rs_options(uri: str) -> dict[str, str] | None:
    """Storage options for opening ``uri`` with delta-rs (None for local paths)."""
    return s3_config().delta_rs_options() if is_s3(uri) else None


def configure_spark(spark: SparkSession, config: S3Config | None = None) -> None:
    """Put the S3A settings into the session's Hadoop configuration (at run time: no secret on a command line).

    Idempotent and cheap when nothing changed; S3A file systems created afterwards use the new values.
    """
    config = config or s3_config()
    conf = config.hadoop_conf()
    key = (id(spark), tuple(sorted(conf.items())))
    if _applied.get(id(spark)) == key:
        return
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()  # noqa: SLF001 - PySpark's Py4J handle
    for name, value in conf.items():
        hadoop.set(name, value)
    # the cached S3A file systems were built with the old values
    if _applied.get(id(spark)) is not None:
        _jvm(spark).org.apache.hadoop.fs.FileSystem.closeAll()
    _applied[id(spark)] = key


_applied: dict[int, Any] = {}


def child_dirs(uri: str, spark: SparkSession | None = None) -> list[str]:
    """The names of the folders directly under ``uri`` (none if it does not exist); S3 is listed through the
    session's S3A file system (``spark`` required), with the same settings as the tables."""
    if is_local(uri):
        root = uri.removeprefix("file://")
        return sorted(e.name for e in os.scandir(root) if e.is_dir()) if os.path.isdir(root) else []
    fs, path = _hadoop(uri, spark)
    if not fs.exists(path):
        return []
    return sorted(str(s.getPath().getName()) for s in fs.listStatus(path) if s.isDirectory())


def exists(uri: str, spark: SparkSession | None = None) -> bool:
    """Whether the file or folder ``uri`` exists (S3 through the session's S3A file system)."""
    if is_local(uri):
        return os.path.exists(uri.removeprefix("file://"))
    fs, path = _hadoop(uri, spark)
    return bool(fs.exists(path))


def remove_tree(uri: str, spark: SparkSession | None = None) -> None:
    """Delete the folder ``uri`` and everything under it (S3 through the session's S3A file system)."""
    if is_local(uri):
        shutil.rmtree(uri.removeprefix("file://"), ignore_errors=False)
        return
    fs, path = _hadoop(uri, spark)
    fs.delete(path, True)


def remove_files(uris: Sequence[str], spark: SparkSession) -> None:
    """Delete the files ``uris`` (as Spark names them: local paths, ``file:`` or ``s3a://`` URIs) through the
    session's Hadoop file systems; a file already gone is no error."""
    jvm = _jvm(spark)
    conf = spark.sparkContext._jsc.hadoopConfiguration()  # noqa: SLF001 - PySpark's Py4J handle
    for uri in uris:
        path = jvm.org.apache.hadoop.fs.Path(spark_uri(uri))
        path.getFileSystem(conf).delete(path, False)


def _jvm(spark: SparkSession) -> Any:
    """The Py4J view of the session's JVM (a classic session always has one)."""
    jvm = spark.sparkContext._jvm  # noqa: SLF001 - PySpark's Py4J gateway
    if jvm is None:
        raise ConfigError("this Spark session has no JVM gateway (object storage needs a classic session, not "
                          "Spark Connect)")
    return jvm


def _hadoop(uri: str, spark: SparkSession | None) -> tuple[Any, Any]:
    if spark is None:
        raise ConfigError(f"listing {redact(uri)} needs a Spark session (object storage is reached through S3A)")
    if is_s3(uri):
        configure_spark(spark)
    jvm = _jvm(spark)
    path = jvm.org.apache.hadoop.fs.Path(spark_uri(uri))
    return path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()), path  # noqa: SLF001 - Py4J


def redact(text: str) -> str:
    """``text`` with every configured secret replaced by ``***``."""
    try:
        secrets = s3_config().secrets()
    except ConfigError:  # half-configured credentials: nothing complete to leak, the error says so elsewhere
        secrets = []
    for secret in secrets:
        if len(secret) >= 4:
            text = text.replace(secret, "***")
    return text


__all__ = ["S3Config", "child_dirs", "configure", "configure_spark", "delta_rs_options", "delta_rs_uri", "is_local",
           "is_s3", "normalize", "redact", "remove_files", "remove_tree", "s3_config", "scheme", "spark_uri"]

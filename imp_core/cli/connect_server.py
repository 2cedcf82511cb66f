"""A long-lived Spark Connect server for maintenance tasks: one JVM for every task instead of one per task.

Maintenance tasks run with ``IMP_SPARK_REMOTE=sc://host:port`` connect to it (``imp_core.spark.session``) and start no
JVM of their own. The server loads the same connectors as every imp session (``imp_core.spark.connector``), has the
same semantics settings, and holds the object-storage credentials in its Hadoop configuration, written to a
private properties file (mode 0600) rather than its command line. With ``IMP_SPARK_CONNECT_TOKEN`` set it admits
only clients presenting that token (``sc://localhost:PORT/;token=...``; pyspark sends a token over TLS to any other
host, so remote clients reach the server through a TLS proxy). See docs/AIRFLOW.md "Spark Connect".

Command line::

    python -m imp_core.cli.connect_server start [--port 15002]   # start in the background, wait until it listens
    python -m imp_core.cli.connect_server status                 # the pid and address, exit 1 when not running
    python -m imp_core.cli.connect_server stop
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from imp_core.cli.scaffold import OneLineParser, run_main
from imp_core.config import Settings
from imp_core.errors import ConfigError
from imp_core.sources import storage
from imp_core.spark import connector
from imp_core.spark.session import _SEMANTICS, LOG4J_CONF, driver_memory

PROG = "python -m imp_core.cli.connect_server"
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
ENV_TOKEN = "IMP_SPARK_CONNECT_TOKEN"
_SERVER_TOKEN_ENV = "SPARK_CONNECT_AUTHENTICATE_TOKEN"  # the server's own variable: the token stays off its argv
DEFAULT_PORT = 15002
START_TIMEOUT = 180.0


@dataclass(frozen=True)
class ServerFiles:
    """Where a server of this IMP_HOME keeps its pid, properties and log."""

    home: Path

    @property
    def folder(self) -> Path:
        return self.home / "spark-connect"

    @property
    def pid(self) -> Path:
        return self.folder / "server.pid"

    @property
    def properties(self) -> Path:
        return self.folder / "server.properties"

    @property
    def log(self) -> Path:
        return self.folder / "server.log"


def start(settings: Settings, port: int = DEFAULT_PORT, host: str = "127.0.0.1",
          timeout: float = START_TIMEOUT) -> str:
    """Start a server in the background and return its ``sc://host:port`` once it accepts connections.

    Raises:
        ConfigError: One is already running for this IMP_HOME, spark-submit is missing, or it did not come up.
    """
    files = ServerFiles(settings.home)
    if running_pid(files) is not None:
        raise ConfigError(f"a Spark Connect server is already running for {settings.home} (pid "
                          f"{running_pid(files)}); stop it first: python -m imp_core.cli.connect_server stop")
    submit = shutil.which("spark-submit") or str(Path(sys.executable).with_name("spark-submit"))
    if not Path(submit).exists():
        raise ConfigError("spark-submit was not found next to this Python or on PATH; install pyspark (./dev setup)")
    files.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    _write_properties(files.properties, settings, host, port)
    argv = [submit, "--master", settings.spark_master, "--class", SERVER_CLASS, *connector.submit_args(),
            "--properties-file", str(files.properties), "spark-internal"]
    env = {**os.environ, "PATH": f"{Path(submit).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    if os.environ.get(ENV_TOKEN):
        env[_SERVER_TOKEN_ENV] = os.environ[ENV_TOKEN]
    with open(files.log, "ab") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    files.pid.write_text(f"{process.pid}\n")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            files.pid.unlink(missing_ok=True)
            raise ConfigError(f"the Spark Connect server exited with {process.returncode} while starting; see "
                              f"{files.log}")
        if _listening(host, port):
            return f"sc://{host}:{port}"
        time.sleep(0.5)
    stop(settings)
    raise ConfigError(f"the Spark Connect server did not listen on {host}:{port} within {timeout:.0f} s; see "
                      f"{files.log}")


def stop(settings: Settings, timeout: float = 30.0) -> bool:
    """Stop this IMP_HOME's server; False when none was running."""
    files = ServerFiles(settings.home)
    pid = running_pid(files)
    if pid is None:
        files.pid.unlink(missing_ok=True)
        return False
    os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.2)
    if _alive(pid):
        os.killpg(pid, signal.SIGKILL)
    files.pid.unlink(missing_ok=True)
    return True


def running_pid(files: ServerFiles) -> int | None:
    try:
        pid = int(files.pid.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if _alive(pid) else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of this process counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return True


def _listening(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def _write_properties(path: Path, settings: Settings, host: str, port: int) -> None:
    """The server's settings (credentials among them) in a file only its owner can read."""
    props = {
        "spark.app.name": "imp-spark-connect",
        "spark.connect.grpc.binding.address": host,
        "spark.connect.grpc.binding.port": str(port),
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": str(settings.shuffle_partitions),
        "spark.sql.adaptive.enabled": "true",
        "spark.databricks.delta.snapshotPartitions": str(settings.shuffle_partitions),
        "spark.driver.memory": driver_memory(),
        "spark.sql.warehouse.dir": str(settings.home / "spark-warehouse"),
        "spark.driver.extraJavaOptions": f"-Dderby.system.home={settings.home} "
                                         f"-Dlog4j2.configurationFile={LOG4J_CONF}",
        **_SEMANTICS,
        **{f"spark.hadoop.{k}": v for k, v in storage.s3_config().hadoop_conf().items()},
    }
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        for key, value in props.items():
            f.write(f"{key}={_escape(value)}\n")


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n")


def _parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog=PROG, description="A long-lived Spark Connect server for imp's maintenance tasks.")
    parser.add_argument("command", choices=("start", "stop", "status"))
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--host", default="127.0.0.1")
    return parser


def _handle(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    if args.command == "start":
        print(start(settings, args.port, args.host))
    elif args.command == "stop":
        print("stopped" if stop(settings) else "not running")
    else:
        pid = running_pid(ServerFiles(settings.home))
        print("not running" if pid is None else f"running (pid {pid})")
        return 1 if pid is None else 0
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_main(PROG, argv, _parser, _handle)


if __name__ == "__main__":
    sys.exit(main())

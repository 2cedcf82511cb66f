"""Shared fixtures: one SparkSession per test session, temp IMP homes, Delta table helpers."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pytest

os.environ.setdefault("PYSPARK_PYTHON", os.sys.executable)  # type: ignore[attr-defined]
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", os.sys.executable)  # type: ignore[attr-defined]


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory):
    from imp_core.config import Settings
    from imp_core.spark.session import get_spark

    home = tmp_path_factory.mktemp("spark-home")
    settings = Settings.from_env({}, home=home, spark_master="local[2]", shuffle_partitions=2)
    session = get_spark(settings)
    yield session
    session.stop()


def write_delta(path: Path | str, table: pa.Table | dict, mode: str = "append", cdf: bool = True, **kw) -> None:
    from deltalake import write_deltalake

    if isinstance(table, dict):
        table = pa.table(table)
    config = {"delta.enableChangeDataFeed": "true"} if cdf else None
    write_deltalake(str(path), table, mode=mode, configuration=config if mode != "append" or not Path(
        path, "_delta_log").exists() else None, **kw)


@pytest.fixture(scope="session")
def imp_settings(tmp_path_factory: pytest.TempPathFactory):
    """Settings with a private IMP_HOME (embedded Postgres catalog) for the whole test session."""
    from imp_core.catalog.embedded import stop_embedded
    from imp_core.config import Settings

    home = tmp_path_factory.mktemp("imp-home")
    settings = Settings.from_env({}, home=home, spark_master="local[2]", shuffle_partitions=2)
    yield settings
    stop_embedded(settings)


@pytest.fixture(scope="session")
def service(imp_settings, spark):
    """A SketchService on the session's Spark and the embedded catalog."""
    from imp_core.maintenance.service import SketchService

    svc = SketchService(imp_settings, spark=spark)
    yield svc
    svc.catalog.close()


def write_in_files(path: Path | str, table: pa.Table, files: int) -> None:
    """Write ``table`` as a Delta table (CDF on) of ``files`` data files, one per commit, in row order.

    delta-rs decides file sizes itself; committing slices separately gives tests a known file layout.
    """
    from deltalake import write_deltalake

    step = -(-table.num_rows // files)
    for i in range(files):
        part = table.slice(i * step, step)
        if i == 0:
            write_deltalake(str(path), part, mode="overwrite",
                            configuration={"delta.enableChangeDataFeed": "true"})
        elif part.num_rows:
            write_deltalake(str(path), part, mode="append")


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory):
    """A real S3-compatible HTTP server (moto's standalone server) on 127.0.0.1 with a bucket ``lake``.

    Its address and credentials are put into the ``IMP_S3_*`` environment variables for the rest of the session,
    as a user would configure them; delta-rs and Spark's S3A both read them (imp_core.sources.storage).
    """
    import shutil
    import signal
    import socket
    import subprocess
    import sys
    import time

    import requests

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    binary = Path(sys.executable).with_name("moto_server")
    assert binary.exists() or shutil.which("moto_server"), "moto_server is missing: run ./dev test"
    log = tmp_path_factory.mktemp("s3-server") / "moto.log"
    proc = subprocess.Popen([str(binary if binary.exists() else "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=open(log, "w"), stderr=subprocess.STDOUT,  # noqa: SIM115
                            start_new_session=True)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, log.read_text()
        try:
            # moto builds its backends on the first request: under load that answer takes seconds
            requests.get(endpoint, timeout=30)
            break
        except requests.RequestException:
            assert time.monotonic() < deadline, "the S3 server did not come up"
            time.sleep(0.2)
    env = {"IMP_S3_ENDPOINT": endpoint, "IMP_S3_REGION": "us-east-1", "IMP_S3_ACCESS_KEY_ID": "imp-test-key",
           "IMP_S3_SECRET_ACCESS_KEY": "imp-test-secret-value", "IMP_S3_PATH_STYLE": "true"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    requests.put(f"{endpoint}/lake", timeout=10).raise_for_status()
    try:
        yield endpoint
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)


def s3_write_options() -> dict[str, str]:
    """delta-rs storage options for tests that write tables to the S3 server (reads need none: imp configures)."""
    from imp_core.sources.storage import s3_config

    return {**s3_config().delta_rs_options(), "AWS_S3_ALLOW_UNSAFE_RENAME": "true"}

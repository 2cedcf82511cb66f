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

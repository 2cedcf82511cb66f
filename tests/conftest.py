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

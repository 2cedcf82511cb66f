"""The installed environment: full PySpark and the provider's pyspark-client coexist, spark-submit works."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest


def test_pyspark_and_pyspark_client_are_the_same_version() -> None:
    # both ship the `pyspark` import package; only identical versions have byte-identical shared files
    assert metadata.version("pyspark") == metadata.version("pyspark-client")


def test_import_pyspark_gives_full_pyspark() -> None:
    import pyspark
    from pyspark.sql import SparkSession  # noqa: F401

    assert pyspark.__version__ == metadata.version("pyspark")
    # full PySpark carries the JVM jars; the connect-only client does not
    assert (Path(pyspark.__file__).parent / "jars").is_dir()


@pytest.mark.spark  # spark-submit --version starts a JVM
def test_spark_submit_version_runs() -> None:
    bindir = Path(sys.executable).parent
    spark_submit = bindir / "spark-submit"
    assert spark_submit.exists(), "spark-submit should be installed next to the venv's python"
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    out = subprocess.run([str(spark_submit), "--version"], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    text = out.stdout + out.stderr
    assert f"version {metadata.version('pyspark')}" in text


def test_imp_console_script_is_installed() -> None:
    imp = Path(sys.executable).parent / "imp"
    out = subprocess.run([str(imp), "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "imp demo" in out.stdout

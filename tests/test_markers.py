"""The test markers of tests/conftest.py: fixtures apply them, and the guard fails a test that starts Spark unmarked.

Runs a small suite with a copy of the conftest in a pytest subprocess; its `spark` fixture and `spark-submit` program
are stand-ins that start nothing (the guard knows a program by its name).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CONFTEST = Path(__file__).with_name("conftest.py")

SUITE = '''
import subprocess

import pytest


@pytest.fixture
def spark():
    return "a stand-in: the marker comes from the fixture's name"


@pytest.fixture
def needs_spark(spark):
    return spark


def test_uses_spark(spark):
    assert spark


def test_uses_spark_through_another_fixture(needs_spark):
    assert needs_spark


def test_pure():
    assert True


def test_runs_spark_submit_unmarked():
    subprocess.run(["spark-submit", "--version"], check=True)


@pytest.mark.spark
def test_runs_spark_submit_marked():
    subprocess.run(["spark-submit", "--version"], check=True)
'''


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    suite = tmp_path / "suite"
    if not suite.exists():
        suite.mkdir()
        (suite / "conftest.py").write_text(CONFTEST.read_text())
        (suite / "test_suite.py").write_text(SUITE)
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        (bin_dir / "spark-submit").write_text("#!/bin/sh\nexit 0\n")
        (bin_dir / "spark-submit").chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA",
                           "--strict-markers", "-o", "markers=spark\npostgres\nairflow", str(suite), *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_fixtures_apply_the_marker_and_the_guard_fails_unmarked_starts(tmp_path: Path) -> None:
    pure = _run(tmp_path, "-m", "not spark")
    out = pure.stdout + pure.stderr
    assert "PASSED suite/test_suite.py::test_pure" in out, out
    assert "FAILED suite/test_suite.py::test_runs_spark_submit_unmarked" in out, out
    assert "started spark without the marker: add @pytest.mark.spark" in out, out
    assert "1 failed, 1 passed, 3 deselected" in out, out

    spark = _run(tmp_path, "-m", "spark")
    out = spark.stdout + spark.stderr
    assert spark.returncode == 0, out
    assert "3 passed, 2 deselected" in out, out


def test_the_files_started_first_exist() -> None:
    """``LONG_FILES`` names files by path: a renamed one would silently start last again."""
    from tests.conftest import LONG_FILES

    root = CONFTEST.parent.parent
    assert [p for p in LONG_FILES if not (root / p).is_file()] == []

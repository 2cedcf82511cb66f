"""Lint: ruff with the rules configured in pyproject.toml ([tool.ruff]) over the code, tests, benchmarks and DAGs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_ruff_check_passes() -> None:
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "imp_core", "tests", "benchmarks",
                           "dags", "plugins"], cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, f"ruff found problems (`ruff check --fix` sorts imports):\n{done.stdout}{done.stderr}"

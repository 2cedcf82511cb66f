"""Lint: ruff with the rules configured in pyproject.toml ([tool.ruff]) over the code, tests, benchmarks and DAGs, and
ruff's formatter over every file but those pyproject.toml lists as not formatted yet (a list that only shrinks)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CODE = ["imp_core", "tests", "benchmarks", "dags", "plugins"]


def _ruff(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--no-cache"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_ruff_check_passes() -> None:
    done = _ruff("check", *CODE)
    assert done.returncode == 0, f"ruff found problems (`ruff check --fix` sorts imports):\n{done.stdout}{done.stderr}"


def test_ruff_format_passes() -> None:
    done = _ruff("format", "--check", *CODE)
    assert done.returncode == 0, f"files to format (`ruff format FILE`):\n{done.stdout}{done.stderr}"


def test_the_files_not_formatted_yet_exist_and_are_not_formatted() -> None:
    listed = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["ruff"]["format"]["exclude"]
    assert listed == sorted(set(listed)), "keep [tool.ruff.format] exclude sorted, each file once"
    gone = [p for p in listed if not (REPO / p).is_file()]
    assert not gone, f"remove from [tool.ruff.format] exclude in pyproject.toml (no such file): {gone}"
    done = _ruff("format", "--check", "--output-format", "concise", "--config", "format.exclude = []", *listed)
    unformatted = {line.split(":", 1)[0] for line in done.stdout.splitlines() if "unformatted" in line}
    formatted = sorted(set(listed) - unformatted)
    assert not formatted, f"formatted now: remove from [tool.ruff.format] exclude in pyproject.toml: {formatted}"

"""The side-by-side top-k state benchmark runs (tiny sizes) and checks its answers: a smoke test, not a speed test."""

from __future__ import annotations

import pytest

from benchmarks import topk_state


def test_topk_state_benchmark_prints_every_case(capsys: pytest.CaptureFixture[str]) -> None:
    assert topk_state.main(["--sizes", "3000", "--batches", "3"]) == 0  # each case asserts its final top-10
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "3,000" in line]
    assert [(r.split(" | ")[0], r.split(" | ")[2]) for r in rows] == [
        ("| random", "old"),
        ("| random", "indexed"),
        ("| top-heavy", "old"),
        ("| top-heavy", "indexed"),
    ]

"""The benchmark harness's bookkeeping: ratios pair runs, tables say how they were measured, hand-written text stays."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import harness
from benchmarks.harness import Experiment


def test_ratios_pair_runs_of_the_same_index() -> None:
    exp = Experiment("x", "t", ratios=[("FM", "IMP")])
    for run, (imp, fm) in enumerate([(1.0, 10.0), (2.0, 10.0), (0.5, 50.0)]):
        exp.add("c", "IMP", run, imp)
        exp.add("c", "FM", run, fm)
    assert exp.ratio("c", "FM", "IMP") == [10.0, 5.0, 100.0]
    assert "| 10x |" in exp.markdown()  # the median of the per-run ratios, not the ratio of the medians (10/1)


def test_markdown_claims_a_warm_up_only_when_there_was_one() -> None:
    for warmup, wanted in ((True, "median of 2 runs after a warm-up"), (False, "median of 2 runs (min–max)")):
        exp = Experiment("x", "t", warmup=warmup)
        exp.add("c", "v", 0, 1.0)
        exp.add("c", "v", 1, 3.0)
        assert wanted in exp.markdown()
        assert "| 2 (1–3) |" in exp.markdown()


@pytest.mark.parametrize("quick", [False, True])
def test_quick_mode_measures_without_a_warm_up(quick: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(harness, "QUICK", quick)
    calls = []
    exp = Experiment("x", "t")
    exp.measure("c", {"v": lambda: calls.append(1) or float(len(calls))}, runs=2)
    assert len(calls) == (2 if quick else 3)
    assert exp.values("c", "v") == ([1.0, 2.0] if quick else [2.0, 3.0])
    assert ("after a warm-up" in exp.markdown()) is not quick


def test_update_doc_replaces_only_the_generated_block(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text("# B\n\nhand text\n\n<!-- bench:x -->\nold table\n<!-- /bench:x -->\n\nreading notes\n")
    monkeypatch.setattr(harness, "DOC", doc)
    harness.update_doc("x", "new table")
    text = doc.read_text()
    assert "old table" not in text and "new table" in text
    assert text.startswith("# B\n\nhand text\n") and text.endswith("reading notes\n")
    harness.update_doc("y", "another")  # a new experiment is appended with its own markers
    assert doc.read_text().rstrip().endswith("<!-- bench:y -->\nanother\n<!-- /bench:y -->")

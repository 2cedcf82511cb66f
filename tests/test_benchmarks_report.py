"""docs/BENCHMARKS.md is generated from docs/bench/*.csv: the committed document is what the generator makes of the
committed CSVs, regenerating rewrites only the generated blocks, the views draw what the CSVs hold, and targets are
met, missed or not measured as the figures say."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from benchmarks import harness, report
from benchmarks.harness import Experiment
from benchmarks.registry import SUITES, TARGETS, VIEWS
from benchmarks.views import Full, Pivot, Target, Wide, ratio_cell, ratio_of

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "docs" / "bench"


def test_the_document_is_what_the_report_makes_of_the_csvs() -> None:
    doc = (REPO / "docs" / "BENCHMARKS.md").read_text()
    assert report.render(doc, BENCH) == doc, "docs/BENCHMARKS.md is stale: run `make bench-report`"


def test_every_csv_has_its_presentation_and_every_row_its_run() -> None:
    for path in sorted(BENCH.glob("*.csv")):
        assert path.with_suffix(".json").exists(), path.name
        exp = Experiment.load(path.stem, BENCH)
        assert exp.rows and all(r.commit and r.date for r in exp.rows), path.name


def test_the_registry_names_every_recorded_experiment_once() -> None:
    named = [n for s in SUITES for n in (*s.experiments, *s.hidden)]
    assert len(named) == len(set(named))
    assert set(named) == {p.stem for p in BENCH.glob("*.csv")}
    assert set(VIEWS) <= set(named)
    assert {n for t in TARGETS for n in t.experiments} <= set(named)
    for t in TARGETS:  # each target is computed from the recorded figures
        assert t.judge(report.loader(BENCH))[1] in ("met", "**missed**"), t.goal


def test_regenerating_rewrites_only_the_blocks_and_appends_a_new_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bench = tmp_path / "bench"
    bench.mkdir()
    for name in ("skipping", "capture"):
        for ext in ("csv", "json"):
            shutil.copy(BENCH / f"{name}.{ext}", bench / f"{name}.{ext}")
    new = Experiment("freshness_lag", "A new experiment no suite lists yet")
    new.add("1 table", "lag", 0, 2.5)
    monkeypatch.setattr(harness, "OUT", bench)
    monkeypatch.setattr(harness, "provenance", lambda: ("abc1234", "2026-12-02"))
    new.write()
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text("# B\n\nhand text\n\n<!-- bench:skipping -->\nold table\n<!-- /bench:skipping -->\n\nreading\n")
    report.refresh(doc, bench)
    text = doc.read_text()
    assert text.startswith("# B\n\nhand text\n\n<!-- bench:skipping -->\n**Capture") and "old table" not in text
    assert "\n<!-- /bench:skipping -->\n\nreading\n" in text
    assert "## A new experiment" not in text and "## freshness_lag\n\n<!-- bench:freshness_lag -->\n" in text
    assert "| 1 table | 2.5 |" in text and "measured 2026-12-02" in text
    assert "## Targets\n\n<!-- bench:targets -->" in text and "| not measured |" in text  # most CSVs are absent
    report.refresh(doc, bench)
    assert doc.read_text() == text  # idempotent


def _exp() -> Experiment:
    exp = Experiment("e", "t", ratios=[("FM", "IMP")])
    for run in range(3):
        for case, imp in (("5% sel, n=10", 0.01), ("5% sel, n=1,000", 0.02), ("1% sel, n=10", 0.04)):
            exp.add(case, "IMP", run, imp * (run + 1))
            exp.add(case, "FM", run, 2.0 * (run + 1))
    return exp


def test_views_lay_out_the_medians_and_ratios() -> None:
    exp = _exp()

    def split(case: str) -> tuple[str, str]:
        row, _, col = case.partition(", n=")
        return row, col

    pivot = Pivot(split, ratio_cell("FM", "IMP"), "sel \\ n").render(exp)
    assert "| sel \\ n | 10 | 1,000 |" in pivot
    assert "| 5% sel | 200x | 100x |" in pivot and "| 1% sel | 50x |  |" in pivot
    wide = Wide("case").render(exp)
    assert "| IMP (s) | 0.02 | 0.04 | 0.08 |" in wide and "| FM/IMP | 200x | 100x | 50x |" in wide
    full = Full(cases=("1% sel, n=10",), variants=("FM",)).render(exp)
    assert "| case | FM (s) | FM/IMP (median of per-run ratios) |" in full
    assert "| 1% sel, n=10 | 4 (2–6) | 50x |" in full and "5% sel" not in full


def test_a_target_is_met_missed_or_not_measured() -> None:
    exp = _exp()

    def load(name: str) -> Experiment | None:
        return exp if name == "e" else None

    def target(limit: float, name: str = "e") -> Target:
        return Target("1", "goal", (name,), ratio_of(name, "5% sel, n=1,000", "FM", "IMP"), ">=", limit)

    assert target(100).judge(load) == ("100", "met")
    assert target(101).judge(load) == ("100", "**missed**")
    assert target(1, name="absent").judge(load) == ("", "not measured")

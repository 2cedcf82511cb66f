"""The benchmark harness's bookkeeping: ratios pair runs, tables say how they were measured, every row records its
run's commit and date, a merging experiment keeps the cases it did not measure, and a CSV reads back as it was."""

from __future__ import annotations

import csv
import re
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


def test_provenance_is_this_checkout_and_today() -> None:
    commit, date = harness.provenance()
    assert re.fullmatch(r"[0-9a-f]{7,}(\+dirty)?", commit), commit
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", date)


def _write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exp: Experiment, provenance: tuple[str, str]) -> None:
    monkeypatch.setattr(harness, "OUT", tmp_path)
    monkeypatch.setattr(harness, "provenance", lambda: provenance)
    exp.write()


def test_every_row_records_its_run_and_the_csv_reads_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    exp = Experiment("x", "a title", ratios=[("FM", "IMP")], warmup=False, notes=["- a note"])
    exp.add("10 rows", "IMP", 0, 0.5, x=10, exact=True)
    exp.add("10 rows", "FM", 0, 5.0, x=10)
    _write(tmp_path, monkeypatch, exp, ("abc1234", "2026-12-01"))
    with open(tmp_path / "x.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["commit"], r["date"]) for r in rows] == [("abc1234", "2026-12-01")] * 2
    assert (tmp_path / "x.png").stat().st_size > 1000
    back = Experiment.load("x", tmp_path)
    assert (back.title, back.ratios, back.warmup, back.notes) == ("a title", [("FM", "IMP")], False, ["- a note"])
    assert back.ratio_median("10 rows", "FM", "IMP") == 10.0
    assert back.extra("10 rows", "exact") == "True" and back.dates() == ["2026-12-01"]
    assert back.markdown() == exp.markdown()


def test_a_merging_experiment_replaces_only_the_cases_it_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = Experiment("m", "t", merge=True)
    first.add("Q1 10 rows", "IMP", 0, 1.0)
    first.add("Q2 10 rows", "IMP", 0, 2.0)
    _write(tmp_path, monkeypatch, first, ("aaaaaaa", "2026-11-01"))
    again = Experiment("m", "t", merge=True)
    again.add("Q2 10 rows", "IMP", 0, 3.0)
    _write(tmp_path, monkeypatch, again, ("bbbbbbb", "2026-12-01"))
    back = Experiment.load("m", tmp_path)
    assert [(r.case, r.value, r.commit, r.date) for r in back.rows] == [
        ("Q1 10 rows", 1.0, "aaaaaaa", "2026-11-01"),
        ("Q2 10 rows", 3.0, "bbbbbbb", "2026-12-01"),
    ]
    plain = Experiment("m", "t")  # without merge a run's CSV is that run alone
    plain.add("Q3 10 rows", "IMP", 0, 4.0)
    _write(tmp_path, monkeypatch, plain, ("ccccccc", "2026-12-02"))
    assert Experiment.load("m", tmp_path).cases() == ["Q3 10 rows"]

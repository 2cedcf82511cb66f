"""Incremental or full by cost (imp_core/maintenance/cost.py): the fit to a sketch's history and the decision, on
recorded versions and Delta log facts made up for each case (no Spark, no catalog)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

import pytest

from imp_core.catalog import VersionRecord
from imp_core.maintenance import cost


def version(n: int, method: str, rows: int, seconds: float, table_version: int,
            placement: dict[str, Any] | None = None, reason: str | None = None) -> VersionRecord:
    return VersionRecord(1, n, {"t": table_version}, {}, {}, method, reason, rows, seconds * 1000, None,
                         dt.datetime(2026, 1, 1), state_placement=placement)


@dataclass
class Commit:
    rows: int | None


@dataclass
class File:
    num_records: int


@dataclass
class Source:
    commit_rows: list[int | None]
    rows_at: dict[int, int]

    def commits(self, after: int, upto: int) -> list[Commit]:
        return [Commit(r) for r in self.commit_rows]

    def files(self, v: int) -> list[File]:
        return [File(self.rows_at[v])]


@dataclass
class Catalog:
    history: list[VersionRecord]

    def versions(self, sketch_id: int) -> list[VersionRecord]:
        return self.history


@dataclass
class Parts:
    catalog: Catalog


@dataclass
class Loaded:
    sources: dict[str, Source]
    record: Any = field(default_factory=lambda: type("R", (), {"id": 1})())


def test_the_fit_is_the_least_squares_line_of_the_history() -> None:
    history = [version(i, "incremental", rows, 0.5 + rows * 1e-4, i) for i, rows in enumerate([10, 1000, 5000], 2)]
    fixed, per_row = cost.fit(history, (9.0, 1e-6))
    assert fixed == pytest.approx(0.5) and per_row == pytest.approx(1e-4)
    assert cost.fit(history[:1], (9.0, 8.0)) == (9.0, 8.0)  # one batch size says nothing about the slope


def test_a_large_step_over_a_cheap_capture_is_a_recapture_and_the_reason_says_why() -> None:
    history = [version(1, "capture", 0, 4.0, 0)] + \
        [version(i, "incremental", rows, 0.2 + rows * 1e-4, i) for i, rows in enumerate([100, 2000, 10_000], 2)]
    source = Source([30_000, 20_000], {0: 1_000_000, 4: 1_000_000, 6: 1_050_000})
    latest = history[-1]
    est = cost.estimate(Parts(Catalog(history)), Loaded({"t": source}), latest, {"t": 6})  # type: ignore[arg-type]
    assert est is not None and est.rows == 50_000
    assert est.incremental == pytest.approx(0.2 + 5.0) and est.recapture == pytest.approx(4.0 * 1.05)
    assert est.recapture_is_cheaper
    assert "about 5.2 s for 50,000 change rows against 4.2 s for a recapture" in est.reason()
    small = cost.estimate(Parts(Catalog(history)), Loaded({"t": Source([500], source.rows_at)}),  # type: ignore[arg-type]
                          latest, {"t": 6})
    assert small is not None and not small.recapture_is_cheaper


def test_without_a_recorded_capture_or_row_counts_nothing_is_chosen() -> None:
    incremental = [version(2, "incremental", 10, 0.1, 1)]
    source = Source([50_000], {1: 10, 2: 10})
    assert cost.estimate(Parts(Catalog(incremental)), Loaded({"t": source}), incremental[-1],  # type: ignore[arg-type]
                         {"t": 2}) is None
    history = [version(1, "capture", 0, 1.0, 0), *incremental]
    unknown = Source([None], {0: 10, 1: 10, 2: 10})
    assert cost.estimate(Parts(Catalog(history)), Loaded({"t": unknown}), history[-1],  # type: ignore[arg-type]
                         {"t": 2}) is None


def test_external_state_starts_from_its_own_prior() -> None:
    history = [version(1, "capture", 0, 60.0, 0),
               version(2, "incremental", 10, 0.1, 1, {"aggregation@r.0": {"where": "external"}})]
    est = cost.estimate(Parts(Catalog(history)), Loaded({"t": Source([10_000], {0: 5, 1: 5, 2: 5})}),  # type: ignore[arg-type]
                        history[-1], {"t": 2})
    fixed, per_row = cost.PRIORS["external"]
    assert est is not None and est.incremental == pytest.approx(fixed + per_row * 10_000)


def test_after_recaptures_in_a_row_chosen_by_cost_the_next_step_is_incremental_once() -> None:
    """The fit learns from incremental versions only: recaptures chosen by cost are its evidence that the choice
    must be measured again, so after ``REVISIT`` of them the step is incremental whatever the estimate says."""
    history = [version(1, "capture", 0, 4.0, 0)] + \
        [version(i, "incremental", rows, 0.2 + rows * 1e-4, i) for i, rows in enumerate([100, 2000, 10_000], 2)]
    source = Source([50_000], {v: 1_000_000 for v in range(20)})
    chosen = cost.estimate(Parts(Catalog(history)), Loaded({"t": source}), history[-1], {"t": 5})  # type: ignore[arg-type]
    assert chosen is not None and chosen.recapture_is_cheaper and not chosen.revisit
    for n in range(cost.REVISIT):
        previous = history[-1].table_versions["t"]
        history.append(version(5 + n, "recapture", 0, 4.0, previous + 1, reason=chosen.reason()))
        est = cost.estimate(Parts(Catalog(history)), Loaded({"t": source}), history[-1],  # type: ignore[arg-type]
                            {"t": previous + 2})
        assert est is not None and est.revisit == (n == cost.REVISIT - 1), n
        assert est.recapture_is_cheaper == (n < cost.REVISIT - 1), n
    history.append(version(9, "incremental", 50_000, 3.0, 10))  # measured again: the choice is the estimate's again
    assert not cost.revisit(history)
    again = cost.estimate(Parts(Catalog(history)), Loaded({"t": source}), history[-1], {"t": 11})  # type: ignore[arg-type]
    assert again is not None and not again.revisit


def test_recaptures_for_other_reasons_do_not_count_towards_a_revisit() -> None:
    history = [version(1, "capture", 0, 4.0, 0)] + \
        [version(i, "recapture", 0, 4.0, i, reason="requested") for i in range(2, 2 + cost.REVISIT)]
    assert not cost.revisit(history)
    assert cost.revisit([*history[:-1], version(9, "recapture", 0, 4.0, 9, reason=f"{cost.REASON}: about ...")]) \
        is False
    by_cost = [version(i, "recapture", 0, 4.0, i, reason=f"{cost.REASON}: about ...") for i in range(cost.REVISIT)]
    assert cost.revisit(by_cost) and not cost.revisit(by_cost[1:])

"""The catalog page's freshness read model and plot (``imp_core.airflow.freshness``) and how the page renders them;
the served page in a real browser is in test_on_commit.py."""

from __future__ import annotations

from typing import Any

from imp_core.airflow.freshness import NOT_REPORTED, PLOT_VERSIONS, TableCommit, age, annotate, plot_svg
from imp_core.airflow.web import render_page
from tests.airflow.test_web_page import _row

NOW = 1_800_000_000.0


def _history(n: int) -> list[dict[str, Any]]:
    return [{"version": v, "method": "capture" if v == 1 else "incremental", "delta_rows": 10 * v,
             "duration_ms": 100.0 + v, "created_at": None} for v in range(1, n + 1)]


def test_versions_behind_and_missed_commits_come_from_observations_and_the_triggers_events() -> None:
    rows = [_row("a", table_versions={"t": 4, "u": 2}, current_table_versions={"t": 5, "u": 2}, stale=True),
            _row("b", table_versions={"t": 7}, current_table_versions={"t": 5})]
    commits = [TableCommit("t", 5, NOW - 50), TableCommit("t", 6, NOW - 20), TableCommit("t", 7, NOW - 5),
               TableCommit("u", 2, NOW - 500)]
    annotate(rows, {"a": _history(3), "b": _history(1)}, commits, now=NOW)
    a, b = rows
    # t's newest version is the trigger's last event (7), past the last observation (5)
    assert a["freshness"]["tables"] == {"t": {"sketch": 4, "current": 7, "behind": 3},
                                        "u": {"sketch": 2, "current": 2, "behind": 0}}
    assert a["freshness"]["behind"] == 3
    assert (a["freshness"]["first_missed_age"], a["freshness"]["last_missed_age"]) == (50, 5)
    assert b["freshness"]["behind"] == 0 and b["freshness"]["last_missed_at"] is None
    assert a["last_maintenance"]["version"] == 3 and b["last_maintenance"] is None  # a capture is no maintenance
    assert [v["version"] for v in a["history"]] == [1, 2, 3]
    assert a["optimizer"] == NOT_REPORTED
    annotate(rows, {"a": _history(PLOT_VERSIONS + 5)}, [], now=NOW, optimizer={"a": {"applied": 3,
                                                                                   "last_applied": "x"}})
    assert len(rows[0]["history"]) == PLOT_VERSIONS and rows[0]["history"][-1]["version"] == PLOT_VERSIONS + 5
    assert rows[0]["optimizer"] == {"applied": 3, "last_applied": "x"}


def test_the_plot_draws_a_bar_per_version_and_the_time_as_a_line() -> None:
    svg = plot_svg(_history(4))
    assert svg.startswith("<svg") and svg.count("<rect") == 4 and svg.count("<polyline") == 1
    assert "v4 incremental: 40 change rows, 104 ms" in svg and "max 40" in svg
    assert plot_svg([]) == ""
    # tallest bar for the most change rows
    heights = [float(part.split('height="')[1].split('"')[0]) for part in svg.split("<rect")[1:]]
    assert heights == sorted(heights) and heights[-1] > heights[0]
    assert (age(None), age(42), age(180), age(7200), age(3 * 86400)) == ("-", "42 s", "3 min", "2 h", "3 d")


def test_the_page_shows_how_far_behind_and_the_last_maintenance() -> None:
    rows = [_row("late", table_versions={"t": 4}, current_table_versions={"t": 4}, stale=False),
            _row("ok", table_versions={"t": 6})]
    annotate(rows, {"late": _history(3), "ok": _history(2)}, [TableCommit("t", 5, NOW - 90),
                                                               TableCommit("t", 6, NOW - 30)], now=NOW)
    html = render_page(rows)
    late = html.split('data-sketch="late"')[1].split("</tr>")[0]
    assert '<span class="badge stale">' in late and "2 versions behind" in late
    assert "last missed commit 30 s ago (first 2 min ago)" in late and "t: 4 / 6" in late
    assert "v3 incremental in 0.10 s, 30 change rows" in late and late.count("<rect") == 3
    assert "not reported (needs the Spark extension)" in late
    ok = html.split('data-sketch="ok"')[1].split("</tr>")[0]
    assert '<span class="badge fresh">fresh</span>' in ok
    assert "1 stale as of the last observation" in html

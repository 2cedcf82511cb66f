"""The catalog page's rendering (``imp_core.airflow.web.render_page``) from catalog rows: what a reader sees about a
sketch that cannot be used. The served page itself is tested against a running Airflow in test_server.py."""

from __future__ import annotations

from typing import Any

from imp_core.airflow.web import render_page


def _row(name: str, **changes: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "name": name, "sql": "SELECT a FROM t", "strategy": "lazy", "latest_version": 3, "latest_method": "maintain",
        "table_versions": {"t": 4}, "current_table_versions": {"t": 4}, "stale": False, "usable": True,
        "unusable_reason": None, "version_created_at": "2026-11-23T01:02:03",
        "last_run": {"id": 7, "status": "succeeded", "finished_at": "2026-11-23T01:02:04", "error": None},
        "partitions": [{"table": "t", "column": "a", "fragments": 2, "fragment_count": 8, "covered_share": 0.25}],
    }
    row.update(changes)
    return row


def test_an_unusable_sketch_shows_why_and_the_count() -> None:
    reason = "assumption t.b >= 0 no longer holds at version 5 <b>; recapture the sketch"
    html = render_page([_row("ok"), _row("broken", usable=False, unusable_reason=reason)])
    broken = html.split('data-sketch="broken"')[1]
    assert '<span class="badge unusable">unusable</span>' in broken
    assert "no longer holds at version 5 &lt;b&gt;; recapture" in broken  # escaped
    assert '<span class="badge unusable">' not in html.split('data-sketch="ok"')[1].split("<tr")[0]
    assert "1 unusable (queries run without them" in html


def test_a_reader_without_log_access_sees_that_the_reason_is_hidden() -> None:
    html = render_page([_row("broken", usable=False, unusable_reason=None, unusable_reason_hidden=True)])
    assert "unusable</span><br><span class=\"hidden\">reason hidden" in html

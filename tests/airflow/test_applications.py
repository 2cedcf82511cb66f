"""The optimizer's application counts on the catalog page (``imp_core.airflow.applications``): the Spark extension's
per-driver files under ``<publish location>/_applications/``, on a local location and on the S3 server the suite
starts, summed per sketch; files of another shape skipped; the page's cell."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from imp_core.airflow.applications import APPLICATIONS_DIR, applications, publish_location, read_counts
from imp_core.airflow.freshness import annotate
from imp_core.airflow.web import render_page
from tests.airflow.test_web_page import _row

T0 = 1_800_000_000_000  # epoch ms


def _driver(sketches: dict[str, tuple[int, int, int]], driver: str = "host-1-1") -> bytes:
    """A driver's file as the extension writes it: per sketch (count, last_ms, version)."""
    return json.dumps({"driver": driver, "sketches": {n: {"count": c, "last_ms": t, "version": v}
                                                      for n, (c, t, v) in sketches.items()}}).encode()


def test_the_location_is_the_setting_else_beside_the_first_table_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("IMP_PUBLISH_LOCATION", raising=False)
    assert publish_location(["/lake/a", "/lake2/b"]) == "/lake/_imp_sketches"
    assert publish_location(["s3://bucket/w/orders/"]) == "s3://bucket/w/_imp_sketches"
    assert publish_location([]) is None
    monkeypatch.setenv("IMP_PUBLISH_LOCATION", "s3://pub/sketches/")
    assert publish_location(["/lake/a"]) == "s3://pub/sketches"
    assert publish_location(["/lake/a"], configured="/elsewhere") == "/elsewhere"


def test_counts_are_summed_over_drivers_and_the_latest_time_wins(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("IMP_PUBLISH_LOCATION", raising=False)
    (tmp_path / "orders").mkdir()
    folder = tmp_path / "_imp_sketches" / APPLICATIONS_DIR
    folder.mkdir(parents=True)
    (folder / "host-1-1.json").write_bytes(_driver({"top": (3, T0, 4), "rev": (1, T0 + 5, 2)}))
    (folder / "host-2-9.json").write_bytes(_driver({"top": (4, T0 + 60_000, 5)}, "host-2-9"))
    # a file being replaced, a damaged one, one of another shape, a negative count: none of them counted
    (folder / ".host-3-3.json.tmp").write_bytes(_driver({"top": (100, T0, 9)}))
    (folder / "host-4-4.json").write_bytes(b'{"driver": "host-4-4", "sketches": {"top": {"count": 7')
    (folder / "host-5-5.json").write_bytes(b'{"sketches": {"top": {"count": "7", "last_ms": 1, "version": 1}}}')
    (folder / "host-6-6.json").write_bytes(_driver({"top": (-2, T0, 4)}))
    (folder / "notes.txt").write_text("not a driver file")

    found = read_counts(str(tmp_path / "_imp_sketches"))
    assert found["top"] == {"applied": 7, "last_applied": "2027-01-15T08:01:00+00:00", "version": 5, "drivers": 2}
    assert found["rev"]["applied"] == 1 and found["rev"]["version"] == 2

    paths = {"orders": str(tmp_path / "orders"), "parts": "/nowhere/parts"}
    got = applications({"top": ["orders"], "rev": ["parts", "orders"], "other": ["parts"], "none": []}, paths)
    # rev's first table by name is orders (beside which the location is); other's location has no files
    assert set(got) == {"top", "rev"} and got["top"]["applied"] == 7
    assert read_counts(str(tmp_path / "missing")) == {}


def test_counts_on_s3_are_read_with_one_listing(s3_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from imp_core.airflow.delta_log import s3_client

    client = s3_client()
    client.put_object(Bucket="lake", Key=f"pub/{APPLICATIONS_DIR}/d1.json", Body=_driver({"top": (2, T0, 1)}))
    client.put_object(Bucket="lake", Key=f"pub/{APPLICATIONS_DIR}/d2.json", Body=_driver({"top": (5, T0 + 1, 3)}))
    monkeypatch.setenv("IMP_PUBLISH_LOCATION", "s3://lake/pub")
    got = applications({"top": ["orders"]}, {"orders": "s3://lake/w/orders"})
    assert got["top"]["applied"] == 7 and got["top"]["version"] == 3 and got["top"]["drivers"] == 2
    # an unreadable location (no such bucket) gives no figures instead of an error on the page
    assert read_counts("s3://no-such-bucket/pub") == {}


def test_the_page_shows_how_often_and_when_last_each_sketch_was_applied() -> None:
    rows: list[dict[str, Any]] = [_row("top"), _row("rev")]
    annotate(rows, {}, [], optimizer={"top": {"applied": 7, "last_applied": "2027-01-15T08:01:00+00:00",
                                              "version": 5, "drivers": 2}})
    page = render_page(rows)
    top = page.split('data-sketch="top"')[1].split("</tr>")[0]
    rev = page.split('data-sketch="rev"')[1].split("</tr>")[0]
    assert '<td class="optimizer">7 queries (v5 last)<br><code>2027-01-15T08:01:00</code></td>' in top
    assert "not reported" in rev

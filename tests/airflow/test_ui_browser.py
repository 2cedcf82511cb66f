"""In a real headless Chromium (Debian's ``chromium``, driven by Playwright): log in to the Airflow UI, open the Sketch
catalog page, trigger ``imp_maintain_on_demand`` from the trigger form and watch the run succeed.

Screenshots go to ``artifacts/airflow/`` (git-ignored) so a developer can see what a user sees.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

from tests.airflow.conftest import APPLE_ROW, AirflowServer, Imp, log_in

pytestmark = [pytest.mark.airflow, pytest.mark.browser, pytest.mark.spark, pytest.mark.postgres, pytest.mark.slow]

def test_catalog_page_and_trigger_form(imp: Imp, airflow_server: AirflowServer, browser: Any,
                                       artifacts: Path) -> None:
    from playwright.sync_api import expect

    imp.table("ui_sales")
    imp.sketch("ui_top", "ui_sales")
    imp.append("ui_sales", APPLE_ROW)
    base = airflow_server.base_url
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.set_default_timeout(30_000)
    try:
        log_in(page, airflow_server, artifacts / "01-login.png")

        # the Sketch catalog page, inside the UI (Browse menu entry -> /plugin/sketch-catalog, an iframe)
        page.goto(f"{base}/plugin/sketch-catalog")
        frame = page.frame_locator("iframe")
        expect(frame.get_by_role("heading", name="Sketch catalog")).to_be_visible()
        row = frame.locator('tr[data-sketch="ui_top"]')
        expect(row).to_be_visible()
        # the page only reads; observing the tables' new versions is an explicit action (a POST)
        frame.get_by_role("button", name="Observe table versions now").click()
        row = frame.locator('tr[data-sketch="ui_top"]')
        expect(row).to_contain_text("stale")
        expect(row).to_contain_text("2 of 4 fragments")
        page.screenshot(path=str(artifacts / "02-sketch-catalog.png"))

        # trigger the on-demand DAG from its trigger form, with a sketch name
        page.goto(f"{base}/dags/imp_maintain_on_demand")
        page.get_by_role("button", name="Trigger").first.click()
        dialog = page.get_by_role("dialog")
        expect(dialog.get_by_text("Name of the sketch to maintain")).to_be_visible()
        dialog.locator("#element_sketch").fill("ui_top")
        page.screenshot(path=str(artifacts / "03-trigger-form.png"))
        dialog.get_by_role("button", name="Trigger").click()
        page.wait_for_url("**/dags/imp_maintain_on_demand/runs/**")
        run_id = unquote(page.url.rsplit("/runs/", 1)[1].split("?")[0])

        # the run page shows the run succeed (the UI refreshes a running run itself; reload now and then anyway)
        rows = {task: page.get_by_role("row", name=task) for task in ("validate_request", "maintain_sketch")}
        deadline = time.monotonic() + 240
        last_reload = time.monotonic()
        while True:
            rows["maintain_sketch"].wait_for(state="visible")
            text = rows["maintain_sketch"].inner_text()
            if "Success" in text or "Failed" in text:
                break
            assert time.monotonic() < deadline, "the run triggered from the UI did not finish in 240 s"
            page.wait_for_timeout(1000)
            if time.monotonic() - last_reload > 20:
                page.reload()
                last_reload = time.monotonic()
        for row in rows.values():
            expect(row).to_contain_text("Success")
        assert airflow_server.wait_run("imp_maintain_on_demand", run_id, timeout=30) == "success"
        page.screenshot(path=str(artifacts / "04-run-succeeded.png"))

        latest = imp.latest("ui_top")
        assert latest.version == 2 and latest.fragments == {"ui_sales": [0, 1, 2, 3]}
        assert imp.runs("ui_top")[0].trigger == f"airflow:imp_maintain_on_demand/{run_id}"

        # and the catalog page now shows the sketch fresh at version 2
        page.goto(f"{base}/plugin/sketch-catalog")
        row = page.frame_locator("iframe").locator('tr[data-sketch="ui_top"]')
        expect(row).to_contain_text("fresh")
        expect(row).to_contain_text("v2 (incremental)")
        expect(row).to_contain_text("4 of 4 fragments")
        page.screenshot(path=str(artifacts / "05-sketch-catalog-after.png"))
    except Exception:
        page.screenshot(path=str(artifacts / "99-failure.png"))
        raise
    finally:
        page.close()

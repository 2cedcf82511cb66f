"""The "Sketch catalog" page of the Airflow UI: a small FastAPI app the plugin mounts in the api-server.

Routes (relative to the plugin's ``url_prefix``, ``/imp``):

* ``GET /catalog``: the HTML page (shown inside the Airflow UI at ``/plugin/sketch-catalog``);
* ``GET /api/sketches``: the same rows as JSON.

Every route requires an Airflow login (``GetUserDep``: the UI's cookie or a ``Bearer`` token from
``POST /auth/token``); anonymous requests get 401. The rows come from ``SketchService.overview`` (the
``sketch_catalog`` view plus sketch size and covered share), with the tables' current Delta versions observed first
unless ``?refresh=false``.
"""

from __future__ import annotations

import html
import threading
from typing import Any

from fastapi import FastAPI, Query
from fastapi.responses import HTMLResponse, RedirectResponse

from airflow.api_fastapi.core_api.security import GetUserDep

from imp_core.airflow import CATALOG_CONN_ID

URL_PREFIX = "/imp"
PAGE_PATH = "/catalog"
API_PATH = "/api/sketches"
URL_ROUTE = "sketch-catalog"

_lock = threading.Lock()
_catalogs: dict[str, Any] = {}


def _service(conn_id: str):  # noqa: ANN202
    """A service on the (cached) catalog: connecting checks the schema, so do it once per api-server process."""
    from imp_core.airflow.hooks import ImpCatalogHook
    from imp_core.catalog.store import Catalog
    from imp_core.maintenance.service import SketchService

    hook = ImpCatalogHook(conn_id)
    settings = hook.settings()
    key = f"{settings.catalog_url or ''}|{settings.home}"
    with _lock:
        catalog = _catalogs.get(key)
        if catalog is None:
            catalog = _catalogs[key] = Catalog.connect(settings)
    return SketchService(settings, catalog=catalog)


def catalog_rows(refresh: bool = True, conn_id: str = CATALOG_CONN_ID) -> list[dict[str, Any]]:
    return _service(conn_id).overview(refresh=refresh)


def create_app(conn_id: str = CATALOG_CONN_ID) -> FastAPI:
    """The FastAPI app the plugin registers under :data:`URL_PREFIX`."""
    app = FastAPI(title="imp sketch catalog", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/", include_in_schema=False)
    def index(user: GetUserDep) -> RedirectResponse:
        return RedirectResponse(url=f"{URL_PREFIX}{PAGE_PATH}")

    @app.get(API_PATH)
    def sketches(user: GetUserDep, refresh: bool = Query(True, description="observe table versions first")
                 ) -> dict[str, Any]:
        return {"sketches": catalog_rows(refresh, conn_id)}

    @app.get(PAGE_PATH, response_class=HTMLResponse)
    def page(user: GetUserDep, refresh: bool = Query(True)) -> HTMLResponse:
        try:
            rows = catalog_rows(refresh, conn_id)
            error = None
        except Exception as e:  # noqa: BLE001 - show the catalog problem on the page instead of a bare 500
            rows, error = [], str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return HTMLResponse(render_page(rows, error, getattr(user, "get_name", lambda: "")()))

    return app


# -- rendering ------------------------------------------------------------------------------------------------------

_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1.5rem; color: #1a202c; }
h1 { font-size: 1.4rem; margin: 0 0 .25rem 0; }
p.sub { color: #4a5568; margin: 0 0 1rem 0; }
table { border-collapse: collapse; width: 100%; font-size: .9rem; }
th, td { text-align: left; padding: .45rem .6rem; border-bottom: 1px solid #e2e8f0; vertical-align: top; }
th { background: #f7fafc; font-weight: 600; }
code { font-size: .8rem; color: #2d3748; }
.badge { display: inline-block; padding: .1rem .5rem; border-radius: .75rem; font-size: .8rem; font-weight: 600; }
.stale { background: #fefcbf; color: #744210; } .fresh { background: #c6f6d5; color: #22543d; }
.succeeded { background: #c6f6d5; color: #22543d; } .failed { background: #fed7d7; color: #822727; }
.running { background: #bee3f8; color: #2a4365; } .none { background: #edf2f7; color: #4a5568; }
.err { color: #822727; font-size: .8rem; } .bar { background: #edf2f7; width: 6rem; height: .5rem; border-radius: .25rem; }
.bar > span { display: block; height: 100%; background: #3182ce; border-radius: .25rem; }
.sql { max-width: 28rem; white-space: pre-wrap; }
"""


def render_page(rows: list[dict[str, Any]], error: str | None = None, user: str = "") -> str:
    e = html.escape
    body = []
    if error:
        body.append(f'<p class="err">Cannot read the sketch catalog: {e(error)}</p>')
    elif not rows:
        body.append("<p>No sketches yet. Register one with <code>imp sketch create</code> or the "
                    "<code>imp_register_sketch</code> DAG.</p>")
    else:
        body.append("<table><thead><tr><th>Sketch</th><th>Latest version</th><th>Table versions (sketch / current)"
                    "</th><th>Freshness</th><th>Last run</th><th>Sketch size</th><th>Covered share</th></tr>"
                    "</thead><tbody>")
        for r in rows:
            tv, cur = r["table_versions"], r["current_table_versions"]
            versions = "<br>".join(f"{e(t)}: {e(str(v))} / {e(str(cur.get(t, '?')))}" for t, v in sorted(tv.items()))
            fresh = '<span class="badge stale">stale</span>' if r["stale"] else '<span class="badge fresh">fresh</span>'
            run = r["last_run"]
            status = run["status"] or "none"
            last = (f'<span class="badge {e(status)}">{e(status)}</span> #{e(str(run["id"]))}'
                    if run["id"] is not None else '<span class="badge none">none</span>')
            if run["finished_at"]:
                last += f'<br><code>{e(str(run["finished_at"])[:19])}</code>'
            if run["error"]:
                last += f'<br><span class="err">{e(run["error"])}</span>'
            size = "<br>".join(f'{e(p["table"])}.{e(p["column"])}: {p["fragments"]} of {p["fragment_count"]} fragments'
                               for p in r["partitions"])
            share = "<br>".join(f'<div class="bar"><span style="width:{p["covered_share"] * 100:.1f}%"></span></div>'
                                f'{p["covered_share"]:.1%}' for p in r["partitions"])
            body.append(
                f'<tr data-sketch="{e(r["name"])}"><td><strong>{e(r["name"])}</strong><br>'
                f'<code class="sql">{e(r["sql"])}</code></td>'
                f'<td>v{e(str(r["latest_version"]))} ({e(str(r["latest_method"]))})<br>'
                f'<code>{e(str(r["version_created_at"] or "")[:19])}</code></td>'
                f"<td>{versions}</td><td>{fresh}</td><td>{last}</td><td>{size}</td><td>{share}</td></tr>")
        body.append("</tbody></table>")
    stale = sum(1 for r in rows if r["stale"])
    who = f" Signed in as {e(user)}." if user else ""
    return (f"<!doctype html><html><head><meta charset=\"utf-8\"><title>Sketch catalog</title>"
            f"<style>{_STYLE}</style></head><body><h1>Sketch catalog</h1>"
            f'<p class="sub">{len(rows)} sketch(es), {stale} stale. Maintain one with the '
            f'<a href="/dags/imp_maintain_on_demand" target="_top">imp_maintain_on_demand</a> DAG; stale ones are '
            f'maintained nightly by <a href="/dags/imp_nightly_maintenance" target="_top">imp_nightly_maintenance'
            f"</a>.{who}</p>{''.join(body)}</body></html>")


__all__ = ["API_PATH", "PAGE_PATH", "URL_PREFIX", "URL_ROUTE", "catalog_rows", "create_app", "render_page"]

"""The "Sketch catalog" page of the Airflow UI: a small FastAPI app the plugin mounts in the api-server.

Routes (relative to the plugin's ``url_prefix``, ``/imp``):

* ``GET /catalog``: the HTML page (shown inside the Airflow UI at ``/plugin/sketch-catalog``);
* ``GET /api/sketches``: the same rows as JSON;
* ``POST /refresh``: observe the tables' current Delta versions (writes ``table_observation``), then back to the
  page. The only route that writes anything.

Who may see what is decided by Airflow's auth manager, like Airflow's own pages:

* every route needs a login (``GetUserDep``: the UI's cookie or a ``Bearer`` token);
* reading the page or the JSON needs the custom view ``Sketch catalog`` (``GET``) and read access to the DAGs that
  maintain sketches (``imp_nightly_maintenance``, ``imp_maintain_on_demand``); otherwise 403;
* a sketch's SQL is shown only to users who may read those DAGs' code, run errors only to users who may read
  their task logs (both can quote tables, paths and values);
* refreshing needs ``POST`` on the custom view and the right to trigger ``imp_maintain_on_demand``.

GETs only read the catalog and Airflow's asset events: no table observations are written and no Delta log is opened.
Freshness (:mod:`imp_core.airflow.freshness`) is as of the last observation (a refresh, a maintenance run) or the
commit trigger's last event, whichever is newer: per sketch the table versions behind, how long ago the commits it
missed were made (users who may read assets), its last maintenance (method, duration) and a plot of its recent
versions' maintenance time and change rows, and how often the optimizer applied it (the Spark extension's
per-driver counts, :mod:`imp_core.airflow.applications`). Links are relative, so the page works under any
``[api] base_url`` path.
"""

from __future__ import annotations

import html
from datetime import datetime, timedelta, timezone
from typing import Any
from urllib.parse import urlsplit

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.base_auth_manager import ResourceMethod
from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails
from airflow.api_fastapi.core_api.security import GetUserDep
from airflow.models.asset import AssetEvent, AssetModel
from airflow.models.dag import DagModel
from airflow.utils.session import create_session
from fastapi import Depends, FastAPI, HTTPException, Request, status
from fastapi.responses import HTMLResponse, RedirectResponse
from sqlalchemy import select

from imp_core.airflow import CATALOG_CONN_ID
from imp_core.airflow.applications import applications
from imp_core.airflow.assets import TABLE_GROUP
from imp_core.airflow.freshness import TableCommit, age, annotate, plot_svg
from imp_core.airflow.hooks import ImpCatalogHook
from imp_core.errors import first_line
from imp_core.security.redact import scrub

URL_PREFIX = "/imp"
PAGE_PATH = "/catalog"
API_PATH = "/api/sketches"
REFRESH_PATH = "/refresh"
URL_ROUTE = "sketch-catalog"
RESOURCE_NAME = "Sketch catalog"
"""The custom view the auth manager is asked about (``is_authorized_custom_view``)."""
MAINTENANCE_DAGS = ("imp_nightly_maintenance", "imp_maintain_on_demand")
TRIGGER_DAG = "imp_maintain_on_demand"


# -- authorization ---------------------------------------------------------------------------------------------------


def _dag_allowed(user: Any, method: ResourceMethod, dag_id: str, entity: Any = None) -> bool:
    try:
        team = DagModel.get_team_name(dag_id)
    except Exception:  # noqa: BLE001 - no team lookup possible: ask without one
        team = None
    return bool(get_auth_manager().is_authorized_dag(method=method, access_entity=entity,
                                                     details=DagDetails(id=dag_id, team_name=team), user=user))


def _view_allowed(user: Any, method: ResourceMethod) -> bool:
    return bool(get_auth_manager().is_authorized_custom_view(method=method, resource_name=RESOURCE_NAME, user=user))


def may_read(user: Any) -> bool:
    """Whether ``user`` may see the page: the custom view, and the DAGs that maintain sketches."""
    return _view_allowed(user, "GET") and all(_dag_allowed(user, "GET", d) for d in MAINTENANCE_DAGS)


def may_refresh(user: Any) -> bool:
    """Whether ``user`` may observe table versions (a catalog write): ``POST`` on the view and triggering a run."""
    return _view_allowed(user, "POST") and _dag_allowed(user, "POST", TRIGGER_DAG, DagAccessEntity.RUN)


def detail_rights(user: Any) -> dict[str, bool]:
    """What of each row ``user`` may see: the SQL (DAG code) and run errors (task logs)."""
    return {
        "sql": all(_dag_allowed(user, "GET", d, DagAccessEntity.CODE) for d in MAINTENANCE_DAGS),
        "errors": all(_dag_allowed(user, "GET", d, DagAccessEntity.TASK_LOGS) for d in MAINTENANCE_DAGS),
        "refresh": may_refresh(user),
        "assets": bool(get_auth_manager().is_authorized_asset(method="GET", user=user)),
    }


def _requires_read(user: GetUserDep) -> Any:
    if not may_read(user):
        raise HTTPException(status.HTTP_403_FORBIDDEN, "Forbidden: reading the sketch catalog needs the 'Sketch "
                                                       "catalog' view and read access to the imp maintenance DAGs")
    return user


def _requires_refresh(request: Request, user: GetUserDep) -> Any:
    origin = request.headers.get("origin")
    if origin is not None and origin != "null" and urlsplit(origin).netloc != request.url.netloc:
        raise HTTPException(status.HTTP_403_FORBIDDEN, "Forbidden: cross-site request")
    if not may_refresh(user):
        raise HTTPException(status.HTTP_403_FORBIDDEN, "Forbidden: refreshing the sketch catalog needs the right to "
                                                       "trigger imp_maintain_on_demand")
    return user


ReaderDep = Depends(_requires_read)
RefresherDep = Depends(_requires_refresh)


# -- data --------------------------------------------------------------------------------------------------------


def catalog_rows(conn_id: str = CATALOG_CONN_ID, rights: dict[str, bool] | None = None) -> list[dict[str, Any]]:
    """The page's rows, read from the catalog only (no observation is written, no Delta log opened).

    ``rights`` (from :func:`detail_rights`) hides the SQL and run errors of users who may not see them.
    """
    # one catalog connection per api-server process: connecting checks the schema
    service = ImpCatalogHook(conn_id).get_conn(shared=True)
    rows = service.overview(refresh=False)
    rights = rights or {"sql": True, "errors": True, "assets": True}
    ids = {r.name: r.id for r in service.catalog.list_sketches()}
    recent = service.catalog.recent_versions([ids[r["name"]] for r in rows if r["name"] in ids])
    history = {name: recent.get(i, []) for name, i in ids.items()}
    paths = {t.name: t.path for t in service.catalog.list_tables()}
    applied = applications({r["name"]: list(r.get("table_versions") or ()) for r in rows}, paths)
    annotate(rows, history, table_commits() if rights.get("assets") else [], optimizer=applied)
    for row in rows:
        if not rights.get("sql"):
            row["sql"] = None
        if not rights.get("errors") and row["last_run"]["error"]:
            row["last_run"]["error"] = None
            row["last_run"]["error_hidden"] = True
        if not rights.get("errors") and row.get("unusable_reason"):
            row["unusable_reason"] = None
            row["unusable_reason_hidden"] = True
    return rows


def table_commits(within: float = 7 * 86400, limit: int = 20_000) -> list[TableCommit]:
    """The table versions the commit trigger reported (its asset events on the table assets, newest ``limit``
    within ``within`` seconds), read from Airflow's database."""
    since = datetime.now(timezone.utc) - timedelta(seconds=within)
    with create_session() as session:
        found = session.execute(
            select(AssetEvent.extra).join(AssetModel, AssetModel.id == AssetEvent.asset_id)
            .where(AssetModel.group == TABLE_GROUP, AssetEvent.timestamp >= since)
            .order_by(AssetEvent.id.desc()).limit(limit)).scalars().all()
    out = []
    for extra in found:
        payload = (extra or {}).get("payload") if (extra or {}).get("from_trigger") else None
        if isinstance(payload, dict) and isinstance(payload.get("version"), int):
            out += [TableCommit(t, payload["version"], float(payload.get("committed_at") or 0.0))
                    for t in payload.get("tables") or ()]
    return out


def refresh(conn_id: str = CATALOG_CONN_ID) -> dict[str, int | str]:
    """Observe every registered table's current Delta version (what ``POST /refresh`` does)."""
    return ImpCatalogHook(conn_id).get_conn(shared=True).refresh_observations(strict=False)


def create_app(conn_id: str = CATALOG_CONN_ID) -> FastAPI:
    """The FastAPI app the plugin registers under :data:`URL_PREFIX`."""
    app = FastAPI(title="imp sketch catalog", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/", include_in_schema=False)
    def index(user: GetUserDep) -> RedirectResponse:
        return RedirectResponse(url=PAGE_PATH.lstrip("/"))  # relative: works under any base path

    @app.get(API_PATH)
    def sketches(user: Any = ReaderDep) -> dict[str, Any]:
        return {"sketches": catalog_rows(conn_id, detail_rights(user))}

    @app.get(PAGE_PATH, response_class=HTMLResponse)
    def page(user: Any = ReaderDep) -> HTMLResponse:
        rights = detail_rights(user)
        try:
            rows, error = catalog_rows(conn_id, rights), None
        except Exception as e:  # noqa: BLE001 - show the catalog problem on the page instead of a bare 500
            rows, error = [], scrub(first_line(e))
        return HTMLResponse(render_page(rows, error, getattr(user, "get_name", lambda: "")(), rights["refresh"]))

    @app.post(REFRESH_PATH)
    def refresh_now(user: Any = RefresherDep) -> RedirectResponse:
        refresh(conn_id)
        # 303: the browser GETs the page again; relative to /imp/refresh, so under any base path
        return RedirectResponse(url=PAGE_PATH.lstrip("/"), status_code=status.HTTP_303_SEE_OTHER)

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
.unusable { background: #fed7d7; color: #822727; }
.err { color: #822727; font-size: .8rem; }
.bar { background: #edf2f7; width: 6rem; height: .5rem; border-radius: .25rem; }
.bar > span { display: block; height: 100%; background: #3182ce; border-radius: .25rem; }
.sql { max-width: 28rem; white-space: pre-wrap; } .hidden { color: #718096; font-style: italic; }
form.refresh { display: inline; } form.refresh button { font-size: .8rem; }
svg.plot rect.rows { fill: #90cdf4; } svg.plot polyline.time { stroke: #c05621; stroke-width: 1.5; }
svg.plot { background: #f7fafc; border-radius: .25rem; } .behind { font-weight: 600; color: #744210; }
.legend { font-size: .7rem; color: #4a5568; } .legend .rows { color: #90cdf4; } .legend .time { color: #c05621; }
"""


def state_cell(state: list[dict[str, Any]], e: Any) -> str:
    """Where each operator's state lives and how big it is (from the latest version)."""
    if not state:
        return '<span class="hidden">in memory (not measured)</span>'
    lines = []
    for op in state:
        size = f"{(op.get('bytes') or 0) / (1 << 20):.1f} MB"
        rows = f", {op['rows']:,} rows" if op.get("rows") is not None else ""
        lines.append(f"{e(op['operator'])}: <strong>{e(op['where'])}</strong> ({size}{rows})")
    return "<br>".join(lines)


def _stale(r: dict[str, Any]) -> bool:
    return bool(r["stale"] or (r.get("freshness") or {}).get("behind"))


def _row_html(r: dict[str, Any], e: Any) -> str:
    """One sketch's row of the page."""
    tv, cur = r["table_versions"], r["current_table_versions"]
    fresh_tables = (r.get("freshness") or {}).get("tables") or {}
    versions = "<br>".join(f"{e(t)}: {e(str(v))} / {e(str(fresh_tables.get(t, {}).get('current', cur.get(t, '?'))))}"
                           for t, v in sorted(tv.items()))
    fresh = _freshness_cell(r, e)
    run = r["last_run"]
    status_ = run["status"] or "none"
    last = (f'<span class="badge {e(status_)}">{e(status_)}</span> #{e(str(run["id"]))}'
            if run["id"] is not None else '<span class="badge none">none</span>')
    if run["finished_at"]:
        last += f'<br><code>{e(str(run["finished_at"])[:19])}</code>'
    if run["error"]:
        last += f'<br><span class="err">{e(run["error"])}</span>'
    elif run.get("error_hidden"):
        last += '<br><span class="hidden">error hidden (needs access to the task logs)</span>'
    sql = (f'<code class="sql">{e(r["sql"])}</code>' if r["sql"] is not None
           else '<span class="hidden">SQL hidden (needs access to the DAG code)</span>')
    size = "<br>".join(f'{e(p["table"])}.{e(p["column"])}: {p["fragments"]} of {p["fragment_count"]} fragments'
                       for p in r["partitions"])
    share = "<br>".join(f'<div class="bar"><span style="width:{p["covered_share"] * 100:.1f}%"></span></div>'
                        f'{p["covered_share"]:.1%}' for p in r["partitions"])
    m = r.get("last_maintenance")
    maintained = '<span class="hidden">not maintained yet</span>'
    if m:
        took = "" if m.get("duration_ms") is None else f" in {m['duration_ms'] / 1000:.2f} s"
        maintained = (f"v{e(str(m['version']))} {e(str(m['method']))}{took}, {m['delta_rows']:,} change rows"
                      f"<br><code>{e(str(m.get('created_at') or '')[:19])}</code>")
    applied = r.get("optimizer") or {}
    optimizer = (f'{applied["applied"]:,} quer{"y" if applied["applied"] == 1 else "ies"} (v'
                 f'{e(str(applied.get("version")))} last)<br><code>{e(str(applied.get("last_applied") or "")[:19])}'
                 f'</code>' if applied.get("applied") is not None
                 else '<span class="hidden">not reported (needs the Spark extension)</span>')
    return (f'<tr data-sketch="{e(r["name"])}"><td><strong>{e(r["name"])}</strong><br>{sql}</td>'
            f'<td>v{e(str(r["latest_version"]))} ({e(str(r["latest_method"]))})<br>'
            f'<code>{e(str(r["version_created_at"] or "")[:19])}</code></td>'
            f'<td>{versions}</td><td class="freshness">{fresh}</td><td class="maintenance">{maintained}</td>'
            f'<td class="history">{plot_svg(r.get("history") or [])}</td><td class="optimizer">{optimizer}</td>'
            f"<td>{last}</td><td>{size}</td><td>{share}</td><td>{state_cell(r.get('state') or [], e)}</td></tr>")


def _freshness_cell(r: dict[str, Any], e: Any) -> str:
    """The badge, the versions behind and how long ago the missed commits were made."""
    f = r.get("freshness") or {}
    if not r.get("usable", True):  # queries run without it until it is recaptured
        cell = '<span class="badge unusable">unusable</span>'
        if r.get("unusable_reason"):
            cell += f'<br><span class="err">{e(r["unusable_reason"])}</span>'
        elif r.get("unusable_reason_hidden"):
            cell += '<br><span class="hidden">reason hidden (needs access to the task logs)</span>'
        return cell
    if not _stale(r):
        return '<span class="badge fresh">fresh</span>'
    behind = f.get("behind")
    cell = '<span class="badge stale">stale</span>'
    if behind:
        cell += f'<br><span class="behind">{behind} version{"s" if behind != 1 else ""} behind</span>'
    if f.get("last_missed_age") is not None:
        first = "" if f.get("first_missed_age") == f.get("last_missed_age") else \
            f" (first {age(f['first_missed_age'])} ago)"
        cell += f'<br>last missed commit {age(f["last_missed_age"])} ago{first}'
    return cell


def render_page(rows: list[dict[str, Any]], error: str | None = None, user: str = "",
                can_refresh: bool = False) -> str:
    e = html.escape
    body = []
    if error:
        body.append(f'<p class="err">Cannot read the sketch catalog: {e(error)}</p>')
    elif not rows:
        body.append("<p>No sketches yet. Register one with <code>imp sketch create</code> or the "
                    "<code>imp_register_sketch</code> DAG.</p>")
    else:
        body.append("<table><thead><tr><th>Sketch</th><th>Latest version</th><th>Table versions (sketch / current)"
                    "</th><th>Freshness</th><th>Last maintenance</th><th>Recent versions</th><th>Applied by the "
                    "optimizer</th><th>Last run</th><th>Sketch size</th><th>Covered share</th><th>Operator state</th>"
                    "</tr></thead><tbody>")
        for r in rows:
            body.append(_row_html(r, e))
        body.append("</tbody></table>")
    stale = sum(1 for r in rows if _stale(r))
    unusable = sum(1 for r in rows if not r.get("usable", True))
    who = f" Signed in as {e(user)}." if user else ""
    refresh = ('<form class="refresh" method="post" action="refresh"><button type="submit">Observe table versions '
               'now</button></form>' if can_refresh else "")
    # relative links: this page is <base>/imp/catalog, Airflow's DAG pages are <base>/dags/<id>
    return (f"<!doctype html><html><head><meta charset=\"utf-8\"><title>Sketch catalog</title>"
            f"<style>{_STYLE}</style></head><body><h1>Sketch catalog</h1>"
            f'<p class="sub">{len(rows)} sketch(es), {stale} stale as of the last observation of their tables'
            f'{f", {unusable} unusable (queries run without them; recapture to use them again)" if unusable else ""}. '
            f'Maintain one with the <a href="../dags/imp_maintain_on_demand" target="_top">imp_maintain_on_demand'
            f'</a> DAG; stale ones are maintained nightly by <a href="../dags/imp_nightly_maintenance" '
            f'target="_top">imp_nightly_maintenance</a>.{who} {refresh}</p>{"".join(body)}</body></html>')


__all__ = ["API_PATH", "MAINTENANCE_DAGS", "PAGE_PATH", "REFRESH_PATH", "RESOURCE_NAME", "URL_PREFIX", "URL_ROUTE",
           "catalog_rows", "create_app", "detail_rights", "may_read", "may_refresh", "refresh", "render_page"]

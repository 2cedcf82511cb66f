"""Registers imp with Airflow: the "Sketch catalog" page (a FastAPI app and its UI menu entry).

Registration only; the app lives in ``imp_core.airflow.web``. The page is served at ``/imp/catalog`` behind Airflow's
login and auth manager, and shown inside the UI at ``/plugin/sketch-catalog`` (Browse menu). The view's ``href`` is
relative (no leading ``/``): the UI resolves it against its base URL, so the page also works when Airflow is served
under a path (``[api] base_url = https://host/airflow``).
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from imp_core.airflow import web


class ImpPlugin(AirflowPlugin):
    name = "imp"
    fastapi_apps = [{"app": web.create_app(), "url_prefix": web.URL_PREFIX, "name": "imp sketch catalog"}]
    external_views = [
        {
            "name": "Sketch catalog",
            "href": f"{web.URL_PREFIX}{web.PAGE_PATH}".lstrip("/"),
            "url_route": web.URL_ROUTE,
            "destination": "nav",
            "category": "browse",
        }
    ]

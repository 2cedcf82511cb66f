"""An auth manager for the security tests: Airflow's simple auth manager plus two users with narrower rights.

Airflow's simple auth manager grants by role only (every viewer may read every DAG's code and logs). Real
deployments narrow that with their auth manager (FAB roles, Keycloak, ...); these two users stand for that:

* ``outsider`` (role viewer): may see nothing that belongs to imp (no imp DAG, not the ``Sketch catalog`` view);
* ``reader`` (role viewer): may see the imp DAGs and the view, but neither DAG code nor task logs.

Loaded by the test api-server through ``AIRFLOW__CORE__AUTH_MANAGER``; the page must ask it, not decide itself.
"""

from __future__ import annotations

from typing import Any

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager


class RestrictedAuthManager(SimpleAuthManager):
    def is_authorized_dag(self, *, method: Any, user: Any, access_entity: Any = None, details: Any = None) -> bool:
        name = user.get_name()
        if name == "outsider" and details is not None and (details.id or "").startswith("imp_"):
            return False
        if name == "reader" and access_entity in (DagAccessEntity.CODE, DagAccessEntity.TASK_LOGS):
            return False
        return super().is_authorized_dag(method=method, user=user, access_entity=access_entity, details=details)

    def is_authorized_custom_view(self, *, method: Any, resource_name: str, user: Any) -> bool:
        if user.get_name() == "outsider":
            return False
        return super().is_authorized_custom_view(method=method, resource_name=resource_name, user=user)

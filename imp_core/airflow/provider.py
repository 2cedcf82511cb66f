"""What this package tells Airflow about itself, through the ``apache_airflow_provider`` entry point of
pyproject.toml: the ``imp`` asset URI scheme of sketches (its check, factory and OpenLineage name) and the trigger
that watches Delta logs. Airflow's providers manager calls :func:`get_provider_info`; nothing here imports Airflow.
"""

from __future__ import annotations

from typing import Any

_ASSETS = "imp_core.airflow.assets"


def get_provider_info() -> dict[str, Any]:
    """The provider description Airflow validates against its ``provider_info.schema.json``."""
    uris = [{"schemes": ["imp"], "handler": f"{_ASSETS}.sanitize_uri", "factory": f"{_ASSETS}.create_asset",
             "to_openlineage_converter": f"{_ASSETS}.convert_asset_to_openlineage"}]
    return {
        "package-name": "imp-spark",  # the distribution's name: Airflow refuses a provider whose name differs
        "name": "imp",
        "description": "Provenance sketches kept fresh under updates: sketch assets (imp://<catalog>/<sketch>) and "
                       "the Delta commit trigger.",
        "asset-uris": uris,
        "dataset-uris": uris,  # the same under its older name, read by OpenLineage's converters
        "triggers": [{"integration-name": "imp", "python-modules": ["imp_core.airflow.triggers"]}],
    }


__all__ = ["get_provider_info"]

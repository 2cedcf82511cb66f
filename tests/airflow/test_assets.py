"""Asset URIs of tables and sketches, and the ``imp`` scheme as Airflow sees it through the package's provider
entry point (Airflow's own providers manager and ``Asset`` validation, no server)."""

from __future__ import annotations

import pytest

from imp_core.airflow import assets
from imp_core.airflow.lineage import dataset_name
from imp_core.airflow.provider import get_provider_info

pytestmark = pytest.mark.airflow


def test_table_uris_follow_airflows_rules(tmp_path) -> None:  # noqa: ANN001
    from airflow.sdk import Asset

    local = tmp_path / "my table"
    uri = assets.table_uri(str(local))
    assert uri == f"file://{str(local).replace(' ', '%20')}"
    assert Asset(uri).uri == uri  # already normalized: Airflow leaves it as it is
    assert assets.location_of(uri) == str(local)
    assert assets.table_uri("s3a://lake/sales/") == "s3://lake/sales" == Asset("s3://lake/sales").uri
    assert assets.table_uri(f"file://{local}/") == uri
    assert dataset_name(uri) == ("file", str(local).replace(" ", "%20"))
    assert dataset_name("s3://lake/db/sales") == ("s3://lake", "db/sales")


def test_the_imp_scheme_is_registered_with_airflow() -> None:
    from airflow.sdk import Asset
    from airflow.sdk.providers_manager_runtime import ProvidersManagerTaskRuntime

    info = get_provider_info()
    assert info["package-name"] == "imp-spark"
    manager = ProvidersManagerTaskRuntime()
    assert "imp-spark" in manager.providers  # found through the apache_airflow_provider entry point
    assert manager.asset_uri_handlers["imp"] is assets.sanitize_uri

    assert Asset("IMP://prod/top").uri == "imp://prod/top"  # Airflow lower-cases the scheme, our handler checks
    assert assets.sketch_asset("top", "prod").uri == "imp://prod/top"
    for bad, message in (("imp:///top", "names its catalog"), ("imp://prod/a/b", "names one sketch"),
                         ("imp://prod/top?x=1", "takes no query"), ("imp://prod/", "names one sketch")):
        with pytest.raises(ValueError, match=message):
            Asset(bad)
    assert assets.sketch_of_uri("imp://prod/top") == ("prod", "top") and assets.sketch_of_uri("s3://a/b") is None


def test_sketch_assets_become_openlineage_datasets() -> None:
    dataset = assets.convert_asset_to_openlineage(assets.create_asset(sketch="top", catalog="prod"), None)
    assert (dataset.namespace, dataset.name) == ("imp://prod", "top")


def test_the_catalog_name_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    from imp_core.config import WatchSettings
    from imp_core.errors import ConfigError

    monkeypatch.setenv("IMP_CATALOG_NAME", "prod-eu.1")
    assert assets.sketch_uri("top") == "imp://prod-eu.1/top"
    for bad, variable in (({"IMP_CATALOG_NAME": "a/b"}, "IMP_CATALOG_NAME"), ({"IMP_WATCH_INTERVAL": "0"},
                          "IMP_WATCH_INTERVAL"), ({"IMP_ON_COMMIT": "maybe"}, "IMP_ON_COMMIT"),
                          ({"IMP_ON_COMMIT_BATCH_SIZE": "0"}, "IMP_ON_COMMIT_BATCH_SIZE")):
        with pytest.raises(ConfigError, match=variable):
            WatchSettings.from_env(bad)
    assert WatchSettings.from_env({}) == WatchSettings(True, 5.0, 1000, "imp")


def test_what_a_job_committed_becomes_openlineage_datasets() -> None:
    from imp_core.airflow.lineage import JobLineage, SketchCommit

    commits = (SketchCommit("top", 5, (4, 5), "incremental", {"sales": 7, "dim": 2}, {"sales": 5, "dim": 2}, 12),
               SketchCommit("other", 3, (3,), "recapture", {"sales": 6}, {"sales": 4}, 0))
    lineage = JobLineage("airflow:d/r", commits, {"sales": "/data/sales", "dim": "s3a://lake/dim/"}, "prod")
    assert lineage.inputs() == [("s3://lake", "dim", 2), ("file", "/data/sales", 7)]  # the newest version reached
    assert lineage.outputs() == [("imp://prod", "top", 5), ("imp://prod", "other", 3)]
    ol = lineage.to_openlineage()
    assert [(d.namespace, d.name, d.facets["version"].datasetVersion) for d in ol.outputs] == [
        ("imp://prod", "top", "5"), ("imp://prod", "other", "3")]
    assert commits[0].asset_extra("airflow:d/r") == {
        "sketch": "top", "version": 5, "versions": [4, 5], "table_versions": {"sales": 7, "dim": 2},
        "table_versions_from": {"sales": 5, "dim": 2}, "method": "incremental", "delta_rows": 12,
        "trigger": "airflow:d/r"}

"""Object storage configured from one place: delta-rs options and Spark's S3A settings from the same values, from the
environment or the Airflow connection; secrets never printed."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow as pa
import pytest

from imp_core.errors import ConfigError
from imp_core.sources import storage
from imp_core.sources.storage import S3Config

SECRET = "wJalrXUtnFEMI-not-a-real-secret"


def test_uris_and_schemes() -> None:
    assert storage.spark_uri("s3://b/t") == "s3a://b/t" and storage.delta_rs_uri("s3a://b/t") == "s3://b/t"
    assert storage.normalize("s3a://b/t/") == "s3://b/t" and storage.normalize("/data/t") == "/data/t"
    assert storage.is_s3("s3://b/t") and storage.is_local("/x") and not storage.is_s3("gs://b/t")


def test_a_local_file_or_folder_exists_or_not(tmp_path) -> None:  # noqa: ANN001
    (tmp_path / "log").mkdir()
    (tmp_path / "log" / "00000000000000000003.json").write_text("{}")
    assert storage.exists(str(tmp_path / "log")) and storage.exists(f"file://{tmp_path}/log/00000000000000000003.json")
    assert not storage.exists(str(tmp_path / "log" / "00000000000000000004.json"))
    with pytest.raises(ConfigError):  # object storage is looked up through a Spark session
        storage.exists("s3://lake/t/_delta_log/00000000000000000000.json")


def test_one_config_feeds_both_readers() -> None:
    config = S3Config.from_env({"IMP_S3_ENDPOINT": "http://127.0.0.1:9000", "AWS_REGION": "eu-west-1",
                                "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE", "AWS_SECRET_ACCESS_KEY": SECRET,
                                "IMP_S3_PATH_STYLE": "true"})
    rs, s3a = config.delta_rs_options(), config.hadoop_conf()
    assert rs["AWS_ENDPOINT_URL"] == s3a["fs.s3a.endpoint"] == "http://127.0.0.1:9000"
    assert rs["AWS_SECRET_ACCESS_KEY"] == s3a["fs.s3a.secret.key"] == SECRET
    assert rs["AWS_ALLOW_HTTP"] == "true" and s3a["fs.s3a.connection.ssl.enabled"] == "false"
    assert s3a["fs.s3a.path.style.access"] == "true" and s3a["fs.s3a.endpoint.region"] == "eu-west-1"
    assert SECRET not in repr(config) and SECRET not in str(config)
    # IMP_S3_* wins over AWS_*; nothing configured leaves both readers to their default chains
    assert S3Config.from_env({"IMP_S3_REGION": "a", "AWS_REGION": "b"}).region == "a"
    assert S3Config().delta_rs_options() == {} and S3Config().hadoop_conf() == {}
    with pytest.raises(ConfigError, match="incomplete"):
        S3Config.from_env({"AWS_ACCESS_KEY_ID": "AKIAEXAMPLE"})


def test_an_installed_config_overrides_the_environment_and_secrets_are_redacted(monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("IMP_S3_ACCESS_KEY_ID", "env-key")
    monkeypatch.setenv("IMP_S3_SECRET_ACCESS_KEY", "env-secret-value")
    storage.configure(S3Config(access_key_id="conn-key", secret_access_key=SECRET))
    try:
        assert storage.s3_config().access_key_id == "conn-key"
        assert storage.redact(f"failed with {SECRET} inside") == "failed with *** inside"
    finally:
        storage.configure(None)
    assert storage.s3_config().secret_access_key == "env-secret-value"


@pytest.mark.airflow
def test_the_airflow_connection_reaches_this_process_and_the_jobs(monkeypatch) -> None:  # noqa: ANN001
    from imp_core.airflow.hooks import ImpCatalogHook

    monkeypatch.setenv("AIRFLOW_CONN_IMP_STORAGE", json.dumps({
        "conn_type": "aws", "login": "AKIAFROMCONN", "password": SECRET,
        "extra": {"endpoint_url": "http://127.0.0.1:9000", "region_name": "us-east-1", "path_style": True}}))
    hook = ImpCatalogHook()
    env = hook.job_env()
    assert env["IMP_S3_ACCESS_KEY_ID"] == "AKIAFROMCONN" and env["IMP_S3_SECRET_ACCESS_KEY"] == SECRET
    assert env["IMP_S3_ENDPOINT"] == "http://127.0.0.1:9000" and env["IMP_S3_PATH_STYLE"] == "true"
    try:
        hook.get_conn()
        assert storage.s3_config().access_key_id == "AKIAFROMCONN"
    finally:
        storage.configure(None)


@pytest.mark.postgres
def test_s3_tables_end_to_end_through_the_cli_without_leaking_secrets(s3_server, tmp_path) -> None:  # noqa: ANN001
    """Register an s3:// table with the CLI and read its change feed (delta-rs on object storage: the log fast
    path does not apply there and falls back); a bad secret fails in one line that does not print it."""
    import os

    from deltalake import write_deltalake

    from imp_core.sources.delta import DeltaSource
    from tests.conftest import s3_write_options

    uri = "s3://lake/storage_cli"
    write_deltalake(uri, pa.table({"a": [1, 2]}), configuration={"delta.enableChangeDataFeed": "true"},
                    storage_options=s3_write_options())
    write_deltalake(uri, pa.table({"a": [3]}), mode="append", storage_options=s3_write_options())
    assert DeltaSource("t", uri).changes(0, 1).to_pylist() == [{"a": 3, "__mult": 1, "__version": 1}]

    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_GATEWAY")}
    env["IMP_HOME"] = str(tmp_path / "home")
    cli = [sys.executable, "-m", "imp_core.cli.main"]
    try:
        done = subprocess.run([*cli, "table", "register", "s3t", uri.replace("s3://", "s3a://"), "--json"],
                              env=env, text=True, capture_output=True, timeout=300, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        assert json.loads(done.stdout)["path"] == uri
        bad = {**env, "IMP_S3_SECRET_ACCESS_KEY": SECRET, "IMP_S3_ACCESS_KEY_ID": "AKIAUNKNOWN"}
        # moto accepts any key; a wrong endpoint port makes the read fail instead
        bad["IMP_S3_ENDPOINT"] = "http://127.0.0.1:9"
        done = subprocess.run([*cli, "table", "register", "s3t2", uri], env=bad, text=True, capture_output=True,
                              timeout=300, check=False)
        assert done.returncode != 0
        assert SECRET not in done.stdout + done.stderr
        assert len([ln for ln in done.stderr.splitlines() if ln.strip()]) == 1, done.stderr
    finally:
        from imp_core.catalog.embedded import stop_embedded
        from imp_core.config import Settings

        stop_embedded(Settings.from_env({"IMP_HOME": env["IMP_HOME"]}))


def test_a_reader_feature_imp_cannot_read_is_refused_in_one_line(tmp_path) -> None:  # noqa: ANN001
    from deltalake import write_deltalake

    from imp_core.errors import UnsupportedError
    from imp_core.sources.delta import DeltaSource

    path = tmp_path / "t"
    write_deltalake(str(path), pa.table({"a": [1]}), configuration={"delta.enableChangeDataFeed": "true"})
    protocol = {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": ["variantShredding-preview"],
                "writerFeatures": ["variantShredding-preview"]}
    (path / "_delta_log" / f"{1:020d}.json").write_text(
        json.dumps({"commitInfo": {"timestamp": 1, "operation": "UPGRADE PROTOCOL"}}) + "\n"
        + json.dumps({"protocol": protocol}) + "\n")
    with pytest.raises(UnsupportedError, match="reader feature.*variantShredding-preview.*does not support") as info:
        DeltaSource("t", str(path)).require_readable_by_spark()
    assert "\n" not in str(info.value)

"""Manifests published to ``IMP_PUBLISH_LOCATION=s3://...`` on the tests' S3-compatible server, read by a PySpark
session started without imp (the printed settings, which then name the location, and the tables' S3A credentials):
the sketch is applied (fewer files, Spark's rows). The same session with a wrong secret cannot read the location
and runs the query unchanged. The server checks credentials while this module runs: an IAM user with S3 access is
the maintaining (and reading) identity."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import requests

from imp_core.config import ENV_PUBLISH_LOCATION
from imp_core.maintenance.service import SketchService
from imp_core.publish import manifest, store
from imp_core.sources import storage
from imp_core.spark import connector
from tests.spark.clients import SQL, no_pythonpath, sketched_table

pytestmark = [pytest.mark.spark, pytest.mark.postgres, pytest.mark.slow]

CLIENT = Path(__file__).with_name("extension_client.py")
LOCATION = "s3://lake/imp-manifests"
KEYS = ("IMP_S3_ACCESS_KEY_ID", "IMP_S3_SECRET_ACCESS_KEY")


@pytest.fixture(scope="module")
def s3_identity(s3_server: str) -> Iterator[dict[str, str]]:
    """An IAM user allowed ``s3:*`` whose keys are the ``IMP_S3_*`` credentials, with the server enforcing
    authentication until the module ends (then back to the shared test credentials and no checks)."""
    iam = boto3.client(
        "iam",
        endpoint_url=s3_server,
        region_name="us-east-1",
        aws_access_key_id=os.environ[KEYS[0]],
        aws_secret_access_key=os.environ[KEYS[1]],
    )
    iam.create_user(UserName="imp-maintainer")
    iam.put_user_policy(
        UserName="imp-maintainer",
        PolicyName="s3",
        PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
        ),
    )
    key = iam.create_access_key(UserName="imp-maintainer")["AccessKey"]
    saved = {k: os.environ[k] for k in KEYS}
    os.environ.update({KEYS[0]: key["AccessKeyId"], KEYS[1]: key["SecretAccessKey"]})
    requests.post(f"{s3_server}/moto-api/reset-auth", data=b"0", timeout=10).raise_for_status()
    try:
        yield {"access": key["AccessKeyId"], "secret": key["SecretAccessKey"]}
    finally:
        requests.post(f"{s3_server}/moto-api/reset-auth", data=b"inf", timeout=10).raise_for_status()
        os.environ.update(saved)


@pytest.fixture(scope="module")
def s3_service(service: SketchService, s3_identity: dict[str, str]) -> Iterator[SketchService]:
    """A service of the shared catalog and Spark whose sketches are published to ``LOCATION``."""
    svc = SketchService(dataclasses.replace(service.settings, publish_location=LOCATION), spark=service.spark)
    yield svc
    svc.catalog.close()


def run_client(queries: list[dict[str, Any]], conf: dict[str, str], tmp: Path) -> list[dict[str, Any]]:
    spec = tmp / f"spec-{len(list(tmp.glob('spec-*')))}.json"
    spec.write_text(json.dumps({"conf": conf, "queries": queries}))
    done = subprocess.run(
        [sys.executable, str(CLIENT), str(spec)], capture_output=True, text=True, timeout=600, env=no_pythonpath()
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


def test_manifests_on_s3_are_applied_and_an_unreadable_location_changes_nothing(
    s3_service: SketchService, s3_identity: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = sketched_table(s3_service, tmp_path, "s3m_sales", "s3m_top")
    record = s3_service.catalog.get_sketch("s3m_top")
    assert store.names(LOCATION) == [store.file_name(record.id, 1)]
    body = manifest.decode(store.read(LOCATION, store.names(LOCATION)[0]))
    assert body is not None and body["usable"] and body["sketch"] == "s3m_top"
    assert not (tmp_path / store.DEFAULT_DIR).exists()  # nothing beside the table

    monkeypatch.setenv(ENV_PUBLISH_LOCATION, LOCATION)
    printed = connector.session_conf()
    assert printed[connector.SKETCH_LOCATION_CONF] == "s3a://lake/imp-manifests"
    s3a = {f"spark.hadoop.{k}": v for k, v in storage.s3_config().hadoop_conf().items()}
    assert s3a["spark.hadoop.fs.s3a.secret.key"] == s3_identity["secret"]
    query = SQL.format(t=f"delta.`{table}`")
    pair = [{"sql": query}, {"sql": query, "off": True}]
    on, off = run_client(pair, {**printed, **s3a}, tmp_path)
    assert on["rows"] == off["rows"] and on["rows"]
    assert on["applied"] == [{"sketch": "s3m_top", "version": 1}] and off["applied"] == []
    assert on["files"] < off["files"] == 10

    wrong = {**s3a, "spark.hadoop.fs.s3a.secret.key": "not-the-secret"}
    on, off = run_client(pair, {**printed, **wrong}, tmp_path)
    assert on["applied"] == [] and on["rows"] == off["rows"] and on["files"] == off["files"] == 10

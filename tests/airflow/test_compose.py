"""docker-compose.yml is valid and consistent with the project (the Docker engine does not run in CI)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
import yaml

from tests.airflow.conftest import REPO

pytestmark = pytest.mark.airflow

REQUIRED_SECRETS = ("POSTGRES_PASSWORD", "IMP_CATALOG_PASSWORD", "AIRFLOW_JWT_SECRET", "SPARK_AUTH_SECRET",
                    "MINIO_ROOT_PASSWORD")


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


def test_services_and_images_match_the_project(compose: dict) -> None:
    import pyspark

    services = compose["services"]
    assert {"postgres", "airflow-init", "airflow-apiserver", "airflow-scheduler", "airflow-dag-processor",
            "airflow-triggerer", "spark-master", "spark-worker"} <= set(services)
    for name in ("spark-master", "spark-worker"):
        assert services[name]["image"].startswith(f"apache/spark:{pyspark.__version__}-"), "Spark must equal pyspark"
    assert "deploy.master.Master" in services["spark-master"]["command"]
    assert "deploy.worker.Worker" in services["spark-worker"]["command"]
    assert "spark://spark-master:7077" in services["spark-worker"]["command"]

    env = services["airflow-scheduler"]["environment"]
    assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
    spark_conn = json.loads(env["AIRFLOW_CONN_SPARK_DEFAULT"])  # JSON form: a raw URI with [*] goes to yarn
    assert spark_conn["conn_type"] == "spark" and spark_conn["host"] == "spark://spark-master:7077"
    assert json.loads(env["AIRFLOW_CONN_IMP_CATALOG"])["conn_type"] == "postgres"
    assert services["airflow-apiserver"]["build"]["dockerfile"] == "docker/Dockerfile"
    # the warehouse is mounted at one path everywhere: executors read the files the driver names
    for name in ("airflow-scheduler", "spark-worker"):
        assert any(v.startswith("warehouse:/data/warehouse") for v in services[name]["volumes"])
    assert (REPO / "docker" / "Dockerfile").exists()


def test_object_storage_and_worker_sharing(compose: dict) -> None:
    services = compose["services"]
    env = services["airflow-scheduler"]["environment"]
    assert env["IMP_S3_ENDPOINT"] == "http://minio:9000" and env["IMP_S3_PATH_STYLE"] == "true"
    assert "?" in env["IMP_S3_SECRET_ACCESS_KEY"], "the object store's secret must be required, not defaulted"
    assert all(p.startswith("127.0.0.1:") for p in services["minio"]["ports"])
    assert "mc mb" in " ".join(services["minio-init"]["command"])
    assert "spark.deploy.defaultCores=1" in services["spark-master"]["environment"]["SPARK_MASTER_OPTS"]
    dockerfile = (REPO / "docker" / "Dockerfile").read_text()
    assert "connector-pom.xml" in dockerfile and "IMP_SPARK_JARS" in dockerfile


def test_compose_config_passes() -> None:
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True,
                                                 check=False).returncode == 0:
        cmd = ["docker", "compose", "config", "--quiet"]
    elif shutil.which("docker-compose"):
        cmd = ["docker-compose", "config", "--quiet"]
    else:  # ./dev test installs Debian's docker-compose; a missing one is a broken environment, not a skip
        raise AssertionError("neither `docker compose` nor `docker-compose` is installed; run ./dev test")
    # the secrets have no defaults (tests/security/test_compose.py checks that it fails without them)
    env = {**os.environ, **{name: "x" * 24 for name in REQUIRED_SECRETS}}
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False, env=env)
    assert done.returncode == 0, done.stderr

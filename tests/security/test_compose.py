"""docker-compose.yml is safe to start as it is (finding 9 of issue 15).

The review found the Spark master (unauthenticated job submission) and Postgres published on all interfaces with
default passwords, and a fixed JWT secret as fallback. The Docker engine does not run here; ``docker-compose
config`` renders the file exactly as ``up`` would use it.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import yaml

from tests.security.conftest import REPO

SECRETS = ("POSTGRES_PASSWORD", "IMP_CATALOG_PASSWORD", "AIRFLOW_JWT_SECRET", "SPARK_AUTH_SECRET",
           "MINIO_ROOT_PASSWORD")


def _config(env: dict[str, str]) -> subprocess.CompletedProcess:
    if shutil.which("docker-compose"):
        cmd = ["docker-compose", "config"]
    elif shutil.which("docker"):
        cmd = ["docker", "compose", "config"]
    else:  # ./dev test installs Debian's docker-compose; a missing one is a broken environment, not a skip
        raise AssertionError("neither docker-compose nor docker is installed; run ./dev test")
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False, timeout=120)


def test_compose_requires_secrets_and_publishes_only_on_localhost() -> None:
    base = {k: v for k, v in os.environ.items() if k not in SECRETS}
    refused = _config(base)
    assert refused.returncode != 0, "docker-compose.yml starts with built-in default secrets"
    assert any(name in refused.stderr for name in SECRETS), refused.stderr

    given = {name: f"given-{name.lower()}-x9" for name in SECRETS}
    done = _config({**base, **given})
    assert done.returncode == 0, done.stderr
    rendered = yaml.safe_load(done.stdout)
    text = done.stdout
    for default in ("airflow:airflow@", "imp:imp@", "PASSWORD: airflow", "imp-dev-only", "change-me"):
        assert default not in text, f"a default secret is still in the configuration: {default}"
    services = rendered["services"]

    published = {}
    for name, service in services.items():
        for port in service.get("ports", []):
            spec = port if isinstance(port, str) else f"{port.get('host_ip', '')}:{port['published']}:{port['target']}"
            parts = spec.split(":")
            assert len(parts) == 3 and parts[0] == "127.0.0.1", f"{name} publishes {spec} on every interface"
            published[name] = published.get(name, []) + [parts[2].split("/")[0]]
    assert "postgres" not in published, "Postgres is reachable from outside the compose network"
    assert "7077" not in published.get("spark-master", []), "the Spark master accepts jobs from outside"

    env = {name: s.get("environment", {}) for name, s in services.items()}
    assert env["airflow-apiserver"]["AIRFLOW__API_AUTH__JWT_SECRET"] == given["AIRFLOW_JWT_SECRET"]
    for name in ("spark-master", "spark-worker"):
        assert "spark.authenticate=true" in (env[name].get("SPARK_MASTER_OPTS", "") + env[name].get(
            "SPARK_WORKER_OPTS", "")), f"{name} runs without authentication"
        assert env[name]["_SPARK_AUTH_SECRET"] == given["SPARK_AUTH_SECRET"]
    assert env["airflow-scheduler"]["_SPARK_AUTH_SECRET"] == given["SPARK_AUTH_SECRET"]

"""The catalog password never reaches output, logs or a job's command line (finding 3 of issue 15).

The review saw the password leak when it contained ``/``, ``#`` or ``?`` or was given as ``?password=``: in CLI
errors, ``imp catalog url``, the spark-submit job's log line, and (YARN/Kubernetes masters) as a ``--conf`` value
the Spark provider logs unmasked. The Airflow page is covered in test_airflow_page.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pytest

from tests.security.conftest import REPO, SENTINEL_CORE, Lab, cli_env, imp

SECRET_CORE = "c0ffee5ecret7"
SECRET = f"S3nt/pw#{SECRET_CORE}?x"  # '/', '#', '?': what broke the old redaction


def urls(host: str = "127.0.0.1:1") -> dict[str, str]:
    encoded = quote(SECRET + "@:%", safe="")
    return {
        "raw": f"postgresql+psycopg2://imp:{SECRET}@{host}/imp",
        "encoded": f"postgresql+psycopg2://imp:{encoded}@{host}/imp",
        "query": f"postgresql+psycopg2://imp@{host}/imp?password={encoded}",
        "libpq": f"postgresql://imp:{encoded}@{host}/imp",
    }


@pytest.mark.parametrize("form", ["raw", "encoded", "query", "libpq"])
def test_cli_never_prints_the_catalog_password(tmp_path: Path, form: str) -> None:
    url = urls()[form]
    env = cli_env(tmp_path / "home", IMP_CATALOG_URL=url)
    outputs = []
    for args in (["catalog", "url", "--psql"], ["-v", "sketch", "list"]):  # -v: log lines and tracebacks too
        done = imp(env, *args, timeout=120)
        outputs.append((args, done.returncode, done.stdout + done.stderr))
    if form == "raw":  # the same URL given as a flag (discouraged, and said so)
        done = imp(cli_env(tmp_path / "home"), "sketch", "list", "--catalog-url", url, timeout=120)
        outputs.append((["--catalog-url"], done.returncode, done.stdout + done.stderr))
        assert "other local users can read it" in done.stderr

    for args, code, text in outputs:
        assert SECRET_CORE not in text, f"imp {' '.join(args)} printed the password: {text}"
        if args[0] != "catalog":
            assert code == 6, (args, code, text)  # the catalog is unreachable: one catalog error line
    url_line = outputs[0][2].strip()
    assert "127.0.0.1:1" in url_line and "imp" in url_line, url_line  # still says which catalog


@pytest.mark.spark  # spark-submit starts a JVM (which then fails to reach the k8s master)
@pytest.mark.postgres  # the operator then reads the job's runs back from the (unreachable) catalog
def test_spark_submit_command_and_log_hold_no_catalog_password(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                               capfd: pytest.CaptureFixture[str]) -> None:
    """A YARN master: the provider turns the job's environment into ``--conf`` values and logs the command."""
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    from imp_core.airflow.operators import ImpSparkSubmitOperator

    url = urls("db.example:5432")["encoded"]
    monkeypatch.setenv("AIRFLOW_CONN_IMP_CATALOG", json.dumps({"conn_type": "postgres", "extra": {"url": url}}))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_YARN", json.dumps({"conn_type": "spark", "host": "yarn"}))
    monkeypatch.setenv("IMP_HOME", str(tmp_path / "home"))
    for name in ("HADOOP_CONF_DIR", "YARN_CONF_DIR", "IMP_CATALOG_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PATH", os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))

    op = ImpSparkSubmitOperator(task_id="maintain", conn_id="spark_yarn",
                                application_args=["maintain", "--sketch=top"])
    # spark-submit itself runs and refuses the master (no YARN here): what matters is what was built and logged
    with pytest.raises(Exception) as failed:
        op.execute({})
    out = capfd.readouterr()
    logged = out.out + out.err + str(failed.value)
    assert "Spark-Submit cmd: spark-submit --master yarn" in logged  # the provider logged its command line ...
    assert SECRET_CORE not in logged  # ... and the password is not in it, nor in the error
    passed = dict(op.env_vars or {})
    assert "IMP_CATALOG_URL" not in passed and SECRET_CORE not in json.dumps(passed)

    # the same environment under Kubernetes: every variable becomes a --conf the provider prints
    k8s = SparkSubmitHook(conn_id="spark_yarn", env_vars=passed, conf=op.conf, application_args=op.application_args)
    k8s._connection["master"], k8s._is_kubernetes, k8s._is_yarn = "k8s://https://127.0.0.1:6443", True, False
    command = k8s._build_spark_submit_command(str(REPO / "imp_core" / "jobs" / "submit.py"))
    assert SECRET_CORE not in " ".join(command)


def test_job_reads_the_catalog_url_from_a_private_file_and_never_logs_it(tmp_path: Path) -> None:
    """The spark-submit application itself: its log line names the catalog, never the password."""
    from imp_core.jobs import SUBMIT_PATH

    secret_file = tmp_path / "catalog-url"
    secret_file.write_text(urls()["encoded"])
    secret_file.chmod(0o600)
    env = cli_env(tmp_path / "home", IMP_CATALOG_URL_FILE=str(secret_file))
    for extra in ([], ["--catalog-url", urls()["raw"]]):
        done = subprocess.run([sys.executable, SUBMIT_PATH, "maintain", "--sketch=top", *extra], env=env,
                              capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 6, done.stderr  # unreachable catalog, one line
        assert SECRET_CORE not in done.stdout + done.stderr, done.stderr
        assert "db.example" not in done.stderr and "127.0.0.1:1" in done.stderr
    # a secret file others can read is refused rather than trusted
    secret_file.chmod(0o644)
    done = subprocess.run([sys.executable, SUBMIT_PATH, "maintain", "--sketch=top"], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 2 and "chmod 600" in done.stderr and SECRET_CORE not in done.stderr


@pytest.mark.parametrize("form", ["raw", "query"])
def test_job_log_names_the_catalog_without_its_password(lab: Lab, sentinel_urls: dict[str, str], form: str) -> None:
    """The job's INFO line (which the Spark provider copies into the Airflow task log) on a reachable catalog."""
    from imp_core.jobs import SUBMIT_PATH

    if "job_top" not in [r.name for r in lab.catalog.list_sketches()]:
        lab.table("job_sales")
        lab.sketch("job_top", "job_sales")
    env = {**lab.env, "IMP_CATALOG_URL": sentinel_urls[form]}
    done = subprocess.run([sys.executable, SUBMIT_PATH, "maintain", "--sketch=job_top"], env=env, capture_output=True,
                          text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr
    assert "imp job maintain" in done.stderr and "imp_sentinel" in done.stderr  # it does say which catalog
    assert SENTINEL_CORE not in done.stdout + done.stderr, done.stderr

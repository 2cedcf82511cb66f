"""imp's Spark extension in a Spark Connect server (``imp_core.cli.connect_server``, started with the printed
settings) queried by a ``pyspark.sql.connect`` client that has no JVM and no imp: the sketched query and a BI
tool's wrapping of it read fewer files than with the rule off and return Spark's rows; a looser constant is left
unchanged."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from imp_core.maintenance.service import SketchService
from tests.spark.clients import SQL, no_pythonpath, sketched_table

pytestmark = [pytest.mark.spark, pytest.mark.postgres, pytest.mark.slow]

CLIENT = Path(__file__).with_name("connect_client.py")


def run_client(remote: str, queries: list[dict[str, Any]], tmp: Path) -> list[dict[str, Any]]:
    spec = tmp / "spec.json"
    spec.write_text(json.dumps({"remote": remote, "queries": queries}))
    done = subprocess.run(
        [sys.executable, str(CLIENT), str(spec)], capture_output=True, text=True, timeout=600, env=no_pythonpath()
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


def test_a_connect_client_gets_the_sketch(service: SketchService, spark_connect: str, tmp_path: Path) -> None:
    # the server was started before this table existed: it reads the manifest when a query first needs it
    table = sketched_table(service, tmp_path, "con_sales", "con_top")
    query = SQL.format(t=f"delta.`{table}`")
    cases = {
        "query": query,
        "wrapped": f"SELECT * FROM ({query}) t ORDER BY rev DESC LIMIT 1000",
        "tighter": query.replace("> 300000", "> 340000"),
        "looser": query.replace("> 300000", "> 1000"),
    }
    out = run_client(
        spark_connect, [q for sql in cases.values() for q in ({"sql": sql}, {"sql": sql, "off": True})], tmp_path
    )
    results = {name: (out[2 * i], out[2 * i + 1]) for i, name in enumerate(cases)}
    for name, (on, off) in results.items():
        assert on["rows"] == off["rows"] and off["applied"] == [], name
        assert off["files"] == 10, name
    assert results["query"][0]["rows"], "the query has an answer"
    for name in ("query", "wrapped", "tighter"):
        on, off = results[name]
        assert on["applied"] == ["imp_sketch(con_top, v1)"], name
        assert on["files"] < off["files"], name
    on, off = results["looser"]
    assert on["applied"] == [] and on["files"] == off["files"]

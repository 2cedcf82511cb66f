"""imp's Spark extension in the Spark Thrift (JDBC/ODBC) server of pyspark's own jars, queried by a JDBC client
(beeline): the server is started with only the printed settings (``python -m imp_core.spark.connector submit-args``,
the jars also on the driver's class path), and every JDBC session gets the sketch. The sketched query against the
table by path, a BI tool's wrapping and a tightened constant (a ``${hivevar:...}`` parameter) read fewer files than
the same statements with the rule off and return Spark's rows; a looser constant is left unchanged."""

from __future__ import annotations

import csv
import io
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from imp_core.maintenance.service import SketchService
from imp_core.spark import connector
from tests.spark.clients import (
    FILES,
    SQL,
    SUBMIT,
    SqlUi,
    files_read,
    free_port,
    listening,
    pyspark_jars,
    sketched_table,
    sketches_in,
    start,
    stop,
    wait_for,
)

pytestmark = [pytest.mark.spark, pytest.mark.postgres, pytest.mark.slow]

SERVER_CLASS = "org.apache.spark.sql.hive.thriftserver.HiveThriftServer2"
MARK, NEXT = "imp_statement", "imp-next-statement"


@dataclass(frozen=True)
class Thrift:
    port: int
    ui: SqlUi
    table: Path
    log: Path


def server_argv(work: Path, port: int, ui_port: int) -> list[str]:
    """The Thrift server's command: pyspark's spark-submit, the printed flags, the same jars on the driver's class
    path (a JDBC session is a new SparkSession whose extensions the driver's class loader must resolve), a private
    warehouse and the in-memory catalog (tables are read by path; no Hive metastore to set up)."""
    args = connector.submit_args()
    jars = args[args.index("--jars") + 1].split(",")
    return [
        str(SUBMIT),
        "--master",
        "local[2]",
        "--class",
        SERVER_CLASS,
        "--name",
        "imp thrift test",
        "--driver-class-path",
        ":".join(jars),
        *args,
        "--conf",
        "spark.ui.enabled=true",
        "--conf",
        f"spark.ui.port={ui_port}",
        "--conf",
        "spark.sql.shuffle.partitions=2",
        "--conf",
        f"spark.sql.warehouse.dir={work / 'warehouse'}",
        "--conf",
        "spark.sql.catalogImplementation=in-memory",
        "--conf",
        f"spark.driver.extraJavaOptions=-Dderby.system.home={work}",
        "spark-internal",
        "--hiveconf",
        f"hive.server2.thrift.port={port}",
        "--hiveconf",
        "hive.server2.thrift.bind.host=127.0.0.1",
    ]


@pytest.fixture(scope="module")
def thrift(service: SketchService, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Thrift]:
    table = sketched_table(service, tmp_path_factory.mktemp("thrift-lake"), "thr_sales", "thr_top")
    work = tmp_path_factory.mktemp("thrift-server")
    port, ui_port = free_port(), free_port()
    log = work / "server.log"
    proc = start(server_argv(work, port, ui_port), log, cwd=work)
    try:
        wait_for(lambda: listening(port), [proc], log, "the Thrift server")
        yield Thrift(port, SqlUi(f"http://127.0.0.1:{ui_port}"), table, log)
    finally:
        stop(proc)


def beeline(port: int, statements: list[str]) -> list[list[list[str]]]:
    """Run ``statements`` in one JDBC session with beeline (pyspark's hive-beeline and hive-jdbc jars); the rows of
    each statement's result, header first, parsed from beeline's csv2 output (RFC 4180 quoting)."""
    script = "".join(f"SELECT '{NEXT}' AS {MARK};\n{s};\n" for s in statements)
    done = subprocess.run(
        [
            "java",
            "-cp",
            f"{pyspark_jars()}/*",
            "org.apache.hive.beeline.BeeLine",
            "-u",
            f"jdbc:hive2://127.0.0.1:{port}/default",
            "-n",
            "user",
            "--outputformat=csv2",
            "--silent=true",
            "--showHeader=true",
            "-e",
            script,
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    results: list[list[list[str]]] = []
    for row in csv.reader(io.StringIO(done.stdout)):
        if row == [MARK]:
            continue  # the marker's header
        if row == [NEXT]:
            results.append([])  # the marker's value: the next statement's result follows
        elif row and results:
            results[-1].append(row)
    return results


def statement_executions(ui: SqlUi, after: int, statements: int) -> list[list[dict[str, Any]]]:
    """The SQL executions of each of ``statements`` run by :func:`beeline` since execution ``after``: those between
    one marker statement and the next, without Delta's own jobs (reading its log: the first query of a table replays
    it, and those scans count files too)."""
    groups: list[list[dict[str, Any]]] = []
    for e in ui.finished_after(after):
        if e["description"].startswith(f"SELECT '{NEXT}'"):
            groups.append([])
        elif groups and not e["description"].startswith("Delta: ") and "_delta_log" not in e["planDescription"]:
            groups[-1].append(e)
    assert len(groups) == statements, [e["description"][:80] for e in ui.finished_after(after)]
    return groups


def test_jdbc_sessions_get_the_sketch(thrift: Thrift) -> None:
    query = SQL.format(t=f"delta.`{thrift.table}`")
    param = query.replace("> 300000", "> ${hivevar:min_rev}")
    cases = {
        "query": ([], query),
        "wrapped": ([], f"SELECT * FROM ({query}) t ORDER BY rev DESC LIMIT 1000"),
        "tighter": (["SET hivevar:min_rev=350000"], param),
        "looser": (["SET hivevar:min_rev=1000"], param),
    }
    statements: list[str] = []
    for sets, sql in cases.values():
        statements += [*sets, "SET spark.imp.sketches.enabled=true", sql, "SET spark.imp.sketches.enabled=false", sql]
    before = thrift.ui.last_id()
    results = beeline(thrift.port, statements)
    executions = statement_executions(thrift.ui, before, len(statements))
    at, answers = 0, {}
    for name, (sets, _) in cases.items():
        at += len(sets)
        on, off = results[at + 1], results[at + 3]
        on_runs, off_runs = executions[at + 1], executions[at + 3]
        at += 4
        answers[name] = on
        assert on[0] == ["brand", "rev"] and len(on) > 1, (name, on)
        assert on == off, name  # ORDER BY where there is one: the same rows in the same order
        on_files, off_files = sum(map(files_read, on_runs)), sum(map(files_read, off_runs))
        assert off_files == FILES and [sketches_in(e) for e in off_runs] == [[]], (name, off_runs)
        if name == "looser":
            assert on_files == off_files and [sketches_in(e) for e in on_runs] == [[]], name
        else:
            assert [sketches_in(e) for e in on_runs] == [["imp_sketch(thr_top, v1)"]], name
            assert on_files < off_files, (name, on_files)
    assert 1 < len(answers["tighter"]) < len(answers["query"]) < len(answers["looser"])  # the constants matter

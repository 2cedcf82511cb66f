"""The paper's running example end to end through the `imp` CLI: real Spark, Delta tables, embedded Postgres.

Also the bad-input contract: a one-line error, a non-zero exit code, and a catalog left as it was.

The running example calls the CLI's entry point in this process, on the test session's Spark (as separate processes,
its commands that need Spark would start a JVM each, ~15 s); the bad-input test runs every command as a process of
its own, one of them starting Spark.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from imp_core.demo import BOUNDS, Q_TOP, S8, SALES

pytestmark = [pytest.mark.spark, pytest.mark.postgres, pytest.mark.slow]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    home = tmp_path_factory.mktemp("imp-home")
    e = dict(os.environ, IMP_HOME=str(home), IMP_SPARK_MASTER="local[2]", IMP_SHUFFLE_PARTITIONS="2",
             PYSPARK_PYTHON=sys.executable)
    e.pop("IMP_CATALOG_URL", None)
    yield e
    from imp_core.catalog.embedded import stop_embedded
    from imp_core.config import Settings

    stop_embedded(Settings.from_env({"IMP_HOME": str(home)}))


Imp = Callable[..., subprocess.CompletedProcess[str]]  # `imp ARGS`: its exit code, stdout and stderr


def imp(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "imp_core.cli.main", *args], env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.fixture
def imp_here(env: dict[str, str], spark, monkeypatch: pytest.MonkeyPatch,  # noqa: ANN001
             capsys: pytest.CaptureFixture[str]) -> Imp:
    """`imp ARGS` through the CLI's entry point in this process (the session's Spark), with ``env``'s settings."""
    from imp_core.cli.main import main

    for key in ("IMP_HOME", "IMP_SPARK_MASTER", "IMP_SHUFFLE_PARTITIONS"):
        monkeypatch.setenv(key, env[key])
    for key in ("IMP_CATALOG_URL", "IMP_SPARK_REMOTE"):
        monkeypatch.delenv(key, raising=False)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        capsys.readouterr()
        try:
            code = main(list(args))
        except SystemExit as e:  # argparse's usage errors
            code = e.code if isinstance(e.code, int) else 2
        out = capsys.readouterr()
        return subprocess.CompletedProcess(["imp", *args], code, out.out, out.err)
    return run


def ok_json(imp: Imp, *args: str):  # noqa: ANN201
    out = imp(*args, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def catalog_snapshot(imp: Imp) -> tuple:
    return ok_json(imp, "table", "list"), ok_json(imp, "sketch", "list")


def assert_one_line_error(out: subprocess.CompletedProcess[str], code: int, *fragments: str) -> None:
    assert out.returncode == code, (out.returncode, out.stderr)
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("imp: error: ")
    for f in fragments:
        assert f in lines[0], lines[0]


def test_running_example_end_to_end(imp_here: Imp, tmp_path: Path) -> None:
    imp = imp_here
    sales = tmp_path / "sales"
    write_deltalake(str(sales), SALES, configuration={"delta.enableChangeDataFeed": "true"})
    assert imp("table", "register", "sales", str(sales)).returncode == 0

    created = ok_json(imp, "sketch", "create", "top", "--sql", Q_TOP, "--on", "sales.price", "--bounds", BOUNDS)
    assert created["version"] == 1 and created["method"] == "capture"
    assert created["partitions"][0]["fragments"] == [2, 3]  # {ρ3, ρ4}

    write_deltalake(str(sales), S8, mode="append")  # Example 1.2
    maintained = ok_json(imp, "sketch", "maintain", "top")
    assert maintained["versions"] == [2] and maintained["delta_rows"] == 1

    shown = ok_json(imp, "sketch", "show", "top")
    assert shown["version"] == 2 and shown["method"] == "incremental"
    assert shown["table_versions"] == {"sales": 1}
    assert shown["partitions"] == [{**shown["partitions"][0], "table": "sales", "column": "price",
                                    "bounds": [1, 601, 1001, 1501, 10001], "fragments": [1, 2, 3]}]
    assert ok_json(imp, "sketch", "show", "top", "--version", "1")["partitions"][0]["fragments"] == [2, 3]

    listed = ok_json(imp, "sketch", "list")
    assert [r["name"] for r in listed] == ["top"] and listed[0]["is_stale"] is False

    with_sketch = ok_json(imp, "query", Q_TOP)
    without = ok_json(imp, "query", Q_TOP, "--no-sketch")
    assert sorted(map(tuple, with_sketch["rows"])) == [("Apple", 5074), ("HP", 6194)]
    assert sorted(map(tuple, without["rows"])) == [("Apple", 5074), ("HP", 6194)]
    assert with_sketch["sketch"] == {"name": "top", "version": 2} and without["sketch"] is None
    # two files (version 0's seven rows, S8), both overlapping the sketch's price range [601, ...)
    assert with_sketch["scanned"] == without["scanned"] == {"files_read": 2, "files_total": 2, "rows_read": 8,
                                                            "rows_total": 8}
    assert with_sketch["notes"] == [] and without["notes"] == []

    history = ok_json(imp, "sketch", "history", "top")
    assert [h["method"] for h in history] == ["capture", "incremental"]

    # the range predicate for plain Spark SQL: fragments 1..3 of [1, 601, 1001, 1501, 10001] are price >= 601
    predicate = ok_json(imp, "sketch", "predicate", "top")
    assert predicate == {"sketch": "top", "version": 2, "table": "sales", "table_version": 1, "column": "price",
                         "predicate": "`price` >= 601", "fragments": 3, "fragment_count": 4}
    assert_one_line_error(imp("sketch", "predicate", "top", "--table", "nosuch"), 2, "does not partition")

    # advice: every partitionable column the query reads, the safe ones estimated and ranked by rows kept
    advice = ok_json(imp, "sketch", "advise", "--sql", Q_TOP, "--fragments", "4", "--max-columns", "2")
    assert advice[0]["safe"] and advice[0]["row_share"] is not None
    shares = [a["row_share"] for a in advice if a["row_share"] is not None]
    assert shares == sorted(shares) and {a["column"] for a in advice} >= {"brand", "price"}
    assert [r["name"] for r in ok_json(imp, "sketch", "list")] == ["top"]  # nothing registered by advice
    assert_one_line_error(imp("sketch", "advise", "--sql", Q_TOP, "--table", "nosuch"), 2, "does not read it")


def test_bad_input_leaves_catalog_unchanged(env: dict[str, str], imp_here: Imp, tmp_path: Path) -> None:
    """In this process, but for two commands that run as processes of their own: a usage error (argparse's exit) and
    a Spark error from a freshly started JVM (its start-up lines must not reach stderr)."""
    cli = imp_here
    good = tmp_path / "good"
    write_deltalake(str(good), SALES, configuration={"delta.enableChangeDataFeed": "true"})
    assert cli("table", "register", "goods", str(good)).returncode == 0
    plain = tmp_path / "plain"
    write_deltalake(str(plain), pa.table({"id": [1]}))
    broken = tmp_path / "broken"  # a table whose data file was deleted behind Delta's back
    write_deltalake(str(broken), SALES, configuration={"delta.enableChangeDataFeed": "true"})
    assert cli("table", "register", "broken", str(broken)).returncode == 0
    for data_file in broken.glob("*.parquet"):
        data_file.unlink()
    before = catalog_snapshot(cli)

    assert_one_line_error(cli("table", "register", "t1", str(tmp_path / "missing")), 4, "is not a Delta table")
    assert_one_line_error(cli("table", "register", "t2", str(plain)), 4, "Change Data Feed")
    assert_one_line_error(cli("sketch", "create", "s1", "--sql", "SELEC brand FROM goods", "--on",
                              "goods.price", "--fragments", "4"), 3)
    assert_one_line_error(cli("sketch", "create", "s2", "--sql", "SELECT nope FROM goods", "--on",
                              "goods.price", "--fragments", "4"), 3, "nope")
    assert_one_line_error(cli("sketch", "create", "s3", "--sql", Q_TOP.replace("sales", "goods"), "--on",
                              "goods.nope", "--fragments", "4"), 3, "column nope does not exist")
    assert_one_line_error(imp(env, "sketch", "create", "s4", "--sql", "SELECT * FROM goods", "--on",
                              "goods.price", "--fragments", "-3"), 2, "--fragments")
    assert_one_line_error(cli("sketch", "show", "ghost"), 7, "ghost")
    assert_one_line_error(cli("sketch", "maintain", "top", "--batch-size", "x"), 2, "--batch-size")
    assert_one_line_error(cli("sketch", "repartition"), 2, "--all")
    assert_one_line_error(cli("table", "layout", "--off"), 2, "switch one table")
    assert_one_line_error(cli("table", "layout", "ghost", "--off"), 7, "ghost")
    assert_one_line_error(cli("sketch", "repartition", "ghost", "--apply"), 7, "ghost")
    assert_one_line_error(cli("sketch", "repartition", "ghost", "--factor", "0.5"), 2, "above 1")
    missing = imp(env, "query", "SELECT brand FROM broken", "--no-sketch")  # Spark started: its progress lines first
    last = missing.stderr.strip().splitlines()[-1]
    assert missing.returncode == 4 and last.startswith("imp: error: a data file of a table is missing"), missing.stderr
    assert str(broken) in last and "Traceback" not in missing.stderr
    assert catalog_snapshot(cli) == before

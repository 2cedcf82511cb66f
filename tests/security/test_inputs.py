"""What users type is checked before anything runs (findings 5 and 8 of issue 15).

Finding 5: sketch names starting with ``-`` passed validation and then could never be maintained by the jobs (argv
parsing), ``isalnum()`` admitted Unicode look-alikes, relative table paths were stored as given, ``--fragments``
had no upper bound, and some bad bounds ended in exit 70 instead of a one-line error.
Finding 8: Delta log file paths were trusted as given (absolute paths and ``../`` were read).
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from tests.security.conftest import BOUNDS, REPO, TOP_SQL, Lab

pytestmark = [pytest.mark.postgres]

LOOKALIKE = "t\u043ep"  # "top" with a Cyrillic o


def _one_line_error(done, code: int, *words: str) -> None:  # noqa: ANN001
    """Exit ``code`` and one error line, the last on stderr (progress lines may come before it), naming ``words``."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode == code, f"exit {done.returncode}: {done.stderr}"
    errors = [line for line in lines if "error" in line.lower() or "Traceback" in line]
    assert errors == [lines[-1]] and lines[-1].startswith("imp: error:"), done.stderr
    for word in words:
        assert word in lines[-1], lines[-1]


def test_sketch_names_are_plain_ascii_and_never_options(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    from imp_core.airflow import tasks
    from imp_core.jobs import submit

    lab.table("names_sales")
    sql = TOP_SQL.format(t="names_sales")
    # a look-alike name through the CLI: refused before anything runs
    done = lab.imp("sketch", "create", LOOKALIKE, "--sql", sql, "--on", "names_sales.price", "--bounds", BOUNDS)
    _one_line_error(done, 2, "not valid")
    assert LOOKALIKE not in [r.name for r in lab.catalog.list_sketches()]

    # a name starting with '-' through the register DAG's check task (what the trigger form allowed)
    monkeypatch.setenv("IMP_HOME", str(lab.home))
    monkeypatch.delenv("IMP_CATALOG_URL", raising=False)
    with pytest.raises(AirflowFailException, match="not valid"):
        tasks.validate_registration({"name": "-top", "sql": sql, "on": "names_sales.price", "fragments": 2})

    # ... the trigger forms refuse both
    import re

    from airflow.dag_processing.dagbag import DagBag

    dags = DagBag(dag_folder=str(REPO / "dags")).dags
    for dag_id, param in (("imp_register_sketch", "name"), ("imp_maintain_on_demand", "sketch")):
        pattern = dags[dag_id].params.get_param(param).schema["pattern"]
        assert re.search(pattern, "-top") is None and re.search(pattern, LOOKALIKE) is None
        assert re.search(pattern, "top_2-b")

    # ... and a job given one says what is wrong with the name (the argv carries it as --sketch=NAME)
    job = subprocess.run([sys.executable, submit.__file__, "maintain", "--sketch=-top"], env=lab.env,
                         capture_output=True, text=True, timeout=120, check=False)
    assert job.returncode == 2 and "sketch name '-top' is not valid" in job.stderr, job.stderr


def test_a_relative_table_path_is_stored_absolute(lab: Lab) -> None:
    from deltalake import write_deltalake

    write_deltalake(str(lab.data / "rel_sales"), pa.table({"id": [1, 2], "price": [1, 2]}),
                    configuration={"delta.enableChangeDataFeed": "true"})
    done = lab.imp("table", "register", "rel_sales", "rel_sales", "--json", cwd=lab.data)
    assert done.returncode == 0, done.stderr
    listed = lab.imp("table", "list", "--json", cwd="/")
    [row] = [t for t in json.loads(listed.stdout) if t["name"] == "rel_sales"]
    assert row["path"] == str(lab.data / "rel_sales")
    # found from any other working directory (this process's is the repository)
    assert Path.cwd() != lab.data
    assert lab.service.source("rel_sales").current_version() == 0


def test_fragments_are_bounded(lab: Lab) -> None:
    lab.table("frag_sales")
    sql = TOP_SQL.format(t="frag_sales")
    runs_before = len(lab.catalog.runs(limit=100_000))
    done = lab.imp("sketch", "create", "frag_top", "--sql", sql, "--on", "frag_sales.price", "--fragments", "50000000")
    _one_line_error(done, 2, "IMP_MAX_FRAGMENTS")
    done = lab.imp("sketch", "create", "frag_top", "--sql", sql, "--on", "frag_sales.price", "--bounds", BOUNDS,
                   env={"IMP_MAX_FRAGMENTS": "3"})
    _one_line_error(done, 2, "IMP_MAX_FRAGMENTS")
    assert "frag_top" not in [r.name for r in lab.catalog.list_sketches()]
    assert len(lab.catalog.runs(limit=100_000)) == runs_before  # nothing was written


@pytest.mark.spark
def test_equi_depth_bounds_collect_a_bounded_sample(spark, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    from imp_core.spark import bounds

    monkeypatch.setattr(bounds, "SAMPLE_MAX", 2_000)  # the cap under test, scaled down with the table
    df = spark.range(200_000).withColumnRenamed("id", "v")
    frame_class = type(df)
    collected: list[int] = []
    to_arrow = frame_class.toArrow

    def counting(self):  # noqa: ANN001, ANN202 - records what reaches the driver
        table = to_arrow(self)
        collected.append(table.num_rows)
        return table

    monkeypatch.setattr(frame_class, "toArrow", counting)
    values = bounds.equi_depth_bounds(df, "v", 5_000, "int", known=(0, 199_999, 200_000))
    assert collected and max(collected) <= 2_000, collected
    assert values[0] == 0 and values[-1] == 199_999 and list(values) == sorted(set(values))


def _bounds_table(lab: Lab) -> None:
    from deltalake import write_deltalake

    utc = dt.timezone.utc
    table = pa.table({
        "id": pa.array([1, 2, 3], pa.int64()),
        "ts": pa.array([dt.datetime(2024, m, 1, tzinfo=utc) for m in (1, 3, 5)], pa.timestamp("us", tz="UTC")),
        "amount": pa.array([decimal.Decimal("1.50"), decimal.Decimal("2.50"), decimal.Decimal("3.50")],
                           pa.decimal128(10, 2)),
    })
    write_deltalake(str(lab.data / "bnd"), table, configuration={"delta.enableChangeDataFeed": "true"})
    lab.service.register_table("bnd", str(lab.data / "bnd"))


@pytest.mark.parametrize(("column", "bounds", "says"), [
    ("ts", "2024-01-01T00:00:00,2024-06-01T00:00:00+00:00", "time zone"),
    ("id", "1,99999999999999999999", "outside the range of BIGINT"),
    ("amount", "1.00,NaN", "not a valid DECIMAL(10,2)"),
])
def test_bad_bounds_are_one_line_usage_errors(lab: Lab, column: str, bounds: str, says: str) -> None:
    if "bnd" not in [t.name for t in lab.catalog.list_tables()]:
        _bounds_table(lab)
    done = lab.imp("sketch", "create", f"bnd_{column}", "--sql", "SELECT id, amount FROM bnd WHERE id > 0",
                   "--on", f"bnd.{column}", "--bounds", bounds)
    _one_line_error(done, 2, says)
    assert f"bnd_{column}" not in [r.name for r in lab.catalog.list_sketches()]


@pytest.mark.parametrize("where", ["relative", "absolute"])
def test_delta_log_paths_outside_the_table_are_refused(lab: Lab, where: str) -> None:
    import pyarrow.parquet as pq

    name = f"path_{where}"
    lab.table(name)
    record = lab.sketch(f"{name}_top", name)
    # a file the table's writer does not own: other data this process can read (here, rows that would change the
    # sketch); a writer of the table's log points an `add` action at it
    outside = lab.data / f"{name}-outside.parquet"
    pq.write_table(pa.table({"id": pa.array([99], pa.int64()), "brand": ["Apple"],
                             "price": pa.array([9000], pa.int64()), "numSold": pa.array([9], pa.int64())}), outside)
    path = f"../{outside.name}" if where == "relative" else str(outside)
    add = {"add": {"path": path, "size": outside.stat().st_size, "partitionValues": {},
                   "modificationTime": 1_700_000_000_000, "dataChange": True}}
    (lab.data / name / "_delta_log" / f"{1:020d}.json").write_text(json.dumps(add) + "\n")

    done = lab.imp("sketch", "maintain", f"{name}_top", "--strategy", "lazy", "--no-recapture")
    _one_line_error(done, 4, "outside the table's directory")
    assert lab.catalog.latest_version(record.id).version == 1  # nothing was committed from that file
    assert os.path.exists(outside)

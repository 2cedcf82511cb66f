"""Lakehouse reads (issue 16): the sketched query through Delta's connector, and the change feed at any size.

``connector``: the skipping benchmark's table (10M rows clustered on ``a``, 100 files, Q_skip's sketch on ``a``)
queried with its sketch through Delta Lake's connector (``versionAsOf`` + the range filter: Delta's own data
skipping decides the files) and through the direct read of the Parquet files our min/max pruning keeps (the read
path for plain tables), plus the plain query through the connector. Pinned at the latest version and at one version
back (time travel: the connector rebuilds that snapshot on every read).

``cdf``: reading the change rows of one commit of 1K, 100K and 10M inserted rows with delta-rs (``load_cdf``), with
Spark's ``readChangeFeed`` (in parallel on the executors, Arrow batches to the driver), and with the log fast path
(``changelog.py``) where it applies. Chooses ``IMP_CDF_SPARK_ROWS``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
from pyspark.sql import SparkSession

from benchmarks import data
from benchmarks.harness import Experiment, scaled
from benchmarks.maintenance import spark_session
from imp_core.engine.pipeline import Pipeline
from imp_core.plan.sql import parse_query
from imp_core.sketch.partition import Partition, PartitionSet
from imp_core.sketch.sketch import Sketch
from imp_core.sources import changelog, reader
from imp_core.sources.delta import DeltaSource
from imp_core.sources.spark_cdf import read_change_feed
from imp_core.spark.backend import SparkBackend
from imp_core.spark.bounds import equi_depth_bounds
from imp_core.use.query import execute

CDF_ROWS = (1_000, 100_000, 10_000_000)


def _scan_mode(mode: str):  # noqa: ANN202
    class Mode:
        def __enter__(self) -> None:
            self.old = os.environ.get("IMP_SPARK_SCAN")
            os.environ["IMP_SPARK_SCAN"] = mode

        def __exit__(self, *exc: object) -> None:
            if self.old is None:
                os.environ.pop("IMP_SPARK_SCAN", None)
            else:
                os.environ["IMP_SPARK_SCAN"] = self.old

    return Mode()


def connector(quick: bool, runs: int) -> Experiment:
    spark = spark_session()
    rows = scaled(200_000 if quick else 10_000_000)
    files = 20 if quick else 100
    name = f"skip_{rows}_{files}"
    path = data.base_table(name, rows, 5000, files=files)
    data.reset(path)
    source = DeltaSource(name, path)
    version = source.current_version()
    sql = f"SELECT a, AVG(b) AS ab FROM {name} GROUP BY a HAVING AVG(c) < 312.5"
    query = parse_query(sql, {name: source.schema()})
    sources = {name: source}
    bounds = equi_depth_bounds(source.scan(spark, version), "a", 1000, "int", source.column_stats(version, "a"))
    partitions = PartitionSet((Partition(name, "a", bounds, "int"),))
    pipe = Pipeline(query.plan, partitions)
    pipe.capture(SparkBackend(spark, sources), {name: version})
    sketch = Sketch.from_global(partitions, pipe.sketch())
    share = len(sketch.fragments[name]) / partitions.partitions[0].fragments

    exp = Experiment("lakehouse_connector", f"Q_skip with its sketch ({share:.1%} of the fragments), {rows:,} rows, "
                     f"{files} files: Delta's connector vs reading the pruned Parquet file list",
                     ratios=[("connector", "Parquet file list")], log_y=False, y_label="seconds")
    seen: dict[str, tuple[int, int, int]] = {}

    def run(mode: str, label: str, with_sketch: bool = True):  # noqa: ANN202
        def go() -> None:
            with _scan_mode(mode):
                df, report = execute(spark, query.plan, sources, {name: version},
                                     partitions if with_sketch else None, sketch if with_sketch else None)
                out = df.collect()
                report.measure(df)
                seen[label] = (report.files_read, report.rows_read, len(out))
        return go

    exp.measure("latest version", {"connector": run("connector", "connector"),
                                   "Parquet file list": run("auto", "Parquet file list"),
                                   "connector, no sketch": run("connector", "plain", with_sketch=False)}, runs)
    a, b = seen["connector"], seen["Parquet file list"]
    assert a[2] == b[2] == seen["plain"][2], "the read path changed the answer"
    exp.notes.append(f"- files read with the sketch: connector {a[0]}, Parquet file list {b[0]} (of {files}); rows "
                     f"read {a[1]:,} vs {b[1]:,}; without the sketch {seen['plain'][0]} files")
    # time travel: a version behind the latest (the connector rebuilds that snapshot on every read)
    from deltalake import write_deltalake

    write_deltalake(str(path), data.synthetic(1000, 5000, seed=11, first_id=rows + 1), mode="append")
    exp.measure("one version back (time travel)", {"connector": run("connector", "connector"),
                                                   "Parquet file list": run("auto", "Parquet file list")}, runs)
    data.reset(path)
    return exp


def write_cdf_table(path: Path, n: int) -> None:
    """A Delta table with the change feed on: version 0 holds 10 rows, version 1 appends ``n`` (seeded by ``n``)."""
    from deltalake import write_deltalake

    rng = np.random.default_rng(n)

    def rows(k: int) -> pa.Table:
        return pa.table({"id": np.arange(k, dtype=np.int64), "g": rng.integers(0, 5000, k), "v": rng.random(k)})

    write_deltalake(str(path), rows(10), configuration={"delta.enableChangeDataFeed": "true"})
    write_deltalake(str(path), rows(n), mode="append")


def cdf_readers(spark: SparkSession, path: Path, n: int) -> dict[str, Callable[[], None]]:
    """Three ways to read version 1's change feed of the table at ``path``, each checking it read ``n`` rows."""
    source = DeltaSource(f"t_{n}", path)
    cols = ["id", "g", "v"]
    schema = source.schema(1)

    def rs() -> None:
        assert reader._from_delta_rs(source, 0, 1, cols, None).num_rows == n  # noqa: SLF001 - timing delta-rs' reader alone

    def sp() -> None:
        assert read_change_feed(spark, str(path), 0, 1, cols).num_rows == n

    def fast() -> None:
        t = changelog.read_range(Path(path), 0, 1, cols, schema, [])
        assert t is not None and t.num_rows == n

    return {"delta-rs": rs, "Spark readChangeFeed": sp, "log fast path": fast}


def cdf(quick: bool, runs: int) -> Experiment:
    spark = spark_session()
    exp = Experiment("lakehouse_cdf", "Change feed of one commit of N inserted rows: delta-rs vs Spark "
                     "(readChangeFeed, local[2]) vs the log fast path", log_x=True, log_y=True,
                     x_label="change rows", y_label="seconds")
    sizes = [scaled(s) for s in CDF_ROWS if not quick or s <= 100_000]
    root = data.DATA / "lakehouse_cdf"
    for n in sizes:
        path = root / f"t_{n}"
        if not (path / "_delta_log").exists():
            write_cdf_table(path, n)
        variants = cdf_readers(spark, path, n)
        exp.measure(f"{n:,} rows", variants, runs if n < 10_000_000 else max(2, runs - 2), x=n)
    return exp


def run(quick: bool = False, runs: int = 5) -> list[Experiment]:
    t0 = time.perf_counter()
    out = [cdf(quick, runs), connector(quick, runs)]
    out[-1].notes.append(f"- suite time {time.perf_counter() - t0:.0f} s")
    return out

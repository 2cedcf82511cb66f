"""External state's store alone: what one external operator costs per batch (issue 38, "Tables of any size").

One ``DeltaGroupStore`` (``imp_core/spark/state_store.py``) of ``GROUPS`` groups with three components as an
aggregation keeps them (``groups`` with two accumulators, ``fcounts`` one fragment per group, ``mm0`` one value
per group), written by Spark; then, per run and per batch size, a batch of existing keys is fetched (the keys'
buckets, one read of their rows) and replaced with every group changed (one append), as the external aggregation
does in a pass: keys drawn from the whole domain (every file read) and keys close together, drawn from a window of
``WINDOW`` of the domain (as the scale benchmark's TPC-H changes: line items of the orders in the table's first
200,000 rows; the files outside the window are skipped by their key statistics). Last, per run, one compaction of
the whole table (what every append beyond a quarter of the live rows triggers). Times in seconds on ``local[2]``;
the number of Spark jobs of each step is recorded too. The aggregation's own fold in process (milliseconds) is not
part of it.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator

import numpy as np
import polars as pl

from benchmarks.harness import Experiment, scaled
from benchmarks.maintenance import spark_session

GROUPS = 1_500_000  # TPC-H SF1's orders: Q18's and Q21's per-order aggregations
SIZES = (10, 1_000, 100_000)
WINDOW = 0.03  # the part of the key domain that keys close together are drawn from
SCHEMAS = {
    "groups": {"k": pl.Int64, "__n": pl.Int64, "__s0": pl.Int64, "__sk": pl.List(pl.UInt32)},
    "fcounts": {"k": pl.Int64, "__frag": pl.UInt32, "__n": pl.Int64},
    "mm0": {"k": pl.Int64, "__value": pl.Int64, "__n": pl.Int64},
}


def run(quick: bool = False, runs: int = 5) -> Iterator[Experiment]:
    from pyspark.sql import functions as F

    from imp_core.spark.state_store import DeltaGroupStore, bucket_count

    groups = scaled(GROUPS) if not quick else 20_000
    sizes = [n for n in SIZES if n <= groups // 10] if not quick else [10, 100]
    exp = Experiment("state_store", f"One external operator's store, {groups:,} groups in one Delta table (three "
                                    f"components): fetch and replace per batch of changed groups, and a compaction",
                     log_x=True, x_label="changed groups")
    spark = spark_session()
    spark.sparkContext.setJobGroup("imp-bench-state-store", "state store")
    root = tempfile.mkdtemp(prefix="imp-state-bench-")
    try:
        store = DeltaGroupStore(spark, f"{root}/op", ["k"], SCHEMAS, buckets=bucket_count(groups))
        ids = spark.range(groups).select(F.col("id").alias("k"))
        t0 = time.perf_counter()
        store.write_all({
            "groups": ids.select("k", F.lit(1).cast("long").alias("__n"), (F.col("k") % 100).alias("__s0")),
            "fcounts": ids.select("k", (F.col("k") % 1000).cast("int").alias("__frag"),
                                  F.lit(1).cast("long").alias("__n")),
            "mm0": ids.select("k", (F.col("k") % 977).alias("__value"), F.lit(1).cast("long").alias("__n")),
        })
        exp.notes.append(f"The store written by Spark in {time.perf_counter() - t0:.1f} s "
                         f"({store.buckets} bucket(s), {sum(store.size().values()):,} rows).")
        rng = np.random.default_rng(38)
        tracker = spark.sparkContext.statusTracker()
        for i in range(runs + 1):  # the first round warms the JVM up and is not recorded
            for n, close in [(n, close) for n in sizes for close in (False, True)]:
                span = max(n, int(groups * WINDOW)) if close else groups
                first = int(rng.integers(0, groups - span + 1))
                keys = pl.DataFrame({"k": first + rng.choice(span, n, replace=False).astype(np.int64)})
                label = f"{n:,} groups" + (" close together" if close else "")
                jobs = len(tracker.getJobIdsForGroup("imp-bench-state-store"))
                t0 = time.perf_counter()
                got = store.fetch(keys)
                fetch_s, fetch_jobs = time.perf_counter() - t0, len(tracker.getJobIdsForGroup(
                    "imp-bench-state-store")) - jobs
                new = {name: df.with_columns(pl.col("__n") + 1) for name, df in got.items()}
                jobs += fetch_jobs
                t0 = time.perf_counter()
                store.replace(keys, new)
                replace_s, replace_jobs = time.perf_counter() - t0, len(tracker.getJobIdsForGroup(
                    "imp-bench-state-store")) - jobs
                if i:
                    exp.add(label, "fetch", i, fetch_s, x=n, spark_jobs=fetch_jobs)
                    exp.add(label, "replace", i, replace_s, x=n, spark_jobs=replace_jobs)
            if i:
                t0 = time.perf_counter()
                store.compact()
                exp.add("compaction (whole table)", "compact", i, time.perf_counter() - t0, x=groups)
    finally:
        spark.sparkContext.setJobGroup("", "")
        shutil.rmtree(root, ignore_errors=True)
    yield exp

"""Data skipping and capture (issue 4): the query with and without its sketch, and what capture costs.

A 10M-row table clustered on the partition column ``a`` (5,000 groups, 100 files); ``Q_skip`` =
``SELECT a, AVG(b) AS ab FROM t GROUP BY a HAVING AVG(c) < 312.5`` keeps ~5% of the groups, so its sketch on ``a``
(1,000 equi-depth fragments) covers ~5% of the data. Measured side by side: the plain query, the query restricted
by the sketch (Delta files pruned by min/max statistics, then the range filter), and the capture (full maintenance)
with the Bucketizer fragment computation versus the nested-CASE fallback.
"""

from __future__ import annotations

import time

from benchmarks import data
from benchmarks.harness import Experiment, scaled
from benchmarks.maintenance import spark_session
from imp_core.engine.pipeline import Pipeline
from imp_core.plan.sql import parse_query
from imp_core.sketch.partition import Partition, PartitionSet
from imp_core.sketch.sketch import Sketch
from imp_core.sources.delta import DeltaSource
from imp_core.spark import fragment as fragment_module
from imp_core.spark.backend import SparkBackend
from imp_core.spark.bounds import equi_depth_bounds
from imp_core.use.query import execute


def run(quick: bool = False, runs: int = 5) -> list[Experiment]:
    spark = spark_session()
    rows = scaled(200_000 if quick else 10_000_000)
    groups = 5000
    files = 20 if quick else 100
    name = f"skip_{rows}_{files}"
    path = data.base_table(name, rows, groups, files=files)
    data.reset(path)
    source = DeltaSource(name, path)
    version = source.current_version()
    sql = f"SELECT a, AVG(b) AS ab FROM {name} GROUP BY a HAVING AVG(c) < 312.5"
    query = parse_query(sql, {name: source.schema()})
    sources = {name: source}

    t0 = time.perf_counter()
    bounds = equi_depth_bounds(source.scan(spark, version), "a", 1000, "int", source.column_stats(version, "a"))
    bounds_s = time.perf_counter() - t0
    partitions = PartitionSet((Partition(name, "a", bounds, "int"),))
    backend = SparkBackend(spark, sources)

    capture = Experiment("capture", f"Capture (full maintenance) of Q_skip on {rows:,} rows, 1,000 fragments",
                         log_y=False, y_label="seconds")
    holder: dict[str, Pipeline] = {}

    def capture_bucketizer() -> None:
        pipe = Pipeline(query.plan, partitions)
        pipe.capture(backend, {name: version})
        holder["pipe"] = pipe

    def capture_case() -> None:
        original = fragment_module.exact_as_double
        fragment_module.exact_as_double = lambda p: False  # force the nested-CASE path
        try:
            pipe = Pipeline(query.plan, partitions)
            pipe.capture(SparkBackend(spark, sources), {name: version})
        finally:
            fragment_module.exact_as_double = original

    def plain_query() -> None:
        df, _ = execute(spark, query.plan, sources, {name: version})
        df.collect()

    capture.measure("capture", {"Bucketizer": capture_bucketizer, "nested CASE": capture_case,
                                "plain query (no annotation)": plain_query}, min(runs, max(2, runs - 2)))
    capture.notes.append(f"- equi-depth bounds (a sample of the {rows:,} rows on Spark, the first Spark job of the "
                         f"process): {bounds_s:.2f} s, measured once")

    pipe = holder["pipe"]
    sketch = Sketch.from_global(partitions, pipe.sketch())
    share = len(sketch.fragments[name]) / partitions.partitions[0].fragments
    skipping = Experiment("skipping", f"Q_skip with and without its sketch ({share:.1%} of the fragments), "
                          f"{rows:,} rows clustered on a, {files} files", ratios=[("plain", "with sketch")],
                          log_y=False, y_label="seconds")
    scans = {}

    def with_sketch() -> None:
        df, report = execute(spark, query.plan, sources, {name: version}, partitions, sketch)
        rows_out = df.collect()
        report.measure(df)
        scans["with"] = (report, len(rows_out))

    def plain() -> None:
        df, report = execute(spark, query.plan, sources, {name: version})
        rows_out = df.collect()
        report.measure(df)
        scans["plain"] = (report, len(rows_out))

    # Spark's fixed cost per query (planning, two stages, result transfer): the same query restricted to a single
    # fragment reads one file; no sketch can make the query cheaper than this on this engine
    floor_sketch = Sketch({name: sketch.fragments[name][:1]})

    def one_fragment() -> None:
        df, report = execute(spark, query.plan, sources, {name: version}, partitions, floor_sketch)
        df.collect()
        report.measure(df)
        scans["floor"] = (report, 0)

    skipping.measure("Q_skip", {"plain": plain, "with sketch": with_sketch,
                                "one fragment (Spark's floor)": one_fragment}, runs)
    (rw, nw), (rp, np_), (rf, _) = scans["with"], scans["plain"], scans["floor"]
    assert nw == np_, "the sketch changed the answer"
    skipping.notes.append(f"- files read: {rw.files_read}/{rw.files_total} with the sketch, "
                          f"{rp.files_read}/{rp.files_total} without, {rf.files_read} for one fragment; rows in "
                          f"files read: {rw.rows_read:,} vs {rp.rows_read:,}; result rows: {nw}")
    med = {v: sorted(skipping.values("Q_skip", v))[runs // 2] for v in skipping.variants()}
    floor = med["one fragment (Spark's floor)"]
    if med["with sketch"] > floor:
        skipping.notes.append(f"- above Spark's per-query floor of {floor:.3f} s, the sketch cuts the query's "
                              f"data-dependent time {(med['plain'] - floor) / (med['with sketch'] - floor):.1f}x "
                              f"(plain {med['plain'] - floor:.3f} s vs with sketch {med['with sketch'] - floor:.3f} s)")
    return [capture, skipping]

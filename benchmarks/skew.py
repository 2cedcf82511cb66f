"""A skewed insert stream with and without range split and merge (issue 20, benchmark 6b; paper 7.4).

Two identical tables ``(b, v)`` of ``BASE`` rows, ``b`` uniform over 1,000 buckets (1,000 rows each), ``v`` = 10 in
buckets 100-149 and 1 elsewhere, each with the sketch of ``Q_avg`` (``GROUP BY b HAVING AVG(v) > 5``: 5% of the
data) on 100 equi-width ranges of ``b``. Every round appends ``ROUND`` rows to both tables, all in 1% of the domain
(buckets 500-509, one range), ``v`` = 10 only in bucket 505, so that bucket joins the query's result and the one
range holding the whole insert stream enters the sketch. Both sketches are maintained; one is repartitioned
(``imp sketch repartition --apply``, factor 4) after each round, the other keeps its ranges. Both tables are
re-clustered by ``b`` after each round (what the nightly layout task does), so files follow the ranges.

Per round: the skipping ratio (all rows over the rows of the sketch's ranges, from the version's tracked rows per
range), the rows Spark read, and the sketched query's time, for the repartitioned sketch, the fixed one and no
sketch (interleaved runs). No target is set by the issue; the figure is the ratio over time.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from benchmarks import harness
from benchmarks.harness import Experiment, scaled
from benchmarks.maintenance import spark_session
from benchmarks.strategies import service_for
from imp_core.maintenance.service import SketchService

SQL = "SELECT b, AVG(v) AS a FROM {t} GROUP BY b HAVING AVG(v) > 5"
BUCKETS = 1000
HOT = (500, 510)
HOT_BUCKET = 505
BOUNDS = ",".join(str(x) for x in range(0, BUCKETS + 1, 10))
CDF = {"delta.enableChangeDataFeed": "true"}


def _base(rows: int) -> pa.Table:
    b = np.arange(rows, dtype=np.int64) * BUCKETS // rows
    return pa.table({"b": b, "v": np.where((b >= 100) & (b < 150), 10.0, 1.0)})


def _round(rows: int, seed: int) -> pa.Table:
    b = np.random.default_rng(seed).integers(HOT[0], HOT[1], rows)
    return pa.table({"b": b, "v": np.where(b == HOT_BUCKET, 10.0, 1.0)})


def _ratio(service: SketchService, name: str) -> tuple[float, int]:
    """All rows over the rows of the sketch's ranges, and its number of ranges."""
    catalog = service.catalog
    v = catalog.latest_version(catalog.get_sketch(name).id)
    table = next(iter(v.fragment_rows))
    rows = v.fragment_rows[table]
    kept = sum(rows[f] for f in v.fragments.get(table, []))
    return (sum(rows) / kept if kept else float("inf")), len(rows)


def skewed_stream(service: SketchService, root: Path, quick: bool, runs: int) -> Experiment:
    base, per_round, rounds = scaled(1_000_000), scaled(100_000), 2 if quick else 10
    exp = Experiment("skew_split", f"Skewed inserts ({per_round:,} rows per round into 1% of the domain) on "
                     f"{base:,} rows: sketch with range split/merge after each round vs fixed ranges vs no sketch",
                     x_label="round", y_label="skipping ratio / seconds", log_y=True, timed=False)
    names = {"split": "skew_split", "fixed": "skew_fixed"}
    from deltalake import write_deltalake

    for table in names.values():
        path = root / table
        shutil.rmtree(path, ignore_errors=True)
        whole = _base(base)
        for chunk in range(10):  # ten files in b order: the base is clustered like the ranges
            write_deltalake(str(path), whole.slice(chunk * base // 10, base // 10), mode="append",
                            configuration=CDF if chunk == 0 else None)
        service.register_table(table, str(path), replace=True)
        service.create_sketch(f"{table}_s", SQL.format(t=table), [f"{table}.b"], bounds=[BOUNDS])
    for r in range(rounds + 1):
        if r:
            rows = _round(per_round, r)
            for table in names.values():
                write_deltalake(str(root / table), rows, mode="append")
                service.source(table).z_order(["b"])  # the nightly layout task's re-clustering
                service.maintain(f"{table}_s")
            t0 = time.perf_counter()
            done = service.repartition("skew_split_s", apply=True)
            exp.add(f"round {r}", "repartition (s)", 0, time.perf_counter() - t0, x=r,
                    rows_moved=sum(t.rows_moved for t in done.tables))
        for arm, table in names.items():
            ratio, ranges = _ratio(service, f"{table}_s")
            exp.add(f"round {r}", f"ratio {arm}", 0, ratio, unit="x", x=r, ranges=ranges)
        _time_queries(service, exp, r, runs)
    return exp


def _time_queries(service: SketchService, exp: Experiment, r: int, runs: int) -> None:
    samples: dict[str, list[tuple[float, Any]]] = {"query split (s)": [], "query fixed (s)": [], "no sketch (s)": []}
    warmup = 0 if harness.QUICK else 1
    for _ in range(warmup + runs):
        for variant, table, use in (("query split (s)", "skew_split", True), ("query fixed (s)", "skew_fixed", True),
                                    ("no sketch (s)", "skew_fixed", False)):
            t0 = time.perf_counter()
            result = service.query(SQL.format(t=table), use_sketch=use)
            samples[variant].append((time.perf_counter() - t0, result.scanned.rows_read))
    for variant, values in samples.items():
        for i, (seconds, rows_read) in enumerate(values[warmup:]):  # the first round warms up (not in quick mode)
            exp.add(f"round {r}", variant, i, seconds, x=r, rows_read=rows_read)


def run(quick: bool = False, runs: int = 5):  # noqa: ANN201
    spark = spark_session()
    with tempfile.TemporaryDirectory() as home:
        service = service_for(Path(home), spark)
        try:
            yield skewed_stream(service, Path(home) / "tables", quick, runs)
        finally:
            from imp_core.catalog.embedded import stop_embedded

            service.catalog.close()
            stop_embedded(service.settings)

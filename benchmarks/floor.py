"""Skipping on 100M rows (issue 20, item 6c).

``skipping_100m``: ``Q_skip`` with and without its ~5% sketch on a table of ``IMP_BENCH_SKIP_ROWS`` rows (default
100M, times ``IMP_BENCH_SCALE``) clustered on the sketch column ``a``. Target: >= 10x. The table (``id, a, b, c``;
``a`` = 5,000 groups in row order, ``b``/``c`` linear in ``a`` plus noise) is generated once into ``data/bench`` by
delta-rs in chunks of 500K rows (one file each; memory stays at one chunk) and reused; generation time is printed
and noted. The sketch is the provenance of ``Q_skip`` on 1,000 equi-depth fragments of ``a`` (``a`` is uniform, so
equi-width bounds are equi-depth): the fragments of the groups that pass ``HAVING``, computed by one Spark query.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from benchmarks import data
from benchmarks.harness import Experiment, scaled
from benchmarks.maintenance import spark_session
from imp_core.sketch.partition import Partition, PartitionSet
from imp_core.sketch.sketch import Sketch
from imp_core.sources import reader
from imp_core.sources.delta import DeltaSource
from imp_core.use.query import ScanReport
from imp_core.use.rewrite import ranges_sql

GROUPS = 5000
FRAGMENTS = 1000
THRESHOLD = 375.0  # AVG(c) ~ 1.5 a: groups a < 250 pass, 5% of the data
CHUNK = 500_000


def clustered_table(rows: int) -> tuple[Path, float | None]:
    """A cached table of ``rows`` rows clustered on ``a`` and the seconds its generation took (None: cached)."""
    from deltalake import DeltaTable, write_deltalake

    path = data.DATA / f"floor_{rows}"
    if (path / "_delta_log").exists():
        return path, None
    data.DATA.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)
    print(f"   generating {path.name}: {rows:,} rows in chunks of {CHUNK:,}", flush=True)
    t0 = time.perf_counter()
    rng = np.random.default_rng(11)
    for start in range(0, rows, CHUNK):
        ids = np.arange(start, min(rows, start + CHUNK), dtype=np.int64)
        a = ids * GROUPS // rows
        chunk = pa.table({"id": ids, "a": a, "b": np.round(a + rng.normal(0, 50, len(ids)), 2),
                          "c": np.round(a * 1.5 + rng.normal(0, 50, len(ids)), 2)})
        write_deltalake(str(tmp), chunk, mode="overwrite" if start == 0 else "append")
    DeltaTable(str(tmp)).create_checkpoint()
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)
    return path, time.perf_counter() - t0


def _sketch(spark, name: str, source: DeltaSource, version: int) -> tuple[PartitionSet, Sketch]:  # noqa: ANN001
    step = GROUPS // FRAGMENTS
    part = Partition(name, "a", tuple(range(step, GROUPS, step)), "int")
    groups = spark.sql(f"SELECT a FROM ({reader.relation_sql(source, version)}) GROUP BY a HAVING AVG(c) < {THRESHOLD}")
    passing = np.array([r[0] for r in groups.collect()], dtype=np.int64)
    frags = np.unique(np.searchsorted(np.array(part.bounds), passing, side="right"))
    return PartitionSet((part,)), Sketch({name: tuple(int(f) for f in frags)})


def _setup(spark, rows: int) -> tuple[str, DeltaSource, int, PartitionSet, Sketch, float | None]:  # noqa: ANN001
    path, generated = clustered_table(rows)
    name = f"floor_{rows}"
    source = DeltaSource(name, str(path))
    version = source.current_version()
    partitions, sketch = _sketch(spark, name, source, version)
    return name, source, version, partitions, sketch, generated


def _median(exp: Experiment, case: str, variant: str) -> float:
    values = sorted(exp.values(case, variant))
    return values[len(values) // 2]


def _query(source: DeltaSource, version: int, predicate: str | None) -> str:
    """Q_skip over the table at ``version`` through Delta's connector, restricted by ``predicate`` (the range filter
    imp's extension adds for the sketch) when given: Delta skips the files whose statistics cannot meet it."""
    relation = reader.relation_sql(source, version, predicate)
    return f"SELECT a, AVG(b) AS ab FROM ({relation}) AS t GROUP BY a HAVING AVG(c) < {THRESHOLD}"


def skipping_100m(spark, quick: bool, runs: int) -> Experiment:  # noqa: ANN001
    rows = scaled(int(os.environ.get("IMP_BENCH_SKIP_ROWS", 2_000_000 if quick else 100_000_000)))
    t0 = time.perf_counter()
    name, source, version, partitions, sketch, generated = _setup(spark, rows)
    setup_s = time.perf_counter() - t0
    files = len(source.files(version))
    share = len(sketch.fragments[name]) / FRAGMENTS
    predicate = ranges_sql("`a`", partitions.partitions[0].ranges(list(sketch.fragments[name])))
    seen: dict[str, tuple] = {}

    def run(key: str, restrict: str | None) -> None:
        df = spark.sql(_query(source, version, restrict))
        out = df.collect()
        report = ScanReport(files_total=files)
        report.measure(df)
        seen[key] = (report, sorted(tuple(r) for r in out))

    exp = Experiment("skipping_100m", f"Q_skip with and without its sketch ({share:.1%} of the fragments), "
                     f"{rows:,} rows clustered on a, {files} files", ratios=[("plain", "with sketch")], log_y=False)
    exp.measure("Q_skip", {"plain": lambda: run("plain", None), "with sketch": lambda: run("with", predicate)}, runs)
    (rp, ap), (rw, aw) = seen["plain"], seen["with"]
    assert ap == aw, "the sketch changed the answer"
    ratio = _median(exp, "Q_skip", "plain") / _median(exp, "Q_skip", "with sketch")
    exp.notes.append(f"- ratio of medians {ratio:.1f}x (target >= 10x); files read {rw.files_read}/{rw.files_total} "
                     f"with the sketch, {rp.files_read}/{rp.files_total} without; rows in files read "
                     f"{rw.rows_read:,} vs {rp.rows_read:,}; result rows: {len(aw)}")
    exp.notes.append(f"- table generation (delta-rs, {-(-rows // CHUNK)} chunks of {CHUNK:,} rows): "
                     + (f"{generated:.0f} s" if generated is not None else "cached from an earlier run")
                     + f"; setup including the sketch's Spark query: {setup_s:.0f} s")
    return exp


def run(quick: bool = False, runs: int = 5) -> list[Experiment]:
    spark = spark_session()
    return [skipping_100m(spark, quick, runs)]

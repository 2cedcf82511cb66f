"""Sketch use at Spark's floor (issue 20, items 5 and 6c).

``sql_floor``: the sketched query as ``imp`` builds it (one SQL text, ``imp_core/use/sql_text.py``) against the same
query hand-written in plain Spark SQL with the same range filter, and against the DataFrame composed from Python
(``imp_core/use/query.execute``, ~180 Py4J round trips); interleaved runs on a 10M-row table. Target: <= 10% overhead
over the hand-written query.

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
from imp_core.plan.sql import parse_query
from imp_core.sketch.partition import Partition, PartitionSet
from imp_core.sketch.sketch import Sketch
from imp_core.sources import reader
from imp_core.sources.delta import DeltaSource
from imp_core.use.query import execute
from imp_core.use.rewrite import ranges_sql
from imp_core.use.sql_text import _direct_view, sketched_dataframe

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


def _setup(spark, rows: int) -> tuple[str, str, DeltaSource, int, PartitionSet, Sketch, float | None]:  # noqa: ANN001
    path, generated = clustered_table(rows)
    name = f"floor_{rows}"
    source = DeltaSource(name, str(path))
    version = source.current_version()
    partitions, sketch = _sketch(spark, name, source, version)
    sql = f"SELECT a, AVG(b) AS ab FROM {name} GROUP BY a HAVING AVG(c) < {THRESHOLD}"
    return name, sql, source, version, partitions, sketch, generated


def _median(exp: Experiment, case: str, variant: str) -> float:
    values = sorted(exp.values(case, variant))
    return values[len(values) // 2]


def sql_floor(spark, quick: bool, runs: int) -> Experiment:  # noqa: ANN001
    rows = scaled(200_000 if quick else 10_000_000)
    name, sql, source, version, partitions, sketch, _ = _setup(spark, rows)
    sources, versions = {name: source}, {name: version}
    part = partitions.partitions[0]
    predicate = ranges_sql("`a`", part.ranges(list(sketch.fragments[name])))
    hand = (f"SELECT a, AVG(b) AS ab FROM delta.`{source.path}` VERSION AS OF {version} WHERE {predicate} "
            f"GROUP BY a HAVING AVG(c) < {THRESHOLD}")
    query = parse_query(sql, {name: source.schema()})
    answers: dict[str, list[tuple]] = {}
    # the same files as imp reads (Parquet read directly, pruned by statistics), as a user would register them
    view = _direct_view(spark, source, version, part, list(sketch.fragments[name]))
    hand_view = (f"SELECT a, AVG(b) AS ab FROM `{view}` WHERE {predicate} GROUP BY a HAVING AVG(c) < {THRESHOLD}")

    def ours() -> None:
        df, _ = sketched_dataframe(spark, sql, "spark", sources, versions, partitions, sketch)
        answers["ours"] = sorted(tuple(r) for r in df.collect())

    def handwritten() -> None:
        answers["hand"] = sorted(tuple(r) for r in spark.sql(hand).collect())

    def handwritten_view() -> None:
        answers["hand_view"] = sorted(tuple(r) for r in spark.sql(hand_view).collect())

    def composed() -> None:
        df, _ = execute(spark, query.plan, sources, versions, partitions, sketch)
        answers["composed"] = sorted(tuple(r) for r in df.collect())

    exp = Experiment("sql_floor", f"The sketched Q_skip as imp builds it vs hand-written Spark SQL with the same range "
                     f"filter, {rows:,} rows, {len(sketch.fragments[name])}/{FRAGMENTS} fragments",
                     ratios=[("imp (one SQL text)", "hand-written, same files")], log_y=False)
    exp.measure("Q_skip", {"imp (one SQL text)": ours, "hand-written, same files": handwritten_view,
                           "hand-written, delta.`path` VERSION AS OF": handwritten,
                           "DataFrame composed from Python (before)": composed}, runs)
    assert answers["ours"] == answers["hand"] == answers["hand_view"], "answers differ"
    assert len(answers["ours"]) == len(answers["composed"]), "answers differ"
    ours_s = _median(exp, "Q_skip", "imp (one SQL text)")
    overhead = ours_s / _median(exp, "Q_skip", "hand-written, same files") - 1
    connector = ours_s / _median(exp, "Q_skip", "hand-written, delta.`path` VERSION AS OF") - 1
    exp.notes.append(f"- overhead of imp's query over the hand-written one on the same files (medians): "
                     f"{overhead:+.1%} (target <= +10%); over the hand-written one through the connector: "
                     f"{connector:+.1%}; result rows: {len(answers['ours'])}, the same in all four")
    return exp


def skipping_100m(spark, quick: bool, runs: int) -> Experiment:  # noqa: ANN001
    rows = scaled(int(os.environ.get("IMP_BENCH_SKIP_ROWS", 2_000_000 if quick else 100_000_000)))
    t0 = time.perf_counter()
    name, sql, source, version, partitions, sketch, generated = _setup(spark, rows)
    setup_s = time.perf_counter() - t0
    sources, versions = {name: source}, {name: version}
    files = len(source.files(version))
    share = len(sketch.fragments[name]) / FRAGMENTS
    seen: dict[str, tuple] = {}

    def run(key: str, part: PartitionSet | None, sk: Sketch | None) -> None:
        df, report = sketched_dataframe(spark, sql, "spark", sources, versions, part, sk)
        out = df.collect()
        report.measure(df)
        seen[key] = (report, sorted(tuple(r) for r in out))

    exp = Experiment("skipping_100m", f"Q_skip with and without its sketch ({share:.1%} of the fragments), "
                     f"{rows:,} rows clustered on a, {files} files", ratios=[("plain", "with sketch")], log_y=False)
    exp.measure("Q_skip", {"plain": lambda: run("plain", None, None),
                           "with sketch": lambda: run("with", partitions, sketch)}, runs)
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
    return [sql_floor(spark, quick, runs), skipping_100m(spark, quick, runs)]

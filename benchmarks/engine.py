"""In-memory engine micro-benchmark (issue 3): delta rows per second and state size/serialization.

Query ``SELECT a, AVG(b) AS ab FROM t GROUP BY a HAVING AVG(c) < 1600`` over a 10M-row table with 5,000 groups,
sketch on ``a`` with 1,000 fragments. The state is built once (capture through the in-memory backend); each change
batch (half deletes of existing rows, half inserts) is then maintained and undone, so every run starts from the same
state. Two variants per batch size:

* ``pipeline``: annotation, every operator and the merge μ (the engine alone);
* ``with CDF read``: the same plus reading the batch from a Delta table's change feed (delta-rs), the way
  maintenance gets it. State write (serialization + catalog) is excluded; it is measured separately.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from benchmarks.harness import Experiment, scaled
from imp_core.engine import frames
from imp_core.engine.local import LocalBackend
from imp_core.engine.pipeline import Pipeline
from imp_core.engine.schema import MULT
from imp_core.plan.sql import parse_query
from imp_core.sketch.partition import Partition, PartitionSet
from imp_core.sources.delta import VERSION, DeltaSource

SQL = "SELECT a, AVG(b) AS ab FROM t GROUP BY a HAVING AVG(c) < 1600"


def table(rows: int, groups: int, seed: int = 1) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    a = rng.integers(0, groups, rows)
    return pl.DataFrame({"id": np.arange(rows, dtype=np.int64), "a": a.astype(np.int64),
                         "b": a * 0.5 + rng.normal(0, 50, rows), "c": a * 1.0 + rng.normal(0, 50, rows)})


def pipeline_for(data: pl.DataFrame, groups: int, fragments: int, v2: bool = True) -> Pipeline:
    """The captured pipeline; ``v2=False`` builds it with the first engine's state (``-aggindex,-topkindex``)."""
    q = parse_query(SQL, {"t": data.to_arrow().schema})
    bounds = tuple(int(x) for x in np.linspace(0, groups, fragments + 1))
    pipe = Pipeline(q.plan, PartitionSet((Partition("t", "a", bounds, "int"),)), agg_index=v2, topk_index=v2)
    pipe.capture(LocalBackend(lambda name, v: data), {"t": 0})
    return pipe


def change_batch(data: pl.DataFrame, size: int, seed: int) -> pl.DataFrame:
    half = size // 2
    dele = data.sample(half, seed=seed).with_columns(pl.lit(-1, dtype=pl.Int64).alias(MULT))
    ins = data.sample(size - half, seed=seed + 7919).with_columns(
        pl.lit(1, dtype=pl.Int64).alias(MULT), (pl.col("id") + data.height).alias("id"))
    return pl.concat([dele, ins])


def cdf_source(batch: pl.DataFrame, root: Path) -> DeltaSource:
    """A Delta table whose version 1 is exactly ``batch`` (deletes of rows written at v0, inserts)."""
    path = root / f"cdf_{batch.height}"
    deleted = batch.filter(pl.col(MULT) < 0).drop(MULT)
    inserted = batch.filter(pl.col(MULT) > 0).drop(MULT)
    write_deltalake(str(path), deleted.to_arrow(), mode="overwrite",
                    configuration={"delta.enableChangeDataFeed": "true"})
    DeltaTable(str(path)).delete()  # v1: delete all (CDF delete rows)
    write_deltalake(str(path), inserted.to_arrow(), mode="append")  # v2: inserts
    return DeltaSource("t", path)


def batch_variants(pipe: Pipeline, batch: pl.DataFrame, source: DeltaSource) -> dict[str, Callable[[], float]]:
    """The timed runs for one change batch: the pipeline alone, and with the change read from the Delta CDF first.

    Each run applies the batch and then its inverse (untimed), so the state is the same before every run.
    """
    undo = batch.with_columns(-pl.col(MULT))

    def engine_only() -> float:
        t = time.perf_counter()
        pipe.maintain_pass("t", batch, None, {"t": 1})  # type: ignore[arg-type]
        elapsed = time.perf_counter() - t
        pipe.maintain_pass("t", undo, None, {"t": 1})  # type: ignore[arg-type]
        return elapsed

    def with_cdf() -> float:
        t = time.perf_counter()
        changes = frames.drop(pl.from_arrow(source.changes(0, 2, ["id", "a", "b", "c"])), VERSION)  # as maintain.py
        pipe.maintain_pass("t", changes, None, {"t": 1})  # type: ignore[arg-type]
        elapsed = time.perf_counter() - t
        pipe.maintain_pass("t", undo, None, {"t": 1})  # type: ignore[arg-type]
        return elapsed

    return {"pipeline": engine_only, "with CDF read": with_cdf}


def run(quick: bool = False, runs: int = 5) -> list[Experiment]:
    rows = scaled(200_000 if quick else 10_000_000)
    groups, fragments = 5000, 1000
    sizes = [10, 1000] if quick else [10, 100, 1000, 10_000, 100_000]
    data = table(rows, groups)
    t0 = time.perf_counter()
    pipe = pipeline_for(data, groups, fragments)
    build_s = time.perf_counter() - t0

    exp = Experiment("engine_throughput", f"In-memory pipeline, {rows:,} rows, {groups:,} groups, {fragments:,} "
                     f"fragments: time per change batch", ratios=[], log_x=True, x_label="change rows",
                     y_label="seconds per batch")
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            batch = change_batch(data, size, seed=size)
            exp.measure(f"{size:,} rows", batch_variants(pipe, batch, cdf_source(batch, Path(tmp))), runs, x=size)
    for case in exp.cases():
        size = next(r.x for r in exp.rows if r.case == case)
        for variant in exp.variants():
            vals = sorted(exp.values(case, variant))
            med = vals[len(vals) // 2]
            exp.notes.append(f"- {case}, {variant}: {size / med:,.0f} delta rows/s")
    exp.notes.insert(0, f"State built in {build_s:.1f} s (in-memory capture of {rows:,} rows).")

    state = state_experiment(quick, runs)
    return [exp, state]


def state_experiment(quick: bool, runs: int) -> Experiment:
    """State of 500K groups: size in memory and serialized, (de)serialization time."""
    groups = 50_000 if quick else 500_000
    rows = scaled(200_000 if quick else 10_000_000)
    data = table(rows, groups, seed=5)
    pipe = pipeline_for(data, groups, 1000)
    exp = Experiment("engine_state", f"Operator state for {groups:,} groups ({rows:,} rows, 1,000 fragments)",
                     log_y=False, x_label="", y_label="seconds / MB")
    holder: dict[str, dict[str, bytes]] = {}

    def serialize() -> None:
        holder["blobs"] = pipe.state_blobs()

    def deserialize() -> None:
        fresh = Pipeline(pipe.plan, pipe.partitions)
        fresh.load_state_blobs(holder["blobs"])

    serialize()
    exp.measure("serialize", {"time": serialize}, runs)
    exp.measure("deserialize", {"time": deserialize}, runs)
    mem = pipe.state_size_bytes()
    ser = sum(len(b) for b in holder["blobs"].values())
    exp.notes.append(f"- state in memory: {mem / 1e6:.1f} MB (polars estimated size); serialized: {ser / 1e6:.1f} MB")
    exp.add("size", "in memory (MB)", 0, mem / 1e6, unit="MB")
    exp.add("size", "serialized (MB)", 0, ser / 1e6, unit="MB")
    _ = pa  # Arrow IPC is what the blobs are
    return exp

"""Maintenance strategies and the mixed workload (IMP paper 8.5 and 8.1), through the full service (catalog commits
included).

* ``eager_vs_lazy``: 1,000 single-row updates, maintained eagerly in batches of 1 ... 1,000 change rows (one
  committed sketch version per batch) versus one lazy maintenance; total time.
* ``mixed_workload``: a sequence of operations (queries and updates of a given size, at a given query:update ratio);
  IMP = lazy maintenance + sketch use, FM = recapture + sketch use, NS = no sketch. Total time of the sequence.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks import data
from benchmarks.harness import Experiment, scaled
from benchmarks.maintenance import spark_session
from imp_core.config import Settings
from imp_core.errors import NotFoundError
from imp_core.maintenance.service import SketchService


def service_for(home: Path, spark) -> SketchService:  # noqa: ANN001
    settings = Settings.from_env(home=home, spark_master="local[2]", shuffle_partitions=8)
    return SketchService(settings, spark=spark, progress=lambda m: None)


def _fresh_sketch(service: SketchService, name: str, sql: str, on: str, fragments: int) -> None:
    try:
        service.catalog.drop_sketch(name)
    except NotFoundError:
        pass
    service.create_sketch(name, sql, [on], fragments=fragments, strategy="eager")


def _clone_at_start(service: SketchService, source: str, name: str) -> None:
    """A new sketch whose version 1 is ``source``'s version 1 (same table versions, sketch and operator state), so
    every run maintains the same backlog from the same start."""
    from imp_core.catalog.store import NewVersion, StateBlob

    try:
        service.catalog.drop_sketch(name)
    except NotFoundError:
        pass
    record = service.catalog.get_sketch(source)
    first = service.catalog.get_version(record.id, 1)
    states = [StateBlob(b.operator_id, b.format, b.format_version, b.payload)
              for b in service.catalog.load_states(record.id, 1).values()]
    service.catalog.create_sketch(name, record.sql, record.dialect, record.template_key, record.plan_json,
                                  record.partitions, record.safety, "eager",
                                  NewVersion(first.table_versions, first.bits, first.fragments, "capture"), states)


def eager_vs_lazy(service: SketchService, quick: bool, runs: int) -> Experiment:
    rows = scaled(200_000 if quick else 10_000_000)
    updates = 20 if quick else 1000
    groups = 5000
    name = f"edb_{rows}"
    path = data.base_table(name, rows, groups)
    sql = f"SELECT a, AVG(c) AS ac FROM {name} GROUP BY a HAVING AVG(c) > 1500 AND AVG(c) < 1800"
    exp = Experiment("eager_vs_lazy", f"Maintaining {updates:,} single-row updates ({rows:,} rows, 5K groups): "
                     f"eager in batches of n change rows vs lazy, total time incl. catalog commits",
                     log_x=True, x_label="batch size (change rows)", y_label="seconds")
    data.reset(path)
    service.register_table(name, str(path), replace=True)
    _fresh_sketch(service, "edb", sql, f"{name}.a", 1000)
    start = service.catalog.latest_version(service.catalog.get_sketch("edb").id).table_versions
    # the updates: each commit changes one row (an update = delete of the old row + insert of the new one)
    from deltalake import DeltaTable

    rng = np.random.default_rng(5)
    dt = DeltaTable(str(path))
    ids = rng.choice(rows, updates, replace=False)
    t0 = time.perf_counter()
    for i in ids:
        dt.update(updates={"c": "c + 1000"}, predicate=f"id = {int(i)}")
    exp.notes.append(f"- setup: {updates} update commits took {time.perf_counter() - t0:.0f} s")
    sizes = [1, 10] if quick else [1, 5, 10, 50, 100, 500, 1000]

    for size in [*sizes, "lazy"]:
        for run in range(runs if size in ("lazy", 1000) else max(1, runs // 2)):
            _clone_at_start(service, "edb", "edb_run")
            record = service.catalog.get_sketch("edb_run")
            assert service.catalog.latest_version(record.id).table_versions == start
            t = time.perf_counter()
            if size == "lazy":
                result = service.maintain("edb_run", strategy="lazy")
            else:
                result = service.maintain("edb_run", strategy="eager", batch_size=int(size) * 2)  # update = 2 rows
            elapsed = time.perf_counter() - t
            label = "lazy" if size == "lazy" else f"eager {size}"
            exp.add(label, "total", run, elapsed, x=updates if size == "lazy" else float(size),
                    versions=len(result.versions))
    return exp


def mixed_workload(service: SketchService, quick: bool, runs: int) -> Experiment:
    rows = scaled(200_000 if quick else 10_000_000)
    ops = 6 if quick else 60
    groups = 5000
    name = f"mixed_{rows}"
    path = data.base_table(name, rows, groups, files=100)
    sql = f"SELECT a, AVG(c) AS ac FROM {name} GROUP BY a HAVING AVG(c) < 300"
    exp = Experiment("mixed_workload", f"Mixed workload: {ops} operations on {rows:,} rows (total time), "
                     f"IMP = lazy maintenance + use, FM = recapture + use, NS = no sketch",
                     ratios=[("NS", "IMP"), ("FM", "IMP")], log_y=True, y_label="seconds (total)")
    ratios = [(1, 1), (1, 5), (5, 1)]
    sizes = [1, 20, 200, 2000]
    if quick:
        ratios, sizes = [(1, 1)], [20]
    for q, u in ratios:
        for size in sizes:
            case = f"{q}Q:{u}U, size {size}"
            for method in ("IMP", "FM", "NS"):
                data.reset(path)
                service.register_table(name, str(path), replace=True)
                try:
                    service.catalog.drop_sketch("mixed")
                except NotFoundError:
                    pass
                next_id = data.max_id(path) + 1
                t0 = time.perf_counter()
                created = False
                for i in range(ops):
                    if i % (q + u) < q:  # a query
                        if method == "NS":
                            service.query(sql, use_sketch=False)
                        else:
                            if not created:
                                service.create_sketch("mixed", sql, [f"{name}.a"], fragments=1000)
                                created = True
                            elif method == "FM" and service.is_stale("mixed"):
                                service.maintain("mixed", strategy="recapture")
                            service.query(sql)
                    else:
                        next_id = data.change(path, size, seed=i, groups=groups, next_id=next_id)
                exp.add(case, method, 0, time.perf_counter() - t0)
    return exp


def run(quick: bool = False, runs: int = 5) -> list[Experiment]:
    spark = spark_session()
    with tempfile.TemporaryDirectory() as home:
        service = service_for(Path(home), spark)
        try:
            out = [eager_vs_lazy(service, quick, runs), mixed_workload(service, quick, runs)]
        finally:
            from imp_core.catalog.embedded import stop_embedded

            service.catalog.close()
            stop_embedded(service.settings)
    return out

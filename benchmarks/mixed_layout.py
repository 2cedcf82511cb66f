"""The mixed workload with layout maintenance on (issue 20, benchmark 6a; paper 8.1's 1:1 workload of 20-row changes).

Without it (docs/BENCHMARKS.md "Mixed workload", 240 operations on 10M rows) IMP answered 2.37x faster than no
sketch, short of the >= 3x target: every update appends a small file spanning the whole domain of the sketch's
column, so the sketched query reads more and more files it cannot prune. Here the nightly layout task runs as the
DAG would run it: after every ``EVERY`` operations (six "nights" over 240 operations) ``imp table layout --apply``
re-clusters the table by the sketched column when more than half of what the sketched scan reads lies outside the
sketch (``IMP_LAYOUT_THRESHOLD``'s default). Side by side over one sequence of updates: IMP (lazy maintenance and
the sketched query) and NS (no sketch); both read the same table, so both see the re-clustered files. Query time is
what counts, as in the paper; the layout passes (background work like the updates themselves) are reported apart,
and IMP's total with them is reported too. Target: IMP >= 3x below NS.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from benchmarks import data, harness
from benchmarks.harness import Experiment, scaled
from benchmarks.maintenance import spark_session
from benchmarks.strategies import _answer, _drop_sketch, service_for
from imp_core.maintenance.service import SketchService

EVERY = 40  # operations between two layout passes: a nightly run every 20 updates
GROUPS = 5000


def mixed_with_layout(service: SketchService, quick: bool, runs: int) -> Experiment:
    rows = scaled(200_000 if quick else 10_000_000)
    n_ops = 4 if quick else 240
    every = 2 if quick else EVERY
    name = f"mixed_{rows}"
    path = data.base_table(name, rows, GROUPS, files=100)
    sql = f"SELECT a, AVG(c) AS ac FROM {name} GROUP BY a HAVING AVG(c) < 300"
    exp = Experiment("mixed_layout", f"Mixed workload 1Q:1U, size 20, {n_ops:,} operations on {rows:,} rows, with "
                     f"the layout task every {every} operations (total query time; IMP = lazy maintenance + "
                     f"sketched query, NS = no sketch)", ratios=[("NS", "IMP"), ("NS", "IMP + layout")], log_y=True,
                     y_label="seconds (total)", timed=False)
    data.reset(path)
    service.register_table(name, str(path), replace=True)
    if not harness.QUICK:  # warm-up, not counted: Spark's first query and capture pay start-up
        service.query(sql, use_sketch=False)
        _drop_sketch(service, "mixed_layout")
        service.create_sketch("mixed_layout", sql, [f"{name}.a"], fragments=1000)
        service.query(sql)
    for with_layout in (False, True):
        case = "layout on" if with_layout else "layout off"
        data.reset(path)
        service.register_table(name, str(path), replace=True)
        _drop_sketch(service, "mixed_layout")
        spent, layout_s, passes, reads = _run(service, sql, name, path, n_ops, every if with_layout else 0)
        exp.add(case, "IMP", 0, spent["IMP"], files_read=reads["IMP"])
        exp.add(case, "NS", 0, spent["NS"], files_read=reads["NS"])
        exp.add(case, "IMP + layout", 0, spent["IMP"] + layout_s, layout_passes=passes)
        exp.add(case, "layout passes", 0, layout_s, rewrites=passes)
        print(f"   mixed with layout ({case}): IMP {spent['IMP']:.1f} s, NS {spent['NS']:.1f} s, layout "
              f"{layout_s:.1f} s in {passes} rewrite(s)", flush=True)
    exp.notes.append(f"- one sequence per case; the update is executed once, then IMP and NS answer the query in turn "
                     f"(order alternating); the layout task (threshold 0.5) runs after every {every} operations")
    return exp


def _run(service: SketchService, sql: str, table: str, path: Path, n_ops: int,
         every: int) -> tuple[dict[str, float], float, int, dict[str, int]]:
    """Queries and 20-row updates alternating; returns query time per method, the layout passes' time and number of
    rewrites, and the median files each method's query read over the last quarter of the run."""
    spent = {"IMP": 0.0, "NS": 0.0}
    files: dict[str, list[int]] = {"IMP": [], "NS": []}
    layout_s, passes = 0.0, 0
    next_id = data.max_id(path) + 1
    created = False
    for i in range(n_ops):
        if i % 2:
            next_id = data.change(path, 20, seed=i, groups=GROUPS, next_id=next_id)
        else:
            answers = []
            for method in (("IMP", "NS") if i % 4 == 0 else ("NS", "IMP")):
                t0 = time.perf_counter()
                if method == "IMP" and not created:
                    service.create_sketch("mixed_layout", sql, [f"{table}.a"], fragments=1000)
                    created = True
                result = service.query(sql, use_sketch=method == "IMP")
                spent[method] += time.perf_counter() - t0
                files[method].append(result.scanned.files_read)
                answers.append(_answer(result))
            if answers[0] != answers[1]:
                raise AssertionError(f"mixed workload with layout, operation {i}: IMP and NS answers differ")
        if every and (i + 1) % every == 0:
            t0 = time.perf_counter()
            done = service.relayout(table)
            layout_s += time.perf_counter() - t0
            passes += sum(1 for d in done if d.after is not None)
    tail = max(1, len(files["IMP"]) // 4)
    return spent, layout_s, passes, {m: int(statistics.median(f[-tail:])) for m, f in files.items()}


def run(quick: bool = False, runs: int = 5):  # noqa: ANN201
    spark = spark_session()
    with tempfile.TemporaryDirectory() as home:
        service = service_for(Path(home), spark)
        try:
            yield mixed_with_layout(service, quick, runs)
        finally:
            from imp_core.catalog.embedded import stop_embedded

            service.catalog.close()
            stop_embedded(service.settings)

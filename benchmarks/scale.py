"""``python -m benchmarks --only scale``: tables of any size (issue 38). TPC-H queries whose operator state outgrows
the driver, maintained through the service as users run it, with operator state in memory or in Delta tables.

Each case is one process (so that its memory is its own): a fresh catalog, the TPC-H tables at SF ``sf`` registered,
the query's sketch created (1,000 equi-depth fragments on the column ``tpch22.choose`` picks, a capture on Spark),
then for each change size a change committed to the query's largest table (half inserts of copied rows under a new
key, half deletes), the sketch maintained lazily (IMP, ``IMP_RECAPTURE_BY_COST=off`` so that the incremental path is
what is timed; a first unmeasured pass builds the joins' side caches, as the first maintenance after a capture does)
and a second sketch of the same query recaptured (FM) at the same table versions; the two sketches must be equal.
The parent samples
the case's peak RSS every 0.2 s: the driver's Python process and the Spark JVM (``local[2]``, an 8 GB heap).

Paths: ``memory`` (a budget no state exceeds), ``external`` (``IMP_STATE_MEMORY_BUDGET=512m``, 64m below SF10: the
grouped aggregations that do not fit keep their state in Delta tables beside the data), ``outside`` (a budget of 0:
every operator with an external form keeps its state in Delta tables). Settings:
``IMP_BENCH_SCALE_CASES`` (``SF:QUERY:PATH`` comma-separated), ``IMP_BENCH_SCALE_SIZES`` (default
``10,1000,100000``); ``--quick`` runs one SF0.01 case with sizes 10 and 100.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

from benchmarks.harness import Experiment

DEFAULT_CASES = ("1:Q18:memory,1:Q18:external,1:Q11:memory,1:Q21:memory,1:Q21:external,"
                 "10:Q3:external,10:Q18:external,10:Q9:external,10:Q21:external,10:W1:external")
BUDGETS = {"memory": "64g", "external": "512m", "outside": "0"}
SMALL_BUDGET = "64m"  # below SF10 the external path needs a smaller budget to put the largest aggregation outside
SCALE = Experiment("scale", "Tables of any size: IMP (lazy maintenance) against FM (a recapture) through the service, "
                   "per change size, with the peak RSS of the driver's Python process and of the Spark JVM",
                   ratios=[("FM", "IMP")], log_x=True, x_label="changed rows", warmup=False, merge=True)


def run(quick: bool = False, runs: int = 1) -> list[Experiment]:
    cases = ["0.01:Q18:external"] if quick else os.environ.get("IMP_BENCH_SCALE_CASES", DEFAULT_CASES).split(",")
    sizes = [10, 100] if quick else [int(s) for s in os.environ.get("IMP_BENCH_SCALE_SIZES",
                                                                     "10,1000,100000").split(",")]
    notes = []
    for spec in cases:
        sf, query, path = spec.strip().split(":")
        out, peaks = _child(float(sf), query, path, sizes)
        label = f"SF{sf} {query} {path}"
        if "error" in out:
            notes.append(f"* {label}: {out['error']} (driver peak RSS {peaks['python'] / 1024:.0f} MB, Spark JVM "
                         f"peak RSS {peaks['jvm'] / 1024:.0f} MB)")
            print(f"   {label}: {out['error']}", flush=True)
            continue
        SCALE.add(f"{label} capture", "FM", 0, out["capture_s"], driver_mb=round(peaks["python"] / 1024),
                  jvm_mb=round(peaks["jvm"] / 1024))
        for r in out["sizes"]:
            case = f"{label} {r['rows']:,} rows"
            SCALE.add(case, "IMP", 0, r["imp_s"], x=r["rows"], exact=r["exact"], placement=out["placement"])
            SCALE.add(case, "FM", 0, r["fm_s"], x=r["rows"])
        notes.append(f"* {label}: state {out['placement']}; driver peak RSS {peaks['python'] / 1024:.0f} MB, "
                     f"Spark JVM peak RSS {peaks['jvm'] / 1024:.0f} MB; every IMP sketch equal to FM's: "
                     f"{'yes' if all(r['exact'] for r in out['sizes']) else 'NO'}")
        print(f"   {notes[-1][2:]}", flush=True)
    SCALE.notes = notes
    return [SCALE]


def _child(sf: float, query: str, path: str, sizes: list[int]) -> tuple[dict, dict[str, int]]:
    """Run one case in its own process, sampling its RSS and its JVM's; its JSON result and the peaks (KB)."""
    budget = SMALL_BUDGET if path == "external" and sf < 10 else BUDGETS[path]
    env = dict(os.environ, IMP_STATE_MEMORY_BUDGET=budget, IMP_RECAPTURE_BY_COST="off",
               IMP_SPARK_DRIVER_MEMORY="8g", IMP_SPARK_MASTER="local[2]", IMP_SHUFFLE_PARTITIONS="8")
    env.pop("IMP_CATALOG_URL", None)
    cmd = [sys.executable, "-m", "benchmarks.scale", json.dumps({"sf": sf, "query": query, "sizes": sizes})]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
    peaks = {"python": 0, "jvm": 0}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peaks["python"] = max(peaks["python"], _rss_kb(proc.pid))
            peaks["jvm"] = max(peaks["jvm"], sum(_rss_kb(p) for p in _children(proc.pid) if _is_java(p)))
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, _ = proc.communicate()
    done.set()
    sampler.join()
    lines = [ln for ln in out.splitlines() if ln.startswith("SCALE-CASE ")]
    if proc.returncode != 0 or not lines:
        how = (f"was killed by signal {-proc.returncode}" if proc.returncode < 0
               else f"exited with {proc.returncode}")
        return {"error": f"the case process {how}"}, peaks
    return json.loads(lines[-1].split(" ", 1)[1]), peaks


def _rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _children(pid: int) -> list[int]:
    out = []
    for child in Path("/proc").glob("[0-9]*"):
        try:
            fields = (child / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(child.name))
            out += _children(int(child.name))
    return out


def _is_java(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == "java"
    except OSError:
        return False


# --- the case process ---------------------------------------------------------------------------------------------


def case(sf: float, query: str, sizes: list[int]) -> dict:
    """One query at one scale: capture, then IMP and FM per change size (see the module docstring)."""
    from benchmarks import data
    from benchmarks.tpch22 import choose
    from benchmarks.tpch22_queries import QUERIES, RANKINGS, SCHEMAS
    from imp_core.catalog.embedded import stop_embedded
    from imp_core.config import Settings
    from imp_core.maintenance.service import SketchService
    from imp_core.plan.sql import parse_query

    root = data.tpch(sf)
    sql = {**QUERIES, **RANKINGS}[query]
    plan = parse_query(sql, SCHEMAS, "spark").plan
    from benchmarks.tpch22 import Outcome

    outcome = Outcome(query, "")
    choose(outcome, plan)
    if outcome.refused:
        return {"error": outcome.refused}
    tables = sorted({s.table for s in plan.scans()})
    for t in tables:
        data.reset(root / t)
    with tempfile.TemporaryDirectory(prefix="imp-scale-") as home:
        settings = Settings.from_env(home=Path(home))
        service = SketchService(settings)
        try:
            for t in tables:
                service.register_table(t, str(root / t))
            service.spark.range(1).count()  # the JVM's start is not the capture's
            t0 = time.perf_counter()
            service.create_sketch("s", sql, [outcome.column], fragments=1000)
            out: dict = {"capture_s": time.perf_counter() - t0, "column": outcome.column, "sizes": []}
            out["placement"] = {s["operator"]: s["where"] for s in service.describe("s")["state"]
                                if s["where"] == "external"} or "all in memory"
            service.create_sketch("fm", sql, [outcome.column], fragments=1000)  # recaptured for each FM time
            changes = Changes(outcome.changed, root / outcome.changed)
            changes.commit(10)  # a first pass builds the joins' side caches (once per capture, kept in the state)
            service.maintain("s", strategy="lazy", trigger="bench")
            for n in sizes:
                changes.commit(n)
                t0 = time.perf_counter()
                result = service.maintain("s", strategy="lazy", trigger="bench")
                imp_s = time.perf_counter() - t0
                maintained = result.versions[-1].fragments if result.versions else None
                t0 = time.perf_counter()
                again = service.recapture("fm", trigger="bench")
                fm_s = time.perf_counter() - t0
                out["sizes"].append({"rows": n, "imp_s": imp_s, "fm_s": fm_s,
                                     "exact": maintained == again.fragments and result.recaptured is None})
                print(f"SF{sf:g} {query} {n:,} rows: IMP {imp_s:.2f} s, FM {fm_s:.2f} s", file=sys.stderr, flush=True)
            return out
        finally:
            service.close()
            stop_embedded(settings)
            for folder in (root / "_imp_state").glob("*-r*"):  # the case's state tables (its catalog goes too)
                if folder.name.split("-r")[0] in ("s", "fm"):
                    shutil.rmtree(folder, ignore_errors=True)


class Changes:
    """Half inserts (copies of sampled rows under a fresh value of the table's second key column), half deletes (the
    sampled rows, by key) of the query's changed table, with a sample of 200K rows in memory whatever the table's
    size (``tpch22.TableChanges`` keeps every key)."""

    def __init__(self, table: str, path: Path) -> None:
        import numpy as np
        import pyarrow.compute as pc
        from deltalake import DeltaTable

        from benchmarks.tpch22 import CHANGE_KEYS

        self.path = path
        self.key, self.column, how = CHANGE_KEYS[table]
        if how != "fresh":  # partsupp: a fresh part key (Q11 reads no part) keeps the supplier's rows joining
            self.column = self.key[0]
        dataset = DeltaTable(str(path)).to_pyarrow_dataset()
        self.rows = dataset.head(200_000)
        self.alive = np.ones(self.rows.num_rows, dtype=bool)
        self.next = int(pc.max(dataset.to_table(columns=[self.column]).column(0)).as_py()) + 1000
        self.rng = np.random.default_rng(23)

    def commit(self, rows: int) -> None:
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc
        from deltalake import DeltaTable, write_deltalake

        deletes = min(rows - rows // 2, int(self.alive.sum()))
        if deletes:
            pick = self.rng.choice(np.flatnonzero(self.alive), deletes, replace=False)
            self.alive[pick] = False
            victims = self.rows.take(pa.array(pick)).select(self.key)
            # one commit, a hash join on the key (a predicate of OR-ed keys takes DataFusion minutes per 2,000 rows);
            # the victims' range of the first key bounds the target's files read (without it, 500 deletes from SF10's
            # lineitem took delta-rs over 18 GB of memory)
            first = self.key[0]
            lo, hi = pc.min(victims.column(first)).as_py(), pc.max(victims.column(first)).as_py()
            bound = f"t.{first} >= {lo} AND t.{first} <= {hi} AND " if isinstance(lo, int) else ""
            DeltaTable(str(self.path)).merge(
                victims, bound + " AND ".join(f"t.{k} = s.{k}" for k in self.key), source_alias="s",
                target_alias="t").when_matched_delete().execute()
        inserts = rows // 2
        if inserts:
            copies = self.rows.take(pa.array(self.rng.choice(self.rows.num_rows, inserts, replace=True)))
            new = pa.array(range(self.next, self.next + inserts), copies.schema.field(self.column).type)
            self.next += inserts
            write_deltalake(str(self.path), copies.set_column(copies.schema.get_field_index(self.column),
                                                              copies.schema.field(self.column), new), mode="append")


if __name__ == "__main__":
    spec = json.loads(sys.argv[1])
    try:
        result = case(spec["sf"], spec["query"], spec["sizes"])
    except Exception as e:  # noqa: BLE001 - the parent reports it (its first line); the traceback goes to stderr
        traceback.print_exc()
        result = {"error": f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"}
    sys.stdout.write("SCALE-CASE " + json.dumps(result, default=str) + "\n")
    sys.stdout.flush()

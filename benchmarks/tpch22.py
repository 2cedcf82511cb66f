"""TPC-H, all 22 queries (issue 21): safe columns, registration, and IMP vs FM under insert/delete/mixed changes.

For each query of :mod:`benchmarks.tpch22_queries` (standard text, validation parameters):

1. parse it (``parse_query``, Spark dialect); a query the front end refuses is reported with the error's first line;
2. find every safe column (``safe_columns`` over all columns of the tables it reads: a few milliseconds a query);
3. choose the sketch column with one rule for every query: the **changed table** is the largest table the query
   reads (lineitem, else orders, partsupp, part, customer, supplier); the sketch goes on the first *safe* column of
   :data:`KEYS` (key columns with many distinct values), looking at the changed table first, then the other tables
   read, largest first. No safe key column: refused ("no safe key column", with the safety check's reason);
4. register: build the pipeline, 1,000 equi-depth fragments, capture on Spark (``maintenance.Setup``); a pipeline
   that cannot be built is refused with the error's first line;
5. maintain: commit a change of n rows to the changed table (insert-only, delete-only, mixed; n = 10, 100, 1,000),
   then IMP (change feed + incremental engine from the saved state) and FM (recapture) interleaved, median of
   ``runs``; every IMP sketch must equal FM's. A mismatch or a maintenance error is recorded ("exact: no"), the
   query's remaining cases are skipped, and the run raises at the end (after the results are written).

Changes (:class:`TableChanges`): deletes remove random existing rows by their key; inserts are copies of existing rows
under a key that is new but keeps every join intact: lineitem a fresh ``l_linenumber`` (same order, part, supplier),
orders/part/customer/supplier a fresh primary key above the largest (no row refers to it yet), partsupp an existing
supplier the part is not yet supplied by (both foreign keys stay valid, the key stays unique).

``--quick`` (the CI smoke test): SF0.01; all 22 parsed, checked and their pipelines built, but only :data:`QUICK`
captured on Spark and maintained (a mixed change of 100 rows, one run, no warm-up round).
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from benchmarks import data
from benchmarks.harness import SCALE, Experiment
from benchmarks.maintenance import Setup, spark_session, timed_fm, timed_imp
from benchmarks.tpch22_queries import BY_SIZE, QUERIES, RANKINGS, SCHEMAS, tables_read
from imp_core.engine.pipeline import Pipeline

# sketch column candidates per table, most preferred first (keys with many distinct values)
KEYS = {"lineitem": ["l_orderkey", "l_partkey", "l_suppkey"], "orders": ["o_orderkey", "o_custkey"],
        "partsupp": ["ps_partkey", "ps_suppkey"], "part": ["p_partkey"], "customer": ["c_custkey"],
        "supplier": ["s_suppkey"]}
# per changed table: its key, the key column inserts change, and how (a fresh value, or an existing one)
CHANGE_KEYS = {"lineitem": (("l_orderkey", "l_linenumber"), "l_linenumber", "fresh"),
               "orders": (("o_orderkey",), "o_orderkey", "fresh"),
               "partsupp": (("ps_partkey", "ps_suppkey"), "ps_suppkey", "existing"),
               "part": (("p_partkey",), "p_partkey", "fresh"), "customer": (("c_custkey",), "c_custkey", "fresh"),
               "supplier": (("s_suppkey",), "s_suppkey", "fresh")}
QUICK = ["Q3", "Q4", "Q18", "W1"]  # top-k over a join, EXISTS, IN (SELECT ... HAVING) + top-k, top-k per group
FRAGMENTS = 1000


@dataclass
class Outcome:
    """One query's row of the registration table."""

    name: str
    constructs: str
    changed: str = ""
    safe: list[str] = field(default_factory=list)
    column: str = ""
    refused: str = ""
    capture_s: float = 0.0
    exact: str = ""  # "yes", "no (...)" or "" (not maintained)


class TableChanges:
    """Commits insert-only, delete-only or mixed changes of n rows to one TPC-H table (see the module docstring)."""

    def __init__(self, table: str, path: Path, seed: int = 17) -> None:
        from deltalake import DeltaTable

        self.table, self.path = table, path
        self.key, self.column, self.how = CHANGE_KEYS[table]
        self.rows = DeltaTable(str(path)).to_pyarrow_dataset().head(200_000)
        self.alive = np.ones(self.rows.num_rows, dtype=bool)  # sampled rows not deleted yet
        keys = DeltaTable(str(path)).to_pyarrow_dataset().to_table(columns=list(self.key))
        self.taken = set(zip(*(keys.column(k).to_pylist() for k in self.key)))
        self.values = np.unique(keys.column(self.column).to_numpy()) if self.how == "existing" else None
        self.next = int(pc.max(keys.column(self.column)).as_py()) + 1000
        self.rng = np.random.default_rng(seed)

    def commit(self, rows: int, kind: str) -> None:
        """Deletes then inserts (two Delta commits for a mixed change: half inserts, half deletes)."""
        from deltalake import DeltaTable, write_deltalake

        inserts = rows if kind == "insert" else (0 if kind == "delete" else rows // 2)
        if rows - inserts:
            pick = self.rng.choice(np.flatnonzero(self.alive), rows - inserts, replace=False)
            self.alive[pick] = False
            victims = self.rows.take(pa.array(pick))
            DeltaTable(str(self.path)).delete(self._predicate(victims))
        if inserts:
            copies = self.rows.take(pa.array(self.rng.choice(self.rows.num_rows, inserts, replace=False)))
            write_deltalake(str(self.path), self._rekeyed(copies), mode="append")

    def _predicate(self, victims: pa.Table) -> str:
        if len(self.key) == 1:
            return f"{self.key[0]} IN ({', '.join(str(int(v)) for v in victims.column(self.key[0]).to_pylist())})"
        cols = [victims.column(k).to_pylist() for k in self.key]
        return " OR ".join("(" + " AND ".join(f"{k} = {int(v)}" for k, v in zip(self.key, vals)) + ")"
                           for vals in zip(*cols))

    def _rekeyed(self, copies: pa.Table) -> pa.Table:
        if self.how == "fresh":
            new = list(range(self.next, self.next + copies.num_rows))
            self.next += copies.num_rows
        else:  # an existing value that makes a key not taken yet (partsupp: another existing supplier)
            others = [copies.column(k).to_pylist() for k in self.key if k != self.column]
            new = []
            for rest in zip(*others):
                value = int(self.rng.choice(self.values))
                while self._key(rest, value) in self.taken:
                    value = int(self.rng.choice(self.values))
                self.taken.add(self._key(rest, value))
                new.append(value)
        field_ = copies.schema.field(self.column)
        return copies.set_column(copies.schema.get_field_index(self.column), field_, pa.array(new, field_.type))

    def _key(self, rest: tuple, value: int) -> tuple:
        it = iter(rest)
        return tuple(value if k == self.column else next(it) for k in self.key)


def constructs(sql: str) -> str:
    """The SQL constructs of a query, for the report (joins, grouping, top-k, subquery kinds, ...)."""
    from sqlglot import exp, parse_one

    tree = parse_one(sql, read="spark")
    found = [f"{len(list(tree.find_all(exp.Table)))} scans"]
    checks = [("GROUP BY", exp.Group), ("HAVING", exp.Having), ("WITH", exp.With), ("CASE", exp.Case),
              ("LIKE", exp.Like), ("OR", exp.Or)]
    found += [label for label, node in checks if any(True for _ in tree.find_all(node))]
    if any(isinstance(s.parent, (exp.From, exp.Join)) for s in tree.find_all(exp.Subquery)):
        found.append("derived table")
    if tree.find(exp.Limit):
        found.append("top-k")
    if tree.find(exp.Window):
        found.append("top-k per group")
    for node in tree.find_all(exp.Exists):
        found.append("NOT EXISTS" if isinstance(node.parent, exp.Not) else "EXISTS")
    for node in tree.find_all(exp.In):
        if node.args.get("query") is not None:
            found.append("NOT IN" if isinstance(node.parent, exp.Not) else "IN subquery")
    if any(isinstance(s.parent, (exp.Binary, exp.Mul)) and not isinstance(s.parent, exp.In)
           for s in tree.find_all(exp.Subquery)):
        found.append("scalar subquery")
    if any(c.find(exp.Distinct) for c in tree.find_all(exp.Count)):
        found.append("COUNT DISTINCT")
    if any(j.side for j in tree.find_all(exp.Join)):
        found.append("outer join")
    return ", ".join(dict.fromkeys(found))


def choose(outcome: Outcome, plan) -> None:  # noqa: ANN001
    """Safe columns and the sketch column (the rule of the module docstring); sets ``refused`` when none fits."""
    from imp_core.plan.safety import check, safe_columns

    read = sorted({s.table for s in plan.scans()}, key=BY_SIZE.index)
    outcome.changed = next(t for t in read if t in CHANGE_KEYS)
    outcome.safe = safe_columns(plan)
    for table in [outcome.changed, *[t for t in read if t != outcome.changed]]:
        for column in KEYS.get(table, []):
            if f"{table}.{column}" in outcome.safe:
                outcome.column = f"{table}.{column}"
                return
    key = KEYS[outcome.changed][0]
    why = check(plan, {outcome.changed: key}).reason
    outcome.refused = f"no safe key column ({outcome.changed}.{key}: {why})"


def register(spark, name: str, root: Path, capture: bool = True) -> tuple[Outcome, Setup | None]:  # noqa: ANN001
    """Parse, choose the column, build the pipeline and (``capture``) capture on Spark; a refusal is the error's
    first line."""
    from imp_core.plan.sql import parse_query

    sql = {**QUERIES, **RANKINGS}[name]
    outcome = Outcome(name, constructs(sql))
    try:
        plan = parse_query(sql, SCHEMAS, "spark").plan
        choose(outcome, plan)
        if not outcome.refused:
            build(plan, outcome.column)
    except Exception as e:  # noqa: BLE001 - a refusal is reported, whatever raised it
        outcome.refused = _first_line(e)
        outcome.changed = outcome.changed or next(t for t in tables_read(sql) if t in CHANGE_KEYS)
    if outcome.refused or not capture:
        return outcome, None
    table, column = outcome.column.split(".")
    try:
        setup = Setup(spark, sql, {t: root / t for t in {s.table for s in plan.scans()}}, (table, column),
                      FRAGMENTS)
    except Exception as e:  # noqa: BLE001
        outcome.refused = _first_line(e)
        return outcome, None
    outcome.capture_s = setup.capture_s
    return outcome, setup


def build(plan, column: str) -> Pipeline:  # noqa: ANN001
    """The query's pipeline on a one-fragment partition of ``table.column`` (an int64 key): building it is what
    refuses a plan node the engine has no operator for, with no Spark and no data."""
    from imp_core.config import Optimizations
    from imp_core.sketch.partition import Partition, PartitionSet

    table, name = column.split(".")
    return Pipeline.configured(plan, PartitionSet((Partition(table, name, (0, 1 << 40), "int"),)), Optimizations())


def _first_line(e: Exception) -> str:
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"


def maintain(exp: Experiment, outcome: Outcome, setup: Setup, root: Path, sizes: list[int], kinds: list[str],
             runs: int, warmup: int = 1) -> None:
    """IMP vs FM for every kind and size, interleaved; stops the query at its first mismatch or error."""
    changes = TableChanges(outcome.changed, root / outcome.changed)
    for kind in kinds:
        for size in sizes:
            case = f"{outcome.name} {kind} {size:,}"
            try:
                changes.commit(size, kind)
                target = dict(setup.versions)
                target[outcome.changed] = setup.sources[outcome.changed].current_version()
                last: dict[str, Pipeline] = {}
                exp.measure(case, {"IMP": timed_imp(setup, target, last, "imp"),
                                   "FM": timed_fm(setup, target, last, "fm")}, runs, warmup, x=size)
            except Exception as e:  # noqa: BLE001 - recorded, and the run fails at the end
                outcome.exact = f"no ({case}: {_first_line(e)})"
                return
            if last["imp"].sketch() != last["fm"].sketch():
                outcome.exact = f"no ({case}: IMP sketch differs from FM sketch)"
                return
            setup.advance(target, last["imp"])
    outcome.exact = "yes"


def report(exp: Experiment, outcomes: list[Outcome], sizes: list[int]) -> list[str]:
    """The registration table (markdown lines): one row per query, FM/IMP median ratio per size."""
    head = ["query", "constructs", "safe columns found", "sketch column", "registered / refused",
            *[f"FM/IMP n={s:,}" for s in sizes], "exact"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for o in outcomes:
        shown = [c.split(".")[1] for c in o.safe if c.endswith("key") or c.endswith("date")]
        safe = f"{len(o.safe)}: {', '.join(shown)}" if o.safe else "none"
        status = (f"refused: {o.refused}" if o.refused else
                  f"registered (capture {o.capture_s:.1f} s)" if o.capture_s else "registered (pipeline built)")
        ratios = []
        for s in sizes:
            r = [x for c in exp.cases() if c.startswith(f"{o.name} ") and c.endswith(f" {s:,}")
                 for x in exp.ratio(c, "FM", "IMP")]
            ratios.append(f"{statistics.median(r):.3g}x" if r else "")
        cells = [o.name, o.constructs, safe, o.column or "-", status.replace("|", "/"), *ratios, o.exact or "-"]
        lines.append("| " + " | ".join(cells) + " |")
    tpch = [o for o in outcomes if o.name in QUERIES]
    registered = sum(1 for o in tpch if not o.refused)
    lines += ["", f"{registered} of {len(tpch)} TPC-H queries registered; changes go to the largest table each reads "
              "(see benchmarks/tpch22.py for the column rule and the changes). W1 and W2 are not TPC-H queries: the "
              "top-N-per-group idiom (ranking windows filtered by a constant) over the same data."]
    return lines


def run(quick: bool = False, runs: int = 5):  # noqa: ANN201
    """Registers all 22, then maintains them one by one; yields the experiment after each query."""
    spark = spark_session()
    scale = 0.01 if quick else (round(SCALE, 3) or 0.01)
    root = data.tpch(scale)
    # IMP_BENCH_TPCH22_SIZES (e.g. "10,1000"): the change sizes of a full run, when time is short
    sizes = [100] if quick else [int(x) for x in os.environ.get("IMP_BENCH_TPCH22_SIZES", "10,100,1000").split(",")]
    kinds = ["mixed"] if quick else ["insert", "delete", "mixed"]
    exp = Experiment("tpch22", f"TPC-H SF{scale:g}, all 22 queries: IMP vs FM, changes to the largest table read",
                     ratios=[("FM", "IMP")], log_y=True, y_label="seconds", warmup=not quick, merge=True)
    outcomes: list[Outcome] = []
    queries = {**QUERIES, **RANKINGS}
    last = list(queries)[-1]
    # IMP_BENCH_TPCH22_QUERIES (e.g. "Q7,Q8"): only these queries, e.g. to finish an interrupted run
    only = [q for q in os.environ.get("IMP_BENCH_TPCH22_QUERIES", "").split(",") if q]
    for name in (q for q in queries if not only or q in only):
        t0 = time.perf_counter()
        outcome, setup = register(spark, name, root, capture=not quick or name in QUICK)
        outcomes.append(outcome)
        if setup is not None:
            maintain(exp, outcome, setup, root, sizes, kinds, runs, warmup=0 if quick else 1)
        print(f"   {name}: {outcome.refused or outcome.column} ({time.perf_counter() - t0:.1f} s)", flush=True)
        for r in exp.rows:
            r.x = None
        exp.notes = report(exp, outcomes, sizes)
        if (setup is not None and not quick) or name == last:  # a long run keeps what it measured
            yield exp
    failed = [f"{o.name}: {o.exact}" for o in outcomes if o.exact.startswith("no")]
    if failed:
        raise AssertionError("tpch22: " + "; ".join(failed))

"""TPC-H SF1 (IMP paper 8.2 Fig. 9): IMP vs FM for top-k and HAVING queries, lineitem changes of 10 to 1,000 rows.

Queries (the supported SQL covers them as written):

* ``Q_space`` (paper Appendix A.4, TPC-H Q10 ordered by revenue ascending, top 20), sketch on ``customer.c_custkey``
  (a group-by column: partial groups cannot arise);
* ``Q3`` (top 10 unshipped orders by revenue), sketch on ``lineitem.l_orderkey`` (= ``o_orderkey``, grouped);
* ``Q10`` (top 20 customers by lost revenue, descending), sketch on ``lineitem.l_orderkey`` (safe: partial sums of
  non-negative revenue can only rank lower in a descending order);
* ``Q18h`` (the HAVING part of TPC-H Q18: orders with more than 300 items), sketch on ``lineitem.l_orderkey``.

Changes go to ``lineitem``: inserts copy existing line items under fresh line numbers (so they join with existing
orders), deletes remove random line items; insert-only, delete-only and mixed batches.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from benchmarks import data
from benchmarks.harness import SCALE, Experiment
from benchmarks.maintenance import FIRST_ENGINE, Setup, spark_session

QUERIES = {
    "Q_space": ("""
        SELECT c_custkey, c_name, sum(l_extendedprice * (1 - l_discount)) AS revenue,
               c_acctbal, n_name, c_address, c_phone, c_comment
        FROM customer, orders, lineitem, nation
        WHERE c_custkey = o_custkey AND l_orderkey = o_orderkey
          AND o_orderdate >= to_date('1994-12-01', 'YYYY-MM-DD')
          AND o_orderdate < to_date('1995-03-01', 'YYYY-MM-DD')
          AND l_returnflag = 'R' AND c_nationkey = n_nationkey
        GROUP BY c_custkey, c_name, c_acctbal, c_phone, n_name, c_address, c_comment
        ORDER BY revenue
        LIMIT 20""", ("customer", "c_custkey"), "postgres"),
    "Q3": ("""
        SELECT l_orderkey, sum(l_extendedprice * (1 - l_discount)) AS revenue, o_orderdate, o_shippriority
        FROM customer, orders, lineitem
        WHERE c_mktsegment = 'BUILDING' AND c_custkey = o_custkey AND l_orderkey = o_orderkey
          AND o_orderdate < DATE '1995-03-15' AND l_shipdate > DATE '1995-03-15'
        GROUP BY l_orderkey, o_orderdate, o_shippriority
        ORDER BY revenue DESC, o_orderdate
        LIMIT 10""", ("lineitem", "l_orderkey"), "spark"),
    "Q10": ("""
        SELECT c_custkey, c_name, sum(l_extendedprice * (1 - l_discount)) AS revenue, c_acctbal, n_name
        FROM customer, orders, lineitem, nation
        WHERE c_custkey = o_custkey AND l_orderkey = o_orderkey
          AND o_orderdate >= DATE '1993-10-01' AND o_orderdate < DATE '1994-01-01'
          AND l_returnflag = 'R' AND c_nationkey = n_nationkey
        GROUP BY c_custkey, c_name, c_acctbal, n_name
        ORDER BY revenue DESC
        LIMIT 20""", ("customer", "c_custkey"), "spark"),
    "Q18h": ("""
        SELECT l_orderkey, sum(l_quantity) AS qty
        FROM lineitem
        GROUP BY l_orderkey
        HAVING sum(l_quantity) > 300""", ("lineitem", "l_orderkey"), "spark"),
}


class LineitemChanges:
    """Commits insert-only, delete-only or mixed changes of n rows to lineitem (inserted rows are copies of
    existing line items under a fresh line number, so they join with existing orders)."""

    def __init__(self, path: Path) -> None:
        from deltalake import DeltaTable

        self.path = path
        self.sample = DeltaTable(str(path)).to_pyarrow_dataset().head(200_000)
        self.next_line = 1000
        self.rng = np.random.default_rng(17)

    def commit(self, rows: int, kind: str) -> None:
        from deltalake import DeltaTable, write_deltalake

        inserts = rows if kind == "insert" else (0 if kind == "delete" else rows // 2)
        deletes = rows - inserts
        if deletes:
            pick = self.sample.take(self.rng.choice(self.sample.num_rows, deletes, replace=False))
            pairs = zip(pick.column("l_orderkey").to_pylist(), pick.column("l_linenumber").to_pylist())
            DeltaTable(str(self.path)).delete(
                " OR ".join(f"(l_orderkey = {int(o)} AND l_linenumber = {int(n)})" for o, n in pairs))
        if inserts:
            rows_ = self.sample.take(self.rng.choice(self.sample.num_rows, inserts, replace=False))
            lines = pa.array(np.arange(self.next_line, self.next_line + inserts, dtype=np.int64))
            self.next_line += inserts
            rows_ = rows_.set_column(rows_.schema.get_field_index("l_linenumber"), "l_linenumber", lines)
            write_deltalake(str(self.path), rows_, mode="append")


def run(quick: bool = False, runs: int = 5):  # noqa: ANN201
    """Yields the experiment after each query (the caller rewrites its files), so a long run keeps what it did."""
    spark = spark_session()
    scale = round((0.1 if quick else 1.0) * SCALE, 3) or 0.01
    root = data.tpch(scale)
    tables = {t: root / t for t in ("customer", "orders", "lineitem", "nation")}
    sizes = [100] if quick else [10, 100, 1000]
    kinds = ["mixed"] if quick else ["insert", "delete", "mixed"]
    exp = Experiment("tpch", f"TPC-H SF{scale:g}: IMP (engine v2 and the first engine) vs FM, lineitem changes",
                     ratios=[("FM", "IMP"), ("FM", "IMP v1")], log_y=True, y_label="seconds")
    for name, (sql, on, dialect) in QUERIES.items():
        if quick and name not in ("Q_space", "Q18h"):
            continue
        t0 = time.perf_counter()
        used = {t: p for t, p in tables.items() if t in sql}
        setup = Setup(spark, sql, used, on, 1000, dialect=dialect)
        first = Setup(spark, sql, used, on, 1000, opts=FIRST_ENGINE, dialect=dialect)
        print(f"   {name}: captured in {setup.capture_s:.1f} s", flush=True)
        changes = LineitemChanges(tables["lineitem"])
        for kind in kinds:
            for size in sizes:
                target_fn = _committer(setup, changes, size, kind)
                _measure(exp, setup, first, f"{name} {kind} {size:,}", target_fn, runs, size)
        print(f"   {name}: {time.perf_counter() - t0:.0f} s", flush=True)
        for r in exp.rows:
            r.x = None
        yield exp


def _committer(setup: Setup, changes: LineitemChanges, size: int, kind: str):  # noqa: ANN202
    def commit() -> dict[str, int]:
        changes.commit(size, kind)
        new = dict(setup.versions)
        new["lineitem"] = setup.sources["lineitem"].current_version()
        return new

    return commit


def _measure(exp: Experiment, setup: Setup, first: Setup, case: str, commit, runs: int,  # noqa: ANN001
             size: int) -> None:
    """IMP with engine v2 (``setup``) and with the first engine (``first``, the same tables), and FM, interleaved;
    every sketch must equal FM's."""
    target = commit()
    last: dict[str, object] = {}

    def imp(s: Setup, key: str):  # noqa: ANN202
        def run_once() -> float:
            elapsed, pipe, _ = s.imp(target)
            last[key] = pipe
            return elapsed
        return run_once

    def fm() -> float:
        elapsed, pipe = setup.fm(target)
        last["fm"] = pipe
        return elapsed

    exp.measure(case, {"IMP": imp(setup, "imp"), "IMP v1": imp(first, "v1"), "FM": fm}, runs, x=size)
    for key in ("imp", "v1"):
        if last[key].sketch() != last["fm"].sketch():  # type: ignore[attr-defined]
            raise AssertionError(f"tpch {case}: IMP ({key}) sketch differs from FM sketch")
    setup.advance(target, last["imp"])  # type: ignore[arg-type]
    first.advance(target, last["v1"])  # type: ignore[arg-type]

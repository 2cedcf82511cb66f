"""The tpch22 benchmark's queries and changes, without Spark: which of the 22 TPC-H queries parse, which are refused
(one line, UnsupportedError), which register with a safe key column; changes keep keys unique and joins intact."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from benchmarks.tpch22 import Outcome, TableChanges, build, choose, constructs
from benchmarks.tpch22_queries import QUERIES, RANKINGS, SCHEMAS, tables_read
from imp_core.plan.sql import parse_query


def test_twenty_two_queries() -> None:
    assert list(QUERIES) == [f"Q{i}" for i in range(1, 23)]


@pytest.mark.parametrize("name", list(QUERIES))
def test_every_query_registers_with_a_safe_key_column(name: str) -> None:
    """All 22, as written (subqueries, NOT EXISTS / NOT IN, the outer join of Q13, the <> correlation of Q21)."""
    plan = parse_query(QUERIES[name], SCHEMAS, "spark").plan
    outcome = Outcome(name, constructs(QUERIES[name]))
    choose(outcome, plan)
    assert not outcome.refused
    assert outcome.column in outcome.safe and outcome.column.endswith("key")
    assert outcome.changed == tables_read(QUERIES[name])[0]
    build(plan, outcome.column)


@pytest.mark.parametrize(("name", "column"), [("W1", "lineitem.l_orderkey"), ("W2", "orders.o_custkey")])
def test_top_n_per_group_queries_register(name: str, column: str) -> None:
    """W1 ranks line items per order (PARTITION BY the sketch's column), W2 aggregated customers per nation (the
    aggregation's groups are whole under o_custkey = c_custkey; its SUM of a signed product is unsafe on lineitem)."""
    plan = parse_query(RANKINGS[name], SCHEMAS, "spark").plan
    outcome = Outcome(name, constructs(RANKINGS[name]))
    choose(outcome, plan)
    assert outcome.column == column and "top-k per group" in outcome.constructs
    build(plan, outcome.column)


@pytest.mark.parametrize(
    ("name", "table"), [("Q13", "orders"), ("Q16", "supplier"), ("Q22", "orders"), ("Q21", "lineitem")]
)
def test_the_negated_side_is_never_the_sketch(name: str, table: str) -> None:
    """The table read by NOT EXISTS / NOT IN or padded by an outer join: a sketch there would drop rows that keep
    others out."""
    outcome = Outcome(name, "")
    choose(outcome, parse_query(QUERIES[name], SCHEMAS, "spark").plan)
    assert not any(c.startswith(f"{table}.") for c in outcome.safe)


def _write(path: Path, table: pa.Table) -> None:
    from deltalake import write_deltalake

    write_deltalake(str(path), table, mode="overwrite")


def _read(path: Path) -> pa.Table:
    from deltalake import DeltaTable

    return DeltaTable(str(path)).to_pyarrow_dataset().to_table()


def test_partsupp_changes_keep_keys_unique_and_suppliers_existing(tmp_path: Path) -> None:
    parts, suppliers = np.repeat(np.arange(1, 51), 4), np.tile(np.arange(1, 5), 50) + np.repeat(np.arange(50) % 6, 4)
    table = pa.table(
        {
            "ps_partkey": pa.array(parts, pa.int64()),
            "ps_suppkey": pa.array(suppliers, pa.int64()),
            "ps_availqty": pa.array(np.arange(200), pa.int64()),
        }
    )
    _write(tmp_path / "partsupp", table)
    changes = TableChanges("partsupp", tmp_path / "partsupp")
    changes.commit(20, "mixed")
    changes.commit(10, "insert")
    after = _read(tmp_path / "partsupp")
    assert after.num_rows == 200 - 10 + 10 + 10
    keys = list(zip(after.column("ps_partkey").to_pylist(), after.column("ps_suppkey").to_pylist()))
    assert len(set(keys)) == len(keys)
    assert set(after.column("ps_suppkey").to_pylist()) <= set(suppliers.tolist())


def test_lineitem_inserts_keep_the_order_and_get_fresh_line_numbers(tmp_path: Path) -> None:
    table = pa.table(
        {
            "l_orderkey": pa.array(np.repeat(np.arange(1, 21), 3), pa.int64()),
            "l_linenumber": pa.array(np.tile(np.arange(1, 4), 20), pa.int64()),
        }
    )
    _write(tmp_path / "lineitem", table)
    changes = TableChanges("lineitem", tmp_path / "lineitem")
    changes.commit(10, "delete")
    changes.commit(10, "insert")
    after = _read(tmp_path / "lineitem")
    assert after.num_rows == 60
    keys = list(zip(after.column("l_orderkey").to_pylist(), after.column("l_linenumber").to_pylist()))
    assert len(set(keys)) == 60 and set(after.column("l_orderkey").to_pylist()) <= set(range(1, 21))

"""Expected answers computed without the code under test.

A sketch is checked against what it must contain, not against another run of the same engine: the table snapshot is
read by delta-rs into Arrow, the rows the answer depends on are found by DuckDB, and their fragments by a binary
search over the bounds the sketch stored. Query answers with a sketch are compared with Spark's answer without one.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from typing import Any

import duckdb
import pyarrow as pa
from deltalake import DeltaTable


def snapshot(path: str, version: int | None = None) -> pa.Table:
    """The Delta table at ``version`` (latest if None), read by delta-rs."""
    return DeltaTable(str(path), version=version).to_pyarrow_table()


def duck(sql: str, **tables: pa.Table) -> list[tuple[Any, ...]]:
    """Run ``sql`` in a fresh DuckDB over the given Arrow tables (by name)."""
    con = duckdb.connect()
    try:
        for name, table in tables.items():
            con.register(name, table)
        return con.execute(sql).fetchall()
    finally:
        con.close()


def fragments_of(values: Iterable[Any], bounds: Sequence[Any]) -> list[int]:
    """Fragment ids of ``values`` under ``bounds`` (fragment i is [b_i, b_{i+1}); below b0 is fragment 0, at or
    above the last bound the last fragment; NULL is fragment 0)."""
    last = len(bounds) - 2
    out = set()
    for v in values:
        if v is None:
            out.add(0)
            continue
        out.add(min(max(bisect.bisect_right(list(bounds), v) - 1, 0), last))
    return sorted(out)


def provenance_fragments(path: str, sql: str, bounds: Sequence[Any], version: int | None = None) -> list[int]:
    """Fragments of the partition-column values ``sql`` returns over the snapshot, registered as table ``t``.

    ``sql`` selects the partition column of every row the query's answer depends on, e.g. for
    ``... GROUP BY g HAVING SUM(v) > 20`` partitioned on ``id``:
    ``SELECT id FROM t WHERE g IN (SELECT g FROM t GROUP BY g HAVING SUM(v) > 20)``.
    """
    return fragments_of((r[0] for r in duck(sql, t=snapshot(path, version))), bounds)


def canonical(rows: Iterable[Sequence[Any]]) -> list[tuple[Any, ...]]:
    """Rows as sorted tuples (NaN made comparable), for comparing answers that may come in any order."""
    def norm(v: Any) -> Any:
        return "NaN" if isinstance(v, float) and math.isnan(v) else v

    return sorted((tuple(norm(v) for v in r) for r in rows), key=repr)


def same_state(a: Any, b: Any) -> None:
    """Two pipelines (``imp_core.engine.pipeline.Pipeline``) reached the same sketch and operator states."""
    assert a.sketch() == b.sketch()
    for x, y in zip(a.stateful(), b.stateful()):
        for name, df in x.canonical().items():
            assert df.equals(y.canonical()[name]), (x.op_id, name)


def answers_with_and_without_sketch(service: Any, sql: str) -> tuple[Any, Any]:
    """``imp query`` with the sketch machinery and with ``--no-sketch`` (Spark alone, the truth)."""
    return service.query(sql), service.query(sql, use_sketch=False)


__all__ = ["answers_with_and_without_sketch", "canonical", "duck", "fragments_of", "provenance_fragments", "snapshot"]

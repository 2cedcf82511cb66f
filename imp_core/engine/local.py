"""An in-memory backend: tables held as polars frames, full relations computed with the operators themselves.

Used by the property tests (many random queries and change sequences, no JVM) and as the reference the Spark
backend is compared with. A stateless subtree's full result is the all-insert delta of its tables pushed through
the same stateless operators that process changes, so the two can only agree.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import polars as pl

from imp_core.engine.annotation import FRAG, MULT, pairs
from imp_core.engine.operators.aggregation import Aggregation
from imp_core.engine.operators.join import JoinOp
from imp_core.engine.pipeline import Pipeline, Versions
from imp_core.plan.nodes import Aggregate, Join, Plan, Scan

TableReader = Callable[[str, int], pl.DataFrame]


class LocalBackend:
    """``tables(name, version)`` returns the table's rows at that version (plain column names)."""

    def __init__(self, tables: TableReader) -> None:
        self.tables = tables

    def relation(self, node: Plan, pipeline: Pipeline, versions: Versions) -> pl.DataFrame:
        current = pipeline.current(node)
        if current is not None:
            return current
        op = pipeline.op(node)
        if isinstance(node, Scan):
            rows = self.tables(node.table, versions[node.table]).with_columns(pl.lit(1, dtype=pl.Int64).alias(MULT))
            return op.process(rows)  # type: ignore[attr-defined]
        if isinstance(node, Join):
            assert isinstance(op, JoinOp)
            return op.join_frames(self.relation(node.left, pipeline, versions),
                                  self.relation(node.right, pipeline, versions))
        return op.process(self.relation(node.children[0], pipeline, versions))  # type: ignore[attr-defined]

    def join_side(self, node: Plan, pipeline: Pipeline, versions: Versions) -> _FrameSide:
        return _FrameSide(pipeline.parent_join(node), self.relation(node, pipeline, versions))

    def aggregate_input(self, node: Aggregate, op: Aggregation, pipeline: Pipeline,
                        versions: Versions) -> tuple[pl.DataFrame, pl.DataFrame, dict[int, pl.DataFrame]]:
        return op.prepare(self.relation(node.child, pipeline, versions))

    def side_summary(self, node: Plan, keys: list[str], max_rows: int, pipeline: Pipeline,
                     versions: Versions) -> tuple[pl.DataFrame | None, pl.DataFrame | None]:
        return _summary(self.relation(node, pipeline, versions), keys, max_rows)

    def rows_with_keys(self, node: Plan, keys: list[str], values: pl.DataFrame, max_rows: int, pipeline: Pipeline,
                       versions: Versions) -> pl.DataFrame | None:
        rows = self.relation(node, pipeline, versions).join(values, on=keys, how="semi")
        return None if max_rows and rows.height > max_rows else rows

    def key_counts(self, node: Plan, keys: list[str], max_keys: int, pipeline: Pipeline,
                   versions: Versions) -> pl.DataFrame | None:
        counts = self.relation(node, pipeline, versions).group_by(keys).agg(pl.col(MULT).sum().alias("__n"))
        return None if counts.height > max_keys else counts

    def fragment_counts(self, node: Plan, pipeline: Pipeline, versions: Versions) -> np.ndarray:
        rel = self.relation(node, pipeline, versions)
        p = pairs(rel, [])
        total = pipeline.partitions.total_fragments
        if p.height == 0:
            return np.zeros(total, dtype=np.int64)
        return np.bincount(p.get_column(FRAG).to_numpy().astype(np.int64),
                           weights=p.get_column(MULT).to_numpy(), minlength=total).astype(np.int64)


def _summary(rel: pl.DataFrame, keys: list[str], max_rows: int) -> tuple[pl.DataFrame | None, pl.DataFrame]:
    if rel.height <= max_rows:
        return rel, None  # type: ignore[return-value]
    return None, rel.group_by(keys).agg(pl.col(MULT).sum().alias("__n"))


class _FrameSide:
    def __init__(self, op: JoinOp, rows: pl.DataFrame) -> None:
        self.op, self.rows = op, rows

    def join_delta(self, delta: pl.DataFrame, delta_is_left: bool) -> pl.DataFrame:
        return self.op.join_frames(delta, self.rows) if delta_is_left else self.op.join_frames(self.rows, delta)

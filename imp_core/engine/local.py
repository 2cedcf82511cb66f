"""An in-memory backend: tables held as polars frames, whole relations computed with the operators themselves.

The reference the Spark backend is compared with, and the backend of the property tests (no JVM). A relation is the
all-insert contents of its tables pushed through freshly built operators of the same classes that process changes,
so capture and maintenance can only agree. See docs/ARCHITECTURE.md, "Passes and backends".
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import polars as pl

from imp_core.engine.annotation import pairs
from imp_core.engine.backend import Relation, Versions
from imp_core.engine.operators.anti_join import AntiJoinOp
from imp_core.engine.operators.base import StatefulOperator, UnaryOperator
from imp_core.engine.operators.context import BuildContext
from imp_core.engine.operators.join import JoinOp
from imp_core.engine.operators.partials import PartialLayout, Partials
from imp_core.engine.operators.registry import build_operator
from imp_core.engine.operators.union import UnionOp
from imp_core.engine.schema import COUNT, FRAG, MULT
from imp_core.errors import UnsupportedError
from imp_core.plan.nodes import Join, Plan, Scan

TableReader = Callable[[str, int], pl.DataFrame]


class LocalBackend:
    """``tables(name, version)`` returns the table's rows at that version (plain column names)."""

    def __init__(self, tables: TableReader) -> None:
        self.tables = tables

    def relation(self, rel: Relation, versions: Versions) -> pl.DataFrame:
        return self._evaluate(rel.node, rel, versions)

    def _evaluate(self, node: Plan, rel: Relation, versions: Versions) -> pl.DataFrame:
        held = rel.state_of(node)
        if held is not None:
            return held
        op = build_operator(node, BuildContext("local", rel.annotations))
        if isinstance(node, Scan):
            assert isinstance(op, UnaryOperator)
            rows = self.tables(node.table, versions[node.table])
            return op.process(rows.with_columns(pl.lit(1, dtype=pl.Int64).alias(MULT)))
        inputs = [self._evaluate(child, rel, versions) for child in node.children]
        if isinstance(op, JoinOp):
            return op.join_frames(*inputs)
        if isinstance(op, UnionOp):
            return op.combine([op.process(rows, i) for i, rows in enumerate(inputs)])
        if isinstance(op, AntiJoinOp):  # a fresh operator fed both inputs whole: its output is the whole result
            left, right = inputs
            return op.process(left, right)
        if isinstance(op, StatefulOperator) or not isinstance(op, UnaryOperator):
            raise UnsupportedError(f"{type(node).__name__} reads operator state; its contents must come with the "
                                   f"relation")
        return op.process(inputs[0])

    def join_delta(self, join: Join, delta: pl.DataFrame, delta_is_left: bool, other: Relation,
                   versions: Versions) -> pl.DataFrame:
        rows = self.relation(other, versions)
        op = JoinOp("local", join)
        return op.join_frames(delta, rows) if delta_is_left else op.join_frames(rows, delta)

    def aggregate_input(self, child: Relation, layout: PartialLayout, versions: Versions) -> Partials:
        return layout.of_delta(self.relation(child, versions))

    def side_summary(self, side: Relation, keys: list[str], max_rows: int,
                     versions: Versions) -> tuple[pl.DataFrame | None, pl.DataFrame | None]:
        rows = self.relation(side, versions)
        if rows.height <= max_rows:
            return rows, None
        return None, rows.group_by(keys).agg(pl.col(MULT).sum().alias(COUNT))

    def rows_with_keys(self, side: Relation, keys: list[str], values: pl.DataFrame, max_rows: int,
                       versions: Versions) -> pl.DataFrame | None:
        rows = self.relation(side, versions).join(values, on=keys, how="semi")
        return None if max_rows and rows.height > max_rows else rows

    def key_counts(self, side: Relation, keys: list[str], max_keys: int, versions: Versions) -> pl.DataFrame | None:
        counts = self.relation(side, versions).group_by(keys).agg(pl.col(MULT).sum().alias(COUNT))
        return None if counts.height > max_keys else counts

    def fragment_counts(self, rel: Relation, versions: Versions) -> np.ndarray:
        p = pairs(self.relation(rel, versions), [])
        total = rel.annotations.total_fragments
        if p.height == 0:
            return np.zeros(total, dtype=np.int64)
        return np.bincount(p.get_column(FRAG).to_numpy().astype(np.int64),
                           weights=p.get_column(MULT).to_numpy(), minlength=total).astype(np.int64)


__all__ = ["LocalBackend", "TableReader"]

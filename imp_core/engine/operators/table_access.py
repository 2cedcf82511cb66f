"""Table access (paper 5.2.1) with the annotate operator (Definition 4.4).

Turns change rows of one table (plain column names, ``__mult``) into an annotated delta of a scan: columns renamed to
``alias.column`` and, when the table is partitioned, the scan's fragment column. See docs/ARCHITECTURE.md,
"Annotated deltas".
"""

from __future__ import annotations

import numpy as np
import polars as pl

from imp_core.engine import frames
from imp_core.engine.annotation import FRAG_DTYPE, ScanAnnotation
from imp_core.engine.evaluate import polars_type
from imp_core.engine.operators.base import UnaryOperator
from imp_core.engine.operators.context import BuildContext
from imp_core.engine.schema import MULT, REFRAG
from imp_core.plan.nodes import Plan, Scan


class TableAccess(UnaryOperator):
    kind = "scan"

    def __init__(self, op_id: str, scan: Scan, annotation: ScanAnnotation | None) -> None:
        super().__init__(op_id)
        self.scan = scan
        self.annotation = annotation
        self._columns = [(c.name, scan.qualified(c.name), polars_type(c.dtype)) for c in scan.columns]
        self._columns.append((MULT, MULT, pl.Int64()))

    @classmethod
    def from_node(cls, node: Plan, ctx: BuildContext) -> TableAccess:
        assert isinstance(node, Scan)
        return cls(ctx.op_id(cls.kind), node, ctx.annotations.of_scan(node))

    def process(self, delta: pl.DataFrame) -> pl.DataFrame:
        """Annotate change rows: ``delta`` has the table's columns and ``__mult``, and may carry each row's global
        fragment id in ``__refrag`` (a repartition deletes rows under their old id and inserts them under the new)."""
        ann = self.annotation
        out = [_cast(delta.get_column(name), dtype).alias(qualified) for name, qualified, dtype in self._columns]
        if ann is not None:
            if REFRAG in delta.columns:
                frag = delta.get_column(REFRAG).to_numpy()
            else:
                frag = ann.fragments(delta.get_column(ann.partition.column))
            out.append(frames.series(ann.column, frag.astype(np.uint32, copy=False), FRAG_DTYPE))  # ids >= 0
        return frames.frame(out)


def _cast(s: pl.Series, dtype: pl.DataType) -> pl.Series:
    """``s`` as ``dtype`` (a value that does not fit becomes NULL, as Spark's reader does); a Series operation, not a
    polars query run (the change rows are a frame of Series put together as they are)."""
    return s if s.dtype == dtype else s.cast(dtype, strict=False)


__all__ = ["TableAccess"]

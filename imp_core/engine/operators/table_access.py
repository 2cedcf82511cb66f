"""Table access (paper 5.2.1) with the annotate operator (Definition 4.4).

Turns change rows of one table (plain column names, ``__mult``) into an annotated delta of a scan: columns renamed to
``alias.column`` and, when the table is partitioned, a fragment column holding the global id of the fragment each row
falls in (vectorized binary search over the bounds). Tables without a partition carry no annotation.
"""

from __future__ import annotations

import polars as pl

from imp_core.engine.annotation import FRAG_DTYPE, MULT, frag_col
from imp_core.engine.evaluate import polars_type
from imp_core.engine.operators.base import Operator
from imp_core.plan.nodes import Scan
from imp_core.sketch.partition import Partition


class TableAccess(Operator):
    kind = "table_access"

    def __init__(self, op_id: str, scan: Scan, partition: Partition | None, offset: int, frag_index: int) -> None:
        super().__init__(op_id)
        self.scan = scan
        self.partition = partition
        self.offset = offset
        self.frag_name = frag_col(frag_index)
        self._columns = [pl.col(c.name).cast(polars_type(c.dtype), strict=False).alias(scan.qualified(c.name))
                         for c in scan.columns] + [pl.col(MULT).cast(pl.Int64)]

    def process(self, changes: pl.DataFrame) -> pl.DataFrame:
        """Annotate change rows; ``changes`` has the table's columns and ``__mult``."""
        if self.partition is None:
            return changes.select(self._columns)
        frag = self.partition.fragment_of(changes.get_column(self.partition.column))
        return changes.select([*self._columns, pl.lit(pl.Series(self.frag_name, frag + self.offset, dtype=FRAG_DTYPE))])

    def annotate_frame(self, rows: pl.DataFrame) -> pl.DataFrame:
        """Annotate current contents read elsewhere (already named ``alias.column``)."""
        if self.partition is None:
            return rows
        values = rows.get_column(self.scan.qualified(self.partition.column))
        frag = self.partition.fragment_of(values)
        return rows.with_columns(pl.Series(self.frag_name, frag + self.offset, dtype=FRAG_DTYPE))

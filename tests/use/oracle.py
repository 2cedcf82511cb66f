"""An oracle for sketch use that shares no code with it: fragments by plain Python over the stored bounds.

``fragment_of`` writes Spark's order out (NULL in fragment 0, NaN above every number, -0.0 = 0.0, strings by code
point); ``needed_files`` reads every data file of a Delta snapshot with pyarrow and says which files hold a row of the
given fragments, which is what pruning must keep.
"""

from __future__ import annotations

import bisect
import math
from typing import Any

import pyarrow.parquet as pq

from imp_core.sketch.partition import Partition
from imp_core.sources.delta import DeltaSource


def fragment_of(part: Partition, value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, float) and math.isnan(value):
        return part.fragments - 1
    return bisect.bisect_right(list(part.bounds[1:-1]), value)


def needed_files(source: DeltaSource, version: int, part: Partition, fragments: list[int]) -> set[str]:
    """URIs of the files of ``version`` that hold at least one row of ``fragments``."""
    wanted = set(fragments)
    out = set()
    for f in source.files(version):
        if part.column in f.partition_values:
            values = [f.partition_values[part.column]]
        else:
            values = pq.read_table(f.uri, columns=[part.column]).column(0).to_pylist()
        if any(fragment_of(part, v) in wanted for v in values):
            out.add(f.uri)
    return out

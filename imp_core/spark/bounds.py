"""Equi-depth partition bounds over the current data (paper 7.4: bounds of an equi-depth histogram).

Numeric, date and timestamp columns use Spark's ``percentile_approx`` (one pass); strings use a sample sorted in
memory. Duplicate quantiles (skewed data) are dropped, so a column with few distinct values gets fewer fragments.
The first and last bounds are the column's minimum and maximum; the outer fragments are open-ended anyway.
"""

from __future__ import annotations

import decimal

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from imp_core.errors import UsageError
from imp_core.sketch.partition import Bound

SAMPLE_ROWS = 200_000


def equi_depth_bounds(df: DataFrame, column: str, fragments: int, kind: str) -> tuple[Bound, ...]:
    if fragments < 1:
        raise UsageError(f"--fragments must be at least 1, got {fragments}")
    c = F.col(f"`{column}`")
    stats = df.select(F.min(c).alias("lo"), F.max(c).alias("hi"), F.count(c).alias("n")).first()
    if stats is None or stats["n"] == 0:
        raise UsageError(f"column {column} has no non-NULL values to compute bounds from; give --bounds")
    lo, hi = stats["lo"], stats["hi"]
    if kind == "string":
        n = stats["n"]
        sample = df.select(c.alias("v")).where(c.isNotNull())
        if n > SAMPLE_ROWS:
            sample = sample.sample(fraction=min(1.0, 2 * SAMPLE_ROWS / n), seed=7)
        values = sorted(r["v"] for r in sample.collect())
        inner = [values[int(len(values) * i / fragments)] for i in range(1, fragments)] if values else []
    else:
        probs = [i / fragments for i in range(1, fragments)]
        if not probs:
            inner = []
        else:
            accuracy = max(10_000, 50 * fragments)
            row = df.select(F.percentile_approx(c, probs, accuracy).alias("q")).first()
            inner = list(row["q"]) if row is not None and row["q"] is not None else []
    if kind == "decimal":
        inner = [decimal.Decimal(str(v)) for v in inner]
        lo, hi = decimal.Decimal(str(lo)), decimal.Decimal(str(hi))
    out: list[Bound] = [lo]
    for v in inner:
        if v > out[-1]:
            out.append(v)
    if hi > out[-1]:
        out.append(hi)
    elif len(out) == 1:
        # a single distinct value: one fragment [v, v+) covers it (and, open-ended, everything else)
        out.append(_successor(hi, kind))
    return tuple(out)


def _successor(v: Bound, kind: str) -> Bound:
    import datetime as dt

    if kind == "int":
        return v + 1
    if kind == "float":
        return v + 1.0
    if kind == "decimal":
        return v + 1
    if kind == "date":
        return v + dt.timedelta(days=1)
    if kind == "timestamp":
        return v + dt.timedelta(microseconds=1)
    return v + "\x00"

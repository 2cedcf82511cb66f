"""The fragment of each scanned row, computed on Spark without a Python UDF, and the bounds as Spark literals.

The rule is docs/SEMANTICS.md's: the column's value, in its own type, compared with bounds of that type.
``pyspark.ml.feature.Bucketizer`` compares doubles, so it is used only where mapping the column and the inner bounds
to doubles keeps every comparison's answer (:func:`exact_as_double`); everything else uses a nested ``CASE`` with
literals of the column's type. NULL goes to fragment 0 and NaN to the last fragment, like
``Partition.fragment_of``. See docs/ARCHITECTURE.md, "Fragments on Spark".
"""

from __future__ import annotations

import datetime as dt
import decimal

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from imp_core.sketch.bounds import micros
from imp_core.sketch.partition import Bound, Partition
from imp_core.spark.types import spark_type_name

_TMP_IN = "__frag_in"
_TMP_OUT = "__frag_out"
_TMP_COUNT = "__frag_count"
_EXACT = 2**53
_NTZ_EPOCH = "TIMESTAMP_NTZ'1970-01-01 00:00:00'"


def exact_as_double(partition: Partition) -> bool:
    """Whether comparing doubles (the Bucketizer) gives every value of the column the fragment of its own type."""
    t = partition.column_type
    if partition.kind == "float" or partition.kind == "date":
        return True
    if partition.kind == "int":
        return all(abs(int(b)) < _EXACT for b in partition.inner_bounds)
    if partition.kind == "timestamp":
        return all(abs(micros(b)) < _EXACT for b in partition.inner_bounds)
    if partition.kind == "decimal":
        return bool(t.precision <= 15)
    return False


def _as_double(value: Column, partition: Partition) -> Column:
    t = partition.column_type
    if partition.kind == "float":
        return F.when(value == F.lit(0.0), F.lit(0.0)).otherwise(value.cast("double"))
    if partition.kind == "date":
        return F.unix_date(value).cast("double")
    if partition.kind == "timestamp":
        if t.tz:
            return F.unix_micros(value).cast("double")
        return F.timestamp_diff("MICROSECOND", F.expr(_NTZ_EPOCH), value).cast("double")  # no time zone involved
    if partition.kind == "decimal":
        return (value * F.lit(decimal.Decimal(10) ** t.scale)).cast("long").cast("double")
    return value.cast("double")


def _bound_as_double(bound: Bound, partition: Partition) -> float:
    if partition.kind == "date":
        return float((bound - dt.date(1970, 1, 1)).days)
    if partition.kind == "timestamp":
        return float(micros(bound))
    if partition.kind == "decimal":
        return float(int(bound.scaleb(partition.column_type.scale)))
    return float(bound)


def bound_literal(bound: Bound, partition: Partition) -> Column:
    """A Spark literal of the partition column's own type holding ``bound`` (exactly: bounds are normalized)."""
    t = partition.column_type
    if partition.kind == "timestamp":
        if t.tz:
            return F.timestamp_micros(F.lit(micros(bound)))
        return F.lit(bound.isoformat(sep=" ")).cast("timestamp_ntz")
    if partition.kind == "string":
        return F.lit(bound)
    if partition.kind == "decimal":
        # the literal's own DECIMAL(digits, scale): it widens to the column's type exactly, whereas two decimal
        # types whose union needs more than 38 digits are compared as doubles by Spark
        return F.lit(bound)
    if partition.kind == "date":
        return F.lit(bound)
    return F.lit(bound).cast(spark_type_name(t))


def add_fragment(df: DataFrame, value: Column, partition: Partition, offset: int, name: str) -> DataFrame:
    """``df`` with an int column ``name`` = ``offset`` + the fragment of ``value``."""
    n = partition.fragments
    if n == 1:
        return df.withColumn(name, F.lit(offset).cast("int"))
    if not exact_as_double(partition):
        return df.withColumn(name, (case_fragment(value, partition) + F.lit(offset)).cast("int"))
    from pyspark.ml.feature import Bucketizer  # pyspark.ml takes 0.8 s to import: only when it is used

    inner = [_bound_as_double(b, partition) for b in partition.inner_bounds]
    splits = [float("-inf"), *inner, float("inf")]
    bucketizer = Bucketizer(splits=splits, inputCol=_TMP_IN, outputCol=_TMP_OUT, handleInvalid="keep")
    x = _as_double(value, partition)
    out = bucketizer.transform(df.withColumn(_TMP_IN, x))
    frag = (
        F.when(F.col(_TMP_IN).isNull(), F.lit(0))
        .when(F.isnan(F.col(_TMP_IN)), F.lit(n - 1))
        .otherwise(F.col(_TMP_OUT).cast("int"))
    )
    return out.withColumn(name, (frag + F.lit(offset)).cast("int")).drop(_TMP_IN, _TMP_OUT)


def fragment_counts(df: DataFrame, partition: Partition, keep: Column | None = None) -> list[int]:
    """Rows of ``df`` (those ``keep`` accepts) in each fragment of ``partition``: one Spark job whose result is one
    row per fragment, so the driver never holds the table."""
    if keep is not None:
        df = df.where(keep)
    value = F.col("`" + partition.column.replace("`", "``") + "`")
    counted = add_fragment(df.select(value), value, partition, 0, _TMP_COUNT).groupBy(_TMP_COUNT).count()
    out = [0] * partition.fragments
    for row in counted.collect():
        out[int(row[_TMP_COUNT])] = int(row["count"])
    return out


def case_fragment(value: Column, partition: Partition) -> Column:
    """Balanced binary search as nested CASE (any ordered type); ``log2(n)`` comparisons per row.

    NaN compares above every bound in Spark, so it lands in the last fragment without a test of its own.
    """
    bounds = partition.bounds
    literals = {i: bound_literal(bounds[i], partition) for i in range(1, partition.fragments)}

    def search(lo: int, hi: int) -> Column:
        if lo == hi:
            return F.lit(lo)
        mid = (lo + hi + 1) // 2  # fragment ``mid`` starts at bounds[mid]
        return F.when(value < literals[mid], search(lo, mid - 1)).otherwise(search(mid, hi))

    return F.when(value.isNull(), F.lit(0)).otherwise(search(0, partition.fragments - 1))


__all__ = ["add_fragment", "bound_literal", "case_fragment", "exact_as_double"]

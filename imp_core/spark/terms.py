"""What a row contributes to each kind of accumulator of an aggregation's partial layout, as Spark columns (before
a group-by sums it); the in-memory engine computes the same terms with polars (``engine/operators/partials.py``)."""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa
from pyspark.sql import Column
from pyspark.sql import functions as F

from imp_core.engine.operators.partials import Accumulator, Term
from imp_core.spark.types import arrow_to_spark

# What a row contributes to each kind of accumulator (before the group-by sums it): ``x`` the aggregate's argument,
# ``d`` the argument as a double, ``m`` the multiplicity. EXACT terms are :func:`exact_term`.
TERMS: dict[Term, Callable[[Column, Column, Column], Column]] = {
    Term.ROWS: lambda x, d, m: m,
    Term.NON_NULL: lambda x, d, m: F.when(x.isNotNull(), m).otherwise(F.lit(0)),
    Term.NAN: lambda x, d, m: F.when(F.isnan(d), m).otherwise(F.lit(0)),
    Term.POS_INF: lambda x, d, m: F.when(d == F.lit(float("inf")), m).otherwise(F.lit(0)),
    Term.NEG_INF: lambda x, d, m: F.when(d == F.lit(float("-inf")), m).otherwise(F.lit(0)),
    Term.FINITE: lambda x, d, m: F.when(~F.isnan(d) & (F.abs(d) != F.lit(float("inf"))), d * m),
    Term.FINITE_ABS: lambda x, d, m: F.when(~F.isnan(d) & (F.abs(d) != F.lit(float("inf"))), F.abs(d) * m),
    Term.WRAPPED: lambda x, d, m: x.cast("long") * m,  # wraps like Spark's own bigint SUM
}
EXACT = (Term.EXACT, Term.EXACT_ABS)


def exact_value(c: Accumulator, x: Column) -> Column:
    """The argument in an EXACT accumulator's DECIMAL(38, s) (absolute for EXACT_ABS)."""
    v = x.cast(arrow_to_spark(pa.decimal128(38, c.dtype.scale)))  # type: ignore[attr-defined]
    return F.abs(v) if c.term is Term.EXACT_ABS else v


def exact_term(c: Accumulator, x: Column, m: Column) -> Column:
    """Decimal sums add the values themselves, negated for deleted rows: ``DECIMAL(38, s) * BIGINT`` would round
    to 6 digits after the point under Spark's precision rules. Rows with |m| > 1 are left to the backend
    (``SparkBackend._multiplied_out``)."""
    v = exact_value(c, x)
    return F.when(m == 1, v).when(m == -1, -v)




def row_term(c: Accumulator, x: Column, m: Column) -> Column:
    """Accumulator ``c``'s term of a row with argument ``x`` and multiplicity ``m``."""
    return exact_term(c, x, m) if c.term in EXACT else TERMS[c.term](x, x.cast("double"), m)


__all__ = ["EXACT", "TERMS", "exact_term", "exact_value", "row_term"]

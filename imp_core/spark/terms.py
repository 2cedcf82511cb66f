"""What a row contributes to each kind of accumulator of an aggregation's partial layout, as Spark columns (before
a group-by sums it); the in-memory engine computes the same terms with polars (``engine/operators/partials.py``)."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal

import pyarrow as pa
from pyspark.sql import Column
from pyspark.sql import functions as F

from imp_core.engine.decimal_sums import BASE_DIGITS
from imp_core.engine.operators.partials import DECIMAL_TERMS, Accumulator, PartialLayout, Rounding, Term
from imp_core.engine.order_dependence import UNIT
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
EXACT = DECIMAL_TERMS


def exact_value(c: Accumulator, x: Column, scale: int | None = None) -> Column:
    """The argument in an EXACT accumulator's DECIMAL(38, s) (absolute for EXACT_ABS); for a part of a wide
    decimal sum (``scale``: its argument's), that part (``decimal_sums``): WIDE_LOW ``x % B``, WIDE_HIGH
    ``x div B`` with ``B`` 10^20 units of the scale. Spark computes both exactly on the decimal values (the quotient
    stays below 10^18 and the remainder below B), so the parts add up over many rows without leaving 38 digits."""
    if c.term in (Term.WIDE_LOW, Term.WIDE_HIGH):
        assert scale is not None
        v = x.cast(arrow_to_spark(pa.decimal128(38, scale)))
        shift = BASE_DIGITS - scale  # B = 10^shift
        base_type = pa.decimal128(shift + 1, 0) if shift >= 0 else pa.decimal128(-shift, -shift)
        base = F.lit(Decimal(1).scaleb(shift)).cast(arrow_to_spark(base_type))
        if c.term is Term.WIDE_LOW:
            return (v % base).cast(arrow_to_spark(pa.decimal128(38, scale)))
        # (v - v % B) is a multiple of B: Spark's precision rules for - and / keep its digits (18 before the point)
        return ((v - v % base) / base).cast(arrow_to_spark(pa.decimal128(38, 0)))
    v = x.cast(arrow_to_spark(pa.decimal128(38, c.dtype.scale)))  # type: ignore[attr-defined]
    return F.abs(v) if c.term is Term.EXACT_ABS else v


def exact_term(c: Accumulator, x: Column, m: Column, scale: int | None = None) -> Column:
    """Decimal sums add the values themselves, negated for deleted rows: ``DECIMAL(38, s) * BIGINT`` would round
    to 6 digits after the point under Spark's precision rules. Rows with |m| > 1 are left to the backend
    (``SparkBackend._multiplied_out``). ``scale``: a wide sum's argument's (``exact_value``)."""
    v = exact_value(c, x, scale)
    return F.when(m == 1, v).when(m == -1, -v)


def rounding_terms(r: Rounding, x: Column, m: Column) -> list[Column]:
    """What a row adds to an order-dependent float aggregate's ``Rounding`` columns: 1 per finite term (|m|), and
    the term's magnitude |x·m|; summed like the accumulators, they give the error bound of Spark's plain sum."""
    d = x.cast("double")
    finite = ~F.isnan(d) & (F.abs(d) != F.lit(float("inf")))
    return [F.when(finite, F.abs(m)).otherwise(F.lit(0)).cast("long").alias(r.terms),
            F.when(finite, F.abs(d * m)).otherwise(F.lit(0.0)).alias(r.magnitude)]




def rounding_bound(terms: Column, magnitude: Column) -> Column:
    """``order_dependence.rounding_bound`` as a Spark column (the same operations on doubles)."""
    g = (terms.cast("double") * 2.0 + 8.0) * UNIT
    return F.coalesce((g / (1.0 - g)) * F.abs(magnitude.cast("double")), F.lit(0.0))


def partial_sums(layout: PartialLayout, args: dict[int, Column], m: Column) -> list[Column]:
    """Spark's sums of a layout's accumulators over a group's rows (``args``: the aggregates' arguments), with the
    ``Rounding`` columns of its order-dependent float sums; ROUNDING accumulators come from those."""
    sums = []
    for c in layout.accumulators:
        if c.term is Term.ROUNDING:
            continue
        x = args[c.agg] if c.agg is not None else m
        sums.append(F.sum(row_term(c, x, m, layout.arg_scale(c))).alias(c.name))
    for r in layout.roundings:
        sums += [F.sum(t).alias(name) for t, name in zip(rounding_terms(r, args[r.agg], m), (r.terms, r.magnitude))]
    return sums


def row_term(c: Accumulator, x: Column, m: Column, scale: int | None = None) -> Column:
    """Accumulator ``c``'s term of a row with argument ``x`` and multiplicity ``m`` (not ROUNDING: that is no
    row's term)."""
    return exact_term(c, x, m, scale) if c.term in EXACT else TERMS[c.term](x, x.cast("double"), m)


__all__ = ["EXACT", "TERMS", "exact_term", "exact_value", "partial_sums", "rounding_bound", "rounding_terms",
           "row_term"]

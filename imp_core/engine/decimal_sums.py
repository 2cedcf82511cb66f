"""Decimal sums that can leave 38 digits: an exact accumulator wider than DECIMAL(38, s), and Spark's NULL.

Spark (ANSI off) types ``SUM`` of a DECIMAL(p, s) as DECIMAL(min(38, p + 10), s) and returns NULL for a group
whose sum needs more digits. With p <= 28 that takes more than 10^10 rows of extreme values, so the engine keeps
such sums in one DECIMAL(38, s) column (the fast path). A *wide* sum (p > 28) can leave 38 digits with two rows,
and must come back into range when rows are deleted, so its state keeps the exact sum in two columns:

* ``low``: DECIMAL(38, s), the digits below ``10^20`` units of the scale (normalized to ``[0, 10^20)`` units);
* ``high``: DECIMAL(38, 0), the count of ``10^20`` units: the exact unscaled sum is ``high * 10^20 + low``.

Each row's value is split the same way before it is added (``split``), so a batch of up to 10^18 rows adds up
without overflow in 128 bits, on Spark (``spark/terms.py``) and in polars alike. The output (``value``) is the
exact sum where its unscaled value is below 10^38 in magnitude, else NULL, as Spark's final result is. See
docs/SEMANTICS.md, "Aggregates".
"""

from __future__ import annotations

from decimal import Decimal

import polars as pl

from imp_core.plan.expr import sum_leaves_38_digits as is_wide

BASE_DIGITS = 20
BASE = 10**BASE_DIGITS  # units of the scale per unit of ``high``
LIMIT = 10**38  # a DECIMAL(38, s)'s unscaled values stay below this in magnitude
_HIGH_CAP = 10**18 + 1  # |high| beyond 10^18 puts the sum out of range whatever ``low`` holds


def _unit(scale: int) -> pl.Expr:
    return pl.lit(Decimal(1).scaleb(-scale), dtype=pl.Decimal(38, scale))


def _from_unscaled(u: pl.Expr, scale: int) -> pl.Expr:
    """A DECIMAL(38, scale) from its unscaled Int128 value (|u| < 10^38), exactly."""
    return u.cast(pl.Decimal(38, 0)) * _unit(scale)


def split(x: pl.Expr, scale: int) -> tuple[pl.Expr, pl.Expr]:
    """A DECIMAL(38, scale) value as (low DECIMAL(38, scale) in ``[0, 10^20)`` units, high DECIMAL(38, 0)) with
    ``x = high * 10^20 units + low``."""
    u = x.cast(pl.Decimal(38, scale)).to_physical()
    high = u // BASE  # floor: low is never negative
    return _from_unscaled(u - high * BASE, scale), high.cast(pl.Decimal(38, 0))


def normalized(low: pl.Expr, high: pl.Expr, scale: int) -> tuple[pl.Expr, pl.Expr]:
    """The same exact sum with ``low`` back in ``[0, 10^20)`` units (after additions took it anywhere below
    10^38)."""
    u = low.to_physical()
    carry = u // BASE
    return (
        _from_unscaled(u - carry * BASE, scale),
        (high.cast(pl.Decimal(38, 0)).to_physical() + carry).cast(pl.Decimal(38, 0)),
    )


def value(low: pl.Expr, high: pl.Expr, scale: int) -> pl.Expr:
    """The sum as a DECIMAL(38, scale), NULL where it needs more than 38 digits (Spark's overflow)."""
    h = high.cast(pl.Decimal(38, 0)).to_physical().clip(-_HIGH_CAP, _HIGH_CAP)
    u = h * BASE + low.to_physical()
    return pl.when(u.abs() < LIMIT).then(_from_unscaled(u.clip(-(LIMIT - 1), LIMIT - 1), scale)).otherwise(None)


__all__ = ["BASE", "BASE_DIGITS", "LIMIT", "is_wide", "normalized", "split", "value"]

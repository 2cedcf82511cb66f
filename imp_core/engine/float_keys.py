"""Floats as keys, the way Spark compares them: in GROUP BY, DISTINCT, join keys and MIN/MAX multisets.

Spark normalizes float keys (every NaN is one value, -0.0 is 0.0) and orders NaN above every number. polars joins do
not match NaN with NaN reliably (a sorted single-row side takes a merge path where NaN != NaN), so engine state never
joins on a NaN: a float key is kept as two NaN-free columns, and a MIN/MAX multiset of doubles as order-preserving
integers. See docs/SEMANTICS.md, "Aggregates, grouping and ordering".
"""

from __future__ import annotations

import numpy as np
import polars as pl

from imp_core.engine.schema import nan_flag

NAN = float("nan")
_FLIP = np.int64(0x7FFFFFFFFFFFFFFF)


def normalize_float(x: pl.Expr) -> pl.Expr:
    """Spark's normalization of float grouping and join keys: -0.0 becomes 0.0, every NaN the same NaN."""
    return pl.when(x == 0.0).then(0.0).when(x.is_nan()).then(NAN).otherwise(x)


def nan_free(x: pl.Expr, name: str) -> list[pl.Expr]:
    """A float key as two NaN-free columns: ``name`` (the value, 0.0 for NaN and -0.0) and ``nan_flag(name)``."""
    return [pl.when(x.is_nan() | (x == 0.0)).then(0.0).otherwise(x).alias(name), x.is_nan().alias(nan_flag(name))]


def from_nan_free(name: str) -> pl.Expr:
    """The float key ``name`` back from its two NaN-free columns."""
    return pl.when(pl.col(nan_flag(name))).then(NAN).otherwise(pl.col(name)).alias(name)


def float_order_key(x: np.ndarray) -> np.ndarray:
    """Doubles as int64s in Spark's order (NaN above +inf, -0.0 = 0.0, every NaN one value), which polars joins,
    groups and compares without NaN's exceptions."""
    x = np.where(np.isnan(x), np.nan, np.where(x == 0.0, 0.0, x)).astype(np.float64)
    bits = x.view(np.int64)
    return np.where(bits < 0, bits ^ _FLIP, bits)


def float_from_order_key(k: np.ndarray) -> np.ndarray:
    k = k.astype(np.int64)
    return np.where(k < 0, k ^ _FLIP, k).view(np.float64)


__all__ = ["float_from_order_key", "float_order_key", "from_nan_free", "nan_free", "normalize_float"]

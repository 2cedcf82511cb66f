"""The state of an aggregation's sums beyond one exact column: the layout version that records them, and a wide
decimal sum's normalized parts.

Two kinds of sum keep more than their value (``operators/partials.py``): an order-dependent float sum whose interval
an operator above reads keeps an error bound ``__e{j}`` (what plain summations rounded away,
``order_dependence.grown_bound``), and a DECIMAL sum that can leave 38 digits keeps its exact value in two parts
``__s{j}``, ``__ov{j}`` (``engine/decimal_sums.py``). See docs/SEMANTICS.md, "Aggregates".
"""

from __future__ import annotations

from typing import Any

import polars as pl

from imp_core.engine import decimal_sums
from imp_core.engine.operators.partials import PartialLayout, agg_columns
from imp_core.errors import StateError

# version of the state's frames: 2 = NaN/±inf counts, NaN-free float keys, MIN/MAX doubles as order keys; 3 = an
# order-dependent float sum's error bound ``__e{j}``, a wide decimal sum's high part ``__ov{j}``
LAYOUT = 3


def check_layout(op_id: str, layout: PartialLayout, saved: Any) -> None:
    """Refuse saved state of another layout version. Layout 2 differs only where an aggregate keeps an error bound
    or a wide decimal sum, so state without those loads as it is; with them it must be recaptured (its sum may
    hold roundings no bound records, or have overflowed).

    Raises:
        StateError: the saved state's layout is not this engine's.
    """
    if saved == LAYOUT or (saved == 2 and not layout.roundings and not layout.wide):
        return
    raise StateError(
        f"operator {op_id}: saved state was written by an older engine (layout {saved or 1}, now "
        f"{LAYOUT}: float sums keep an error bound, decimal sums beyond 38 digits an exact carry); "
        f"recapture the sketch"
    )


def wide_normalized(layout: PartialLayout) -> list[pl.Expr]:
    """Each wide decimal sum's parts with the low part back in range (``decimal_sums.normalized``), as expressions
    over a groups frame."""
    out = []
    for j in layout.wide:
        cols = agg_columns(j)
        low, high = decimal_sums.normalized(pl.col(cols.sum), pl.col(cols.carry), layout.scale_of(j))
        out += [low.alias(cols.sum), high.alias(cols.carry)]
    return out


def canonical_groups(layout: PartialLayout, groups: pl.DataFrame) -> pl.DataFrame:
    """A groups frame with its sums as values: a float sum as ``fl(s + c)`` (two routes reach the same exact sum as
    different (sum, compensation) pairs), without its error bound (which depends on the route: it never shrinks),
    a wide decimal sum by its normalized parts."""
    pairs = [(c.name, c.compensation) for c in layout.compensated if c.compensation is not None]
    if pairs:
        groups = groups.with_columns([(pl.col(s) + pl.col(c)).alias(s) for s, c in pairs]).drop([c for _, c in pairs])
    if layout.roundings or layout.wide:
        groups = groups.drop([r.bound for r in layout.roundings]).with_columns(wide_normalized(layout))
    return groups


__all__ = ["LAYOUT", "canonical_groups", "check_layout", "wide_normalized"]

"""Streams the code on main gets wrong (issue 53): each is marked ``xfail(strict=True)`` with its reason, so that
the run stays green until the fix is merged and then fails until the entry is removed. The lead removes an entry
once its fix is merged (a strict xfail that passes fails the run)."""

from __future__ import annotations

NOT_MERGED = "issue 53 fix not merged"

KNOWN_ON_MAIN: dict[int, str] = {
    6: f"{NOT_MERGED}: four rows of 6e37 in a DECIMAL(38, 0) SUM: every maintain job exits with 'ComputeError: "
    "overflow in decimal multiplication' (item 4)",
}
"""Seed of a CI stream -> why it fails on main."""

REPRODUCTIONS_ON_MAIN: dict[str, str] = {
    "ranking_duplicates_outside": f"{NOT_MERGED}: DeltaGroupStore compares sets, not bags (item 1)",
    "anti_join_duplicates_outside": f"{NOT_MERGED}: DeltaGroupStore compares sets, not bags (item 2)",
    "float_sum_rounded_at_capture": f"{NOT_MERGED}: the float interval assumes an exact stored sum (item 3)",
    "decimal_overflow": f"{NOT_MERGED}: a DECIMAL(38, 0) sum overflows in the engine (item 4)",
    "not_in_over_float_having": f"{NOT_MERGED}: the NOT IN cannot register outside (item 5)",
}
"""Name of an issue reproduction (``test_reproductions.py``) -> why it fails on main."""

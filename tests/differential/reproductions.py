"""The reproductions of issue 53 as differential streams (items 1-5), run by the harness like any other stream, and
the streams that take a guarded wide decimal sum into Spark's order-dependent range and back."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from tests.differential.generate import BIG_DECIMAL, DSUM_VARIANTS, Batch, Stream, targeted_sql

ONE = Decimal(1)


class _Fixed:
    """A stand-in for ``random.Random`` that picks the first choice: the targeted SQL with its first constants."""

    def choice(self, options: list[Any]) -> Any:
        return options[0]


def _sql(shape: str) -> tuple[str, list[str], list[str]]:
    return targeted_sql(shape, _Fixed())  # type: ignore[arg-type]


def ranking_duplicates() -> Stream:
    """Item 1: two rows identical in every kept column at the top of group 1; one job deletes one, the next job the
    other and inserts (1, 5.0). Spark returns (1, 5.0); the sketch must hold v = 5.0's fragment."""
    sql, on, bounds = _sql("rank")
    sql = sql.replace(" ASC)", " DESC)")
    top = (1, 10.0, ONE, 5)
    return Stream(
        -1,
        "repro:1",
        sql,
        {"d": [top, top, (2, 1.0, ONE, 6)]},
        on,
        bounds,
        [
            Batch({"d": [top]}, {}, ["delete one copy"]),
            Batch({"d": [top]}, {"d": [(1, 5.0, ONE, 5)]}, ["delete the other, insert (1, 5.0)"]),
        ],
    )


def anti_join_duplicates() -> Stream:
    """Item 2: two identical left rows blocked by e.k = 7; one job deletes one of them, the next the blocking row.
    Spark returns group 1 (one row)."""
    sql, on, bounds = _sql("anti")
    left = (1, 1.0, ONE, 7)
    return Stream(
        -2,
        "repro:2",
        sql,
        {"d": [left, left, (2, 1.0, ONE, 5)], "e": [(7, 1.0)]},
        on,
        bounds,
        [Batch({"d": [left]}, {}, ["delete one copy"]), Batch({"e": [(7, 1.0)]}, {}, ["delete the blocking row"])],
    )


def float_sum_rounded_at_capture() -> Stream:
    """Item 3: group 1 holds 1e16, 1.0, -1e16 in one file, in that order (Spark's capture sums them to 0.0); a job
    deletes the two large rows, and the true sum 1.0 passes the HAVING."""
    sql = "SELECT d.g, SUM(d.v) AS s FROM d AS d GROUP BY d.g HAVING SUM(d.v) > 0.5"
    rows = [(1, 1e16, ONE, 5), (1, 1.0, ONE, 5), (1, -1e16, ONE, 5), (2, 2.0, ONE, 6)]
    return Stream(
        -3,
        "repro:3",
        sql,
        {"d": rows},
        ["d.g"],
        ["1,2,3,4"],
        [Batch({"d": [rows[0], rows[2]]}, {}, ["delete the large terms"])],
    )


def decimal_overflow() -> Stream:
    """Item 4: two values of 6e37 in one group of a DECIMAL(38, 0) SUM (Spark: NULL); then one of them is deleted
    (Spark: 6e37)."""
    sql = "SELECT d.g, SUM(d.m) AS s FROM d AS d GROUP BY d.g HAVING SUM(d.m) > 0"
    big = (1, 1.0, BIG_DECIMAL, 5)
    return Stream(
        -4,
        "repro:4",
        sql,
        {"d": [big, big, (2, 1.0, ONE, 6)]},
        ["d.g"],
        ["1,2,3,4"],
        [Batch({"d": [big]}, {}, ["delete one 6e37"])],
    )


def not_in_over_float_having() -> Stream:
    """Item 5: a NOT IN over a float HAVING aggregation registers with every operator outside, and is maintained."""
    sql, on, bounds = _sql("notin")
    return Stream(
        -5,
        "repro:5",
        sql,
        {"d": [(1, 1.0, ONE, 5), (1, 1.0, ONE, 6), (2, 1.0, ONE, 7)], "e": [(5, 1.0), (5, 1.0), (6, 0.5)]},
        on,
        bounds,
        [Batch({}, {"e": [(6, 1.5)]}, ["block k = 6"]), Batch({"e": [(5, 1.0)]}, {}, ["unblock k = 5"])],
    )


def ranked_wide_sum(distinct: bool) -> Stream:
    """A DECIMAL(38, 0) sum ranked by ORDER BY ... LIMIT (a guarded aggregation), plain or DISTINCT: group 1 holds 6e37
    and -5; batch 1 adds -6e37, so its sum is -5 but Spark's running sum may leave 38 digits (NULL) depending on the
    order of the rows, and every maintain job and the recapture are refused; batch 2 deletes it again, and the next
    job maintains the sketch from its last version."""
    sql = DSUM_VARIANTS[2 if distinct else 1]
    neg = (1, 1.0, -BIG_DECIMAL, 5)
    return Stream(
        -7 if distinct else -6,
        "guard:distinct" if distinct else "guard:sum",
        sql,
        {"d": [(1, 1.0, BIG_DECIMAL, 5), (1, 1.0, Decimal(-5), 5), (2, 1.0, ONE, 6), (3, 1.0, Decimal(2), 7)]},
        ["d.g"],
        ["1,2,3,4"],
        [Batch({}, {"d": [neg]}, ["insert -6e37"]), Batch({"d": [neg]}, {}, ["delete it"])],
    )


REPRODUCTIONS = {
    "ranking_duplicates_outside": ranking_duplicates,
    "anti_join_duplicates_outside": anti_join_duplicates,
    "float_sum_rounded_at_capture": float_sum_rounded_at_capture,
    "decimal_overflow": decimal_overflow,
    "not_in_over_float_having": not_in_over_float_having,
}

"""Date and timestamp constants in SQL: accepted TO_DATE formats and folding ``constant +/- INTERVAL``.

See docs/ARCHITECTURE.md, "The plan IR".
"""

from __future__ import annotations

import calendar
import datetime as dt
import functools

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

from imp_core.plan.expr import Interval


@functools.cache
def iso_date_formats(dialect: str) -> frozenset[str]:
    """The format strings sqlglot produces in ``dialect`` for 'YYYY-MM-DD' and 'yyyy-MM-dd'.

    sqlglot rewrites TO_DATE's format into its own notation (and Spark reads 'DD' as day-of-year), so the accepted
    spellings are recognized by parsing them in the same dialect rather than by string comparison.
    """
    out = {"YYYY-MM-DD", "yyyy-MM-dd", "%Y-%m-%d"}
    for fmt in ("YYYY-MM-DD", "yyyy-MM-dd"):
        try:
            node = sqlglot.parse_one(f"SELECT TO_DATE('2000-01-01', '{fmt}')", read=dialect)
        except SqlglotError:  # pragma: no cover - every dialect we know parses this
            continue
        for call in node.find_all(exp.TsOrDsToDate, exp.StrToDate):
            f = call.args.get("format")
            if isinstance(f, exp.Literal):
                out.add(f.this)
    return frozenset(out)


def add_months(value: dt.date, months: int) -> dt.date:
    """``value`` moved by whole months, clamped to the target month's last day (Spark's add_months, Postgres)."""
    years, month0 = divmod(value.month - 1 + months, 12)
    year, month = value.year + years, month0 + 1
    day = min(value.day, calendar.monthrange(year, month)[1])
    return value.replace(year=year, month=month, day=day)


def shift(value: dt.date, op: str, iv: Interval) -> dt.date | None:
    """``value op interval`` for a constant date/timestamp, or None when it does not fold to the same type."""
    n = iv.value if op == "+" else -iv.value
    if iv.unit in ("day", "week"):
        return value + dt.timedelta(days=n * (7 if iv.unit == "week" else 1))
    if iv.unit in ("month", "year"):
        return add_months(value, n * (12 if iv.unit == "year" else 1))
    if isinstance(value, dt.datetime):
        return value + dt.timedelta(**{f"{iv.unit}s": n})
    return None  # date + hours is a timestamp in Spark; leave it to the engine

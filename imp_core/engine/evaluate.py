"""Compile IR expressions to polars expressions with SQL semantics (as Spark evaluates them, non-ANSI).

The in-memory engine and the Spark capture must agree on every value, or a maintained sketch would differ from a
recapture. So each operation is spelled out rather than left to polars' defaults: three-valued logic for AND/OR/NOT
and IN lists, ``NULL`` on division by zero, truncated ``%``, decimals brought to the exact result scale before
arithmetic (polars would otherwise truncate ``decimal * decimal`` to the larger input scale), Spark's ``dayofweek``
numbering, HALF_UP rounding.
"""

from __future__ import annotations

import re

import numpy as np
import polars as pl
import pyarrow as pa

from imp_core.errors import UnsupportedError
from imp_core.plan.expr import (
    NULL,
    Between,
    Binary,
    Case,
    Cast,
    Col,
    Expr,
    Extract,
    Func,
    InList,
    Interval,
    IsNull,
    Like,
    Lit,
    Unary,
    common_type,
)


def polars_type(t: pa.DataType) -> pl.DataType:
    """The polars dtype the engine uses for an Arrow type."""
    if pa.types.is_integer(t):
        return pl.Int64
    if pa.types.is_floating(t):
        return pl.Float64
    if pa.types.is_decimal(t):
        return pl.Decimal(38, t.scale)
    if pa.types.is_string(t) or pa.types.is_large_string(t) or t == pa.string_view():
        return pl.String
    if pa.types.is_boolean(t):
        return pl.Boolean
    if pa.types.is_date(t):
        return pl.Date
    if pa.types.is_timestamp(t):
        return pl.Datetime("us", t.tz) if t.tz else pl.Datetime("us")
    if t == NULL:
        return pl.Null
    if pa.types.is_binary(t):
        return pl.Binary
    raise UnsupportedError(f"columns of type {t} are not supported by the incremental engine")


def compile_expr(e: Expr) -> pl.Expr:
    """A polars expression computing ``e`` with exactly the type ``e.dtype``."""
    out = _compile(e)
    if e.dtype != NULL and not isinstance(e, Col):
        out = out.cast(polars_type(e.dtype), strict=False)
    return out


def _to(e: Expr, t: pa.DataType) -> pl.Expr:
    x = _compile(e)
    if e.dtype == t or t == NULL:
        return x
    return x.cast(polars_type(t), strict=False)


def _compile(e: Expr) -> pl.Expr:
    if isinstance(e, Col):
        return pl.col(e.name)
    if isinstance(e, Lit):
        if e.value is None:
            return pl.lit(None)
        return pl.lit(e.value, dtype=polars_type(e.dtype))
    if isinstance(e, Unary):
        if e.op == "not":
            return ~_compile(e.arg)
        return -_compile(e.arg)
    if isinstance(e, Binary):
        return _binary(e)
    if isinstance(e, IsNull):
        x = _compile(e.arg)
        return x.is_not_null() if e.negated else x.is_null()
    if isinstance(e, InList):
        # An OR of equalities gives SQL's NULL semantics (``2 NOT IN (1, NULL)`` is NULL, not TRUE).
        parts = [_compare("=", e.arg, item) for item in e.items]
        out = parts[0]
        for p in parts[1:]:
            out = out | p
        return ~out if e.negated else out
    if isinstance(e, Between):
        out = _compare(">=", e.arg, e.low) & _compare("<=", e.arg, e.high)
        return ~out if e.negated else out
    if isinstance(e, Like):
        regex = like_to_regex(e.pattern, e.case_insensitive)
        out = _compile(e.arg).str.contains(regex)
        return ~out if e.negated else out
    if isinstance(e, Case):
        t = e.dtype
        chain = None
        for cond, value in e.whens:
            c = _compile(cond).fill_null(False)
            chain = pl.when(c).then(_to(value, t)) if chain is None else chain.when(c).then(_to(value, t))
        default = _to(e.default, t) if e.default is not None else pl.lit(None, dtype=polars_type(t))
        return chain.otherwise(default) if chain is not None else default  # type: ignore[union-attr]
    if isinstance(e, Cast):
        return _cast(e)
    if isinstance(e, (Func, Extract)):
        # polars returns its own widths (UInt32 for a length, Int8 for a month); arithmetic above must see the IR
        # type (BIGINT), or -LENGTH(s) fails and EXTRACT(DAY FROM d) * 100 overflows
        out = _func(e) if isinstance(e, Func) else _extract(e)
        return out if e.dtype == NULL else out.cast(polars_type(e.dtype), strict=False)
    if isinstance(e, Interval):
        raise UnsupportedError("an INTERVAL is only valid added to or subtracted from a date")
    raise UnsupportedError(f"expression {type(e).__name__} is not supported by the incremental engine")


def _compare(op: str, a: Expr, b: Expr) -> pl.Expr:
    t = common_type(a.dtype, b.dtype)
    x, y = _to(a, t), _to(b, t)
    if op == "=":
        return x == y
    if op == "<>":
        return x != y
    if op == "<":
        return x < y
    if op == "<=":
        return x <= y
    if op == ">":
        return x > y
    return x >= y


def _binary(e: Binary) -> pl.Expr:
    op = e.op
    if op == "and":
        return _compile(e.left) & _compile(e.right)
    if op == "or":
        return _compile(e.left) | _compile(e.right)
    if op in ("=", "<>", "<", "<=", ">", ">="):
        return _compare(op, e.left, e.right)
    if isinstance(e.right, Interval) or isinstance(e.left, Interval):
        base, iv = (e.left, e.right) if isinstance(e.right, Interval) else (e.right, e.left)
        assert isinstance(iv, Interval)
        n = iv.value if op == "+" else -iv.value
        unit = {"day": "d", "week": "w", "month": "mo", "year": "y", "hour": "h", "minute": "m", "second": "s"}
        if iv.unit not in unit:
            raise UnsupportedError(f"INTERVAL unit {iv.unit.upper()} is not supported")
        return _compile(base).dt.offset_by(f"{n}{unit[iv.unit]}")
    lt, rt = e.left.dtype, e.right.dtype
    if pa.types.is_date(lt) or pa.types.is_timestamp(lt):
        if pa.types.is_date(rt) or pa.types.is_timestamp(rt):
            return (_compile(e.left) - _compile(e.right)).dt.total_days()
        days = _compile(e.right)
        return _compile(e.left) + pl.duration(days=days if op == "+" else -days)
    t = e.dtype
    if op == "/":
        x, y = _to(e.left, pa.float64()), _to(e.right, pa.float64())
        return pl.when(y == 0).then(None).otherwise(x / y)
    x, y = _to(e.left, t), _to(e.right, t)
    if op == "+":
        return x + y
    if op == "-":
        return x - y
    if op == "*":
        return x * y
    if op == "%":
        # truncated remainder (sign of the dividend), exact, like Spark (Java's %) and C's fmod; polars' % is
        # floored, and for floats computed as x - y * floor(x / y), which rounds (7.5 % 0.3 gives 0.0, not 2.8e-16)
        if pa.types.is_integer(t):
            q = (x.abs() // y.abs()) * x.sign() * y.sign()
            return pl.when(y == 0).then(None).otherwise(x - q * y)
        if pa.types.is_decimal(t):
            r = x.abs() % y.abs()  # exact decimal arithmetic; floored = truncated for non-negative operands
            return pl.when(y == 0).then(None).when(x < 0).then(-r).otherwise(r)
        xf, yf = x.cast(pl.Float64), y.cast(pl.Float64)
        divisor = pl.when(yf == 0).then(None).otherwise(yf)
        exact = np.fmod(xf.fill_null(0.0), divisor.fill_null(1.0))  # vectorized; the fills only avoid warnings
        return pl.when(xf.is_null() | divisor.is_null()).then(None).otherwise(exact)
    raise UnsupportedError(f"operator {op} is not supported")


def _cast(e: Cast) -> pl.Expr:
    src, dst = e.arg.dtype, e.to
    x = _compile(e.arg)
    if pa.types.is_string(src) and pa.types.is_date(dst):
        return x.str.strip_chars().str.to_date("%Y-%m-%d", strict=False)
    if pa.types.is_string(src) and pa.types.is_timestamp(dst):
        return x.str.strip_chars().str.to_datetime(time_unit="us", strict=False)
    if pa.types.is_string(src) and (pa.types.is_integer(dst) or pa.types.is_floating(dst)):
        return x.str.strip_chars().cast(pl.Float64 if pa.types.is_floating(dst) else pl.Int64, strict=False)
    if pa.types.is_boolean(src) and pa.types.is_string(dst):
        return pl.when(x).then(pl.lit("true")).when(~x).then(pl.lit("false")).otherwise(None)
    if pa.types.is_floating(src) and pa.types.is_integer(dst):
        return x.cast(pl.Int64, strict=False)
    return x.cast(polars_type(dst), strict=False)


def _func(e: Func) -> pl.Expr:
    n, a = e.name, e.args
    c = [_compile(x) for x in a]
    if n == "upper":
        return c[0].str.to_uppercase()
    if n == "lower":
        return c[0].str.to_lowercase()
    if n == "length":
        return c[0].str.len_chars()
    if n == "trim":
        return c[0].str.strip_chars()
    if n == "ltrim":
        return c[0].str.strip_chars_start()
    if n == "rtrim":
        return c[0].str.strip_chars_end()
    if n == "substring":
        start = c[1].cast(pl.Int64)
        # Spark: 1-based; 0 behaves like 1; negative counts from the end
        offset = pl.when(start > 0).then(start - 1).when(start == 0).then(0).otherwise(start)
        length = c[2].cast(pl.Int64) if len(c) > 2 else None
        return c[0].str.slice(offset, length)
    if n == "concat":
        return pl.concat_str([x.cast(pl.String) for x in c], ignore_nulls=False)
    if n == "coalesce":
        return pl.coalesce([_to(x, e.dtype) for x in a])
    if n == "abs":
        return c[0].abs()
    if n == "sign":
        return c[0].sign()
    if n == "round":
        digits = int(a[1].value) if len(a) > 1 and isinstance(a[1], Lit) else 0
        return c[0].round(digits, mode="half_away_from_zero")
    if n == "floor":
        return c[0].floor()
    if n == "ceil":
        return c[0].ceil()
    if n in ("date_add", "date_sub"):
        days = c[1].cast(pl.Int64)
        return c[0].cast(pl.Date) + pl.duration(days=days if n == "date_add" else -days)
    if n == "datediff":
        return (c[0].cast(pl.Date) - c[1].cast(pl.Date)).dt.total_days()
    if n == "greatest":
        return pl.max_horizontal([_to(x, e.dtype) for x in a])
    if n == "least":
        return pl.min_horizontal([_to(x, e.dtype) for x in a])
    if n == "nullif":
        return pl.when(_compare("=", a[0], a[1]).fill_null(False)).then(None).otherwise(c[0])
    if n == "replace":
        if not (isinstance(a[1], Lit) and isinstance(a[2], Lit)):
            raise UnsupportedError("REPLACE needs constant search and replacement strings")
        return c[0].str.replace_all(str(a[1].value), str(a[2].value), literal=True)
    if n == "sqrt":
        return pl.when(c[0] < 0).then(None).otherwise(c[0].cast(pl.Float64).sqrt())
    if n == "ln":
        return pl.when(c[0] <= 0).then(None).otherwise(c[0].cast(pl.Float64).log())
    if n == "exp":
        return c[0].cast(pl.Float64).exp()
    if n == "power":
        return c[0].cast(pl.Float64).pow(c[1].cast(pl.Float64))
    raise UnsupportedError(f"function {n.upper()} is not supported by the incremental engine")


def _extract(e: Extract) -> pl.Expr:
    x = _compile(e.arg)
    f = e.field_
    if f == "year":
        return x.dt.year()
    if f == "quarter":
        return x.dt.quarter()
    if f == "month":
        return x.dt.month()
    if f == "week":
        return x.dt.week()
    if f == "day":
        return x.dt.day()
    if f == "dayofweek":
        return (x.dt.weekday() % 7) + 1  # Spark: 1 = Sunday ... 7 = Saturday
    if f == "dayofyear":
        return x.dt.ordinal_day()
    if f == "hour":
        return x.dt.hour()
    if f == "minute":
        return x.dt.minute()
    if f == "second":
        return x.dt.second()
    raise UnsupportedError(f"EXTRACT({f.upper()}) is not supported")


def like_to_regex(pattern: str, case_insensitive: bool = False) -> str:
    """SQL LIKE pattern (``%``, ``_``, backslash escapes) as an anchored regular expression."""
    out = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        if ch == "%":
            out.append(".*")
        elif ch == "_":
            out.append(".")
        else:
            out.append(re.escape(ch))
        i += 1
    return ("(?is)" if case_insensitive else "(?s)") + "^" + "".join(out) + "$"


def predicate_mask(df: pl.DataFrame, e: Expr) -> pl.Series:
    """Boolean mask of rows satisfying ``e`` (NULL counts as not satisfied, as in WHERE)."""
    return df.select(_compile(e).fill_null(False).alias("__m")).to_series()

"""Polars kernels for the value rules where Spark and polars differ: casts, decimal arithmetic and AVG, HALF_UP
rounding, doubles through their shortest decimal text.

Every kernel is vectorized; decimal arithmetic runs on the unscaled integers in Int128, and the few rows too large for
that to be exact are computed with Python's ``decimal`` module. See docs/SEMANTICS.md.
"""

from __future__ import annotations

import decimal
from collections.abc import Callable, Sequence
from typing import Any

import polars as pl
import pyarrow as pa

from imp_core.plan import values as V

I128 = pl.Int128
_CONTEXT = decimal.Context(prec=200, rounding=decimal.ROUND_HALF_UP, Emax=999999, Emin=-999999)


def neg(x: pl.Expr) -> pl.Expr:
    """``-x`` for Int128 (polars has no Int128 negation)."""
    return pl.lit(0, dtype=I128) - x


def sign_of(n: pl.Expr) -> pl.Expr:
    """-1 or 1 as Int128 (multiplying by it, rather than branching, keeps each operand evaluated once)."""
    return pl.when(n < 0).then(pl.lit(-1, dtype=I128)).otherwise(pl.lit(1, dtype=I128))


def pow10(k: int) -> pl.Expr:
    """``10 ** k`` as an Int128 literal (k <= 38)."""
    return pl.lit(10**k, dtype=I128)


# -- decimals as unscaled integers ---------------------------------------------------------------------------------


def unscaled(x: pl.Expr) -> pl.Expr:
    """The unscaled Int128 integer of a decimal (``1.25`` at scale 2 is 125): polars' physical representation."""
    return x.to_physical().cast(I128)


def from_unscaled(r: pl.Expr, t: pa.DataType) -> pl.Expr:
    """A ``DECIMAL(p, s)`` from its unscaled Int128 integer; NULL when it has more than ``p`` digits (Spark's
    overflow rule with ANSI off)."""
    value = r.cast(pl.Decimal(38, 0), strict=False)  # NULL from 10^38 on
    if t.scale:
        value = value * pl.lit(decimal.Decimal(1).scaleb(-t.scale), dtype=pl.Decimal(38, t.scale))
    return value.cast(pl.Decimal(t.precision, t.scale), strict=False)  # NULL beyond p digits


def div_half_up(n: pl.Expr, d: pl.Expr) -> pl.Expr:
    """``n / d`` rounded HALF_UP (ties away from zero) for Int128 ``n`` and positive ``d``, as one floor division
    ``(2|n| + d) // 2d``; callers keep ``2|n| + d`` below 2^127."""
    return (n.abs() * 2 + d) // (d * 2) * sign_of(n)


def div_pow10_half_up(n: pl.Expr, k: int) -> pl.Expr:
    """``n / 10^k`` rounded HALF_UP for any Int128 ``n`` below 10^38 (no intermediate exceeds it)."""
    if k > 38:
        return pl.lit(0, dtype=I128)
    a = n.abs()
    if k == 38:
        return (a >= pl.lit(5 * 10**37, dtype=I128)).cast(I128) * sign_of(n)
    # (a + den/2) // den without overflow: a < 10^38 and den/2 <= 5 * 10^36
    return (a + pl.lit(10**k // 2, dtype=I128)) // pow10(k) * sign_of(n) if k else n


def _spark_decimal(op: str, a: decimal.Decimal, b: decimal.Decimal, t: pa.DataType) -> decimal.Decimal | None:
    """Spark's decimal ``a op b`` of result type ``t``, exactly (the reference the fast path must equal)."""
    if op in ("/", "%") and b == 0:
        return None
    if op == "+":
        v = _CONTEXT.add(a, b)
    elif op == "-":
        v = _CONTEXT.subtract(a, b)
    elif op == "*":
        v = _CONTEXT.multiply(a, b)
    elif op == "/":
        v = _CONTEXT.divide(a, b)
    else:
        v = _CONTEXT.remainder(a, b)  # sign of the dividend, as Java's BigDecimal.remainder
    q = v.quantize(decimal.Decimal(1).scaleb(-t.scale), context=_CONTEXT)
    return None if abs(q) >= decimal.Decimal(10) ** (t.precision - t.scale) else q


def exact_fallback(fast: pl.Expr, slow_rows: pl.Expr, args: Sequence[pl.Expr],
                   fn: Callable[..., Any], dtype: pl.DataType) -> pl.Expr:
    """``fast``, except on the rows flagged by ``slow_rows``, which get ``fn(*row)`` computed in Python.

    The flag marks rows a vectorized kernel cannot compute exactly (operands too large for Int128); they are rare,
    so the Python work is proportional to them, not to the batch.
    """

    def apply(series: Sequence[pl.Series]) -> pl.Series:
        out, flags, *xs = series
        flags = flags.fill_null(False)
        if not flags.any():
            return out
        idx = flags.arg_true()
        rows = zip(*(x.gather(idx).to_list() for x in xs))
        values = [None if any(v is None for v in row) else fn(*row) for row in rows]
        out = out.clone()
        out.scatter(idx, pl.Series(values, dtype=dtype))
        return out

    return pl.map_batches([fast, slow_rows, *args], apply, return_dtype=dtype, is_elementwise=True)


def decimal_arithmetic(op: str, x: pl.Expr, y: pl.Expr, ta: pa.DataType, tb: pa.DataType,
                       tr: pa.DataType) -> pl.Expr:
    """Spark's ``x op y`` for decimals ``x: ta``, ``y: tb`` with result type ``tr`` (from
    ``imp_core.plan.expr.decimal_result``): the exact value rounded HALF_UP to ``tr``'s scale, NULL when it does
    not fit ``tr``'s precision or for a zero divisor."""
    X, Y = unscaled(x), unscaled(y)
    sa, sb, sr = ta.scale, tb.scale, tr.scale
    if op in ("+", "-", "%"):
        sm = max(sa, sb)
        ok = (X.abs() < pow10(37 - (sm - sa))) & (Y.abs() < pow10(37 - (sm - sb)))
        Xs, Ys = X * pow10(sm - sa), Y * pow10(sm - sb)
        if op == "%":
            ok = ok & (Y != 0)
            r = Xs.abs() % pl.when(Ys == 0).then(pl.lit(1, dtype=I128)).otherwise(Ys.abs()) * sign_of(Xs)
            exact = pl.when(Y == 0).then(None).otherwise(r)
        else:
            exact = Xs + Ys if op == "+" else Xs - Ys
        rounded = exact if sr >= sm else div_pow10_half_up(exact, sm - sr)
    elif op == "*":
        sp = sa + sb
        ok = (x.cast(pl.Float64).abs() * y.cast(pl.Float64).abs()) < 10.0 ** (37 - sp)
        exact = X * Y
        drop = sp - sr
        rounded = exact if drop <= 0 else div_pow10_half_up(exact, drop)
    elif op == "/":
        k = sr + sb - sa
        up, down = max(k, 0), max(-k, 0)
        # |num| and |den| below 5 * 10^37, so the one-division HALF_UP stays inside Int128
        ok = ((X.abs() < pl.lit(5 * 10 ** (37 - up), dtype=I128))
              & (Y.abs() < pl.lit(5 * 10 ** (37 - down), dtype=I128)) if up <= 37 and down <= 37 else pl.lit(False))
        num = X * pow10(min(up, 38))
        den = Y * pow10(min(down, 38))
        safe_den = pl.when(den == 0).then(pl.lit(1, dtype=I128)).otherwise(den.abs())
        rounded = pl.when(Y == 0).then(None).otherwise(div_half_up(num, safe_den) * sign_of(den))
    else:
        raise ValueError(f"unknown decimal operator {op}")
    # rows the fast path cannot compute get 0 here and their exact value below; NULL operands stay NULL
    fast = from_unscaled(pl.when(ok.not_()).then(pl.lit(0, dtype=I128)).otherwise(rounded), tr)
    slow = ~ok & x.is_not_null() & y.is_not_null()
    return exact_fallback(fast, slow, [x, y], lambda a, b: _spark_decimal(op, a, b, tr),
                          pl.Decimal(tr.precision, tr.scale))


def rescale_decimal(x: pl.Expr, ta: pa.DataType, tb: pa.DataType) -> pl.Expr:
    """``CAST(x AS DECIMAL(p, s))`` from another decimal: HALF_UP to the new scale, NULL on overflow."""
    X = unscaled(x)
    if tb.scale >= ta.scale:
        up = tb.scale - ta.scale
        if up >= 38:
            return pl.when(X == 0).then(pl.lit(0, dtype=I128)).otherwise(None).pipe(from_unscaled, tb)
        big = X.abs() >= pow10(38 - up)  # 38 digits or more after scaling: beyond any precision
        return from_unscaled(pl.when(big).then(None).otherwise(X * pow10(up)), tb)
    down = ta.scale - tb.scale
    return from_unscaled(div_pow10_half_up(X, down), tb)


def integral_to_decimal(x: pl.Expr, t: pa.DataType) -> pl.Expr:
    X = x.cast(I128)
    return from_unscaled(pl.when(X.abs() >= pow10(38 - t.scale)).then(None).otherwise(X * pow10(t.scale)), t)


def wrap_integral(x: pl.Expr, bits: int) -> pl.Expr:
    """The low ``bits`` bits of an integer as a signed integer (Java's narrowing conversion)."""
    dtypes = {8: pl.Int8, 16: pl.Int16, 32: pl.Int32, 64: pl.Int64}
    low = x.cast(I128) & pl.lit(2**bits - 1, dtype=I128)
    signed = pl.when(low >= pl.lit(2 ** (bits - 1), dtype=I128)).then(low - pl.lit(2**bits, dtype=I128))
    return signed.otherwise(low).cast(dtypes[bits])


def decimal_to_integral(x: pl.Expr, ta: pa.DataType, bits: int) -> pl.Expr:
    """Spark: truncate toward zero, keep the low bits (BigDecimal.longValue)."""
    X = unscaled(x)
    a = X.abs() // pow10(ta.scale)
    return wrap_integral(pl.when(X < 0).then(neg(a)).otherwise(a), bits)


def float_to_integral(x: pl.Expr, bits: int) -> pl.Expr:
    """Spark: NaN is 0; BIGINT and INT saturate at their range (Java's d.toLong / d.toInt); SMALLINT and TINYINT
    take the low bits of the saturated INT."""
    f = x.cast(pl.Float64)
    width = 64 if bits == 64 else 32
    lo, hi = -(2 ** (width - 1)), 2 ** (width - 1) - 1
    sat = (pl.when(f.is_nan()).then(0).when(f >= float(2 ** (width - 1))).then(hi)
           .when(f <= float(lo)).then(lo).otherwise(f.cast(pl.Int64, strict=False)))
    return sat.cast(pl.Int64) if bits == 64 else wrap_integral(sat, bits)


def decimal_to_float(x: pl.Expr, ta: pa.DataType, dtype: pl.DataType) -> pl.Expr:
    """Spark: a compact decimal (precision <= 18) as long / 10^scale; a larger one through BigDecimal, i.e. the
    correctly rounded value of its text."""
    if ta.precision <= 18:
        return x.cast(pl.Float64).cast(dtype)
    return x.cast(pl.String).cast(pl.Float64).cast(dtype)


def decimal_avg(total: pl.Expr, n: pl.Expr, arg_type: pa.DataType, out_type: pa.DataType) -> pl.Expr:
    """Spark's AVG of a DECIMAL(p, s): the exact sum over the count, rounded HALF_UP (ties away from zero) to the
    result scale, NULL when the result needs more than the result precision (non-ANSI overflow).

    Vectorized on the unscaled 128-bit integers: ``|S| = q·n + r``; the result's unscaled magnitude is
    ``q·10^d + round(r·10^d / n)`` with ``d`` the added scale (``r·10^d`` stays far inside 128 bits), written out as
    a decimal string so that no step rounds.
    """
    d = out_type.scale - arg_type.scale
    scale = out_type.scale
    i128 = pl.Int128
    shift = pl.lit(10 ** d, dtype=i128)
    limit = pl.lit(10 ** out_type.precision, dtype=i128)
    s = total.to_physical()
    count = n.cast(i128).clip(lower_bound=1)
    mag = s.abs()
    q, r = mag // count, mag % count
    scaled = r * shift
    frac = scaled // count
    up = ((scaled % count) * pl.lit(2, dtype=i128) >= count).cast(i128)
    fits = q <= pl.lit((10 ** out_type.precision - 1) // 10 ** d, dtype=i128)
    unscaled = pl.when(fits).then(q * shift + frac + up).otherwise(None)
    unscaled = pl.when(unscaled < limit).then(unscaled).otherwise(None)
    digits = unscaled.cast(pl.String).str.zfill(scale + 1)
    text = pl.concat_str([pl.when(s < 0).then(pl.lit("-")).otherwise(pl.lit("")), digits.str.head(-scale), pl.lit("."),
                          digits.str.tail(scale)])
    return text.cast(pl.Decimal(38, scale), strict=False)


# -- doubles through their shortest decimal text -------------------------------------------------------------------

_SHORTEST = r"^([0-9]+)(?:\.([0-9]+))?(?:e([+-]?[0-9]+))?$"


def _shortest(x: pl.Expr) -> tuple[pl.Expr, pl.Expr, pl.Expr]:
    """``(digits M, exponent E)`` with ``|x| = M * 10^E`` read from the shortest text that reads back as ``x``
    (what Java's Double.toString gives, and what Spark's BigDecimal(double) starts from), plus the sign."""
    text = x.abs().cast(pl.String)
    whole = text.str.extract(_SHORTEST, 1)
    frac = text.str.extract(_SHORTEST, 2).fill_null("")
    exp = text.str.extract(_SHORTEST, 3).fill_null("0").cast(pl.Int32)
    m = (whole + frac).str.strip_chars_start("0")
    m = pl.when(m == "").then(pl.lit("0")).otherwise(m).cast(pl.Int64)
    e = exp - frac.str.len_chars().cast(pl.Int32)
    return m, e, x < 0


def _half_up_digits(m: pl.Expr, k: pl.Expr) -> pl.Expr:
    """``round_half_up(m / 10^k)`` for ``m < 10^18`` and ``k >= 1`` (0 once ``k >= 19``)."""
    kk = k.clip(1, 18).cast(pl.UInt32)
    p = pl.lit(10, dtype=pl.Int64).pow(kk)
    q = (m + p // 2) // p
    return pl.when(k >= 19).then(0).otherwise(q)


def round_float(x: pl.Expr, digits: int, dtype: pl.DataType) -> pl.Expr:
    """Spark's ROUND(x, d) on a FLOAT/DOUBLE: HALF_UP on the shortest decimal text of the (double) value, so
    ROUND(1.005, 2) = 1.01 and ROUND(2.5) = 3; NaN and infinities stay; a zero result is +0.0."""
    f = x.cast(pl.Float64)
    m, e, neg = _shortest(f)
    k = -digits - e
    r = _half_up_digits(m, k)
    text = pl.concat_str([pl.when(neg).then(pl.lit("-")).otherwise(pl.lit("")), r.cast(pl.String),
                          pl.lit(f"e{-digits}")])
    rounded = pl.when(r == 0).then(pl.lit(0.0)).otherwise(text.cast(pl.Float64))
    if dtype == pl.Float32:
        rounded = pl.when(r == 0).then(pl.lit(0.0)).otherwise(text.cast(pl.Float32)).cast(pl.Float32)
    out = (pl.when(~f.is_finite()).then(f.cast(dtype)).when(f == 0).then(pl.lit(0.0, dtype=dtype))
           .when(k <= 0).then(f.cast(dtype)).otherwise(rounded.cast(dtype)))
    return out


def float_to_decimal(x: pl.Expr, t: pa.DataType) -> pl.Expr:
    """Spark's CAST(double AS DECIMAL(p, s)): the shortest decimal text of the double, HALF_UP to ``s``; NaN and
    infinities are NULL, so is a value that does not fit."""
    f = x.cast(pl.Float64)
    m, e, neg = _shortest(f)
    k = -t.scale - e
    r = _half_up_digits(m, k)
    sign = pl.when(neg).then(pl.lit("-")).otherwise(pl.lit(""))
    exact = pl.concat_str([sign, m.cast(pl.String), pl.lit("e"), e.cast(pl.String)])
    rounded = pl.concat_str([sign, r.cast(pl.String), pl.lit(f"e-{t.scale}")])
    text = pl.when(k <= 0).then(exact).otherwise(rounded)
    value = text.cast(pl.Decimal(t.precision, t.scale), strict=False)
    return pl.when(f.is_finite()).then(value).otherwise(None)


# -- strings -------------------------------------------------------------------------------------------------------


def string_to_integral(x: pl.Expr, bits: int) -> pl.Expr:
    """Spark's CAST(string AS integer): trimmed, sign and digits, fraction dropped, NULL when out of range."""
    s = x.str.strip_chars(V.TRIM_ALL)
    whole = s.str.extract(r"^([+-]?[0-9]*)", 1)
    digits = pl.when(whole.str.contains(r"[0-9]")).then(whole).otherwise(pl.lit("0"))
    value = digits.cast(pl.Int64, strict=False)
    dtypes = {8: pl.Int8, 16: pl.Int16, 32: pl.Int32, 64: pl.Int64}
    return pl.when(s.str.contains(V.INTEGRAL_TEXT)).then(value).otherwise(None).cast(dtypes[bits], strict=False)


def string_to_float(x: pl.Expr, dtype: pl.DataType) -> pl.Expr:
    """Spark's CAST(string AS DOUBLE/FLOAT): Java's number text (with an optional f/d suffix), its NaN/Infinity
    words and Spark's inf/nan words; hexadecimal text is read in Python (exact, as Java)."""
    s = x.str.strip_chars(V.TRIM_JAVA)
    number = s.str.replace(r"[fFdD]$", "")
    words = {**V.FLOAT_JAVA_WORDS}
    lowered = s.str.to_lowercase()
    out: Any = pl.when(s.str.contains(V.FLOAT_TEXT)).then(number.cast(dtype, strict=False))
    for word, value in words.items():
        out = out.when(s == word).then(pl.lit(float(value), dtype=dtype))
    for word, value in V.FLOAT_WORDS.items():
        out = out.when(lowered == word).then(pl.lit(float(value), dtype=dtype))
    fast = out.otherwise(None)
    hexa = s.str.contains(V.HEX_FLOAT_TEXT).fill_null(False)

    def from_hex(text: str) -> float:
        value = float.fromhex(text.rstrip("fFdD"))
        return float(pl.Series([value], dtype=pl.Float64).cast(dtype)[0])

    return exact_fallback(fast, hexa, [s], from_hex, dtype)


def string_to_decimal(x: pl.Expr, t: pa.DataType) -> pl.Expr:
    """Spark's CAST(string AS DECIMAL(p, s)): java.math.BigDecimal text, HALF_UP to ``s``, NULL on overflow.

    The plain form is rounded on its digits (cut after ``s`` fraction digits, plus one unit when the next digit is
    5 or more); text with an exponent is read in Python."""
    s = x.str.strip_chars(V.TRIM_JAVA)
    valid = s.str.contains(V.DECIMAL_TEXT).fill_null(False)
    plain = s.str.contains(r"^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)$").fill_null(False)
    sign = s.str.extract(r"^([+-]?)", 1)
    whole = s.str.extract(r"^[+-]?([0-9]*)", 1).str.strip_chars_start("0")
    frac = s.str.extract(r"\.([0-9]*)$", 1).fill_null("")
    kept = frac.str.pad_end(t.scale, "0").str.slice(0, t.scale)
    next_digit = frac.str.slice(t.scale, 1)
    digits = (whole + kept).str.strip_chars_start("0")
    digits = pl.when((digits == "") | (digits.str.len_chars() > 38)).then(
        pl.when(digits == "").then(pl.lit("0")).otherwise(pl.lit("1" + "0" * 38))).otherwise(digits)
    n = digits.cast(I128, strict=False)
    n = n + (next_digit >= "5").fill_null(False).cast(I128)
    n = pl.when(sign == "-").then(neg(n)).otherwise(n)
    fast = from_unscaled(pl.when(plain).then(n).otherwise(None), t)

    def from_text(text: str) -> decimal.Decimal | None:
        value = decimal.Decimal(text)
        if value and value.adjusted() >= t.precision - t.scale:
            return None
        q = value.quantize(decimal.Decimal(1).scaleb(-t.scale), context=_CONTEXT)
        return None if abs(q) >= decimal.Decimal(10) ** (t.precision - t.scale) else q

    return exact_fallback(fast, valid & ~plain, [s], from_text, pl.Decimal(t.precision, t.scale))


def string_to_bool(x: pl.Expr) -> pl.Expr:
    s = x.str.strip_chars(V.TRIM_ALL).str.to_lowercase()
    return (pl.when(s.is_in(list(V.BOOL_TRUE))).then(pl.lit(True))
            .when(s.is_in(list(V.BOOL_FALSE))).then(pl.lit(False)).otherwise(None))


def days_from_civil(y: pl.Expr, m: pl.Expr, d: pl.Expr) -> pl.Expr:
    """Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm, integer arithmetic)."""
    y = y.cast(pl.Int64) - (m <= 2).cast(pl.Int64)
    era = pl.when(y >= 0).then(y).otherwise(y - 399) // 400
    yoe = y - era * 400
    mp = (m.cast(pl.Int64) + 9) % 12
    doy = (153 * mp + 2) // 5 + d.cast(pl.Int64) - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def string_to_date(x: pl.Expr) -> pl.Expr:
    """Spark's CAST(string AS DATE) (the forms in ``imp_core.plan.values.DATE_TEXT``); NULL for anything else or
    a day that does not exist."""
    s = x.str.strip_chars(V.TRIM_ALL)
    sign = s.str.extract(V.DATE_TEXT, 1)
    year = s.str.extract(V.DATE_TEXT, 2).cast(pl.Int64)
    year = pl.when(sign == "-").then(-year).otherwise(year)
    month = s.str.extract(V.DATE_TEXT, 3).fill_null("1").cast(pl.Int64)
    day = s.str.extract(V.DATE_TEXT, 4).fill_null("1").cast(pl.Int64)
    leap = ((year % 4 == 0) & (year % 100 != 0)) | (year % 400 == 0)
    month_days = (pl.when(month == 2).then(pl.when(leap).then(29).otherwise(28))
                  .when(month.is_in([4, 6, 9, 11])).then(30).otherwise(31))
    valid = s.str.contains(V.DATE_TEXT) & (month >= 1) & (month <= 12) & (day >= 1) & (day <= month_days)
    days = days_from_civil(year, month.clip(1, 12), day.clip(1, 31))
    return pl.when(valid).then(days).otherwise(None).cast(pl.Int32).cast(pl.Date)


def timestamp_to_string(x: pl.Expr) -> pl.Expr:
    """Spark's text of a timestamp: 'yyyy-MM-dd HH:mm:ss' plus the fraction without trailing zeros."""
    micros = x.dt.microsecond()
    fraction = pl.concat_str([pl.lit("."), micros.cast(pl.String).str.zfill(6).str.strip_chars_end("0")])
    return pl.concat_str([x.dt.strftime("%Y-%m-%d %H:%M:%S"),
                          pl.when(micros == 0).then(pl.lit("")).otherwise(fraction)])


def shortest_text_digits(values: Sequence[float]) -> list[tuple[int, int]]:
    """(M, E) of each value as ``_shortest`` computes them, for tests."""
    df = pl.DataFrame({"x": pl.Series(values, dtype=pl.Float64)})
    m, e, _ = _shortest(pl.col("x"))
    out = df.select(m.alias("m"), e.alias("e"))
    return list(zip(out["m"].to_list(), out["e"].to_list()))


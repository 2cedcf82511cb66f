"""Compile IR expressions to polars expressions that compute exactly what Spark computes (non-ANSI).

``PolarsCompiler`` is a visitor over the expression IR (one ``visit_<Node>`` per node class, one ``func_<name>`` per
function, one ``extract_<field>`` per EXTRACT field; an import-time check refuses a compiler with a gap); where
polars differs from Spark, ``imp_core.engine.kernels`` has the vectorized kernel, and what the engine cannot
reproduce is refused (``imp_core.engine.support``). See docs/ARCHITECTURE.md, "The plan IR", and docs/SEMANTICS.md.
"""

from __future__ import annotations

import decimal
import functools
import operator
import re
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np
import polars as pl
import pyarrow as pa

from imp_core.engine import kernels as K
from imp_core.engine.support import UNSUPPORTED_FUNCTIONS, engine_cast_reason, engine_unsupported
from imp_core.errors import UnsupportedError
from imp_core.plan import expr as ex
from imp_core.plan import values as V
from imp_core.plan.expr import (
    BOOL,
    NULL,
    Binary,
    Col,
    Expr,
    Func,
    Interval,
    Lit,
    arithmetic_types,
    comparison_type,
    is_string,
    require_visitors,
)


def polars_type(t: pa.DataType) -> pl.DataType:
    """The polars dtype the engine stores values of an Arrow type in: every integer as Int64, every float as
    Float64, decimals at precision 38. Storage is wide and exact (a FLOAT or INT value is held without change);
    expressions compute in the exact width (``value_type``) and store their result back in this type."""
    if pa.types.is_integer(t):
        return pl.Int64()
    if pa.types.is_floating(t):
        return pl.Float64()
    if pa.types.is_decimal(t):
        return pl.Decimal(38, t.scale)
    return value_type(t)


# Arrow types whose polars value type takes no parameter, tried in order (float32 before the other floats)
_PLAIN_VALUE_TYPES: tuple[tuple[Callable[[pa.DataType], bool], pl.DataType], ...] = (
    (lambda t: pa.types.is_float32(t) or pa.types.is_float16(t), pl.Float32()),
    (pa.types.is_floating, pl.Float64()),
    (is_string, pl.String()),
    (pa.types.is_boolean, pl.Boolean()),
    (pa.types.is_date, pl.Date()),
    (lambda t: t == NULL, pl.Null()),
    (pa.types.is_binary, pl.Binary()),
)


def value_type(t: pa.DataType) -> pl.DataType:
    """The polars dtype an expression computes values of an Arrow type in: Spark's width (INT + INT wraps at 32
    bits, FLOAT * FLOAT rounds to 32 bits, a DECIMAL(p, s) overflows past p digits)."""
    if pa.types.is_integer(t):
        if pa.types.is_signed_integer(t):
            return {8: pl.Int8(), 16: pl.Int16(), 32: pl.Int32()}.get(t.bit_width, pl.Int64())
        return pl.Int64()
    if pa.types.is_decimal(t):
        return pl.Decimal(t.precision, t.scale)
    if pa.types.is_timestamp(t):
        return pl.Datetime("us", t.tz) if t.tz else pl.Datetime("us")
    for matches, dtype in _PLAIN_VALUE_TYPES:
        if matches(t):
            return dtype
    raise UnsupportedError(f"columns of type {t} are not supported by the incremental engine")


def _fmod(series: Sequence[pl.Series]) -> pl.Series:
    """C's fmod, vectorized: exact, the sign of the dividend (inf % y and x % 0 are NaN; callers mask x % 0)."""
    with np.errstate(invalid="ignore"):
        return pl.Series(np.fmod(series[0].to_numpy(), series[1].to_numpy()), dtype=pl.Float64)


# functions whose value is not NULL just because an argument is the NULL constant
_NULL_TOLERANT = ("coalesce", "greatest", "least", "nullif")

class PolarsCompiler:
    """IR expression -> polars expression, with Spark's value rules."""

    # Functions the engine refuses in sketched queries, with the reason (the import check accepts these in place
    # of a func_<name>).
    UNSUPPORTED_FUNCTIONS: ClassVar[dict[str, str]] = UNSUPPORTED_FUNCTIONS

    # Expression classes that are never compiled on their own, with the reason (their visitors raise it).
    UNSUPPORTED_EXPRESSIONS: ClassVar[dict[type[Expr], str]] = {
        Interval: "an INTERVAL is only valid added to or subtracted from a date or timestamp",
        ex.AggCall: "an aggregate is evaluated by the aggregation operator, not as a scalar expression",
    }

    def compile(self, e: Expr) -> pl.Expr:
        visit: Callable[[Expr], pl.Expr] = getattr(self, f"visit_{type(e).__name__}")
        return visit(e)

    def to(self, e: Expr, t: pa.DataType) -> pl.Expr:
        """``e`` converted to ``t`` with Spark's CAST rules."""
        return self.cast(self.compile(e), e.dtype, t)

    # -- leaves -----------------------------------------------------------------------------------------------------

    def visit_Col(self, e: Col) -> pl.Expr:
        stored, exact = polars_type(e.dtype), value_type(e.dtype)
        return pl.col(e.name) if stored == exact else pl.col(e.name).cast(exact)  # exact: storage is wider

    def visit_Lit(self, e: Lit) -> pl.Expr:
        if e.value is None:
            return pl.lit(None) if e.dtype == NULL else pl.lit(None, dtype=value_type(e.dtype))
        value = decimal.Decimal(e.value) if pa.types.is_decimal(e.dtype) else e.value
        return pl.lit(value, dtype=value_type(e.dtype))

    def visit_Interval(self, e: Interval) -> pl.Expr:
        raise UnsupportedError(f"{e}: {self.UNSUPPORTED_EXPRESSIONS[Interval]}")

    def visit_AggCall(self, e: ex.AggCall) -> pl.Expr:
        raise UnsupportedError(f"{e}: {self.UNSUPPORTED_EXPRESSIONS[ex.AggCall]}")

    # -- logic and comparison ---------------------------------------------------------------------------------------

    def visit_Unary(self, e: ex.Unary) -> pl.Expr:
        if e.op == "not":
            return ~self.to(e.arg, BOOL)
        return -self.to(e.arg, e.dtype)  # integers wrap (-MIN = MIN), as Java does

    def compare(self, op: str, a: Expr, b: Expr, t: pa.DataType | None = None) -> pl.Expr:
        """``a op b`` in the type Spark compares them in. polars orders floats as Spark does: NaN = NaN, NaN above
        every other value, -0.0 = 0.0."""
        t = comparison_type(a, b) if t is None else t
        x, y = self.to(a, t), self.to(b, t)
        return {"=": x == y, "<>": x != y, "<": x < y, "<=": x <= y, ">": x > y, ">=": x >= y}[op]

    def visit_Binary(self, e: Binary) -> pl.Expr:
        op = e.op
        if op == "and":
            return self.to(e.left, BOOL) & self.to(e.right, BOOL)
        if op == "or":
            return self.to(e.left, BOOL) | self.to(e.right, BOOL)
        if op in ("=", "<>", "<", "<=", ">", ">="):
            return self.compare(op, e.left, e.right)
        if isinstance(e.left, Interval) or isinstance(e.right, Interval):
            return self._interval_arithmetic(e)
        lt, rt = e.left.dtype, e.right.dtype
        if pa.types.is_date(lt) or pa.types.is_date(rt) or pa.types.is_timestamp(lt) or pa.types.is_timestamp(rt):
            return self._date_arithmetic(e)
        ta, tb, tr = arithmetic_types(op, e.left, e.right)
        x, y = self.to(e.left, ta), self.to(e.right, tb)
        if pa.types.is_decimal(tr):
            return K.decimal_arithmetic(op, x, y, ta, tb, tr)
        if op == "/":
            return pl.when(y == 0).then(None).otherwise(x / y)  # Spark: NULL for a zero divisor, even for doubles
        if op == "%":
            return self._remainder(x, y, tr)
        return {"+": x + y, "-": x - y, "*": x * y}[op]  # integers wrap, FLOAT stays 32-bit

    @staticmethod
    def _remainder(x: pl.Expr, y: pl.Expr, t: pa.DataType) -> pl.Expr:
        """Java's ``%``: sign of the dividend, NULL for a zero divisor; for floats fmod, which is exact."""
        if pa.types.is_integer(t):
            r = x % y  # polars' remainder is floored; shift it to truncated
            r = pl.when((r != 0) & ((r < 0) != (x < 0))).then(r - y).otherwise(r)
            minus_one = (y == -1) & x.is_not_null()
            return pl.when(y == 0).then(None).when(minus_one).then(pl.lit(0, dtype=value_type(t))).otherwise(r)
        xf, yf = x.cast(pl.Float64), y.cast(pl.Float64)
        divisor = pl.when(yf == 0).then(None).otherwise(yf)
        exact = pl.map_batches([xf.fill_null(0.0), divisor.fill_null(1.0)], _fmod, return_dtype=pl.Float64,
                               is_elementwise=True)
        return pl.when(xf.is_null() | divisor.is_null()).then(None).otherwise(exact).cast(value_type(t))

    def _date_arithmetic(self, e: Binary) -> pl.Expr:
        """``date +/- days`` and ``date - date`` on the day numbers (INT arithmetic, as Spark's date_add)."""
        lt, rt = e.left.dtype, e.right.dtype
        if pa.types.is_date(lt) and pa.types.is_date(rt):
            return self.compile(e.left).cast(pl.Int32) - self.compile(e.right).cast(pl.Int32)
        date, days = (e.left, e.right) if pa.types.is_date(lt) else (e.right, e.left)
        return self._add_days(self.compile(date), self.to(days, pa.int32()), negate=e.op == "-")

    @staticmethod
    def _add_days(date: pl.Expr, days: pl.Expr, negate: bool = False) -> pl.Expr:
        n = date.cast(pl.Int32)
        return (n - days if negate else n + days).cast(pl.Int32).cast(pl.Date)

    def _interval_arithmetic(self, e: Binary) -> pl.Expr:
        base, iv = (e.left, e.right) if isinstance(e.right, Interval) else (e.right, e.left)
        assert isinstance(iv, Interval)
        n = iv.value if e.op == "+" else -iv.value
        if base.dtype == NULL:
            return pl.lit(None, dtype=value_type(e.dtype))
        x = self.compile(base)
        if pa.types.is_date(base.dtype) and iv.unit in ("day", "week"):
            return self._add_days(x, pl.lit(n * (7 if iv.unit == "week" else 1), dtype=pl.Int32))
        if pa.types.is_date(base.dtype) and not iv.is_calendar:
            x = x.cast(pl.Datetime("us"))  # date + INTERVAL '1' HOUR is a timestamp
        unit = {"day": "d", "week": "w", "month": "mo", "year": "y", "hour": "h", "minute": "m", "second": "s"}
        # months and years land on the same day of the month, clamped to its last day (Spark's add_months)
        return x.dt.offset_by(f"{n}{unit[iv.unit]}")

    def visit_IsNull(self, e: ex.IsNull) -> pl.Expr:
        x = self.compile(e.arg)
        return x.is_not_null() if e.negated else x.is_null()

    def visit_InList(self, e: ex.InList) -> pl.Expr:
        # an OR of equalities in the list's common type gives SQL's NULL semantics (2 NOT IN (1, NULL) is NULL)
        out = functools.reduce(operator.or_, (self.compare("=", e.arg, item, e.compare_type) for item in e.items))
        return ~out if e.negated else out

    def visit_Between(self, e: ex.Between) -> pl.Expr:
        out = self.compare(">=", e.arg, e.low) & self.compare("<=", e.arg, e.high)
        return ~out if e.negated else out

    def visit_Like(self, e: ex.Like) -> pl.Expr:
        x = self.to(e.arg, pa.string())
        if e.case_insensitive:
            # Spark's ILIKE is lower(x) LIKE lower(pattern): full lower-casing (final sigma, dotted I), not folding
            x = x.str.to_lowercase()
            out = x.str.contains(like_to_regex(e.pattern.lower()))
        else:
            out = x.str.contains(like_to_regex(e.pattern))
        return ~out if e.negated else out

    def visit_Case(self, e: ex.Case) -> pl.Expr:
        t = e.dtype
        chain: Any = None
        for cond, value in e.whens:
            c = self.to(cond, BOOL).fill_null(False)
            v = self.to(value, t)
            chain = pl.when(c).then(v) if chain is None else chain.when(c).then(v)
        default = self.to(e.default, t) if e.default is not None else pl.lit(None, dtype=value_type(t))
        return chain.otherwise(default) if chain is not None else default

    # -- casts --------------------------------------------------------------------------------------------------------

    def visit_Cast(self, e: ex.Cast) -> pl.Expr:
        return self.to(e.arg, e.to)

    def cast(self, x: pl.Expr, src: pa.DataType, dst: pa.DataType) -> pl.Expr:
        """``CAST(x AS dst)`` for ``x`` of type ``src``, as Spark (non-ANSI) computes it."""
        if src == dst:
            return x
        out = value_type(dst)
        if src == NULL:
            return pl.lit(None, dtype=out)
        if is_string(dst):
            return self._to_string(x, src)
        if pa.types.is_boolean(dst):
            return K.string_to_bool(x) if is_string(src) else x != 0  # NaN is TRUE
        if pa.types.is_integer(dst):
            return self._to_integral(x, src, dst)
        if pa.types.is_floating(dst):
            return self._to_float(x, src, out)
        if pa.types.is_decimal(dst):
            return self._to_decimal(x, src, dst)
        if pa.types.is_date(dst):
            return K.string_to_date(x) if is_string(src) else self._utc(x, src).dt.date()
        if pa.types.is_timestamp(dst):
            return self._to_timestamp(x, src, dst)
        raise UnsupportedError(f"CAST of {src} to {dst} is not supported by the incremental engine")

    @staticmethod
    def _to_integral(x: pl.Expr, src: pa.DataType, dst: pa.DataType) -> pl.Expr:
        bits = dst.bit_width
        if pa.types.is_boolean(src):
            return x.cast(value_type(dst))
        if pa.types.is_integer(src):
            return x.cast(value_type(dst)) if src.bit_width <= bits else K.wrap_integral(x, bits)
        if pa.types.is_floating(src):
            return K.float_to_integral(x, bits)
        if pa.types.is_decimal(src):
            return K.decimal_to_integral(x, src, bits)
        return K.string_to_integral(x, bits)

    @staticmethod
    def _to_float(x: pl.Expr, src: pa.DataType, out: pl.DataType) -> pl.Expr:
        if pa.types.is_decimal(src):
            return K.decimal_to_float(x, src, out)
        return K.string_to_float(x, out) if is_string(src) else x.cast(out)

    @staticmethod
    def _to_decimal(x: pl.Expr, src: pa.DataType, dst: pa.DataType) -> pl.Expr:
        if pa.types.is_decimal(src):
            return K.rescale_decimal(x, src, dst)
        if pa.types.is_integer(src) or pa.types.is_boolean(src):
            return K.integral_to_decimal(x.cast(pl.Int64), dst)
        if pa.types.is_floating(src):
            return K.float_to_decimal(x, dst)
        return K.string_to_decimal(x, dst)

    def _to_timestamp(self, x: pl.Expr, src: pa.DataType, dst: pa.DataType) -> pl.Expr:
        if pa.types.is_date(src):
            x = x.cast(pl.Datetime("us"))
        elif pa.types.is_timestamp(src):
            x = self._utc(x, src)
        else:
            raise UnsupportedError(f"CAST of {src} to {dst} is not supported by the incremental engine")
        return x.dt.replace_time_zone("UTC").dt.convert_time_zone(dst.tz) if dst.tz else x

    @staticmethod
    def _utc(x: pl.Expr, t: pa.DataType) -> pl.Expr:
        """A timestamp as wall-clock time in the session time zone (UTC)."""
        if pa.types.is_timestamp(t) and t.tz:
            return x.dt.convert_time_zone("UTC").dt.replace_time_zone(None)
        return x

    def _to_string(self, x: pl.Expr, src: pa.DataType) -> pl.Expr:
        if is_string(src):
            return x
        if pa.types.is_boolean(src):
            return pl.when(x).then(pl.lit("true")).when(~x).then(pl.lit("false")).otherwise(None)
        if pa.types.is_integer(src) or pa.types.is_date(src):
            return x.cast(pl.String)
        if pa.types.is_decimal(src) and src.scale <= 6:
            return x.cast(pl.String)  # plain notation; Java's BigDecimal.toString is plain up to scale 6
        if pa.types.is_timestamp(src):
            return K.timestamp_to_string(self._utc(x, src))
        raise UnsupportedError(engine_cast_reason(src, pa.string()) or f"CAST of {src} to STRING is not supported")

    # -- functions ----------------------------------------------------------------------------------------------------

    def visit_Func(self, e: Func) -> pl.Expr:
        if e.name in self.UNSUPPORTED_FUNCTIONS:
            raise UnsupportedError(f"{e.name.upper()} is not supported in sketched queries: "
                                   f"{self.UNSUPPORTED_FUNCTIONS[e.name]}")
        if e.name not in _NULL_TOLERANT and any(a.dtype == NULL for a in e.args):
            return pl.lit(None, dtype=value_type(e.dtype) if e.dtype != NULL else None)  # NULL in, NULL out
        return getattr(self, f"func_{e.name}")(e)

    def func_upper(self, e: Func) -> pl.Expr:
        return self.compile(e.args[0]).str.to_uppercase()

    def func_lower(self, e: Func) -> pl.Expr:
        return self.compile(e.args[0]).str.to_lowercase()

    def func_length(self, e: Func) -> pl.Expr:
        return self.compile(e.args[0]).str.len_chars().cast(pl.Int32)  # characters (code points), not bytes

    def func_trim(self, e: Func) -> pl.Expr:
        return self.compile(e.args[0]).str.strip_chars(V.TRIM_SPACE)  # Spark trims only ' '

    def func_ltrim(self, e: Func) -> pl.Expr:
        return self.compile(e.args[0]).str.strip_chars_start(V.TRIM_SPACE)

    def func_rtrim(self, e: Func) -> pl.Expr:
        return self.compile(e.args[0]).str.strip_chars_end(V.TRIM_SPACE)

    def func_substring(self, e: Func) -> pl.Expr:
        """Spark's substringSQL: 1-based, 0 counts as 1, a negative position counts from the end, the window
        [start, start + length) is clipped to the string (so SUBSTRING('hello', -10, 7) is 'he')."""
        s = self.compile(e.args[0])
        pos = self.to(e.args[1], pa.int32()).cast(pl.Int64)
        length = self.to(e.args[2], pa.int32()).cast(pl.Int64) if len(e.args) > 2 else pl.lit(2**31 - 1)
        n = s.str.len_chars().cast(pl.Int64)
        start = pl.when(pos > 0).then(pos - 1).when(pos < 0).then(n + pos).otherwise(0)
        end = start + length
        start = pl.max_horizontal(start, pl.lit(0))
        out = s.str.slice(start, pl.max_horizontal(end - start, pl.lit(0)))
        empty = pl.when(s.is_null()).then(None).otherwise(pl.lit(""))
        return pl.when(pos.is_null() | length.is_null()).then(None).when(start >= end).then(empty).otherwise(out)

    def func_concat(self, e: Func) -> pl.Expr:
        return pl.concat_str([self.to(a, pa.string()) for a in e.args], ignore_nulls=False)

    def func_replace(self, e: Func) -> pl.Expr:
        search, repl = e.args[1], e.args[2]
        assert isinstance(search, Lit) and isinstance(repl, Lit)
        x = self.compile(e.args[0])
        if search.value is None or repl.value is None:
            return pl.lit(None, dtype=pl.String)
        if search.value == "":
            return x  # Spark leaves the string as it is; polars would insert between every character
        return x.str.replace_all(str(search.value), str(repl.value), literal=True)

    def func_coalesce(self, e: Func) -> pl.Expr:
        return pl.coalesce([self.to(a, e.dtype) for a in e.args])

    def _extreme(self, e: Func, greater: bool) -> pl.Expr:
        """GREATEST/LEAST as Spark evaluates them: skip NULLs, replace the running value only on a strictly
        greater (smaller) one, so NaN wins GREATEST and the first of -0.0/0.0 is kept."""
        out = None
        for a in e.args:
            x = self.to(a, e.dtype)
            if out is None:
                out = x
                continue
            better = (x > out) if greater else (x < out)
            out = pl.when(x.is_not_null() & (out.is_null() | better)).then(x).otherwise(out)
        assert out is not None
        return out

    def func_greatest(self, e: Func) -> pl.Expr:
        return self._extreme(e, greater=True)

    def func_least(self, e: Func) -> pl.Expr:
        return self._extreme(e, greater=False)

    def func_nullif(self, e: Func) -> pl.Expr:
        equal = self.compare("=", e.args[0], e.args[1]).fill_null(False)
        return pl.when(equal).then(pl.lit(None, dtype=value_type(e.dtype))).otherwise(self.to(e.args[0], e.dtype))

    def func_abs(self, e: Func) -> pl.Expr:
        return self.to(e.args[0], e.dtype).abs()  # integers wrap: ABS(MIN) = MIN

    def func_sign(self, e: Func) -> pl.Expr:
        return self.to(e.args[0], e.dtype).sign()  # a DOUBLE; SIGN(-0.0) = -0.0, SIGN(NaN) = NaN

    def func_sqrt(self, e: Func) -> pl.Expr:
        return self.to(e.args[0], e.dtype).sqrt()  # IEEE, correctly rounded on both sides; SQRT(-1) is NaN

    def _floor_ceil(self, e: Func, ceil: bool) -> pl.Expr:
        a = e.args[0]
        t = a.dtype
        if t == NULL:
            return pl.lit(None, dtype=value_type(e.dtype))
        if pa.types.is_integer(t):
            return self.compile(a).cast(pl.Int64)
        if pa.types.is_decimal(t):
            if t.scale == 0:
                return self.compile(a).cast(value_type(e.dtype))
            x = K.unscaled(self.compile(a))
            p = K.pow10(t.scale)
            q = K.neg(K.neg(x) // p) if ceil else x // p  # Int128 // is floored
            return K.from_unscaled(q, e.dtype)
        x = self.compile(a).cast(pl.Float64)
        return K.float_to_integral(x.ceil() if ceil else x.floor(), 64)  # NaN -> 0, saturating

    def func_floor(self, e: Func) -> pl.Expr:
        return self._floor_ceil(e, ceil=False)

    def func_ceil(self, e: Func) -> pl.Expr:
        return self._floor_ceil(e, ceil=True)

    def func_round(self, e: Func) -> pl.Expr:
        a, d = e.args[0], e.round_digits
        t = a.dtype
        if t == NULL:
            return pl.lit(None, dtype=pl.Float64)
        x = self.compile(a)
        if pa.types.is_floating(t):
            return K.round_float(x, d, value_type(t))
        if pa.types.is_decimal(t):
            if d >= t.scale:
                return K.rescale_decimal(x, t, e.dtype)
            X = K.unscaled(x)
            drop = t.scale - d
            r = K.div_pow10_half_up(X, drop)
            if d < 0:
                r = pl.when(r.abs() >= K.pow10(38 + d)).then(None).otherwise(r * K.pow10(min(-d, 38)))
            return K.from_unscaled(r, e.dtype)
        if d >= 0:
            return x
        # an integer rounded HALF_UP at 10^-d, then wrapped to its width (Spark: BigDecimal -> longValue)
        X = x.cast(K.I128)
        r = K.div_pow10_half_up(X, -d) * K.pow10(-d) if -d <= 38 else pl.lit(0, dtype=K.I128)
        return K.wrap_integral(r, t.bit_width)

    def func_date_add(self, e: Func) -> pl.Expr:
        return self._add_days(self.compile(e.args[0]), self.to(e.args[1], pa.int32()))

    def func_date_sub(self, e: Func) -> pl.Expr:
        return self._add_days(self.compile(e.args[0]), self.to(e.args[1], pa.int32()), negate=True)

    def func_datediff(self, e: Func) -> pl.Expr:
        return self.compile(e.args[0]).cast(pl.Int32) - self.compile(e.args[1]).cast(pl.Int32)

    # -- EXTRACT ------------------------------------------------------------------------------------------------------

    def visit_Extract(self, e: ex.Extract) -> pl.Expr:
        if e.arg.dtype == NULL:
            return pl.lit(None, dtype=value_type(e.dtype))
        x = self.compile(e.arg)
        if pa.types.is_timestamp(e.arg.dtype):
            x = self._utc(x, e.arg.dtype)
        elif e.field_ in ("hour", "minute", "second", "second_with_fraction"):
            x = x.cast(pl.Datetime("us"))  # a date is midnight
        out = getattr(self, f"extract_{e.field_}")(x)
        return out if e.field_ == "second_with_fraction" else out.cast(pl.Int32)

    def extract_year(self, x: pl.Expr) -> pl.Expr:
        return x.dt.year()

    def extract_quarter(self, x: pl.Expr) -> pl.Expr:
        return x.dt.quarter()

    def extract_month(self, x: pl.Expr) -> pl.Expr:
        return x.dt.month()

    def extract_week(self, x: pl.Expr) -> pl.Expr:
        return x.dt.week()  # ISO 8601 week, as Spark's weekofyear

    def extract_day(self, x: pl.Expr) -> pl.Expr:
        return x.dt.day()

    def extract_dayofweek(self, x: pl.Expr) -> pl.Expr:
        return (x.dt.weekday() % 7) + 1  # Spark: 1 = Sunday ... 7 = Saturday

    def extract_dayofyear(self, x: pl.Expr) -> pl.Expr:
        return x.dt.ordinal_day()

    def extract_hour(self, x: pl.Expr) -> pl.Expr:
        return x.dt.hour()

    def extract_minute(self, x: pl.Expr) -> pl.Expr:
        return x.dt.minute()

    def extract_second(self, x: pl.Expr) -> pl.Expr:
        return x.dt.second()

    def extract_second_with_fraction(self, x: pl.Expr) -> pl.Expr:
        micros = x.dt.second().cast(K.I128) * 1_000_000 + x.dt.microsecond().cast(K.I128)
        return K.from_unscaled(micros, pa.decimal128(8, 6))


require_visitors(PolarsCompiler, "polars")
_COMPILER = PolarsCompiler()


def compile_expr(e: Expr) -> pl.Expr:
    """A polars expression computing ``e`` exactly as Spark does, with exactly the type ``e.dtype``.

    Raises:
        UnsupportedError: ``e`` uses something the engine refuses (see ``engine_unsupported``).
    """
    reason = engine_unsupported(e)
    if reason is not None:
        raise UnsupportedError(reason)
    if isinstance(e, Col):
        return pl.col(e.name)  # already in storage type
    out = _COMPILER.compile(e)
    return out if e.dtype == NULL else out.cast(polars_type(e.dtype))  # computed exactly, stored wide


def like_to_regex(pattern: str, case_insensitive: bool = False) -> str:
    """SQL LIKE pattern (``%``, ``_``, ``\\`` escaping ``%``, ``_`` or ``\\``) as an anchored regular expression;
    ``_`` and ``%`` match any character, newlines included (Spark uses DOTALL)."""
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

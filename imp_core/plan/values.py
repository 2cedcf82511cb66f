"""Spark's rules for reading strings as values (CAST from STRING): the one definition the front-end (constants,
with ``re``) and the engine (columns, with polars) share, so both accept exactly the texts Spark accepts.

Determined on Spark 4 (non-ANSI); docs/SEMANTICS.md, "Values and types".
"""

from __future__ import annotations

import calendar
import datetime as dt
import re

# Characters CAST trims before parsing. Integers, dates, timestamps and booleans: ASCII control characters, space
# and DEL (UTF8String.trimAll); floats and decimals: only characters up to U+0020 (Java's String.trim). Unicode
# spaces (U+00A0, U+2003, U+3000, ...) are never trimmed, so ' 12' with a no-break space is NULL.
TRIM_ALL = "".join(chr(c) for c in range(0x21)) + "\x7f"
TRIM_JAVA = "".join(chr(c) for c in range(0x21))
# TRIM/LTRIM/RTRIM remove only the space character.
TRIM_SPACE = " "

# CAST(string AS BIGINT/INT/SMALLINT/TINYINT): sign, digits, an optional fraction that is dropped ('12.7' is 12,
# '.5' and '.' are 0); out of range is NULL.
INTEGRAL_TEXT = r"^[+-]?([0-9]+\.?[0-9]*|\.[0-9]*)$"
# CAST(string AS DOUBLE/FLOAT): Java's Double.parseDouble (an f/F/d/D suffix is allowed, 'NaN' and 'Infinity' with
# an optional sign, case-sensitive) plus Spark's special words (inf, +inf, infinity, +infinity, -inf, -infinity,
# nan; case-insensitive).
FLOAT_TEXT = r"^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?[fFdD]?$"
FLOAT_WORDS = {"inf": "inf", "+inf": "inf", "infinity": "inf", "+infinity": "inf", "-inf": "-inf",
               "-infinity": "-inf", "nan": "nan"}
FLOAT_JAVA_WORDS = {"NaN": "nan", "+NaN": "nan", "-NaN": "nan", "Infinity": "inf", "+Infinity": "inf",
                    "-Infinity": "-inf"}
# Java also reads hexadecimal floating-point text ('0x1.8p1'); the engine refuses such values loudly.
HEX_FLOAT_TEXT = r"^[+-]?0[xX]([0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)[pP][+-]?[0-9]+[fFdD]?$"
# CAST(string AS DECIMAL): java.math.BigDecimal text; rounded HALF_UP to the scale, NULL when it does not fit.
DECIMAL_TEXT = r"^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$"
# CAST(string AS DATE): [+-]yyyy[y..] (4 to 7 digits), then optionally -[m]m, then optionally -[d]d, then
# optionally a space or 'T' followed by anything. A missing month or day is 1.
DATE_TEXT = r"(?s)^([+-]?)([0-9]{4,7})(?:-([0-9]{1,2})(?:-([0-9]{1,2})(?:[ T].*)?)?)?$"
BOOL_TRUE = ("t", "true", "y", "yes", "1")
BOOL_FALSE = ("f", "false", "n", "no", "0")

_DATE = re.compile(DATE_TEXT)
# The timestamp texts the front-end folds; Spark reads more (time zones, single-digit fields, time-only texts),
# which the front-end refuses rather than guess.
_TIMESTAMP = re.compile(r"^([0-9]{4})-([0-9]{2})-([0-9]{2})(?:[ T]([0-9]{2}):([0-9]{2})(?::([0-9]{2})"
                        r"(?:\.([0-9]{1,9}))?)?)?$")


def string_to_date(text: str) -> dt.date | None:
    """``CAST(text AS DATE)`` as Spark computes it; None where Spark gives NULL (or a year Python cannot hold)."""
    m = _DATE.match(text.strip(TRIM_ALL))
    if m is None:
        return None
    sign, year_text, month_text, day_text = m.groups()
    year = int(year_text) * (-1 if sign == "-" else 1)
    month = int(month_text) if month_text else 1
    day = int(day_text) if day_text else 1
    if not 1 <= month <= 12 or not 1 <= year <= 9999:
        return None
    if not 1 <= day <= calendar.monthrange(year, month)[1]:
        return None
    return dt.date(year, month, day)


def string_to_timestamp(text: str) -> dt.datetime | None:
    """``CAST(text AS TIMESTAMP)`` for the texts ``yyyy-mm-dd[( |T)hh:mm[:ss[.fraction]]]`` (fraction truncated to
    microseconds, as Spark does); None for any other text, which the caller refuses."""
    m = _TIMESTAMP.match(text.strip(TRIM_ALL))
    if m is None:
        return None
    year, month, day, hour, minute, second, fraction = m.groups()
    try:
        return dt.datetime(int(year), int(month), int(day), int(hour or 0), int(minute or 0), int(second or 0),
                           int((fraction or "").ljust(6, "0")[:6]))
    except ValueError:
        return None

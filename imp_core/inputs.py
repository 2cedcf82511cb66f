"""What user input may look like: names, table locations, fragment counts and partition bounds.

Every entry point (CLI, spark-submit job, Airflow task, Python API) goes through these checks before anything is
written, so a bad value ends as one ``UsageError`` line naming what is wrong and what to do:

* **names** of sketches: ASCII letters, digits, ``_`` and ``-``, not starting with ``-`` (a name must survive a
  command line: the jobs' argv carries ``--sketch=NAME``); table names are SQL identifiers (ASCII letters, digits,
  ``_``, not starting with a digit). Unicode look-alikes are refused: two names that look the same must be the same.
* **table locations** are stored as absolute URIs: ``scheme://...`` as given, a local path made absolute, so a
  table registered from one directory is found from any other (and by the jobs, which run elsewhere).
* **fragments** at most ``IMP_MAX_FRAGMENTS`` (bounds, sketches and operator state grow with it).
* **bounds** parse as the column's kind, fit its range (integers in int64), are all naive or all time-zone aware
  (timestamps), and are numbers (no NaN).
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
import os
import re
from pathlib import Path
from typing import Any

from imp_core.errors import UsageError

MAX_NAME_LENGTH = 128
SKETCH_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*\Z", re.ASCII)
TABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z", re.ASCII)
_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://", re.ASCII)
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def check_sketch_name(name: Any) -> str:
    """``name`` if it is a valid sketch name.

    Raises:
        UsageError: Not a string of ASCII letters, digits, ``_`` and ``-`` starting with a letter, digit or ``_``.
    """
    if not isinstance(name, str) or not SKETCH_NAME.match(name) or len(name) > MAX_NAME_LENGTH:
        raise UsageError(f"sketch name {name!r} is not valid: use ASCII letters, digits, '_' and '-', starting with a "
                         f"letter, digit or '_' (at most {MAX_NAME_LENGTH} characters)")
    return name


def check_table_name(name: Any) -> str:
    """``name`` if it is a valid table name (an ASCII SQL identifier).

    Raises:
        UsageError: Not an identifier of ASCII letters, digits and ``_`` starting with a letter or ``_``.
    """
    if not isinstance(name, str) or not TABLE_NAME.match(name) or len(name) > MAX_NAME_LENGTH:
        raise UsageError(f"table name {name!r} must be an identifier: ASCII letters, digits and underscores, starting "
                         f"with a letter or underscore (at most {MAX_NAME_LENGTH} characters)")
    return name


def table_uri(path: Any) -> str:
    """Where a table lives, as stored in the catalog: ``scheme://...`` as given, a local path made absolute.

    Raises:
        UsageError: The location is empty or not a string.
    """
    if isinstance(path, Path):
        path = str(path)
    if not isinstance(path, str) or not path.strip():
        raise UsageError("give the location of the Delta table (a path, or a URI such as s3://bucket/table)")
    if _URI.match(path):
        return path
    return os.path.abspath(os.path.expanduser(path))


def check_fragments(fragments: int, most: int) -> int:
    """``fragments`` if it is between 1 and ``most`` (``IMP_MAX_FRAGMENTS``).

    Raises:
        UsageError: Below 1 or above the setting (the message names the setting).
    """
    if isinstance(fragments, bool) or not isinstance(fragments, int):
        raise UsageError(f"--fragments must be an integer, got {fragments!r}")
    if fragments < 1:
        raise UsageError(f"--fragments must be at least 1, got {fragments}")
    if fragments > most:
        raise UsageError(f"--fragments {fragments} is more than IMP_MAX_FRAGMENTS ({most}); use fewer fragments, or "
                         f"raise IMP_MAX_FRAGMENTS if this many are really needed")
    return fragments


def parse_bounds(text: str, kind: str, where: str, most: int) -> tuple[Any, ...]:
    """The bounds ``b0,...,bn`` of one ``--bounds`` value, parsed for a column of ``kind``.

    Checks what the partition itself cannot say clearly: the number of fragments, integer range, NaN, and that
    timestamps are all naive or all time-zone aware (they cannot be ordered otherwise).

    Args:
        text: The comma-separated bounds.
        kind: The partition column's kind (``int``, ``float``, ``decimal``, ``date``, ``timestamp``, ``string``).
        where: ``TABLE.COLUMN``, for messages.
        most: The largest number of fragments allowed (``IMP_MAX_FRAGMENTS``).

    Raises:
        UsageError: Anything about the bounds that cannot work, in one line.
    """
    from imp_core.sketch.partition import parse_bound

    items = text.split(",")
    if len(items) - 1 > most:
        raise UsageError(f"--bounds for {where} give {len(items) - 1} fragments, more than IMP_MAX_FRAGMENTS "
                         f"({most}); use fewer bounds")
    values = tuple(parse_bound(item, kind) for item in items)
    for v in values:
        if kind == "int" and not INT64_MIN <= v <= INT64_MAX:
            raise UsageError(f"bound {v} for {where} does not fit a 64-bit integer ({INT64_MIN}..{INT64_MAX})")
        if kind == "float" and math.isnan(v):
            raise UsageError(f"bound NaN for {where} is not a number; give finite bounds")
        if kind == "decimal" and not v.is_finite():
            raise UsageError(f"bound {v} for {where} is not a finite decimal; give finite bounds")
    if kind == "timestamp":
        aware = {isinstance(v, dt.datetime) and v.tzinfo is not None for v in values}
        if len(aware) > 1:
            raise UsageError(f"bounds for {where} mix timestamps with and without a time zone; write every bound "
                             f"with an offset (2024-01-01T00:00:00+00:00) or none")
    try:
        for lo, hi in zip(values, values[1:]):
            if not lo < hi:
                raise UsageError(f"bounds for {where} must be strictly increasing; {lo!r} is followed by {hi!r}")
    except (TypeError, decimal.InvalidOperation) as e:
        raise UsageError(f"bounds for {where} cannot be compared with each other ({e}); give values of one type")
    return values


__all__ = ["MAX_NAME_LENGTH", "SKETCH_NAME", "TABLE_NAME", "check_fragments", "check_sketch_name",
           "check_table_name", "parse_bounds", "table_uri"]

"""What user input may look like: names, table locations, fragment counts and partition bounds.

Every entry point (CLI, spark-submit job, Airflow task, Python API) goes through these checks before anything is
written, so a bad value ends as one ``UsageError`` line naming what is wrong and what to do:

* **names** of sketches: ASCII letters, digits, ``_`` and ``-``, not starting with ``-`` (a name must survive a
  command line: the jobs' argv carries ``--sketch=NAME``); table names are SQL identifiers (ASCII letters, digits,
  ``_``, not starting with a digit). Unicode look-alikes are refused: two names that look the same must be the same.
* **table locations** are stored as absolute URIs: ``scheme://...`` as given, a local path made absolute, so a
  table registered from one directory is found from any other (and by the jobs, which run elsewhere).
* **fragments** (``--fragments``, or the number of ``--bounds``) at most ``IMP_MAX_FRAGMENTS`` (bounds, sketches and
  operator state grow with it). What each bound may be is decided by the column's type in
  :mod:`imp_core.sketch.bounds`.
"""

from __future__ import annotations

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
    return _check_name(name, SKETCH_NAME, "sketch name {name!r} is not valid: use ASCII letters, digits, '_' and "
                                          "'-', starting with a letter, digit or '_'")


def check_table_name(name: Any) -> str:
    """``name`` if it is a valid table name (an ASCII SQL identifier).

    Raises:
        UsageError: Not an identifier of ASCII letters, digits and ``_`` starting with a letter or ``_``.
    """
    return _check_name(name, TABLE_NAME, "table name {name!r} must be an identifier: ASCII letters, digits and "
                                         "underscores, starting with a letter or underscore")


def _check_name(name: Any, pattern: re.Pattern[str], message: str) -> str:
    if not isinstance(name, str) or not pattern.match(name) or len(name) > MAX_NAME_LENGTH:
        raise UsageError(message.format(name=name) + f" (at most {MAX_NAME_LENGTH} characters)")
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


def check_bounds_count(text: str, most: int) -> None:
    """Refuse a ``--bounds`` value with more than ``most`` fragments (``IMP_MAX_FRAGMENTS``) before parsing it.

    What each bound may be is :func:`imp_core.sketch.bounds.parse_bounds`'s to say (the column's type decides).

    Raises:
        UsageError: Too many bounds.
    """
    fragments = text.count(",")
    if fragments > most:
        raise UsageError(f"--bounds give {fragments} fragments, more than IMP_MAX_FRAGMENTS ({most}); use fewer "
                         f"bounds, or raise IMP_MAX_FRAGMENTS if this many are really needed")


def check_batch_size(value: Any, flag: str | None = None) -> int:
    """``value`` if it is a batch size of eager maintenance: an integer of at least 1 (change rows per version).

    ``flag`` names the command-line option it came from; without one it came from elsewhere (an Airflow parameter).

    Raises:
        UsageError: Not an integer, or below 1.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(f"{flag or 'batch size'} must be an integer of at least 1 (change rows per committed "
                         f"version), got {value!r}")
    if value < 1:
        raise UsageError(f"{flag} must be at least 1, got {value}" if flag else
                         f"batch size must be an integer of at least 1 (change rows per committed version), got "
                         f"{value!r}")
    return value


__all__ = ["MAX_NAME_LENGTH", "SKETCH_NAME", "TABLE_NAME", "check_batch_size", "check_bounds_count", "check_fragments",
           "check_sketch_name", "check_table_name", "table_uri"]

"""Spark failures that say something about the data, as the platform's errors.

Spark reports a data file that is gone as an ``AnalysisException`` (``PATH_NOT_FOUND``, when the scan is planned) or
a ``SparkFileNotFoundException`` (``FAILED_READ_FILE.FILE_NOT_EXIST``, when a task reads it). Both mean the table's
files were changed outside Delta (or vacuumed while a version that needs them is still read), not a bug: the CLI and
the jobs turn them into a one-line ``SourceError`` here instead of an internal error. Text only: no pyspark import.
"""

from __future__ import annotations

import re

from imp_core.errors import SourceError

_MISSING_FILE = ("PATH_NOT_FOUND", "FAILED_READ_FILE.FILE_NOT_EXIST", "java.io.FileNotFoundException")
_PATH = re.compile(r"\b(?:file|s3a?|hdfs|abfss?|gs|wasbs?):/[^\s,;]*[^\s,;.]")


def as_source_error(error: BaseException) -> SourceError | None:
    """The ``SourceError`` a Spark failure stands for, or None when it is not one of the known data failures."""
    text = str(error)
    if not any(code in text for code in _MISSING_FILE):
        return None
    path = _PATH.search(text)
    where = f" ({path.group(0)})" if path else ""
    return SourceError(f"a data file of a table is missing{where}: it was deleted outside Delta, or vacuumed while a "
                       f"version that needs it is still read; restore it, or re-register the table and recapture its "
                       f"sketches")


__all__ = ["as_source_error"]

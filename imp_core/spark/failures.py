"""Spark failures that say something about the data, as the platform's errors.

Spark reports a data file that is gone as an ``AnalysisException`` (``PATH_NOT_FOUND``, when the scan is planned) or
a ``SparkFileNotFoundException`` (``FAILED_READ_FILE.FILE_NOT_EXIST``, when a task reads it). Both mean the table's
files were changed outside Delta (or vacuumed while a version that needs them is still read), not a bug: the CLI and
the jobs turn them into a one-line ``SourceError`` here instead of an internal error. Rows a job brings back beyond
``spark.driver.maxResultSize`` mean state that this imp keeps in the driver outgrew it on a table this size: a
``StateError`` saying what to change. Text only: no pyspark import.
"""

from __future__ import annotations

import re

from imp_core.errors import ImpError, SourceError, StateError

_MISSING_FILE = ("PATH_NOT_FOUND", "FAILED_READ_FILE.FILE_NOT_EXIST", "java.io.FileNotFoundException")
_RESULT_SIZE = re.compile(r"Total size of serialized results of \d+ tasks \(([^)]*)\) is bigger than "
                          r"spark\.driver\.maxResultSize \(([^)]*)\)")
_PATH = re.compile(r"\b(?:file|s3a?|hdfs|abfss?|gs|wasbs?):/[^\s,;]*[^\s,;.]")


def as_known_error(error: BaseException) -> ImpError | None:
    """The platform error a Spark failure stands for, or None when it is not one of the known failures."""
    too_large = _RESULT_SIZE.search(str(error))
    if too_large is not None:
        return StateError(f"Spark refused to bring {too_large.group(1)} of rows to the driver (over "
                          f"spark.driver.maxResultSize, {too_large.group(2)}): an operator whose state stays in the "
                          f"driver (a top-k per group, an anti join, a join cache) outgrew it on this table; lower "
                          f"IMP_STATE_MEMORY_BUDGET so that aggregations keep their state in Delta tables, sketch a "
                          f"query without that operator, or raise spark.driver.maxResultSize (spark-defaults.conf in "
                          f"SPARK_CONF_DIR, or the job's --conf) and IMP_SPARK_DRIVER_MEMORY")
    return as_source_error(error)


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


__all__ = ["as_known_error", "as_source_error"]

"""Spark's missing-file failures become one-line source errors naming the file; anything else stays unknown."""

from __future__ import annotations

from imp_core.errors import SourceError
from imp_core.spark.failures import as_source_error


def test_missing_files_are_source_errors_naming_the_file() -> None:
    planned = Exception("[PATH_NOT_FOUND] Path does not exist: file:/data/t/part-0.snappy.parquet. SQLSTATE: 42K03")
    read = Exception("[FAILED_READ_FILE.FILE_NOT_EXIST] Error while reading file s3a://lake/t/part-1.parquet. ...")
    for error, path in ((planned, "file:/data/t/part-0.snappy.parquet"), (read, "s3a://lake/t/part-1.parquet")):
        got = as_source_error(error)
        assert isinstance(got, SourceError) and got.exit_code == 4
        assert path in str(got) and "restore it" in str(got)


def test_other_failures_are_not_mapped() -> None:
    assert as_source_error(Exception("[DIVIDE_BY_ZERO] Division by zero")) is None
    assert as_source_error(ValueError("bad")) is None

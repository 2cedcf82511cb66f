"""Spark failures that say something about the data or the state's size become one-line platform errors; anything else
stays unknown."""

from __future__ import annotations

from imp_core.errors import SourceError, StateError
from imp_core.spark.failures import as_known_error, as_source_error


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


def test_rows_beyond_the_drivers_result_size_are_a_state_error_saying_what_to_change() -> None:
    # Spark's message when TPC-H SF10's W1 captured its top-k per group (every input row) into the driver
    spark = Exception("Job aborted due to stage failure: Total size of serialized results of 12 tasks (1037.7 MiB) "
                      "is bigger than spark.driver.maxResultSize (1024.0 MiB)")
    got = as_known_error(Exception("An error occurred while calling o144.getResult.\n" + str(spark)))
    assert isinstance(got, StateError)
    assert "1037.7 MiB" in str(got) and "1024.0 MiB" in str(got) and "IMP_STATE_MEMORY_BUDGET" in str(got)
    assert "\n" not in str(got)
    assert as_known_error(Exception("[PATH_NOT_FOUND] Path does not exist: file:/t/p.parquet.")).exit_code == 4
    assert as_known_error(ValueError("bad")) is None

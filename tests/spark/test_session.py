"""The session get_spark starts: the settings the engine relies on, and no per-call Python call-site capture."""

from __future__ import annotations

import pytest

from tests.jvm_calls import counting_round_trips

pytestmark = pytest.mark.spark


def test_session_settings(spark) -> None:  # noqa: ANN001
    assert spark.conf.get("spark.sql.ansi.enabled") == "false"
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    assert spark.conf.get("spark.sql.execution.arrow.pyspark.enabled") == "true"


def test_dataframe_calls_do_not_capture_python_call_sites(spark) -> None:  # noqa: ANN001
    """Building a DataFrame costs a few JVM round trips per API call, not a dozen (call-site capture is off).

    Measured: ~90 calls with capture off, ~290 with it on (releases of collected objects aside, see
    ``tests.jvm_calls``).
    """
    from pyspark.errors.utils import is_debugging_enabled
    from pyspark.sql import functions as F

    assert spark.conf.get("spark.python.sql.dataFrameDebugging.enabled") == "false"
    assert not is_debugging_enabled()
    with counting_round_trips() as counter:
        df = spark.range(10)
        for i in range(10):
            df = df.filter(F.col("id") >= F.lit(i))
    assert df.count() == 1  # ids 9..9 survive: the filters took effect
    assert counter.calls < 150, f"{counter.calls} JVM round trips to build 10 filters"

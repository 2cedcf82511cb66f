"""The session get_spark starts: the settings the engine relies on, and no per-call Python call-site capture."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.spark


def test_session_settings(spark) -> None:  # noqa: ANN001
    assert spark.conf.get("spark.sql.ansi.enabled") == "false"
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    assert spark.conf.get("spark.sql.execution.arrow.pyspark.enabled") == "true"


def test_dataframe_calls_do_not_capture_python_call_sites(spark) -> None:  # noqa: ANN001
    """Building a DataFrame costs one JVM round trip per API call, not six (call-site capture is off)."""
    from py4j import clientserver
    from pyspark.errors.utils import is_debugging_enabled
    from pyspark.sql import functions as F

    assert spark.conf.get("spark.python.sql.dataFrameDebugging.enabled") == "false"
    assert not is_debugging_enabled()
    calls = 0
    original = clientserver.ClientServerConnection.send_command

    def counting(self, command):  # noqa: ANN001, ANN202
        nonlocal calls
        calls += 1
        return original(self, command)

    clientserver.ClientServerConnection.send_command = counting
    try:
        df = spark.range(10)
        for i in range(10):
            df = df.filter(F.col("id") >= F.lit(i))
    finally:
        clientserver.ClientServerConnection.send_command = original
    assert df.count() == 1  # ids 9..9 survive: the filters took effect
    assert calls < 150, f"{calls} JVM round trips to build 10 filters"

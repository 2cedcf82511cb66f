"""Slot constraints: which literals registration perturbs to ask the reuse check (no Spark needed)."""

from __future__ import annotations

from imp_core.publish.signature import _perturbed


def test_numbers_dates_and_timestamps_are_perturbed_one_step_each_way() -> None:
    assert _perturbed("300000", "int", "300000") == ("300001", "299999")
    assert _perturbed("2.50", "decimal(3,2)", "2.50") == ("2.51", "2.49")
    assert _perturbed("DATE '2024-03-01'", "date", "19783") == ("DATE '2024-03-02'", "DATE '2024-02-29'")
    assert _perturbed("TIMESTAMP '2024-01-01 00:00:00'", "timestamp", "1704067200000000") == (
        "TIMESTAMP '2024-01-01 00:00:01'",
        "TIMESTAMP '2023-12-31 23:59:59'",
    )


def test_literals_whose_value_is_not_their_text_keep_their_value() -> None:
    assert _perturbed("TIMESTAMP '2024-01-01 00:00:00'", "timestamp", "1") is None  # another zone's reading
    assert _perturbed("TIMESTAMP '2024-01-01 00:00:00+02:00'", "timestamp", "1704060000000000") is None
    assert _perturbed("'abc'", "string", "abc") is None

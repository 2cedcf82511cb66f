"""The harness catches the defects issue 53 fixed: each mutant puts one back, and the harness must report a
difference on the stream that triggers it.

* ``set comparison``: a Delta-kept store decides what changed by comparing sets of rows (an anti join), and the
  Spark capture writes one stored row per input row, so deleting one of two identical rows looks like no change
  (item 1). The fix has two layers, each enough alone (the capture nets rows to one per distinct row with its count,
  and the store compares bags), so the mutant takes out both: that is the code before the fix;
* ``shrinking error bound``: a float sum's interval is computed as if the stored value were exact (no error bound
  at all), so deleting the large terms of a cancelled sum leaves an interval narrower than the rounding that reached
  it (item 3).

With the fixes in place the harness finds no difference on these streams (test_streams.py), so a difference here
comes from the mutant alone. A mutant whose target has moved fails here (``monkeypatch`` raises), so that it is
updated rather than silently testing nothing.
"""

from __future__ import annotations

import polars as pl
import pytest

from tests.differential.reproductions import float_sum_rounded_at_capture, ranking_duplicates
from tests.differential.run import Harness

pytestmark = [pytest.mark.spark, pytest.mark.postgres, pytest.mark.slow, pytest.mark.differential]


def _set_changed_groups(old: pl.DataFrame, new: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """The keys of groups whose rows differ as *sets* (the mutant: multiplicities ignored)."""
    from imp_core.spark.state_store import COMPONENT, MARKER

    old, new = old.filter(pl.col(COMPONENT) != MARKER), new.filter(pl.col(COMPONENT) != MARKER)
    columns = [c for c in new.columns if c in old.columns]
    only_new = new.join(old, on=columns, how="anti", nulls_equal=True)
    only_old = old.join(new, on=columns, how="anti", nulls_equal=True)
    return pl.concat([only_new.select(keys), only_old.select(keys)]).unique()


def test_a_set_comparison_in_the_delta_store_is_caught(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    from imp_core.spark import external_capture, state_store

    monkeypatch.setattr(state_store, "_changed_groups", _set_changed_groups)
    monkeypatch.setattr(external_capture, "_netted", lambda rows, count: rows)
    outcome = harness.run(ranking_duplicates())
    print(outcome.report())
    assert not any(d.check == "error" for d in outcome.differences), outcome.report()
    assert {d.mode for d in outcome.differences} & {"outside", "moved"}, outcome.report()


def _exact_interval(
    value: pl.Expr,
    n: pl.Expr,
    abs_sum: pl.Expr,
    exact: pl.Expr,
    divide: bool,
    exact_below: float | None = None,
    bound: pl.Expr | None = None,
) -> tuple[pl.Expr, pl.Expr]:
    """A float sum's interval of width zero (the mutant: no rounding error assumed anywhere, the state's bound
    ignored)."""
    none = n <= 0
    v = pl.when(none).then(None).otherwise(value).cast(pl.Float64)
    return v, v


def test_a_shrinking_float_error_bound_is_caught(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    from imp_core.engine.operators import aggregation, small_batch

    monkeypatch.setattr(aggregation, "sum_interval", _exact_interval)
    monkeypatch.setattr(small_batch, "computes_outputs", lambda op: False)  # every interval through sum_interval
    outcome = harness.run(float_sum_rounded_at_capture())
    print(outcome.report())
    assert not any(d.check == "error" for d in outcome.differences), outcome.report()
    assert any(d.check in ("answer", "recapture") for d in outcome.differences), outcome.report()

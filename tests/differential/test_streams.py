"""The differential test: random streams (``generate.py``) run three ways (``run.py``); after every step the
query with each sketch equals Spark's answer over all rows, and each maintained sketch equals a recapture."""

from __future__ import annotations

import pytest

from tests.differential.conftest import OUTCOMES
from tests.differential.generate import DSUM_VARIANTS, draw_stream, dsum_variant
from tests.differential.known import REPRODUCTIONS_ON_MAIN
from tests.differential.reproductions import REPRODUCTIONS, ranked_wide_sum
from tests.differential.run import Harness

pytestmark = [pytest.mark.spark, pytest.mark.postgres, pytest.mark.slow, pytest.mark.differential]


def test_stream(harness: Harness, stream_seed: int) -> None:
    outcome = harness.run(draw_stream(stream_seed))
    OUTCOMES.append(outcome)
    print(outcome.report())
    assert not outcome.differences, outcome.report()


def test_a_distinct_wide_decimal_sum_under_a_having(harness: Harness) -> None:
    """The first dsum stream of a SUM(DISTINCT) of a DECIMAL(38, 0) under a HAVING (the ranked variants are the
    guard's streams below): no difference."""
    seed = next(s for s in range(0, 400, 2) if (s // 2) % 5 == 3 and dsum_variant(s) == 0)
    stream = draw_stream(seed)
    assert stream.sql == DSUM_VARIANTS[0]
    outcome = harness.run(stream)
    print(outcome.report())
    assert outcome.skipped is None and outcome.steps > 0, outcome.report()
    assert not outcome.differences, outcome.report()


@pytest.mark.parametrize("distinct", [False, True], ids=["sum", "distinct"])
def test_a_guarded_sum_is_refused_while_sparks_value_depends_on_the_order(harness: Harness, distinct: bool) -> None:
    """Batch 1's maintain jobs (memory, outside, moved) and its recapture are refused; batch 2 brings the sum back
    and every mode is maintained and checked again."""
    outcome = harness.run(ranked_wide_sum(distinct))
    print(outcome.report())
    assert outcome.refused == 4, outcome.report()
    assert outcome.steps == 6, outcome.report()  # after the capture and after batch 2, three modes each
    assert not outcome.differences, outcome.report()


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(
            n,
            marks=[pytest.mark.xfail(strict=True, reason=REPRODUCTIONS_ON_MAIN[n])]
            if n in REPRODUCTIONS_ON_MAIN
            else [],
        )
        for n in REPRODUCTIONS
    ],
)
def test_issue_53_reproduction(harness: Harness, name: str) -> None:
    """Each reproduction of issue 53 is a stream the harness judges: no difference, and it registers (exit 0)."""
    outcome = harness.run(REPRODUCTIONS[name]())
    print(outcome.report())
    assert outcome.skipped is None and outcome.steps > 0, outcome.report()
    assert not outcome.differences, outcome.report()

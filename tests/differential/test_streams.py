"""The differential test: random streams (``generate.py``) run three ways (``run.py``); after every step the
query with each sketch equals Spark's answer over all rows, and each maintained sketch equals a recapture."""

from __future__ import annotations

import pytest

from tests.differential.conftest import OUTCOMES
from tests.differential.generate import draw_stream
from tests.differential.known import REPRODUCTIONS_ON_MAIN
from tests.differential.reproductions import REPRODUCTIONS
from tests.differential.run import Harness

pytestmark = [pytest.mark.spark, pytest.mark.postgres, pytest.mark.slow, pytest.mark.differential]


def test_stream(harness: Harness, stream_seed: int) -> None:
    outcome = harness.run(draw_stream(stream_seed))
    OUTCOMES.append(outcome)
    print(outcome.report())
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

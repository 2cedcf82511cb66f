"""The differential test's options, its harness fixture and its summary.

``pytest tests/differential`` runs the CI streams (``--diff-streams``, default 4, from seed ``--diff-seed``, default
0); ``pytest tests/differential --diff-streams 2000`` is the long run (with ``-n 2`` over two processes). The summary
at the end counts streams, checks and differences (``python -m tests.differential`` runs the same without pytest).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING

import pytest

from tests.differential.known import KNOWN_ON_MAIN, REGRESSION_SEEDS

if TYPE_CHECKING:
    from imp_core.maintenance.service import SketchService
    from tests.differential.run import Harness, Outcome

CI_STREAMS = 4
OUTCOMES: list[Outcome] = []


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("differential", "the differential test (tests/differential)")
    group.addoption(
        "--diff-streams", type=int, default=CI_STREAMS, help=f"random streams to run (default {CI_STREAMS}, the CI run)"
    )
    group.addoption("--diff-seed", type=int, default=0, help="seed of the first stream (default 0)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "differential: the differential test's streams (tests/differential)")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "stream_seed" not in metafunc.fixturenames:
        return
    first = metafunc.config.getoption("diff_seed", default=0)
    count = metafunc.config.getoption("diff_streams", default=CI_STREAMS)
    params = []
    for seed in sorted(set(range(first, first + count)) | set(REGRESSION_SEEDS)):
        marks = [pytest.mark.xfail(strict=True, reason=KNOWN_ON_MAIN[seed])] if seed in KNOWN_ON_MAIN else []
        params.append(pytest.param(seed, marks=marks, id=f"seed{seed}"))
    metafunc.parametrize("stream_seed", params)


@pytest.fixture(scope="session")
def harness(service: SketchService, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    """One harness for every stream: the session's Spark and catalog, a service with the default state budget and
    one with a budget of 0."""
    from imp_core.maintenance.service import SketchService
    from tests.differential.run import Harness

    outside = SketchService(replace(service.settings, state_budget=0), catalog=service.catalog, spark=service.spark)
    yield Harness(service, outside, tmp_path_factory.mktemp("differential"))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not OUTCOMES:
        return
    from tests.differential.run import summary

    terminalreporter.write_sep("-", "differential")
    terminalreporter.write_line(summary(OUTCOMES))

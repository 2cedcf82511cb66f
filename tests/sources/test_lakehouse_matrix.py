"""The lakehouse matrix's covering subset (tests/lakehouse_matrix.py): every pair of feature, writer, storage and
command at least once. Each sequence is one test; its cells are the commands run on its table, and each checks that
``imp query`` answers with the sketch as Spark does without it and that the maintained sketch equals a recapture.
The whole product runs as ``python -m tests.lakehouse_matrix --full``."""

from __future__ import annotations

import pytest

from tests.lakehouse_matrix import COMMANDS, FEATURES, STORAGES, Sequence, covering, full_product, pairs, run_sequence


def test_the_subset_covers_every_pair_of_the_product() -> None:
    whole, subset = full_product(), covering()
    assert pairs(subset) == pairs(whole)
    assert len(subset) < len(whole)
    for f in FEATURES:  # each feature with every command, every writer that can write it, and both storages
        mine = [s for s in subset if s.feature == f]
        assert set().union(*(s.commands for s in mine)) == set(COMMANDS)
        assert {s.writer for s in mine} == set(f.writers()) and {s.storage for s in mine} == set(STORAGES)


@pytest.mark.spark
@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.parametrize("seq", covering(), ids=lambda s: s.id)
def test_sequence(seq: Sequence, service, spark, tmp_path_factory, request) -> None:  # noqa: ANN001
    if seq.storage == "s3":
        from imp_core.sources.storage import configure_spark

        request.getfixturevalue("s3_server")
        configure_spark(spark)
        root = "s3://lake/matrix"
    else:
        root = str(tmp_path_factory.mktemp("lake"))
    cells = run_sequence(service, spark, seq, root)
    failed = [f"{c.command}: {c.detail}" for c in cells if not c.ok]
    assert not failed, "\n".join(failed)
    assert [c.command for c in cells] == list(seq.commands)

"""Netting out (MinShip, Liu et al.): inserts and deletes of the same row in one batch cancel before the engine."""

from __future__ import annotations

import polars as pl
import pytest

from imp_core.engine.annotation import consolidate
from imp_core.engine.local import LocalBackend
from imp_core.engine.operators.aggregation import Aggregation
from imp_core.engine.pipeline import Pipeline
from imp_core.engine.schema import MULT
from imp_core.plan.sql import parse_query
from imp_core.sketch.partition import Partition, PartitionSet


def test_insert_and_delete_of_the_same_row_is_nothing() -> None:
    batch = pl.DataFrame({"a": [1, 1, 2, 2, 2], "b": ["x", "x", "y", "y", "y"], MULT: [1, -1, 1, 1, -1]})
    out = consolidate(batch)
    assert out.to_dicts() == [{"a": 2, "b": "y", MULT: 1}]  # duplicates collapse into a multiplicity
    assert consolidate(batch.head(2)).height == 0


@pytest.mark.parametrize("netting", [True, False])
def test_a_cancelling_batch_reaches_no_operator(netting: bool) -> None:
    """With netting, an insert and a delete of the same row never reach the aggregation; without it they do (so the
    first assertion could fail), and either way the state ends where it started."""
    data = pl.DataFrame({"a": [1, 2, 3], "b": [5, 6, 7]})
    plan = parse_query("SELECT a, SUM(b) AS s FROM t GROUP BY a", {"t": data.to_arrow().schema}).plan
    pipe = Pipeline(plan, PartitionSet((Partition("t", "a", (0, 2, 4), "int"),)))
    backend = LocalBackend(lambda name, v: data)
    pipe.capture(backend, {"t": 0})
    before = {op.op_id: op.state_to_bytes() for op in pipe.stateful()}
    agg = next(op for op in pipe.stateful() if isinstance(op, Aggregation))
    seen: list[int] = []
    process = agg.process

    def spy(delta: pl.DataFrame) -> pl.DataFrame:
        seen.append(delta.height)
        return process(delta)

    agg.process = spy  # type: ignore[method-assign]
    cancelling = pl.DataFrame({"a": [9, 9], "b": [1, 1], MULT: [1, -1]})
    out = pipe.maintain_pass("t", cancelling, backend, {"t": 1}, netting=netting)
    assert sum(seen) == (0 if netting else 2)
    assert out.empty
    assert {op.op_id: op.state_to_bytes() for op in pipe.stateful()} == before

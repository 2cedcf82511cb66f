"""The indexed top-k state (head + boundary + rest log) against the first engine's state (every row re-sorted).

Tiny head margins and compaction thresholds make every path run on small inputs: changes after the boundary, trims,
refills after deletions, compaction of the rest log, and save/load between batches, with ties, NaN and NULL keys.
"""

from __future__ import annotations

import random

import polars as pl
import pytest

from imp_core.engine.operators.topk import LAYOUT, TopKOp
from imp_core.engine.schema import MULT, SET, frag_col
from imp_core.engine.state import decode, encode
from imp_core.errors import StateError
from imp_core.plan.expr import FLOAT, INT, Col
from imp_core.plan.nodes import SortKey

SCHEMA = {"g": pl.Int64, "v": pl.Float64, "w": pl.Int64}
VALUES = [None, float("nan"), -1.5, 0.0, 1.0, 2.0, 2.0, 3.5, float("inf")]


def op(index: bool, desc: bool, nulls_first: bool | None, margin: int = 2, k: int = 3) -> TopKOp:
    order = (SortKey(Col("v", FLOAT), descending=desc, nulls_first=nulls_first), SortKey(Col("w", INT)))
    o = TopKOp("topk@t", order, k, SCHEMA, index=index, head_margin=margin)
    o.compact_min = 2
    return o


def delta(rows: list[tuple[int, float | None, int, int]]) -> pl.DataFrame:
    return pl.DataFrame({"g": [r[0] for r in rows], "v": pl.Series([r[1] for r in rows], dtype=pl.Float64),
                         "w": [r[2] for r in rows], MULT: [r[3] for r in rows],
                         frag_col(0): pl.Series([r[0] % 5 for r in rows], dtype=pl.UInt32)})


def bag(df: pl.DataFrame) -> list:
    rows = df.select("g", pl.col("v").cast(pl.String), "w", MULT, pl.col(SET).list.sort())  # NaN == NaN here
    return sorted(rows.rows(), key=repr)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(("desc", "nulls_first"), [(False, None), (True, None), (False, True), (True, False)])
def test_indexed_state_gives_the_same_deltas(seed: int, desc: bool, nulls_first: bool | None) -> None:
    rng = random.Random(seed)
    live = [(i, rng.choice(VALUES), rng.randint(0, 2)) for i in range(30)]
    old, new = op(False, desc, nulls_first), op(True, desc, nulls_first, margin=rng.choice([0, 1, 3]))
    first = delta([(*r, 1) for r in live])
    assert bag(old.process(first)) == bag(new.process(first))
    assert new.boundary is not None and new.rest.height > 0  # the head was trimmed at capture
    next_id = 100
    for step in range(30):
        batch = []
        for _ in range(rng.randint(1, 5)):
            if live and rng.random() < 0.5:
                batch.append((*live.pop(rng.randrange(len(live))), -1))
            else:
                row = (next_id % 7 if rng.random() < 0.3 else next_id, rng.choice(VALUES), rng.randint(0, 2))
                next_id += 1
                live.append(row)
                batch.append((*row, 1))
        d = delta(batch)
        assert bag(old.process(d)) == bag(new.process(d)), f"batch {step}"
        assert bag(old.output_relation()) == bag(new.output_relation())
        assert old.canonical()["rows"].equals(new.canonical()["rows"])
        if step % 7 == 3:  # a saved state continues where it left off
            again = op(True, desc, nulls_first, margin=new.head_target - new.k)
            again.load_state(new.state_to_bytes())
            new = again


def test_states_of_either_layout_load_into_either_operator() -> None:
    rows = delta([(i, float(i % 4), i % 2, 1) for i in range(20)])
    old, new = op(False, False, None), op(True, False, None)
    old.process(rows)
    new.process(rows)
    assert decode(new.state_to_bytes()).meta["layout"] == LAYOUT and "layout" not in decode(old.state_to_bytes()).meta
    for blob in (old.state_to_bytes(), new.state_to_bytes()):
        for index in (False, True):
            o = op(index, False, None)
            o.load_state(blob)
            assert bag(o.output_relation()) == bag(old.output_relation())
            assert o.canonical()["rows"].equals(old.canonical()["rows"])


def test_unknown_layout_is_a_state_error() -> None:
    new = op(True, False, None)
    new.process(delta([(i, float(i), 0, 1) for i in range(10)]))
    meta, frames = new.state_frames()
    blob = encode(new.kind, new.op_id, new.fingerprint, {**meta, "layout": LAYOUT + 1}, frames)
    with pytest.raises(StateError, match="layout"):
        op(True, False, None).load_state(blob)


def test_deleting_rows_never_seen_after_the_boundary_is_a_state_error() -> None:
    new = op(True, False, None)
    new.process(delta([(i, float(i), 0, 1) for i in range(10)]))
    with pytest.raises(StateError, match="never saw"):  # found when the rest log is compacted
        for g in range(100, 110):
            new.process(delta([(g, 50.0, 0, -1)]))


def test_a_saved_rest_log_stays_a_log_with_its_compacted_length() -> None:
    """Saving does not compact the rest (a sort of every row of a large input per save); the loaded operator knows
    how much of the log is uncompacted, so it compacts when it would have without the save."""
    new = op(True, False, None)
    new.compact_min = 1000
    new.process(delta([(i, float(i), 0, 1) for i in range(20)]))
    compacted = new.rest.height
    for g in range(3):  # ranked after the boundary: appended to the log, not compacted (below compact_min)
        new.process(delta([(100 + g, 50.0, 0, 1), (3 + g, 50.0 + g, 0, 1)]))
    assert new.rest.height == compacted + 6
    meta, frames = new.state_frames()
    assert frames["rest"].height == compacted + 6 and meta["rest_compacted"] == compacted
    again = op(True, False, None)
    again.load_state(new.state_to_bytes())
    assert again.rest.height - again._rest_compacted == 6
    assert again.canonical()["rows"].equals(new.canonical()["rows"])
    del meta["rest_compacted"]  # a state saved compacted, before the length was recorded
    older = op(True, False, None)
    older.load_state(encode(new.kind, new.op_id, new.fingerprint, meta, frames))
    assert older.rest.height == older._rest_compacted
    assert bag(older.output_relation()) == bag(new.output_relation())

"""The indexed top-k state (head + boundary + rest base and log) against the first engine's state (every row
re-sorted).

Tiny head margins and compaction thresholds make every path run on small inputs: changes after the boundary, trims,
refills after deletions, compaction of the rest log, and save/load between batches (with the base stored as a chunk
and read on demand), with ties, NaN and NULL keys.
"""

from __future__ import annotations

import random

import polars as pl
import pytest

from imp_core.engine.operators.topk import LAYOUT, TopKOp
from imp_core.engine.schema import MULT, SET, frag_col
from imp_core.engine.state import DETACHED_VERSION, Chunk, decode, encode, encode_parts
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
    assert new.boundary is not None and new.rest_rows > 0  # the head was trimmed at capture
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
        if step % 7 == 3:  # a saved state continues where it left off, its base stored apart (read on demand)
            again = op(True, desc, nulls_first, margin=new.head_target - new.k)
            blob, chunks = new.saved_state() if step % 2 else (new.state_to_bytes(), {})
            again.load_state(blob, lambda d, c=chunks: c[d].data())
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


def test_a_saved_base_is_stored_once_and_read_only_when_needed() -> None:
    """The rest's base is a chunk: saving without a compaction names the same chunk again (nothing re-encoded), a
    loaded base is fetched only when a compaction or refill needs it, and the log travels inline."""
    new = op(True, False, None)
    new.compact_min = 1000
    new.process(delta([(i, float(i), 0, 1) for i in range(20)]))
    base = new.base
    assert base is not None and new.base_rows == 20 - new.rows.height and new.log.height == 0
    blob, chunks = encode_parts(new.kind, new.op_id, new.fingerprint, *new.state_frames(), detach_from=0)
    assert list(chunks) == [base.digest] and int.from_bytes(blob[4:6], "little") == DETACHED_VERSION
    for g in range(3):  # ranked after the boundary: appended to the log, not compacted (below compact_min)
        new.process(delta([(100 + g, 50.0, 0, 1), (3 + g, 50.0 + g, 0, 1)]))
    assert new.base is base and new.log.height == 6
    meta, frames = new.state_frames()
    assert frames["rest"] is base and meta["rest_rows"] == new.base_rows and frames["rest_log"].height == 6
    blob, chunks = encode_parts(new.kind, new.op_id, new.fingerprint, meta, frames, detach_from=0)
    assert list(chunks) == [base.digest]

    fetched: list[str] = []

    def fetch(digest: str) -> bytes:
        fetched.append(digest)
        return chunks[digest].data()

    again = op(True, False, None)
    again.compact_min = 1000
    again.load_state(blob, fetch)
    assert isinstance(again.base, Chunk) and not again.base.loaded and again.log.height == 6
    again.process(delta([(200, 60.0, 0, 1)]))  # after the boundary: the base is not read
    assert fetched == [] and again.base.digest == base.digest
    assert bag(again.output_relation()) == bag(new.output_relation())
    inline = op(True, False, None)  # a self-contained blob of a loaded state reads its base to write it inline
    blob_again, chunks_again = encode_parts(again.kind, again.op_id, again.fingerprint, *again.state_frames(),
                                            detach_from=0)
    fresh = op(True, False, None)
    fresh.load_state(blob_again, fetch)
    inline.load_state(fresh.state_to_bytes())
    assert list(chunks_again) == [base.digest] and fetched == [base.digest] and inline.base.loaded
    assert inline.canonical()["rows"].equals(fresh.canonical()["rows"])
    fetched.clear()
    again.compact_min = 1
    again.process(delta([(201, 61.0, 0, 1)]))  # the log outgrows the base: compacted into a new base
    assert fetched == [base.digest] and again.log.height == 0 and again.base.digest != base.digest
    new.process(delta([(200, 60.0, 0, 1)]))
    new.process(delta([(201, 61.0, 0, 1)]))
    assert again.canonical()["rows"].equals(new.canonical()["rows"])


def test_a_damaged_or_missing_chunk_is_a_state_error() -> None:
    new = op(True, False, None)
    new.process(delta([(i, float(i), 0, 1) for i in range(20)]))
    blob, chunks = encode_parts(new.kind, new.op_id, new.fingerprint, *new.state_frames(), detach_from=0)
    [digest] = chunks
    cases = {"corrupt": lambda d: chunks[d].data()[:-1] + b"x", "without the catalog": None}
    for message, fetch in cases.items():
        again = op(True, False, None)
        again.load_state(blob, fetch)
        with pytest.raises(StateError, match=message):
            again.all_rows()
    with pytest.raises(StateError, match="malformed"):  # a digest that is not one
        decode(blob.replace(digest.encode(), b"z" * 64))


def test_states_with_the_rest_as_one_log_still_load() -> None:
    """Layout 2 (before the base was split from the log): the saved rest, tombstones and all, becomes the base."""
    new = op(True, False, None)
    new.compact_min = 1000
    new.process(delta([(i, float(i), 0, 1) for i in range(20)]))
    new.process(delta([(15, 15.0, 0, -1), (100, 50.0, 0, 1)]))  # a tombstone and an insert after the boundary
    meta, frames = new.state_frames()
    rest = pl.concat([frames["rest"].frame(), frames["rest_log"]])
    older = {"k": meta["k"], "buffer": 0, "truncated": False, "layout": 2, "rest_compacted": 12}
    old_blob = encode(new.kind, new.op_id, new.fingerprint, older,
                      {"rows": frames["rows"], "rest": rest, "boundary": frames["boundary"]})
    again = op(True, False, None)
    again.load_state(old_blob)
    assert again.base_rows == rest.height and again.log.height == 0
    assert again.canonical()["rows"].equals(new.canonical()["rows"])
    for d in (delta([(1, 1.0, 0, -1), (2, 2.0, 0, -1)]), delta([(0, 0.0, 0, -1), (3, 3.0, 0, -1)])):  # refills
        assert bag(again.process(d)) == bag(new.process(d))

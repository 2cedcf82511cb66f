"""Operator state persistence: round trips of every stateful operator, and corrupt or foreign blobs.

For aggregation (every aggregate kind, COUNT/SUM(DISTINCT) too, several key types, with and without GROUP BY),
DISTINCT, top-k, the anti join, top-k per group and the merge operator, at three sizes (empty, normal, huge: 500K
groups / rows, 1M fragments): ``state_to_bytes`` then ``load_state`` into a fresh operator gives identical canonical
frames, and both operators then behave identically on further changes. A blob with any single byte flipped, a blob of
another format version, operator, kind or plan, or a truncated blob raises ``StateError`` (which makes the service
recapture), never a silently different state.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable

import numpy as np
import polars as pl
import pyarrow as pa
import pytest

from imp_core.engine import state as codec
from imp_core.engine.annotation import SET_DTYPE
from imp_core.engine.operators.aggregation import Aggregation
from imp_core.engine.operators.anti_join import AntiJoinOp
from imp_core.engine.operators.base import StatefulOperator
from imp_core.engine.operators.group_topk import GroupTopKOp
from imp_core.engine.operators.merge import Merge
from imp_core.engine.operators.topk import TopKOp
from imp_core.engine.schema import MULT, SET
from imp_core.errors import StateError
from imp_core.plan.expr import DATE, FLOAT, INT, STRING, AggCall, Binary, Col
from imp_core.plan.nodes import AntiJoin, Field, GroupTopK, Project, Scan, SortKey

DEC = pa.decimal128(12, 2)
KEY_TYPES = {"g": pl.Int64, "s": pl.String}


def aggregation() -> Aggregation:
    i, x, d, s, dec = Col("i", INT), Col("x", FLOAT), Col("d", DATE), Col("s", STRING), Col("m", DEC)
    aggs = (("sum_i", AggCall("sum", i)), ("sum_x", AggCall("sum", x)), ("sum_m", AggCall("sum", dec)),
            ("cnt_i", AggCall("count", i)), ("cnt", AggCall("count", None)), ("avg_x", AggCall("avg", x)),
            ("avg_i", AggCall("avg", i)), ("min_x", AggCall("min", x)), ("max_s", AggCall("max", s)),
            ("min_d", AggCall("min", d)), ("max_i", AggCall("max", i)),
            ("cntd_x", AggCall("count", x, distinct=True)), ("cntd_s", AggCall("count", s, distinct=True)),
            ("sumd_i", AggCall("sum", i, distinct=True)), ("sumd_m", AggCall("sum", dec, distinct=True)))
    return Aggregation("aggregation@r.0", (("g", Col("g", INT)), ("s", s)), aggs, KEY_TYPES, fingerprint="fp")


def global_aggregation() -> Aggregation:
    return Aggregation("aggregation@r", (), (("sum_x", AggCall("sum", Col("x", FLOAT))),
                                             ("min_i", AggCall("min", Col("i", INT)))), {}, fingerprint="fp")


def distinct() -> Aggregation:
    op = Aggregation("distinct@r", (("g", Col("g", INT)), ("s", Col("s", STRING))), (), KEY_TYPES, "fp")
    op.kind = "distinct"
    return op


def topk() -> TopKOp:
    order = (SortKey(Col("x", FLOAT), descending=True), SortKey(Col("s", STRING), nulls_first=True))
    return TopKOp("topk@r", order, 5, {"g": pl.Int64, "s": pl.String, "x": pl.Float64}, fingerprint="fp")


def anti_join() -> AntiJoinOp:
    """NOT EXISTS of the test rows (the left side) against their keys divisible by 3 (the right, ``feed``)."""
    cols = (Field("g", INT), Field("s", STRING), Field("i", INT), Field("x", FLOAT), Field("d", DATE), Field("m", DEC))
    left = Project(Scan("T", "T", cols), tuple((c.name, Col(f"T.{c.name}", c.dtype)) for c in cols))
    right = Project(Scan("U", "U", (Field("g", INT),)), (("rg", Col("U.g", INT)),))
    return AntiJoinOp("anti_join@r", AntiJoin(left, right, Binary("=", Col("g", INT), Col("rg", INT))),
                      fingerprint="fp")


def group_topk() -> GroupTopKOp:
    """The two best rows per ``s`` by ``x`` descending (ROW_NUMBER: ties in the order of the rows' values)."""
    cols = (Field("g", INT), Field("s", STRING), Field("i", INT), Field("x", FLOAT), Field("d", DATE), Field("m", DEC))
    child = Project(Scan("T", "T", cols), tuple((c.name, Col(f"T.{c.name}", c.dtype)) for c in cols))
    node = GroupTopK(child, (Col("s", STRING),), (SortKey(Col("x", FLOAT), descending=True),), "row_number", "rn", 2)
    return GroupTopKOp("group_topk@r", node, fingerprint="fp")


def merge(total: int = 1000) -> Merge:
    return Merge("merge@r", total, fingerprint="fp")


def rows(n: int, groups: int, seed: int, sets: bool = False) -> pl.DataFrame:
    """An all-insert annotated delta of ``n`` rows over about ``groups`` groups (with NULLs)."""
    rng = np.random.default_rng(seed)
    g = rng.integers(0, max(groups, 1), n)
    df = pl.DataFrame({
        "g": pl.Series(g, dtype=pl.Int64).set(pl.Series(rng.random(n) < 0.01), None),
        "s": pl.Series(np.array(["a", "b", "c"])[g % 3]).set(pl.Series(rng.random(n) < 0.01), None),
        "i": pl.Series(rng.integers(-50, 50, n), dtype=pl.Int64),
        "x": pl.Series(rng.integers(-400, 400, n) / 4, dtype=pl.Float64),
        "d": pl.Series(np.datetime64("2024-01-01") + rng.integers(0, 30, n).astype("timedelta64[D]")).cast(pl.Date),
        "m": pl.Series(rng.integers(-1000, 1000, n) / 4).cast(pl.Decimal(12, 2)),
        MULT: pl.Series(np.ones(n, dtype=np.int64)),
    })
    if sets:
        first = pl.Series("__a", rng.integers(0, 900, n), dtype=pl.UInt32)
        return df.with_columns(pl.concat_list([first, first + 3]).cast(SET_DTYPE).alias(SET))
    return df.with_columns(pl.Series("__f0", rng.integers(0, 1000, n), dtype=pl.UInt32))


def deletes_of(df: pl.DataFrame, k: int, seed: int) -> pl.DataFrame:
    """Delete ``k`` of the rows of an earlier all-insert delta, plus insert a few new ones."""
    picked = df.sample(min(k, df.height), seed=seed).with_columns(pl.lit(-1, dtype=pl.Int64).alias(MULT))
    fresh = rows(k, 7, seed + 1).select(df.columns) if "__f0" in df.columns else \
        rows(k, 7, seed + 1, sets=True).select(df.columns)
    return pl.concat([picked, fresh])


# (factory, annotation as fragment sets?) — every stateful operator kind
OPERATORS: dict[str, tuple[Callable[[], StatefulOperator], bool]] = {
    "aggregation": (aggregation, False),
    "aggregation_without_group_by": (global_aggregation, False),
    "distinct": (distinct, True),
    "topk": (topk, True),
    "anti_join": (anti_join, False),
    "merge": (merge, True),
    "group_topk": (group_topk, True),
}
SIZES = {"empty": 0, "normal": 300, "huge": 500_000}  # huge: 500K rows in about 500K groups


def fed(name: str, size: int) -> tuple[StatefulOperator, pl.DataFrame]:
    factory, sets = OPERATORS[name]
    op = factory()
    if name == "merge" and size == SIZES["huge"]:
        op = merge(1_000_000)
    data = rows(size, size or 1, seed=size, sets=sets)
    if name == "merge" and size == SIZES["huge"]:
        data = data.with_columns(pl.concat_list(pl.Series(np.arange(size) * 2, dtype=pl.UInt32)).alias(SET))
    if size:
        feed(op, data)
    return op, data


def feed(op: StatefulOperator, d: pl.DataFrame) -> object:
    if isinstance(op, (Aggregation, TopKOp, GroupTopKOp)):
        return op.process(d)
    if isinstance(op, AntiJoinOp):  # the rows on the left, their keys divisible by 3 on the right
        return op.process(d, d.filter(pl.col("g") % 3 == 0).select(pl.col("g").alias("rg"), MULT))
    assert isinstance(op, Merge)
    return op.process(d)


def fresh_like(name: str, op: StatefulOperator) -> StatefulOperator:
    if isinstance(op, Merge):
        return merge(op.total)
    return OPERATORS[name][0]()


def assert_same(a: StatefulOperator, b: StatefulOperator) -> None:
    ca, cb = a.canonical(), b.canonical()
    assert ca.keys() == cb.keys()
    for frame_name, df in ca.items():
        assert df.schema == cb[frame_name].schema, frame_name
        assert df.equals(cb[frame_name]), frame_name


def same_output(x: object, y: object) -> bool:
    if isinstance(x, pl.DataFrame) and isinstance(y, pl.DataFrame):
        cols = [c for c in x.columns if c != SET]
        return x.sort(cols, nulls_last=True).equals(y.sort(cols, nulls_last=True))
    return x == y


@pytest.mark.parametrize("size", [pytest.param(s, marks=pytest.mark.slow) if s == "huge" else s for s in SIZES])
@pytest.mark.parametrize("name", list(OPERATORS))
def test_round_trip_then_identical_behaviour(name: str, size: str) -> None:
    op, data = fed(name, SIZES[size])
    blob = op.state_to_bytes()
    other = fresh_like(name, op)
    other.load_state(blob)
    assert_same(op, other)
    # the loaded operator behaves exactly like the original on further changes (deletes included)
    follow = deletes_of(data, 50, seed=9) if data.height else rows(20, 5, seed=9, sets=OPERATORS[name][1])
    if isinstance(op, Merge) and not data.height:
        follow = follow.filter(pl.col(MULT) > 0)
    assert same_output(feed(op, follow), feed(other, follow))
    # the states after the changes, and a second round trip (huge: the outputs above only; sorting both states
    # for the comparison costs another ~7 s there)
    if size != "huge":
        assert_same(op, other)
        third = fresh_like(name, op)
        third.load_state(other.state_to_bytes())
        assert_same(op, third)


@pytest.mark.parametrize("name", list(OPERATORS))
def test_every_flipped_byte_is_caught_or_harmless(name: str) -> None:
    op, _ = fed(name, 40)
    blob = op.state_to_bytes()
    _, hlen, _ = _header(blob)
    # every byte of the prefix and header; a sample of the payload (its SHA-256 is in the header)
    positions = [*range(10 + hlen), *range(10 + hlen, len(blob), 13)]
    caught = 0
    for pos in positions:
        bad = bytearray(blob)
        bad[pos] ^= 0xFF
        other = fresh_like(name, op)
        try:
            other.load_state(bytes(bad))
        except StateError:
            caught += 1
            continue
        # a flip that loads (e.g. in JSON whitespace) must not change the state
        assert_same(op, other)
    assert caught >= len(positions) - 64, f"only {caught} of {len(positions)} flips were detected"
    # low bits keep the header valid UTF-8 and often valid JSON ("frames" -> "grames", "k": 5 -> "k": 4)
    for pos in range(10 + hlen):
        for bit in (0x01, 0x02, 0x20):
            bad = bytearray(blob)
            bad[pos] ^= bit
            other = fresh_like(name, op)
            try:
                other.load_state(bytes(bad))
            except StateError:
                continue
            assert_same(op, other)


def _header(blob: bytes) -> tuple[int, int, dict]:
    version, hlen = struct.unpack("<HI", blob[4:10])
    return version, hlen, json.loads(blob[10:10 + hlen])


def _with_header(blob: bytes, header: dict, version: int | None = None) -> bytes:
    old_version, hlen, _ = _header(blob)
    raw = blob[10 + hlen:]
    text = json.dumps(header, sort_keys=True).encode()
    return codec.MAGIC + struct.pack("<HI", old_version if version is None else version, len(text)) + text + raw


@pytest.mark.parametrize("name", list(OPERATORS))
def test_foreign_and_malformed_blobs(name: str) -> None:
    op, _ = fed(name, 40)
    blob = op.state_to_bytes()
    version, _, header = _header(blob)

    def rejects(bad: bytes, match: str | None = None) -> None:
        with pytest.raises(StateError, match=match):
            fresh_like(name, op).load_state(bad)

    rejects(_with_header(blob, header, version=99), "format version")
    rejects(blob[:-1], "checksum")
    rejects(blob[:9])
    rejects(b"")
    rejects(b"PK\x03\x04" + blob[4:], "magic")
    for key, value in [("kind", "other"), ("op_id", "other@r"), ("fingerprint", "other-plan"),
                       ("sha256", "0" * 64)]:
        rejects(_with_header(blob, {**header, key: value}))
    # a header that parses but lacks what a blob must have
    rejects(_with_header(blob, {k: v for k, v in header.items() if k != "frames"}))
    rejects(_with_header(blob, {**header, "frames": "groups"}))
    rejects(_with_header(blob, {**header, "frames": [*header["frames"], "extra"]}))
    rejects(_with_header(blob, {**header, "meta": {}}))
    # a blob of another operator kind
    other_name = "merge" if name != "merge" else "topk"
    with pytest.raises(StateError):
        fresh_like(other_name, OPERATORS[other_name][0]()).load_state(blob)


def test_shape_mismatch_is_a_state_error() -> None:
    """State of the same operator id and plan but the wrong shape (e.g. written by a buggy version)."""
    op, _ = fed("aggregation", 40)
    meta, frames = op.state_frames()
    bad = codec.encode(op.kind, op.op_id, op.fingerprint, meta, {**frames, "groups": frames["groups"].drop("__cnt")})
    with pytest.raises(StateError):
        aggregation().load_state(bad)
    bad = codec.encode(op.kind, op.op_id, op.fingerprint, meta, {k: v for k, v in frames.items() if k != "mm7"})
    with pytest.raises(StateError):
        aggregation().load_state(bad)


def test_aggregation_state_of_an_older_layout_is_refused() -> None:
    """State written before NaN/±inf counts and NaN-free keys (no layout in its metadata) is not loaded as if it fit:
    StateError, so the service recaptures."""
    op = aggregation()
    meta, frames = op.state_frames()
    assert meta["layout"] >= 2
    old = {k: v for k, v in meta.items() if k != "layout"}
    blob = codec.encode(op.kind, op.op_id, op.fingerprint, old, frames)
    with pytest.raises(StateError, match="older engine"):
        aggregation().load_state(blob)


class Parts(dict):
    """A part store standing in for the catalog's chunk table: records what was handed over, and when."""

    def __init__(self) -> None:
        super().__init__()
        self.order: list[str] = []

    def sink(self, digest: str, data: bytes) -> None:
        self.order.append(digest)
        self[digest] = data


@pytest.mark.parametrize("name", list(OPERATORS))
def test_large_frames_are_streamed_as_parts_and_read_back(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a sink, frames past PART_FROM leave the blob as row slices (format version 3), each handed over as it is
    encoded; loading them through a fetch gives the same state and the same behaviour as the self-contained blob."""
    monkeypatch.setattr(codec, "PART_FROM", 2_000)
    monkeypatch.setattr(codec, "PART_BYTES", 1_000)
    op, data = fed(name, 3_000)
    store = Parts()
    blob, _ = op.saved_state(store.sink)
    names = codec.state_parts(blob)
    assert codec.format_version(blob) == codec.PARTS_VERSION and len(names) > 2
    assert sorted(names) == sorted(store.order)  # each handed over once, as encoded
    _, frames = op.state_frames()
    large = {n for n, f in frames.items() if isinstance(f, pl.DataFrame) and f.height and f.estimated_size() >= 2_000}
    assert large and set(_header(blob)[2]["parts"]) == large  # the large frames, and only they, left the blob
    fetched: list[str] = []
    other = fresh_like(name, op)
    other.load_state(blob, fetch=lambda d: fetched.append(d) or store[d])
    assert sorted(fetched) == sorted(names)  # each part read once (a streamed frame when the operator takes it)
    assert_same(op, other)
    follow = deletes_of(data, 50, seed=9)
    assert same_output(feed(op, follow), feed(other, follow))
    assert_same(op, other)


def test_parts_are_checked_and_need_the_catalog(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(codec, "PART_FROM", 2_000)
    monkeypatch.setattr(codec, "PART_BYTES", 1_000)
    op, _ = fed("aggregation", 3_000)
    store = Parts()
    blob, _ = op.saved_state(store.sink)
    first = codec.state_parts(blob)[1]
    with pytest.raises(StateError, match="without the catalog"):
        aggregation().load_state(blob)
    with pytest.raises(StateError, match=f"part {first[:12]} is corrupt"):
        aggregation().load_state(blob, fetch=lambda d: store[d] if d != first else store[d][:-1] + b"x")
    # a header that names parts in a version that has none, or no parts in version 3, is malformed
    version, _, header = _header(blob)
    with pytest.raises(StateError, match="malformed"):
        aggregation().load_state(_with_header(blob, header, version=codec.DETACHED_VERSION), fetch=store.__getitem__)
    with pytest.raises(StateError, match="malformed"):
        aggregation().load_state(_with_header(blob, {**header, "parts": {}}), fetch=store.__getitem__)
    with pytest.raises(StateError, match="malformed"):
        aggregation().load_state(_with_header(blob, {**header, "parts": {"groups": ["x" * 64]}}),
                                 fetch=store.__getitem__)
    # below PART_FROM, or without a sink, every frame stays in the blob
    small, _ = fed("aggregation", 10)
    assert codec.format_version(small.saved_state(store.sink)[0]) == codec.FORMAT_VERSION
    assert codec.format_version(op.saved_state()[0]) == codec.FORMAT_VERSION


def test_keyed_groups_are_saved_slice_by_slice_as_the_same_frames(monkeypatch: pytest.MonkeyPatch) -> None:
    """The keyed aggregation hands its groups, F_g and value counts over as row slices built on demand: written as
    parts they read back as exactly the frames it would have built whole (every slice boundary inside a group's
    fragment list)."""
    monkeypatch.setattr(codec, "PART_FROM", 0)
    monkeypatch.setattr(codec, "PART_BYTES", 300)
    op, _ = fed("aggregation", 2_000)
    _, lazy = op.saved_frames()
    made = {n for n, f in lazy.items() if isinstance(f, codec.Rows)}
    values = {n for n in lazy if n.startswith("mm")}
    assert {"groups", "fcounts"} <= made and values and values <= made  # MIN/MAX and DISTINCT counts too
    store = Parts()
    blob, _ = op.saved_state(store.sink)
    payload = codec.decode(blob, fetch=store.__getitem__)
    _, whole = op.state_frames()
    for name in made:
        assert len(_header(blob)[2]["parts"][name]) > 5
        assert sum(_header(blob)[2]["part_rows"][name]) == whole[name].height
        assert payload.frames[name].frame().equals(whole[name]), name


def test_keyed_state_is_loaded_part_by_part(monkeypatch: pytest.MonkeyPatch) -> None:
    """A keyed aggregation takes its groups and F_g from the parts one at a time (never the whole decoded frame) and
    reaches the same state and behaviour; a blob without the rows per part (written before they were recorded) still
    loads; a part with other rows than the header records, or a NULL count, is a StateError."""
    monkeypatch.setattr(codec, "PART_FROM", 0)
    monkeypatch.setattr(codec, "PART_BYTES", 300)
    op, data = fed("aggregation", 2_000)
    store = Parts()
    blob, _ = op.saved_state(store.sink)
    version, _, header = _header(blob)
    whole = codec.Parts.frame
    with monkeypatch.context() as m:
        m.setattr(codec.Parts, "frame", lambda self: pytest.fail("a streamed frame was read whole"))
        streamed = aggregation()
        streamed.load_state(blob, fetch=store.__getitem__)
    assert_same(op, streamed)
    older = aggregation()
    older.load_state(_with_header(blob, {k: v for k, v in header.items() if k != "part_rows"}), fetch=store.__getitem__)
    assert_same(op, older)
    assert whole is codec.Parts.frame
    follow = deletes_of(data, 50, seed=3)
    assert same_output(feed(op, follow), feed(streamed, follow))
    assert_same(op, streamed)
    rows = header["part_rows"]
    for name in ("groups", "fcounts"):
        wrong = {**rows, name: [rows[name][0] + 1, *rows[name][1:]]}
        with pytest.raises(StateError, match="header says"):
            aggregation().load_state(_with_header(blob, {**header, "part_rows": wrong}), fetch=store.__getitem__)
    with pytest.raises(StateError, match="malformed"):
        aggregation().load_state(_with_header(blob, {**header, "part_rows": {"groups": [1]}}), fetch=store.__getitem__)
    # a NULL count under valid checksums (a writer's bug) is refused, not read as a pair
    meta, frames = op.state_frames()
    nulls = frames["fcounts"].with_columns(pl.when(pl.int_range(pl.len()) == 7).then(None).otherwise(pl.col("__n"))
                                           .alias("__n"))
    bad = Parts()
    codec_blob, _ = codec.encode_parts(op.kind, op.op_id, op.fingerprint, meta, {**frames, "fcounts": nulls},
                                       detach_from=None, sink=bad.sink)
    with pytest.raises(StateError, match="NULL"):
        aggregation().load_state(codec_blob, fetch=bad.__getitem__)


def test_pairs_or_values_of_a_group_not_held_are_refused() -> None:
    """F_g pairs or MIN/MAX values naming a group the saved groups lack (a writer's bug, under a valid checksum) are
    a StateError when the slots are looked up, not a state silently missing them."""
    op, _ = fed("aggregation", 40)
    meta, frames = op.state_frames()
    stray = frames["fcounts"].head(1).with_columns(pl.lit(10**9).cast(pl.Int64).alias("g"))
    bad = codec.encode(op.kind, op.op_id, op.fingerprint, meta,
                       {**frames, "fcounts": pl.concat([frames["fcounts"], stray])})
    with pytest.raises(StateError, match="names groups it does not hold"):
        aggregation().load_state(bad)
    values = next(n for n in frames if n.startswith("mm") and "g" in frames[n].columns and frames[n].height)
    stray = frames[values].head(1).with_columns(pl.lit(10**9).cast(pl.Int64).alias("g"))
    bad = codec.encode(op.kind, op.op_id, op.fingerprint, meta,
                       {**frames, values: pl.concat([frames[values], stray])})
    with pytest.raises(StateError, match="names groups it does not hold"):
        aggregation().load_state(bad)

"""Versions of keyed state as typed values (imp_core/engine/keyed_state/versions.py) and the state descriptions of the
contract (contract.py): what is saved reads back equal, what this imp did not write is refused."""

from __future__ import annotations

import polars as pl
import pytest

from imp_core.engine.keyed_state.contract import Component, Kind, StateSpec, normal_form
from imp_core.engine.keyed_state.versions import DeltaVersion, MemoryVersion, version_from_json, version_from_meta
from imp_core.errors import StateError

# a reference as the Delta store writes it into the sealed state (spark/state_store.py: DeltaGroupStore.reference)
REFERENCE = {"store": "delta", "format": 2, "location": "s3://lake/_imp_state/q18-r7/aggregation_r.0.0",
             "version": 12, "buckets": 4, "rows": {"groups": 1500000, "fcounts": 1499233}, "log": 2048,
             "pins": [9, 10, 11, 12], "span": [1, 6000000]}


def test_a_delta_reference_reads_as_a_version_and_writes_back_the_same() -> None:
    version = DeltaVersion.from_json(REFERENCE)
    assert version.table_version == 12 and version.buckets == 4 and version.pins == (9, 10, 11, 12)
    assert version.row_counts == {"groups": 1500000, "fcounts": 1499233} and version.span == (1, 6000000)
    assert version.to_json() == REFERENCE
    assert version_from_json(REFERENCE) == version
    unwritten = {**REFERENCE, "version": None, "span": None, "pins": []}
    assert DeltaVersion.from_json(unwritten).to_json() == unwritten


def test_a_version_is_saved_where_the_operators_metadata_has_always_kept_it() -> None:
    delta = DeltaVersion.from_json(REFERENCE)
    meta = {"keys": ["k"], "layout": 2, **delta.saved_meta()}
    assert meta["external"] == REFERENCE and version_from_meta(meta, {}) == delta
    memory = MemoryVersion(rows=(("groups", 3), ("fcounts", 5)))
    assert memory.saved_meta() == {} and version_from_meta({"keys": ["k"]}, {"groups": 3, "fcounts": 5}) == memory


def test_a_memory_version_reads_back_equal() -> None:
    version = MemoryVersion(rows=(("groups", 3), ("fcounts", 5)), serial=4)
    assert version_from_json(version.to_json()) == version and version != MemoryVersion(rows=version.rows, serial=5)


@pytest.mark.parametrize("saved", [
    {**REFERENCE, "format": 1}, {**REFERENCE, "store": "rocksdb"}, {"rows": {}},
    {k: v for k, v in REFERENCE.items() if k != "buckets"}, {**REFERENCE, "span": [1]},
    {**REFERENCE, "rows": {"groups": "many"}}, {"store": "memory", "serial": "x"},
])
def test_a_version_this_imp_did_not_write_is_refused(saved: dict) -> None:
    with pytest.raises(StateError, match="recapture"):
        version_from_json(saved)


@pytest.mark.parametrize("make", [
    lambda: Component("b", Kind.BAG, (("v", pl.String),)),  # a bag without a count
    lambda: Component("b", Kind.BAG, (("v", pl.String), ("n", pl.String)), count="n"),  # a count that is text
    lambda: Component("m", Kind.MAP, (("x", pl.Int64), ("x", pl.Int64))),
    lambda: Component("m", Kind.MAP, (("__kslot", pl.Int64),)),
    lambda: StateSpec("op", (), (Component("m", Kind.MAP, ()),)),
    lambda: StateSpec("op", (("k", pl.Int64),), (Component("m", Kind.MAP, (("k", pl.Int64),)),)),
    lambda: StateSpec("op", (("k", pl.Int64),), (Component("m", Kind.MAP, ()), Component("m", Kind.MAP, ()))),
    lambda: StateSpec("op", (("k", pl.Int64),), ()),
])
def test_a_state_description_that_cannot_work_is_refused(make) -> None:  # noqa: ANN001
    with pytest.raises(StateError):
        make()


def test_the_normal_form_nets_a_bag_and_keeps_a_maps_live_rows() -> None:
    spec = StateSpec("op", (("k", pl.Int64),), (Component("m", Kind.MAP, (("x", pl.Int64), ("n", pl.Int64)), "n"),
                                                 Component("b", Kind.BAG, (("v", pl.String), ("n", pl.Int64)), "n")))
    bag = pl.DataFrame({"k": [1, 1, 1, None, None, 2], "v": ["a", "a", "b", None, None, "c"], "n": [1, 2, 1, 1, -1, 0]})
    assert normal_form(spec, "b", bag).sort("v").rows() == [(1, "a", 3), (1, "b", 1)]
    live = normal_form(spec, "m", pl.DataFrame({"k": [1, 2], "x": [5, 6], "n": [0, 4]}))
    assert live.rows() == [(2, 6, 4)]

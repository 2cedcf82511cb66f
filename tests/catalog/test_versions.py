"""Sketch versions: gap-free numbering, immutability enforced by the database, races, retention, checksums, state
chunks stored once and released with the last state naming them."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable

import pytest
import sqlalchemy as sa

from imp_core.catalog import Catalog, PartSink, SketchRecord, StateBlob, VersionRecord
from imp_core.errors import ConcurrentMaintenanceError, NotFoundError, StateError, UsageError
from tests.catalog.conftest import blob, version
from tests.catalog.test_locks import wait_until

pytestmark = pytest.mark.postgres

MakeSketch = Callable[..., SketchRecord]


def blocked_backends(catalog: Catalog) -> int:
    """Backends of this test's database waiting for a lock."""
    with catalog.engine.connect() as conn:
        return int(conn.execute(sa.text(
            "SELECT count(DISTINCT l.pid) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE NOT l.granted AND a.datname = current_database()")).scalar_one())


def test_commit_appends_the_next_version(catalog: Catalog, make_sketch: MakeSketch) -> None:
    sketch = make_sketch(table_versions={"orders": 1})
    for n in (2, 3):
        committed = catalog.commit_version(sketch.id, n - 1, version({"orders": n}, {"orders": [n]}), [blob()], 5)
        assert committed.version == n

    assert [v.version for v in catalog.versions(sketch.id)] == [1, 2, 3]
    latest = catalog.latest_version(sketch.id)
    assert latest.table_versions == {"orders": 3}
    assert latest.fragments == {"orders": [3]}
    assert latest.bits == {"orders": bytes([0b1000])}
    assert latest.method == "incremental"
    assert catalog.get_version(sketch.id, 2).fragments == {"orders": [2]}
    assert catalog.versions(sketch.id)[0].method == "capture"


def test_database_refuses_out_of_order_and_duplicate_versions(catalog: Catalog, make_sketch: MakeSketch) -> None:
    sketch = make_sketch()
    insert = sa.text("INSERT INTO sketch_version (sketch_id, version, table_versions, bits, fragments, method) "
                     "VALUES (:s, :v, '{}', '{}', '{}', 'incremental')")
    for bad in (3, 1, 0):  # skipping a number, repeating one, going back
        with pytest.raises(sa.exc.DBAPIError), catalog.engine.begin() as conn:
            conn.execute(insert, {"s": sketch.id, "v": bad})
    with catalog.engine.begin() as conn:
        conn.execute(insert, {"s": sketch.id, "v": 2})
    assert [v.version for v in catalog.versions(sketch.id)] == [1, 2]


def test_commit_with_stale_expected_previous_is_refused(catalog: Catalog, make_sketch: MakeSketch) -> None:
    sketch = make_sketch()
    catalog.commit_version(sketch.id, 1, version({"orders": 2}), [], 5)
    with pytest.raises(ConcurrentMaintenanceError, match="latest committed version is 2"):
        catalog.commit_version(sketch.id, 1, version({"orders": 3}), [], 5)


@pytest.mark.parametrize("statement", [
    "UPDATE sketch_version SET method = 'recapture' WHERE sketch_id = :s AND version = 1",
    "UPDATE sketch_version SET fragments = '{}' WHERE sketch_id = :s",
    "DELETE FROM sketch_version WHERE sketch_id = :s AND version = 1",
    "TRUNCATE sketch_version CASCADE",
])
def test_committed_versions_cannot_be_changed_or_deleted(catalog: Catalog, make_sketch: MakeSketch,
                                                         statement: str) -> None:
    sketch = make_sketch()
    with pytest.raises(sa.exc.DBAPIError, match="sketch versions are immutable"), catalog.engine.begin() as conn:
        conn.execute(sa.text(statement), {"s": sketch.id})
    assert catalog.latest_version(sketch.id).method == "capture"


def test_operator_state_cannot_be_updated_but_can_be_deleted(catalog: Catalog, make_sketch: MakeSketch) -> None:
    sketch = make_sketch()
    with pytest.raises(sa.exc.DBAPIError, match="operator state is immutable"), catalog.engine.begin() as conn:
        conn.execute(sa.text("UPDATE operator_state SET payload = 'x' WHERE sketch_id = :s"), {"s": sketch.id})
    with catalog.engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM operator_state WHERE sketch_id = :s"), {"s": sketch.id})
    assert not catalog.has_states(sketch.id, 1)


def test_racing_commits_exactly_one_wins(catalog: Catalog, make_sketch: MakeSketch) -> None:
    sketch = make_sketch()
    start = threading.Barrier(2)
    outcomes: list[VersionRecord | BaseException] = []

    def maintain(n: int) -> None:
        start.wait()
        try:
            outcomes.append(catalog.commit_version(sketch.id, 1, version({"orders": 10 + n}), [blob()], 5))
        except BaseException as e:  # noqa: BLE001 - collected and asserted below
            outcomes.append(e)

    threads = [threading.Thread(target=maintain, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)

    winners = [o for o in outcomes if isinstance(o, VersionRecord)]
    losers = [o for o in outcomes if isinstance(o, ConcurrentMaintenanceError)]
    assert len(winners) == 1 and len(losers) == 1, outcomes
    assert winners[0].version == 2
    assert [v.version for v in catalog.versions(sketch.id)] == [1, 2]
    assert catalog.latest_version(sketch.id).table_versions == winners[0].table_versions


def test_primary_key_stops_a_racing_insert_that_bypasses_the_api(catalog: Catalog, make_sketch: MakeSketch) -> None:
    # Both transactions pass the ordering trigger (each sees max = 1); the second must still fail once the first
    # commits, whatever the API does.
    sketch = make_sketch()
    insert = sa.text("INSERT INTO sketch_version (sketch_id, version, table_versions, bits, fragments, method) "
                     "VALUES (:s, 2, '{}', '{}', '{}', 'incremental')")
    second_error: list[BaseException] = []

    def second() -> None:
        try:
            with catalog.engine.begin() as conn:
                conn.execute(insert, {"s": sketch.id})
        except BaseException as e:  # noqa: BLE001
            second_error.append(e)

    with catalog.engine.begin() as first:
        first.execute(insert, {"s": sketch.id})
        racer = threading.Thread(target=second)
        racer.start()
        # the second insert must be queued behind the first transaction in Postgres (not merely unscheduled)
        assert wait_until(lambda: blocked_backends(catalog) == 1), "the second insert did not wait for the first"
        assert racer.is_alive() and not second_error
    racer.join(10)
    assert len(second_error) == 1 and isinstance(second_error[0], sa.exc.IntegrityError)
    assert [v.version for v in catalog.versions(sketch.id)] == [1, 2]


def test_retention_keeps_state_of_latest_versions_and_every_version_row(catalog: Catalog,
                                                                        make_sketch: MakeSketch) -> None:
    sketch = make_sketch(states=[blob("a"), blob("b")])
    for n in range(2, 6):
        catalog.commit_version(sketch.id, n - 1, version({"orders": n}), [blob("a", bytes([n])), blob("b")], 2)

    assert [v.version for v in catalog.versions(sketch.id)] == [1, 2, 3, 4, 5]
    assert [catalog.has_states(sketch.id, n) for n in range(1, 6)] == [False, False, False, True, True]
    assert catalog.load_states(sketch.id, 5)["a"].payload == bytes([5])
    assert catalog.load_states(sketch.id, 2) == {}


def test_unknown_method_is_refused() -> None:
    with pytest.raises(UsageError, match="unknown sketch version method 'rebuild'"):
        version({"orders": 1}, method="rebuild")


def test_retention_below_one_is_refused(catalog: Catalog, make_sketch: MakeSketch) -> None:
    sketch = make_sketch()
    with pytest.raises(UsageError, match="at least 1"):
        catalog.commit_version(sketch.id, 1, version({"orders": 2}), [], 0)
    assert len(catalog.versions(sketch.id)) == 1


def test_states_round_trip_with_checksums(catalog: Catalog, make_sketch: MakeSketch) -> None:
    payload = bytes(range(256)) * 100
    sketch = make_sketch(states=[blob("join#3", payload), blob("agg#1", b"")])
    states = catalog.load_states(sketch.id, 1)
    assert set(states) == {"join#3", "agg#1"}
    assert states["join#3"].payload == payload
    assert states["join#3"].format == "arrow-ipc" and states["join#3"].format_version == 1
    assert states["join#3"].checksum is not None and len(states["join#3"].checksum) == 64
    with catalog.engine.connect() as conn:
        size = conn.execute(sa.text("SELECT size_bytes FROM operator_state WHERE operator_id = 'join#3'")).scalar()
    assert size == len(payload)


def test_corrupt_state_is_detected_on_load(catalog: Catalog, make_sketch: MakeSketch) -> None:
    sketch = make_sketch(name="orders_by_day", states=[blob("agg#1", b"good state")])
    # The immutability trigger refuses this UPDATE; a superuser can switch triggers off for the session, which
    # is how we simulate bit rot or a tampered row.
    with catalog.engine.begin() as conn:
        conn.execute(sa.text("SET LOCAL session_replication_role = replica"))
        conn.execute(sa.text("UPDATE operator_state SET payload = 'evil state' WHERE sketch_id = :s"),
                     {"s": sketch.id})

    with pytest.raises(StateError) as caught:
        catalog.load_states(sketch.id, 1)
    message = str(caught.value)
    assert "operator state of sketch orders_by_day version 1 is corrupt (checksum mismatch" in message
    assert "run `imp sketch recapture orders_by_day`" in message


def test_blob_whose_given_checksum_does_not_match_is_not_written(catalog: Catalog, make_sketch: MakeSketch) -> None:
    sketch = make_sketch()
    bad = StateBlob("agg#1", "arrow-ipc", 1, b"abc", checksum="0" * 64)
    with pytest.raises(StateError, match="does not match the checksum"):
        catalog.commit_version(sketch.id, 1, version({"orders": 2}), [bad], 5)
    assert len(catalog.versions(sketch.id)) == 1


def test_version_as_of_table_version(catalog: Catalog, make_sketch: MakeSketch) -> None:
    sketch = make_sketch(table_versions={"orders": 3, "customer": 1})
    catalog.commit_version(sketch.id, 1, version({"orders": 5, "customer": 1}), [], 5)
    catalog.commit_version(sketch.id, 2, version({"orders": 9, "customer": 2}), [], 5)

    assert catalog.version_as_of_table_version(sketch.id, "orders", 3).version == 1
    assert catalog.version_as_of_table_version(sketch.id, "orders", 8).version == 2
    assert catalog.version_as_of_table_version(sketch.id, "orders", 100).version == 3
    assert catalog.version_as_of_table_version(sketch.id, "customer", 1).version == 2
    with pytest.raises(NotFoundError, match="first version reflects orders version 3"):
        catalog.version_as_of_table_version(sketch.id, "orders", 2)
    with pytest.raises(NotFoundError, match="does not read table 'lineitem'; it reads customer, orders"):
        catalog.version_as_of_table_version(sketch.id, "lineitem", 2)


def test_unknown_versions_and_sketch_ids(catalog: Catalog, make_sketch: MakeSketch) -> None:
    sketch = make_sketch(name="daily")
    with pytest.raises(NotFoundError, match="sketch 'daily' has no version 7; it has versions 1 to 1"):
        catalog.get_version(sketch.id, 7)
    with pytest.raises(NotFoundError, match="no sketch has id 999"):
        catalog.latest_version(999)
    with pytest.raises(NotFoundError, match="no sketch has id 999"):
        catalog.commit_version(999, 1, version({"orders": 2}), [], 5)


def _chunked(operator_id: str, payload: bytes, *chunks: bytes, calls: list[bytes] | None = None) -> StateBlob:
    """A blob naming ``chunks`` by digest; each chunk's bytes are appended to ``calls`` when the catalog asks."""
    def data(c: bytes) -> Callable[[], bytes]:
        return lambda: calls.append(c) or c if calls is not None else c  # type: ignore[func-returns-value]
    return StateBlob(operator_id, "arrow-ipc", 2, payload,
                     chunks={hashlib.sha256(c).hexdigest(): data(c) for c in chunks})


def _chunk_rows(catalog: Catalog, sketch_id: int) -> list[str]:
    with catalog.engine.connect() as conn:
        return list(conn.execute(sa.text("SELECT digest FROM state_chunk WHERE sketch_id = :s ORDER BY digest"),
                                 {"s": sketch_id}).scalars())


def test_a_chunk_is_written_once_and_released_with_the_last_state_naming_it(catalog: Catalog,
                                                                            make_sketch: MakeSketch) -> None:
    big, other = b"base rows " * 1000, b"compacted again"
    digest, other_digest = hashlib.sha256(big).hexdigest(), hashlib.sha256(other).hexdigest()
    calls: list[bytes] = []
    sketch = make_sketch(states=[_chunked("topk@0", b"v1", big, calls=calls)])
    assert calls == [big] and _chunk_rows(catalog, sketch.id) == [digest]
    for n in (2, 3):  # versions keeping the base: the catalog holds it, its bytes are not asked for
        catalog.commit_version(sketch.id, n - 1, version({"orders": n}), [_chunked("topk@0", b"v", big, calls=calls)],
                               2)
    assert calls == [big]
    state = catalog.load_states(sketch.id, 3)["topk@0"]
    assert list(state.chunks) == [digest] and state.chunks[digest]() == big
    catalog.commit_version(sketch.id, 3, version({"orders": 4}), [_chunked("topk@0", b"v4", other, calls=calls)], 2)
    assert calls == [big, other] and sorted(_chunk_rows(catalog, sketch.id)) == sorted([digest, other_digest])
    catalog.commit_version(sketch.id, 4, version({"orders": 5}), [_chunked("topk@0", b"v5", other)], 2)
    assert _chunk_rows(catalog, sketch.id) == [other_digest]  # version 3 left retention: its base went with it
    with pytest.raises(StateError, match="no longer holds.*recapture"):
        catalog.load_chunk(sketch.id, digest)
    catalog.drop_sketch("q")
    assert _chunk_rows(catalog, sketch.id) == []


def test_a_chunk_not_matching_its_digest_is_not_written(catalog: Catalog, make_sketch: MakeSketch) -> None:
    sketch = make_sketch()
    bad = StateBlob("topk@0", "arrow-ipc", 2, b"v2", chunks={"0" * 64: lambda: b"something else"})
    with pytest.raises(StateError, match="does not match its digest"):
        catalog.commit_version(sketch.id, 1, version({"orders": 2}), [bad], 5)
    assert len(catalog.versions(sketch.id)) == 1 and _chunk_rows(catalog, sketch.id) == []


def _writer(parts: list[bytes], fail_after: int | None = None) -> Callable[[PartSink], list[StateBlob]]:
    """A state writer handing ``parts`` to the catalog's sink one at a time (raising after ``fail_after`` of them),
    then returning a blob that names them."""
    def write(sink: PartSink) -> list[StateBlob]:
        for n, part in enumerate(parts):
            if n == fail_after:
                raise StateError("the writer failed half-way")
            sink(hashlib.sha256(part).hexdigest(), part)
        return [_chunked("aggregation@0", b"header", *parts)]
    return write


def test_a_writer_streams_parts_into_the_commit(catalog: Catalog, make_sketch: MakeSketch) -> None:
    """Parts handed to the sink are stored in the committing transaction and named with the blob: a failure before
    the commit leaves none of them, a commit keeps them for as long as a state names them."""
    first, second = b"rows 0-999 " * 100, b"rows 1000-1999 " * 100
    digests = sorted(hashlib.sha256(p).hexdigest() for p in (first, second))
    sketch = make_sketch(states=_writer([first, second]))
    assert _chunk_rows(catalog, sketch.id) == digests
    state = catalog.load_states(sketch.id, 1)["aggregation@0"]
    assert sorted(state.chunks) == digests and state.chunks[hashlib.sha256(second).hexdigest()]() == second
    with pytest.raises(StateError, match="half-way"):
        catalog.commit_version(sketch.id, 1, version({"orders": 2}), _writer([b"new part", b"other"], 1), 1)
    assert len(catalog.versions(sketch.id)) == 1 and _chunk_rows(catalog, sketch.id) == digests
    with pytest.raises(StateError, match="does not match its digest"):
        catalog.commit_version(sketch.id, 1, version({"orders": 2}),
                               lambda sink: sink("0" * 64, b"something else") or [], 1)
    assert len(catalog.versions(sketch.id)) == 1
    catalog.commit_version(sketch.id, 1, version({"orders": 2}), _writer([second, b"new part"]), 1)
    assert _chunk_rows(catalog, sketch.id) == sorted(hashlib.sha256(p).hexdigest() for p in (second, b"new part"))


def test_chunks_are_immutable(catalog: Catalog, make_sketch: MakeSketch) -> None:
    sketch = make_sketch(states=[_chunked("topk@0", b"v1", b"rows")])
    with pytest.raises(sa.exc.DBAPIError, match="immutable"), catalog.engine.begin() as conn:
        conn.execute(sa.text("UPDATE state_chunk SET payload = 'x' WHERE sketch_id = :s"), {"s": sketch.id})

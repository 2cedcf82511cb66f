"""A top-k sketch's rest stored as a state chunk (``imp_core.engine.state.Chunk``) on real Spark, Delta and the
catalog: versions that keep the base reference the stored copy and never read it; a refill reads it once; the chunks
the catalog holds are exactly the ones kept state names; the sketch equals a recapture and Spark answers the same with
and without it; a chunk changed in the catalog is caught when read and the sketch recaptured."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
import sqlalchemy as sa
from deltalake import DeltaTable, write_deltalake

from imp_core.catalog.versions import VersionStore
from imp_core.engine import state
from tests.oracles import answers_with_and_without_sketch, canonical

pytestmark = [pytest.mark.spark, pytest.mark.postgres]

SQL = "SELECT g, v FROM chunky ORDER BY v DESC, g LIMIT 5"
N = 3000  # rows: the head keeps about k + 512, the rest goes to the base


def _sketch(service, tmp_path: Path) -> str:  # noqa: ANN001
    """A table of N rows and the top-k sketch ``chunky_s`` on it; returns the table's path."""
    path = str(tmp_path / "chunky")
    write_deltalake(path, pa.table({"g": list(range(N)), "v": [float((i * 7919) % N) for i in range(N)]}),
                    configuration={"delta.enableChangeDataFeed": "true"})
    service.register_table("chunky", path, replace=True)
    service.create_sketch("chunky_s", SQL, ["chunky.g"], bounds=[f"0,{N // 4},{N // 2},{3 * N // 4},{N}"])
    return path


def _chunks(service, sketch_id: int) -> tuple[set[str], set[str]]:  # noqa: ANN001
    """The chunks the catalog holds for a sketch, and the ones its kept operator state names."""
    with service.catalog.engine.connect() as conn:
        held = set(conn.execute(sa.text("SELECT digest FROM state_chunk WHERE sketch_id = :s"),
                                {"s": sketch_id}).scalars())
        named = set(conn.execute(sa.text("SELECT DISTINCT unnest(chunks) FROM operator_state WHERE sketch_id = :s"),
                                 {"s": sketch_id}).scalars())
    return held, named


def test_a_topk_base_is_written_once_and_read_only_for_a_refill(service, tmp_path: Path,  # noqa: ANN001
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state, "DETACH_FROM", 0)  # every base is a chunk (in production from 8 MB)
    reads: list[str] = []
    load_chunk = VersionStore.load_chunk

    def counted(self, sketch_id: int, digest: str) -> bytes:  # noqa: ANN001
        reads.append(digest)
        return load_chunk(self, sketch_id, digest)

    monkeypatch.setattr(VersionStore, "load_chunk", counted)
    path = _sketch(service, tmp_path)
    try:
        sketch_id = service.catalog.get_sketch("chunky_s").id
        [first] = _chunks(service, sketch_id)[0]
        # rows ranked after the head: appended to the log, the base stays the stored chunk and is not read
        write_deltalake(path, pa.table({"g": [N + i for i in range(20)], "v": [-1.0 - i for i in range(20)]}),
                        mode="append")
        kept = service.maintain("chunky_s").versions[-1]
        assert kept.method == "incremental" and reads == [] and _chunks(service, sketch_id) == ({first}, {first})
        # deleting the head's rows leaves fewer than k: the head is refilled from the base, read once
        DeltaTable(path).delete(f"v >= {N - 600}")
        refilled = service.maintain("chunky_s").versions[-1]
        assert refilled.method == "incremental" and reads == [first]
        held, named = _chunks(service, sketch_id)
        assert held == named and len(held) == 2  # the refill's new base, and the old one kept by retention
        assert service.recapture("chunky_s").fragments == refilled.fragments
        with_sketch, without = answers_with_and_without_sketch(service, SQL)
        assert with_sketch.sketch is not None and canonical(with_sketch.rows) == canonical(without.rows)
    finally:
        service.drop_sketch("chunky_s")
    assert _chunks(service, sketch_id) == (set(), set())


def test_a_changed_chunk_is_caught_when_read_and_the_sketch_recaptured(service, tmp_path: Path,  # noqa: ANN001
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state, "DETACH_FROM", 0)
    path = _sketch(service, tmp_path)
    try:
        sketch_id = service.catalog.get_sketch("chunky_s").id
        with service.catalog.engine.begin() as conn:  # a catalog writer swaps the bytes (trigger switched off)
            conn.execute(sa.text("SET LOCAL session_replication_role = replica"))
            conn.execute(sa.text("UPDATE state_chunk SET payload = payload || '\\x00'::bytea WHERE sketch_id = :s"),
                         {"s": sketch_id})
        DeltaTable(path).delete(f"v >= {N - 600}")  # a refill: the base is read
        done = service.maintain("chunky_s")
        assert done.recaptured is not None and "corrupt" in done.recaptured
        assert done.versions[-1].method == "recapture" and "corrupt" in done.versions[-1].reason
        with_sketch, without = answers_with_and_without_sketch(service, SQL)
        assert canonical(with_sketch.rows) == canonical(without.rows)
    finally:
        service.drop_sketch("chunky_s")


def test_state_streamed_as_parts_is_loaded_for_the_next_pass(service, tmp_path: Path,  # noqa: ANN001
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Every frame written as parts of a few rows (in production frames from 32 MB, in 16 MB parts): the commit
    stores them with the version, the next run loads them (incremental, no recapture), the kept state names exactly
    the chunks the catalog holds, and the sketch equals a recapture and answers like Spark without it."""
    monkeypatch.setattr(state, "PART_FROM", 0)
    monkeypatch.setattr(state, "PART_BYTES", 256)
    sql = "SELECT g % 7 AS k, count(*) AS n, min(v) AS lo, sum(DISTINCT g) AS s FROM parted GROUP BY g % 7 " \
          "HAVING count(*) > 2"
    path = str(tmp_path / "parted")
    write_deltalake(path, pa.table({"g": list(range(N)), "v": [float((i * 7919) % N) for i in range(N)]}),
                    configuration={"delta.enableChangeDataFeed": "true"})
    service.register_table("parted", path, replace=True)
    service.create_sketch("parted_s", sql, ["parted.g"], bounds=[f"0,{N // 4},{N // 2},{3 * N // 4},{N}"])
    try:
        sketch_id = service.catalog.get_sketch("parted_s").id
        with service.catalog.engine.connect() as conn:
            versions = set(conn.execute(sa.text("SELECT format_version FROM operator_state WHERE sketch_id = :s"),
                                        {"s": sketch_id}).scalars())
            sizes = conn.execute(sa.text("SELECT (SELECT sum(size_bytes) FROM operator_state WHERE sketch_id = :s), "
                                         "(SELECT sum(size_bytes) FROM state_chunk WHERE sketch_id = :s)"),
                                 {"s": sketch_id}).one()
        held, named = _chunks(service, sketch_id)
        assert versions == {state.PARTS_VERSION} and held == named and len(held) > 20
        assert sizes[0] > sizes[1]  # a state's recorded size counts its parts
        DeltaTable(path).delete("g % 5 = 0")
        write_deltalake(path, pa.table({"g": [N + i for i in range(50)], "v": [-1.0 - i for i in range(50)]}),
                        mode="append")
        done = service.maintain("parted_s")
        assert done.recaptured is None and done.versions[-1].method == "incremental"
        held, named = _chunks(service, sketch_id)
        assert held == named
        assert service.recapture("parted_s").fragments == done.versions[-1].fragments
        with_sketch, without = answers_with_and_without_sketch(service, sql)
        assert with_sketch.sketch is not None and canonical(with_sketch.rows) == canonical(without.rows)
    finally:
        service.drop_sketch("parted_s")
    assert _chunks(service, sketch_id) == (set(), set())

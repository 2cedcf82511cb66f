"""Sketch versions in the catalog: immutable versions, committing a new one with its operator state, retention.

Part of :class:`imp_core.catalog.store.Catalog`; see docs/ARCHITECTURE.md, "State and versions".
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import sqlalchemy as sa

from imp_core import faults
from imp_core.catalog.connection import UNIQUE_VIOLATION, CatalogConnection, as_json, sqlstate
from imp_core.catalog.records import NewVersion, StateBlob, States, VersionRecord, unusable_message, version_record
from imp_core.errors import ConcurrentMaintenanceError, NotFoundError, SketchUnusableError, StateError, UsageError
from imp_core.security import integrity


class VersionStore(CatalogConnection):
    """The ``sketch_version``, ``operator_state`` and ``state_chunk`` tables."""

    def latest_version(self, sketch_id: int) -> VersionRecord:
        """The latest committed version of a sketch.

        Raises:
            NotFoundError: The sketch does not exist.
        """
        with self._transaction(f"read the latest version of sketch {sketch_id}") as conn:
            row = conn.execute(
                sa.text("SELECT * FROM sketch_version WHERE sketch_id = :s ORDER BY version DESC LIMIT 1"),
                {"s": sketch_id},
            ).mappings().first()
            if row is None:
                raise NotFoundError(f"sketch {self._sketch_label(conn, sketch_id)} has no versions")
            return version_record(row)

    def get_version(self, sketch_id: int, version: int) -> VersionRecord:
        """Version ``version`` of a sketch.

        Raises:
            NotFoundError: The sketch or the version does not exist (the message gives the valid range).
        """
        with self._transaction(f"read version {version} of sketch {sketch_id}") as conn:
            row = conn.execute(sa.text("SELECT * FROM sketch_version WHERE sketch_id = :s AND version = :v"),
                               {"s": sketch_id, "v": version}).mappings().first()
            if row is None:
                raise self._version_not_found(conn, sketch_id, f"version {version}")
            return version_record(row)

    def versions(self, sketch_id: int) -> list[VersionRecord]:
        """Every version of a sketch, oldest first."""
        with self._transaction(f"list versions of sketch {sketch_id}") as conn:
            rows = conn.execute(sa.text("SELECT * FROM sketch_version WHERE sketch_id = :s ORDER BY version"),
                                {"s": sketch_id}).mappings()
            return [version_record(r) for r in rows]

    def recent_versions(self, sketch_ids: Sequence[int], limit: int = 20) -> dict[int, list[dict[str, Any]]]:
        """The newest ``limit`` versions of each sketch, oldest first, without bits or state (one query): per
        version its number, method, change rows, duration, creation time and table versions."""
        if not sketch_ids:
            return {}
        with self._transaction("read the recent versions of sketches") as conn:
            rows = conn.execute(sa.text(
                "SELECT sketch_id, version, method, delta_rows, duration_ms, created_at, table_versions FROM ("
                "SELECT *, row_number() OVER (PARTITION BY sketch_id ORDER BY version DESC) AS n FROM sketch_version "
                "WHERE sketch_id = ANY(:ids)) recent WHERE n <= :lim ORDER BY sketch_id, version"),
                {"ids": list(sketch_ids), "lim": limit}).mappings()
            out: dict[int, list[dict[str, Any]]] = {}
            for r in rows:
                out.setdefault(r["sketch_id"], []).append({k: r[k] for k in r.keys() if k != "sketch_id"})
            return out

    def version_as_of_table_version(self, sketch_id: int, table: str, table_version: int) -> VersionRecord:
        """The latest sketch version that reflects table ``table`` at Delta version ``table_version`` or earlier.

        Raises:
            NotFoundError: The sketch does not read ``table``, or its first version is already past
                ``table_version``.
        """
        with self._transaction(f"find the version of sketch {sketch_id} as of {table}@{table_version}") as conn:
            row = conn.execute(
                sa.text("SELECT * FROM sketch_version WHERE sketch_id = :s AND (table_versions ->> :t) IS NOT NULL "
                        "AND (table_versions ->> :t)::bigint <= :tv ORDER BY version DESC LIMIT 1"),
                {"s": sketch_id, "t": table, "tv": table_version},
            ).mappings().first()
            if row is None:
                first = conn.execute(
                    sa.text("SELECT table_versions FROM sketch_version WHERE sketch_id = :s ORDER BY version LIMIT 1"),
                    {"s": sketch_id},
                ).scalar()
                label = self._sketch_label(conn, sketch_id)
                if first is None:
                    raise NotFoundError(f"sketch {label} has no versions")
                if table not in first:
                    raise NotFoundError(f"sketch {label} does not read table {table!r}; it reads "
                                        f"{', '.join(sorted(first)) or 'no tables'}")
                raise NotFoundError(f"sketch {label} has no version as of {table} version {table_version}: its first "
                                    f"version reflects {table} version {first[table]}")
            return version_record(row)

    def commit_version(
        self, sketch_id: int, expected_previous: int, new: NewVersion, states: States, retention: int,
        safety: Any = None,
    ) -> VersionRecord:
        """Commit version ``expected_previous + 1`` of a sketch with its operator state, then apply retention.

        One transaction: the version row, its state (chunks the catalog does not hold yet included), and deleting
        operator state of versions older than the latest ``retention`` (their version rows stay) with the chunks no
        state references any more. Serialized per sketch by a row lock on the sketch, so the check
        "nobody committed since ``expected_previous``" and the insert cannot interleave with another committer.

        Args:
            sketch_id: The sketch.
            expected_previous: The version this one was computed from.
            new: The new version.
            states: Operator state of the new version: blobs, or a writer run inside the transaction (its parts are
                stored as it hands them over, so a large state is never held encoded whole).
            retention: Keep operator state for this many latest versions (at least 1).
            safety: A safety verdict re-checked for this version (a recapture's), stored with the sketch in the
                same transaction so the sign assumptions later batches check always belong to the latest version.

        Returns:
            The committed version.

        Raises:
            ConcurrentMaintenanceError: Another maintainer already committed after ``expected_previous``.
            NotFoundError: The sketch does not exist or was dropped.
            SketchUnusableError: The sketch was marked unusable meanwhile (nothing is committed).
            UsageError: ``retention`` is below 1, or two state blobs share an operator id.
        """
        if retention < 1:
            raise UsageError(f"state retention must be at least 1 (keep state of the latest version), got {retention}")
        version = expected_previous + 1
        with self._transaction(f"commit version {version} of sketch {sketch_id}") as conn:
            sketch = conn.execute(sa.text("SELECT name, dropped_at, unusable_reason FROM sketch WHERE id = :s "
                                          "FOR UPDATE"), {"s": sketch_id}).first()
            if sketch is None:
                raise NotFoundError(f"no sketch has id {sketch_id}; see `imp sketch list`")
            if sketch.dropped_at is not None:
                raise NotFoundError(f"sketch {sketch.name!r} was dropped while it was being maintained; "
                                    f"nothing was committed")
            if sketch.unusable_reason is not None:
                raise SketchUnusableError(unusable_message(sketch.name, sketch.unusable_reason))
            latest = conn.execute(sa.text("SELECT max(version) FROM sketch_version WHERE sketch_id = :s"),
                                  {"s": sketch_id}).scalar()
            if latest != expected_previous:
                raise ConcurrentMaintenanceError(
                    f"sketch {sketch.name!r}: cannot commit version {version} on top of version {expected_previous}, "
                    f"the latest committed version is {latest} (another maintainer got there first); "
                    f"maintain again from version {latest}"
                )
            blobs = prepared_states(written(conn, sketch_id, states), sketch.name, version, self._state_key)
            try:
                record = insert_version(conn, sketch_id, version, new, blobs)
            except sa.exc.IntegrityError as e:
                # Only reachable if a writer bypassed the row lock; the primary key still keeps versions unique.
                if sqlstate(e) == UNIQUE_VIOLATION:
                    raise ConcurrentMaintenanceError(f"sketch {sketch.name!r}: version {version} was committed by "
                                                     f"another maintainer; maintain again") from e
                raise
            if safety is not None:
                conn.execute(sa.text("UPDATE sketch SET safety = CAST(:j AS jsonb) WHERE id = :s"),
                             {"s": sketch_id, "j": as_json(safety)})
            faults.point("in_commit")
            conn.execute(sa.text("DELETE FROM operator_state WHERE sketch_id = :s AND version <= :v"),
                         {"s": sketch_id, "v": version - retention})
            release_chunks(conn, sketch_id)
            return record

    # -- operator state

    def load_states(self, sketch_id: int, version: int) -> dict[str, StateBlob]:
        """Operator state of a sketch version, by operator id, each verified against its checksum.

        Returns:
            Possibly empty (stateless plan, or state removed by retention; see :meth:`has_states`). The chunks a blob
            names are read when asked for (:meth:`load_chunk`).

        Raises:
            StateError: A payload does not match its checksum.
        """
        with self._transaction(f"load operator state of sketch {sketch_id} version {version}") as conn:
            rows = conn.execute(
                sa.text("SELECT operator_id, format, format_version, payload, checksum, chunks FROM operator_state "
                        "WHERE sketch_id = :s AND version = :v ORDER BY operator_id"),
                {"s": sketch_id, "v": version},
            ).all()
            out: dict[str, StateBlob] = {}
            name = (self._sketch_name(conn, sketch_id) or f"#{sketch_id}") if rows else ""
            for row in rows:
                payload = bytes(row.payload)
                if not _verify(self._state_key, name, version, row.operator_id, payload, row.checksum):
                    raise StateError(
                        f"operator state of sketch {name} version {version} is corrupt (checksum mismatch for "
                        f"operator {row.operator_id}: changed after it was written, or sealed with another state "
                        f"key); run `imp sketch recapture {name}`"
                    )
                out[row.operator_id] = StateBlob(row.operator_id, row.format, row.format_version, payload,
                                                 checksum(payload),
                                                 {d: partial(self.load_chunk, sketch_id, d) for d in row.chunks})
            return out

    def load_chunk(self, sketch_id: int, digest: str) -> bytes:
        """The bytes of a state chunk of a sketch (the caller checks them against ``digest``, which it took from a
        sealed blob).

        Raises:
            StateError: The catalog holds no such chunk for the sketch.
        """
        with self._transaction(f"load state chunk {digest[:12]} of sketch {sketch_id}") as conn:
            payload = conn.execute(sa.text("SELECT payload FROM state_chunk WHERE sketch_id = :s AND digest = :d"),
                                   {"s": sketch_id, "d": digest}).scalar()
            if payload is None:
                name = self._sketch_name(conn, sketch_id) or f"#{sketch_id}"
                raise StateError(f"sketch {name}: its operator state names the state chunk {digest[:12]}, which the "
                                 f"catalog no longer holds (the state was dropped, or the row deleted by hand); "
                                 f"recapture the sketch (`imp sketch recapture {name}`)")
            return bytes(payload)

    def has_states(self, sketch_id: int, version: int) -> bool:
        """Whether any operator state is stored for this sketch version."""
        with self._transaction(f"check operator state of sketch {sketch_id} version {version}") as conn:
            return bool(conn.execute(
                sa.text("SELECT EXISTS (SELECT 1 FROM operator_state WHERE sketch_id = :s AND version = :v)"),
                {"s": sketch_id, "v": version},
            ).scalar())
    def _version_not_found(self, conn: sa.Connection, sketch_id: int, what: str) -> NotFoundError:
        label = self._sketch_label(conn, sketch_id)
        latest = conn.execute(sa.text("SELECT max(version) FROM sketch_version WHERE sketch_id = :s"),
                              {"s": sketch_id}).scalar()
        have = f"it has versions 1 to {latest}" if latest else "it has no versions"
        return NotFoundError(f"sketch {label} has no {what}; {have}")


def insert_version(
    conn: sa.Connection, sketch_id: int, version: int, new: NewVersion, blobs: list[dict[str, Any]]
) -> VersionRecord:
    """Insert version ``version`` of a sketch and its prepared operator state (:func:`prepared_states`) on ``conn``."""
    row = conn.execute(
        sa.text("INSERT INTO sketch_version (sketch_id, version, table_versions, bits, fragments, method, reason, "
                "delta_rows, duration_ms, run_id, table_identities, state_options, partitions, fragment_rows, "
                "state_placement) "
                "VALUES (:s, :v, CAST(:tv AS jsonb), CAST(:bits AS jsonb), CAST(:frags AS jsonb), :m, :reason, :dr, "
                ":dur, :run, CAST(:ids AS jsonb), CAST(:opts AS jsonb), CAST(:parts AS jsonb), "
                "CAST(:rows AS jsonb), CAST(:place AS jsonb)) RETURNING *"),
        {"s": sketch_id, "v": version,
         "tv": as_json({t: int(v) for t, v in new.table_versions.items()}),
         "bits": as_json({t: bytes(b).hex() for t, b in new.bits.items()}),
         "frags": as_json({t: sorted(int(f) for f in frags) for t, frags in new.fragments.items()}),
         "m": new.method, "reason": new.reason, "dr": new.delta_rows, "dur": new.duration_ms, "run": new.run_id,
         "ids": as_json({t: dict(i) for t, i in new.table_identities.items()}
                        if new.table_identities is not None else None),
         "opts": as_json(dict(new.state_options) if new.state_options is not None else None),
         "parts": as_json(new.partitions),
         "rows": as_json({t: [int(n) for n in c] for t, c in new.fragment_rows.items()}
                         if new.fragment_rows is not None else None),
         "place": as_json({op: dict(p) for op, p in new.state_placement.items()}
                          if new.state_placement is not None else None)},
    ).mappings().one()
    if blobs:
        store_chunks(conn, sketch_id, {d: f for b in blobs for d, f in b["data"].items()})
        conn.execute(
            sa.text("INSERT INTO operator_state (sketch_id, version, operator_id, format, format_version, "
                    "payload, checksum, size_bytes, chunks) VALUES (:s, :v, :op, :fmt, :fv, :payload, :sum, :size, "
                    ":chunks)"),
            [{"s": sketch_id, "v": version, **{k: v for k, v in b.items() if k != "data"}} for b in blobs],
        )
    return version_record(row)


def written(conn: sa.Connection, sketch_id: int, states: States) -> Sequence[StateBlob]:
    """The blobs of ``states``; a writer is run now, its parts stored on ``conn`` as it hands them over."""
    if not callable(states):
        return states

    return states(lambda digest, data: _insert_chunk(conn, sketch_id, digest, data))


def store_chunks(conn: sa.Connection, sketch_id: int, chunks: Mapping[str, Callable[[], bytes]]) -> None:
    """Insert the chunks the catalog does not hold for the sketch yet (their bytes are asked for only then).

    Raises:
        StateError: A chunk's bytes do not match its digest.
    """
    if not chunks:
        return
    held = set(conn.execute(sa.text("SELECT digest FROM state_chunk WHERE sketch_id = :s AND digest = ANY(:d)"),
                            {"s": sketch_id, "d": sorted(chunks)}).scalars())
    for digest in sorted(set(chunks) - held):
        _insert_chunk(conn, sketch_id, digest, bytes(chunks[digest]()))


def _insert_chunk(conn: sa.Connection, sketch_id: int, digest: str, payload: bytes) -> None:
    """Store a chunk or part under its digest (kept if the sketch holds it already), checked against it first.

    Raises:
        StateError: The bytes do not match the digest.
    """
    if checksum(payload) != digest:
        raise StateError(f"state chunk {digest[:12]} of sketch {sketch_id} does not match its digest; it was "
                         f"changed after it was produced")
    conn.execute(sa.text("INSERT INTO state_chunk (sketch_id, digest, payload, size_bytes) VALUES (:s, :d, :p, :n) "
                         "ON CONFLICT (sketch_id, digest) DO NOTHING"),
                 {"s": sketch_id, "d": digest, "p": payload, "n": len(payload)})


def release_chunks(conn: sa.Connection, sketch_id: int) -> None:
    """Delete the sketch's chunks no operator state references any more (after state was deleted)."""
    conn.execute(sa.text("DELETE FROM state_chunk c WHERE c.sketch_id = :s AND NOT EXISTS (SELECT 1 FROM "
                         "operator_state o WHERE o.sketch_id = :s AND c.digest = ANY(o.chunks))"), {"s": sketch_id})


def checksum(payload: bytes) -> str:
    """The plain checksum of a payload: sha256, hex (what :class:`StateBlob` carries)."""
    return hashlib.sha256(payload).hexdigest()


def _seal(key: bytes | None, sketch: str, version: int, operator_id: str, payload: bytes) -> str:
    """What ``operator_state.checksum`` stores: the keyed checksum, or sha256 for a catalog opened without a key."""
    return integrity.seal(key, sketch, version, operator_id, payload) if key else checksum(payload)


def _verify(key: bytes | None, sketch: str, version: int, operator_id: str, payload: bytes, stored: str) -> bool:
    """Whether ``stored`` is the checksum :func:`_seal` gives for this payload."""
    if key:
        return integrity.verify(key, sketch, version, operator_id, payload, stored)
    return checksum(payload) == stored


def prepared_states(states: Sequence[StateBlob], sketch: str, version: int,
                    key: bytes | None = None) -> list[dict[str, Any]]:
    """Operator state as insert parameters for :func:`insert_version`, each sealed for its version.

    Raises:
        UsageError: Two blobs share an operator id.
        StateError: A blob does not match the checksum it came with.
    """
    seen: set[str] = set()
    out = []
    for blob in states:
        if blob.operator_id in seen:
            raise UsageError(f"two operator states for operator {blob.operator_id!r} of sketch {sketch!r} "
                             f"version {version}; operator ids must be unique")
        seen.add(blob.operator_id)
        payload = bytes(blob.payload)
        digest = checksum(payload)
        if blob.checksum is not None and blob.checksum != digest:
            raise StateError(f"operator state {blob.operator_id!r} of sketch {sketch!r} version {version} does not "
                             f"match the checksum it came with; it was changed after it was produced")
        out.append({"op": blob.operator_id, "fmt": blob.format, "fv": blob.format_version, "payload": payload,
                    "sum": _seal(key, sketch, version, blob.operator_id, payload),
                    "size": len(payload) + blob.parts_bytes, "chunks": sorted(blob.chunks), "data": dict(blob.chunks)})
    return out


__all__ = ["VersionStore", "checksum", "insert_version", "prepared_states", "release_chunks", "store_chunks",
           "written"]

"""Sketches in the catalog: registering one with its first version, looking sketches up, dropping, marking
unusable, and the ``sketch_catalog`` view.

Part of :class:`imp_core.catalog.store.Catalog`; see docs/ARCHITECTURE.md, "State and versions".
"""

from __future__ import annotations

import dataclasses
from typing import Any

import sqlalchemy as sa

from imp_core.catalog.connection import UNIQUE_VIOLATION, CatalogConnection, as_json, listed, sqlstate
from imp_core.catalog.records import NewVersion, SketchRecord, States, sketch_record
from imp_core.catalog.versions import insert_version, prepared_states, written
from imp_core.errors import NotFoundError, UsageError


class SketchStore(CatalogConnection):
    """The ``sketch`` table and the ``sketch_catalog`` view."""

    def create_sketch(
        self,
        name: str,
        sql: str,
        dialect: str | None,
        template_key: str,
        plan_json: Any,
        partitions: Any,
        safety: Any,
        strategy: str,
        first_version: NewVersion,
        states: States,
        run_id: int | None = None,
        replaces: int | None = None,
        signature: Any = None,
    ) -> SketchRecord:
        """Register a sketch together with its captured version 1 and that version's operator state, atomically.

        Args:
            name: Unique among live sketches.
            sql: The query.
            dialect: SQL dialect of ``sql`` (sqlglot name).
            template_key: Key of the query template the sketch answers.
            plan_json: The analysed plan, for display and debugging.
            partitions: The partition set (JSON).
            safety: Result of the safety check (JSON).
            strategy: Maintenance strategy (``lazy`` or ``eager``).
            first_version: The captured sketch, committed as version 1.
            states: Operator state of version 1 (blobs, or a writer run inside the transaction).
            run_id: The maintenance run that captured it (also linked to the new sketch); defaults to
                ``first_version.run_id``.
            replaces: The id of the live sketch of that name this one replaces: dropped in the same transaction.
            signature: The Spark plan signature (:mod:`imp_core.publish.signature`), if computed.

        Returns:
            The new sketch.

        Raises:
            UsageError: A live sketch named ``name`` exists (the catalog is left unchanged).
        """
        run_id = run_id if run_id is not None else first_version.run_id
        with self._transaction(f"create sketch {name!r}") as conn:
            if replaces is not None:
                self._drop(conn, name, replaces)
            try:
                row = conn.execute(
                    sa.text("INSERT INTO sketch (name, sql, dialect, template_key, plan_json, partitions, safety, "
                            "strategy, signature) VALUES (:name, :sql, :dialect, :tk, CAST(:plan AS jsonb), "
                            "CAST(:parts AS jsonb), CAST(:safety AS jsonb), :strategy, CAST(:sig AS jsonb)) "
                            "RETURNING *"),
                    {"name": name, "sql": sql, "dialect": dialect, "tk": template_key, "plan": as_json(plan_json),
                     "parts": as_json(partitions), "safety": as_json(safety), "strategy": strategy,
                     "sig": None if signature is None else as_json(signature)},
                ).mappings().one()
            except sa.exc.IntegrityError as e:
                if sqlstate(e) == UNIQUE_VIOLATION:
                    raise UsageError(f"sketch {name!r} already exists; pick another name or drop it "
                                     f"(`imp sketch drop {name}`)") from e
                raise
            sketch = sketch_record(row)
            if run_id is not None:
                conn.execute(sa.text("UPDATE maintenance_run SET sketch_id = :s WHERE id = :r AND sketch_id IS NULL"),
                             {"s": sketch.id, "r": run_id})
            blobs = prepared_states(written(conn, sketch.id, states), name, 1, self._state_key)
            insert_version(conn, sketch.id, 1, dataclasses.replace(first_version, run_id=run_id), blobs)
            return sketch

    def get_sketch(self, name: str) -> SketchRecord:
        """The live sketch ``name``.

        Raises:
            NotFoundError: No live sketch has that name.
        """
        with self._transaction(f"read sketch {name!r}") as conn:
            row = conn.execute(sa.text("SELECT * FROM sketch WHERE name = :n AND dropped_at IS NULL"),
                               {"n": name}).mappings().first()
            if row is None:
                raise self._sketch_not_found(conn, name)
            return sketch_record(row)

    def get_sketch_by_id(self, sketch_id: int) -> SketchRecord:
        """The sketch with internal id ``sketch_id`` (dropped ones included: their versions stay readable).

        Raises:
            NotFoundError: No sketch has that id.
        """
        with self._transaction(f"read sketch {sketch_id}") as conn:
            row = conn.execute(sa.text("SELECT * FROM sketch WHERE id = :i"), {"i": sketch_id}).mappings().first()
            if row is None:
                raise NotFoundError(f"no sketch has id {sketch_id}; see `imp sketch list`")
            return sketch_record(row)

    def list_sketches(self) -> list[SketchRecord]:
        """Every live sketch, by name."""
        with self._transaction("list sketches") as conn:
            rows = conn.execute(sa.text("SELECT * FROM sketch WHERE dropped_at IS NULL ORDER BY name")).mappings()
            return [sketch_record(r) for r in rows]

    def drop_sketch(self, name: str) -> None:
        """Drop the live sketch ``name``: its name becomes free, its versions stay for the record.

        Its operator state is deleted (a dropped sketch is never maintained again).

        Raises:
            NotFoundError: No live sketch has that name.
        """
        with self._transaction(f"drop sketch {name!r}") as conn:
            self._drop(conn, name)

    def _drop(self, conn: sa.Connection, name: str, sketch_id: int | None = None) -> None:
        """Drop the live sketch ``name`` (only if its id is ``sketch_id``, when given) and delete its state."""
        dropped = conn.execute(
            sa.text("UPDATE sketch SET dropped_at = now() WHERE name = :n AND dropped_at IS NULL "
                    "AND (CAST(:i AS bigint) IS NULL OR id = :i) RETURNING id"),
            {"n": name, "i": sketch_id},
        ).scalar()
        if dropped is None:
            if sketch_id is not None:
                raise UsageError(f"sketch {name!r} was dropped or replaced by another process meanwhile; run the "
                                 f"command again")
            raise self._sketch_not_found(conn, name)
        conn.execute(sa.text("DELETE FROM operator_state WHERE sketch_id = :s"), {"s": dropped})
        conn.execute(sa.text("DELETE FROM state_chunk WHERE sketch_id = :s"), {"s": dropped})

    def set_signature(self, sketch_id: int, signature: Any) -> None:
        """Record the Spark plan signature of a sketch (:mod:`imp_core.publish.signature`)."""
        with self._transaction(f"record the signature of sketch {sketch_id}") as conn:
            conn.execute(sa.text("UPDATE sketch SET signature = CAST(:g AS jsonb) WHERE id = :s"),
                         {"g": as_json(signature), "s": sketch_id})

    def mark_published(self, sketch_id: int, version: int) -> None:
        """Record that ``version``'s manifest is published (never moves backwards)."""
        with self._transaction(f"record the published version of sketch {sketch_id}") as conn:
            conn.execute(sa.text("UPDATE sketch SET published_version = :v WHERE id = :s "
                                 "AND (published_version IS NULL OR published_version < :v)"),
                         {"v": version, "s": sketch_id})

    def mark_unusable(self, sketch_id: int, reason: str) -> bool:
        """Mark a sketch unusable: queries run without it, maintenance refuses it, until it is dropped.

        The first reason is kept (a later one does not overwrite it).

        Returns:
            True if this call marked it, False if it was already unusable.

        Raises:
            NotFoundError: No sketch has that id.
        """
        with self._transaction(f"mark sketch {sketch_id} unusable") as conn:
            marked = conn.execute(
                sa.text("UPDATE sketch SET unusable_reason = :r, unusable_at = now() "
                        "WHERE id = :s AND unusable_reason IS NULL RETURNING id"),
                {"s": sketch_id, "r": reason},
            ).scalar()
            if marked is None:
                self._sketch_label(conn, sketch_id)  # raises NotFoundError for an unknown id
            return marked is not None

    def sketch_catalog(self) -> list[dict[str, Any]]:
        """The rows of the ``sketch_catalog`` view (one per live sketch, by name)."""
        with self._transaction("read the sketch catalog view") as conn:
            return [dict(r) for r in conn.execute(sa.text("SELECT * FROM sketch_catalog ORDER BY name")).mappings()]

    def stale_sketches(self) -> list[str]:
        """Names of live, usable sketches whose latest version is behind an observed table version."""
        with self._transaction("list stale sketches") as conn:
            return list(conn.execute(sa.text("SELECT name FROM sketch_catalog WHERE is_stale AND usable "
                                             "ORDER BY name")).scalars())

    def _sketch_not_found(self, conn: sa.Connection, name: str) -> NotFoundError:
        names: list[str] = list(conn.execute(sa.text("SELECT name FROM sketch WHERE dropped_at IS NULL "
                                                     "ORDER BY name")).scalars())
        known = f"existing sketches: {listed(names)}" if names else "no sketches exist yet"
        return NotFoundError(f"no sketch named {name!r} ({known}); create one with `imp sketch create`")


__all__ = ["SketchStore"]

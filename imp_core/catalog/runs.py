"""Maintenance runs in the catalog: each capture or maintenance attempt, from start to its end.

Part of :class:`imp_core.catalog.store.Catalog`; see docs/ARCHITECTURE.md, "State and versions".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa

from imp_core.catalog.connection import as_json
from imp_core.catalog.locks import CAPTURE_LOCK_NAMESPACE, LockStore
from imp_core.catalog.records import FINAL_RUN_STATUSES, RunRecord, default_triggered_by, run_record
from imp_core.errors import CatalogError, NotFoundError, UsageError


class RunStore(LockStore):
    """The ``maintenance_run`` table."""

    def start_run(
        self,
        sketch_id: int | None,
        strategy: str | None,
        trigger: str,
        triggered_by: str | None = None,
        from_version: int | None = None,
        table_versions_from: Mapping[str, int] | None = None,
    ) -> int:
        """Record the start of a capture or maintenance run (committed at once, so a crash leaves it ``running``).

        Args:
            sketch_id: The sketch, or None for a capture that will create it (``create_sketch(run_id=...)`` links it).
            strategy: The maintenance strategy in effect.
            trigger: What started it: ``cli``, ``airflow:<dag_id>/<run_id>``, ...
            triggered_by: Who started it; defaults to ``user@host``.
            from_version: Sketch version the run starts from.
            table_versions_from: Table versions of that sketch version.

        Returns:
            The run id.
        """
        with self._transaction("start a maintenance run") as conn:
            return int(conn.execute(
                sa.text("INSERT INTO maintenance_run (sketch_id, strategy, trigger, triggered_by, from_version, "
                        "table_versions_from) VALUES (:s, :st, :tr, :by, :fv, CAST(:tvf AS jsonb)) RETURNING id"),
                {"s": sketch_id, "st": strategy, "tr": trigger, "by": triggered_by or default_triggered_by(),
                 "fv": from_version, "tvf": as_json(table_versions_from)},
            ).scalar_one())

    def finish_run(
        self,
        run_id: int,
        status: str,
        to_version: int | None = None,
        table_versions_to: Mapping[str, int] | None = None,
        delta_rows: int | None = None,
        error: str | None = None,
        timings: Mapping[str, Any] | None = None,
    ) -> RunRecord:
        """Record how a run ended.

        Args:
            run_id: From :meth:`start_run`.
            status: ``succeeded`` or ``failed``.
            to_version: Sketch version the run committed.
            table_versions_to: Table versions of that sketch version.
            delta_rows: Change rows processed.
            error: The error message of a failed run.
            timings: Phase name -> milliseconds.

        Returns:
            The finished run.

        Raises:
            UsageError: ``status`` is not a final status.
            NotFoundError: No such run.
            CatalogError: The run has already finished.
        """
        if status not in FINAL_RUN_STATUSES:
            raise UsageError(f"a run finishes as {' or '.join(FINAL_RUN_STATUSES)}, not {status!r}")
        with self._transaction(f"finish maintenance run {run_id}") as conn:
            row = conn.execute(
                sa.text("UPDATE maintenance_run SET status = :st, to_version = :tv, "
                        "table_versions_to = CAST(:tvt AS jsonb), delta_rows = :dr, error = :err, "
                        "timings = CAST(:tim AS jsonb), finished_at = now() "
                        "WHERE id = :r AND status = 'running' RETURNING *"),
                {"r": run_id, "st": status, "tv": to_version, "tvt": as_json(table_versions_to), "dr": delta_rows,
                 "err": error, "tim": as_json(timings)},
            ).mappings().first()
            if row is None:
                current = conn.execute(sa.text("SELECT status FROM maintenance_run WHERE id = :r"),
                                       {"r": run_id}).scalar()
                if current is None:
                    raise NotFoundError(f"no maintenance run has id {run_id}; see `imp runs`")
                raise CatalogError(f"maintenance run {run_id} already finished ({current})")
            return run_record(row)

    def abandon_running(self, sketch_id: int) -> int:
        """Mark the sketch's runs still ``running`` as failed: their process died (call with the sketch lock held).

        Returns:
            How many runs were marked.
        """
        with self._transaction("mark abandoned runs") as conn:
            return conn.execute(
                sa.text("UPDATE maintenance_run SET status = 'failed', finished_at = now(), error = 'the process "
                        "running it stopped before finishing (crashed or killed); nothing of it was committed' "
                        "WHERE sketch_id = :s AND status = 'running'"), {"s": sketch_id}).rowcount

    def discard_capture_run(self, run_id: int) -> bool:
        """Delete a capture run that created no sketch (a failed ``sketch create`` leaves nothing behind).

        Returns:
            Whether a row was deleted (False once the run is linked to a sketch).
        """
        with self._transaction(f"discard capture run {run_id}") as conn:
            return bool(conn.execute(sa.text("DELETE FROM maintenance_run WHERE id = :r AND sketch_id IS NULL"),
                                     {"r": run_id}).rowcount)

    def clear_abandoned_captures(self) -> int:
        """Delete capture runs still ``running`` without a sketch whose process died (their capture lock is free).

        Returns:
            How many runs were deleted.
        """
        with self._transaction("list running captures") as conn:
            ids: list[int] = list(conn.execute(sa.text("SELECT id FROM maintenance_run WHERE sketch_id IS NULL "
                                            "AND status = 'running' ORDER BY id")).scalars())
        cleared = 0
        for run_id in ids:
            with self._advisory(run_id, wait=False, namespace=CAPTURE_LOCK_NAMESPACE) as free:
                if free:
                    cleared += self.discard_capture_run(run_id)
        return cleared

    def running_ids(self) -> set[int]:
        """The ids of every run still marked ``running`` (of any sketch, and captures without one yet)."""
        with self._transaction("list running runs") as conn:
            return set(conn.execute(sa.text("SELECT id FROM maintenance_run WHERE status = 'running'")).scalars())

    def get_run(self, run_id: int) -> RunRecord:
        """One maintenance run.

        Raises:
            NotFoundError: No such run.
        """
        with self._transaction(f"read maintenance run {run_id}") as conn:
            row = conn.execute(sa.text("SELECT * FROM maintenance_run WHERE id = :r"), {"r": run_id}).mappings().first()
            if row is None:
                raise NotFoundError(f"no maintenance run has id {run_id}; see `imp runs`")
            return run_record(row)

    def runs(self, sketch_id: int | None = None, limit: int = 50) -> list[RunRecord]:
        """The most recent runs, newest first, of one sketch or of all."""
        with self._transaction("list maintenance runs") as conn:
            rows = conn.execute(
                sa.text("SELECT * FROM maintenance_run WHERE CAST(:s AS integer) IS NULL OR sketch_id = :s "
                        "ORDER BY id DESC LIMIT :lim"),
                {"s": sketch_id, "lim": limit},
            ).mappings()
            return [run_record(r) for r in rows]


__all__ = ["RunStore"]

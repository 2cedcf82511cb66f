"""Advisory locks in the catalog: one maintainer per sketch at a time, and live captures told from dead ones.

Part of :class:`imp_core.catalog.store.Catalog`; see docs/ARCHITECTURE.md, "State and versions".
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import sqlalchemy as sa

from imp_core.catalog.connection import LOCK_NOT_AVAILABLE, CatalogConnection, as_json, db_message, sqlstate
from imp_core.catalog.records import default_triggered_by
from imp_core.errors import CatalogError, MaintainerBusyError

# First half of the two-int advisory lock key for sketch locks ("imps"); the second half is the sketch id. A fixed
# namespace keeps our locks apart from other applications' advisory locks in a shared database.
SKETCH_LOCK_NAMESPACE = 0x696D7073
# ... and for captures ("impc"), keyed by run id: held while a capture runs, so a capture run whose lock is free
# belongs to a dead process (see clear_abandoned_captures)
CAPTURE_LOCK_NAMESPACE = 0x696D7063


class LockStore(CatalogConnection):
    """Postgres session advisory locks on dedicated connections."""

    @contextmanager
    def sketch_lock(self, sketch_id: int, timeout: float | None = None) -> Iterator[None]:
        """Hold the maintenance lock of a sketch for the ``with`` block, waiting while another process holds it.

        A Postgres session-level advisory lock on a dedicated connection: released when the block ends, or by the
        server if this process dies. Outside any transaction, so a long maintenance does not hold one open.

        Args:
            sketch_id: The sketch.
            timeout: Wait at most this many seconds (the server's ``lock_timeout``); None waits as long as it takes.

        Raises:
            MaintainerBusyError: ``timeout`` passed while another process held the lock.
        """
        with self._advisory(sketch_id, wait=True, timeout=timeout):
            yield

    @contextmanager
    def try_sketch_lock(self, sketch_id: int) -> Iterator[bool]:
        """Like :meth:`sketch_lock` but never waits: yields False (holding nothing) if another holder has it."""
        with self._advisory(sketch_id, wait=False) as acquired:
            yield acquired

    @contextmanager
    def capture_run(self, trigger: str, table_versions_from: Mapping[str, int] | None = None) -> Iterator[int]:
        """Start a capture run (no sketch yet) and hold its capture lock for the ``with`` block; yields the run id.

        The run id is drawn and locked before the row exists, so :meth:`clear_abandoned_captures` never mistakes a
        starting capture for a dead one. The lock is a session advisory lock: the server drops it when the
        capturing process dies, which is how a dead capture is recognised.
        """
        conn: sa.Connection | None = None
        run_id = 0
        try:
            conn = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            run_id = int(conn.execute(sa.text("SELECT nextval(pg_get_serial_sequence('maintenance_run', 'id'))"))
                         .scalar_one())
            conn.execute(sa.text("SELECT pg_advisory_lock(:ns, :r)"), {"ns": CAPTURE_LOCK_NAMESPACE, "r": run_id})
            conn.execute(sa.text("INSERT INTO maintenance_run (id, sketch_id, strategy, trigger, triggered_by, "
                                 "table_versions_from) VALUES (:r, NULL, 'capture', :tr, :by, CAST(:tvf AS jsonb))"),
                         {"r": run_id, "tr": trigger, "by": default_triggered_by(),
                          "tvf": as_json(table_versions_from)})
        except sa.exc.SQLAlchemyError as e:
            if conn is not None:
                conn.invalidate()
            raise CatalogError(f"could not start a capture run in the catalog at {self.url}: {db_message(e)}") from e
        try:
            yield run_id
        finally:
            try:
                conn.execute(sa.text("SELECT pg_advisory_unlock(:ns, :r)"),
                             {"ns": CAPTURE_LOCK_NAMESPACE, "r": run_id})
                conn.close()
            except sa.exc.SQLAlchemyError:
                conn.invalidate()

    @contextmanager
    def _advisory(self, sketch_id: int, *, wait: bool, namespace: int = SKETCH_LOCK_NAMESPACE,
                  timeout: float | None = None) -> Iterator[bool]:
        key = {"ns": namespace, "s": sketch_id}
        conn: sa.Connection | None = None
        try:
            conn = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            if wait and timeout is not None:
                conn.execute(sa.text("SELECT set_config('lock_timeout', :t, false)"),
                             {"t": f"{max(1, int(timeout * 1000))}ms"})
                try:
                    conn.execute(sa.text("SELECT pg_advisory_lock(:ns, :s)"), key)
                except sa.exc.OperationalError as e:
                    if sqlstate(e) != LOCK_NOT_AVAILABLE:
                        raise
                    conn.invalidate()  # its session still has the lock_timeout: never back to the pool
                    raise MaintainerBusyError(f"another process is maintaining sketch {sketch_id} (waited "
                                              f"{timeout:g} s for it)") from e
                conn.execute(sa.text("SELECT set_config('lock_timeout', '0', false)"))
                acquired = True
            elif wait:
                conn.execute(sa.text("SELECT pg_advisory_lock(:ns, :s)"), key)
                acquired = True
            else:
                acquired = bool(conn.execute(sa.text("SELECT pg_try_advisory_lock(:ns, :s)"), key).scalar())
        except sa.exc.SQLAlchemyError as e:
            if conn is not None:
                conn.invalidate()
            raise CatalogError(f"could not take the maintenance lock of sketch {sketch_id} in the catalog at "
                               f"{self.url}: {db_message(e)}") from e
        assert conn is not None
        try:
            yield acquired
        finally:
            try:
                if acquired:
                    conn.execute(sa.text("SELECT pg_advisory_unlock(:ns, :s)"), key)
                conn.close()
            except sa.exc.SQLAlchemyError:
                # The lock may still be held by this session: never hand the connection back to the pool.
                conn.invalidate()


__all__ = ["CAPTURE_LOCK_NAMESPACE", "SKETCH_LOCK_NAMESPACE", "LockStore"]

"""The event trigger of maintenance on commit: new versions of a registered Delta table, watched in the triggerer.

:class:`DeltaCommitTrigger` is the trigger of each table asset's ``AssetWatcher`` (``dags/imp_maintain_on_commit.py``).
It runs in Airflow's triggerer (asyncio; no Spark, no catalog connection), reads the table's ``_delta_log`` every
``poll_seconds`` with :class:`~imp_core.airflow.delta_log.DeltaLog` (one ``stat``, or one S3 ``LIST``, per poll) in a
worker thread, and fires one event per new version: the payload ``{"table_uri", "tables", "version",
"previous_version", "committed_at"}`` becomes the extra (``{"from_trigger": true, "payload": ...}``) of an asset
event on the table's asset. A backlog of more than ``MAX_EVENTS_PER_POLL`` versions found at once (a long pause)
is one event for the whole range (``previous_version`` says where it starts), so events always chain: each one's
``previous_version`` is the version of the one before.

The last version reported is kept in Airflow's asset state store (key ``delta_version`` of the table's asset), so a
restarted triggerer resumes after it: versions committed while it was down are reported then. It is written a few
seconds after the events of that version were handed to the triggerer (by then they are in Airflow's database), so a
crash repeats at most the latest events and loses none. The first watch of a table starts at its current version.

A table whose log disappears (dropped) is no longer read: the trigger waits, checking once every ``DROPPED_CHECK``
seconds whether a table was created there again. A table that is unregistered leaves the DAG's schedule when the DAG
processor next parses the DAG file, and Airflow then cancels its watcher. See docs/AIRFLOW.md, "Maintenance on
commit".
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from imp_core.airflow.assets import location_of
from imp_core.airflow.delta_log import Commit, DeltaLog
from imp_core.errors import ImpError, first_line
from imp_core.security.redact import scrub

STATE_KEY = "delta_version"
"""The asset state store key holding the last version reported."""
MAX_EVENTS_PER_POLL = 100
PERSIST_DELAY = 3.0
"""Seconds between handing a version's events to the triggerer and recording it as reported."""
DROPPED_CHECK = 60.0
ERROR_BACKOFF = 30.0


class DeltaCommitTrigger(BaseEventTrigger):
    """One event per new Delta version of the table at ``table_uri``.

    Args:
        table_uri: The table asset's URI (``file:///...`` or ``s3://...``, :func:`imp_core.airflow.assets.table_uri`).
        tables: The names registered for that location (carried in the events).
        poll_seconds: Seconds between two reads of the log (``IMP_WATCH_INTERVAL``).
    """

    def __init__(self, table_uri: str, tables: list[str] | tuple[str, ...] = (), poll_seconds: float = 5.0) -> None:
        super().__init__()
        self.table_uri = table_uri
        self.tables = sorted(tables)
        self.poll_seconds = float(poll_seconds)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {"table_uri": self.table_uri, "tables": self.tables, "poll_seconds": self.poll_seconds})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        log = DeltaLog(location_of(self.table_uri))
        last = await self._resume(log)
        pending: deque[tuple[int, float]] = deque()  # (version reported, when its events were handed over)
        dropped = False
        while True:
            due = None
            while pending and time.monotonic() - pending[0][1] >= PERSIST_DELAY:
                due = pending.popleft()[0]
            if due is not None:
                await self._record(due)
            try:
                commits = await asyncio.to_thread(log.commits_after, last)
            except ImpError as e:
                self.log.warning("watch of %s: %s; retrying in %.0f s", self.table_uri, scrub(first_line(e)),
                                 ERROR_BACKOFF)
                await asyncio.sleep(ERROR_BACKOFF)
                continue
            if commits is None:
                if not dropped:
                    self.log.warning("the Delta log of %s is gone (table dropped): no longer watched; it is checked "
                                     "again every %.0f s", self.table_uri, DROPPED_CHECK)
                    dropped, last = True, -1  # a table created there again starts its versions at 0
                await asyncio.sleep(DROPPED_CHECK)
                continue
            if dropped:
                self.log.info("a Delta table exists again at %s: watching it", self.table_uri)
                dropped = False
            for event in self.events(commits, last):
                yield event
            if commits:
                last = commits[-1].version
                pending.append((last, time.monotonic()))
            await asyncio.sleep(self.poll_seconds)

    def events(self, commits: list[Commit], last: int) -> list[TriggerEvent]:
        """The events reporting ``commits`` (each after the one before it; a backlog as one range)."""
        if len(commits) > MAX_EVENTS_PER_POLL:
            commits = commits[-1:]
        out = []
        for commit in commits:
            out.append(TriggerEvent({"table_uri": self.table_uri, "tables": self.tables, "version": commit.version,
                                     "previous_version": last, "committed_at": commit.committed_at}))
            last = commit.version
        return out

    async def _resume(self, log: DeltaLog) -> int:
        """The version to watch from: the one recorded last, else the table's current version (first watch)."""
        stored = await self._stored()
        if stored is not None:
            self.log.info("watching %s (tables %s) from version %d, every %.1f s", self.table_uri,
                          ", ".join(self.tables), stored, self.poll_seconds)
            return stored
        while True:
            try:
                latest = await asyncio.to_thread(log.latest)
                break
            except ImpError as e:
                self.log.warning("watch of %s: %s; retrying in %.0f s", self.table_uri, scrub(first_line(e)),
                                 ERROR_BACKOFF)
                await asyncio.sleep(ERROR_BACKOFF)
        start = latest.version if latest is not None else -1
        await self._record(start)
        self.log.info("watching %s (tables %s) from its current version %d, every %.1f s", self.table_uri,
                      ", ".join(self.tables), start, self.poll_seconds)
        return start

    async def _stored(self) -> int | None:
        """The version recorded last (None: first watch). Retried while Airflow's API cannot say: starting at the
        current version instead would skip what was committed meanwhile."""
        if self.asset_state_store is None:  # not run as an asset's watcher (no state to resume from)
            return None
        while True:
            try:
                value = await self.asset_state_store.aget(STATE_KEY)
                break
            except Exception as e:  # noqa: BLE001 - Airflow's API errors, whatever they are: retried
                self.log.warning("watch of %s: cannot read its last version from the asset state store (%s); "
                                 "retrying in %.0f s", self.table_uri, scrub(first_line(e)), ERROR_BACKOFF)
                await asyncio.sleep(ERROR_BACKOFF)
        return int(value) if isinstance(value, (int, float, str)) and str(value).lstrip("-").isdigit() else None

    async def _record(self, version: int) -> None:
        """Record ``version`` as reported (a failure is logged: the next version's record covers it)."""
        if self.asset_state_store is None:
            return
        try:
            await self.asset_state_store.aset(STATE_KEY, version)
        except Exception as e:  # noqa: BLE001 - Airflow's API errors: a restart would repeat a few events at most
            self.log.warning("watch of %s: cannot record version %d in the asset state store (%s)", self.table_uri,
                             version, scrub(first_line(e)))


__all__ = ["DROPPED_CHECK", "DeltaCommitTrigger", "MAX_EVENTS_PER_POLL", "PERSIST_DELAY", "STATE_KEY"]

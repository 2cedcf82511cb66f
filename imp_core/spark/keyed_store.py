"""The Delta store of the keyed-state contract (``engine/keyed_state/contract.py``) over the Delta state tables of
``spark/state_store.py`` (``DeltaGroupStore``), which it leaves as they are: one table per operator, read and
written by Spark, its versions the table's Delta versions.

It reads through ``DeltaGroupStore`` and returns the contract's normal form (a bag's rows netted, a map's live rows);
what it hands to ``DeltaGroupStore`` (replaced rows, loaded frames, Spark DataFrames a capture computed) goes as it
is given. So the contract suite (``tests/engine/keyed_state/test_contract.py``) shows the Delta tables' own
behaviour, including where they count rows handed in un-netted. A commit is the table version the last write pinned;
an abort closes the store, and the next write after an open rolls the table back to the opened version (``RESTORE``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np
import polars as pl
from pyspark.sql import DataFrame, SparkSession

from imp_core.engine.keyed_state.contract import Batch, Checkpoint, StateSpec, StoreTraits, checked_rows, normal_form
from imp_core.engine.keyed_state.versions import DeltaVersion, StateVersion
from imp_core.errors import StateError
from imp_core.spark.state_store import DeltaGroupStore


class DeltaStore:
    """The :class:`~imp_core.engine.keyed_state.contract.KeyedStore` in Delta tables at ``location`` (not
    ``resident``); ``retention``: the sketch versions whose state is kept (``IMP_STATE_RETENTION``)."""

    traits = StoreTraits(resident=False)

    def __init__(self, spark: SparkSession, spec: StateSpec, location: str, buckets: int = 1,
                 retention: int = 5) -> None:
        self.spec = spec
        self.spark = spark
        self.location = location.rstrip("/")
        self.buckets = buckets
        self.retention = retention
        self._schemas = {c.name: spec.schema(c.name) for c in spec.components}
        self._tables: DeltaGroupStore | None = None
        self._version: StateVersion = self._initial()
        self._fresh = False  # opened empty: the first write starts the table over
        self._dirty = False
        self._ticket = 0

    def _initial(self) -> DeltaVersion:
        return DeltaVersion(rows=tuple((c.name, 0) for c in self.spec.components), location=self.location,
                            buckets=self.buckets)

    # -- versions ------------------------------------------------------------------------------------------------

    @property
    def version(self) -> StateVersion:
        return self._version

    def open(self, at: Checkpoint | None = None) -> None:
        self._dirty = False
        if at is None or (isinstance(at.version, DeltaVersion) and at.version.table_version is None):
            self._tables = DeltaGroupStore(self.spark, self.location, self.spec.key_names, self._schemas,
                                           buckets=self.buckets, retention=self.retention)
            self._version, self._fresh = self._initial(), True
            return
        if not isinstance(at.version, DeltaVersion):
            raise StateError(f"operator {self.spec.owner}: a Delta store opens Delta versions, not a "
                             f"{at.version.store} one (move state between stores with load and scan)")
        self._tables = DeltaGroupStore.from_reference(self.spark, self.spec.key_names, self._schemas,
                                                      at.version.to_json(), self.retention)
        self._version, self._fresh = at.version, False

    def commit(self) -> StateVersion:
        tables = self._usable()
        if self._dirty:
            self._version = DeltaVersion.from_json(tables.reference())
            self._dirty = False
        return self._version

    def abort(self) -> None:
        self._tables = None
        self._dirty = False

    def checkpoint(self) -> Checkpoint:
        self._usable()
        if self._dirty:
            raise StateError(f"operator {self.spec.owner}: a checkpoint of state with changes not committed; commit "
                             f"first (this is a bug in imp)")
        return Checkpoint(self._version)

    # -- reads ---------------------------------------------------------------------------------------------------

    def fetch(self, keys: pl.DataFrame) -> Batch:
        tables = self._usable()
        names = self.spec.key_names
        wanted = keys.select(names).cast(self.spec.key_types).unique(maintain_order=True)  # type: ignore[arg-type]
        rows = self._normal(tables.fetch(wanted))
        present = np.zeros(wanted.height, dtype=bool)
        for frame in rows.values():
            if frame.height:
                held = wanted.with_row_index("__i").join(frame.select(names), on=names, how="semi",
                                                           nulls_equal=True).get_column("__i").to_numpy()
                present[held] = True
        self._ticket += 1
        return Batch(wanted, present, rows.__getitem__, self, self._ticket)

    def lookup(self, keys: pl.DataFrame) -> dict[str, pl.DataFrame]:
        tables = self._usable()
        types = self.spec.key_types
        if not keys.width or not set(keys.columns) <= set(types):
            raise StateError(f"operator {self.spec.owner}: a lookup by {keys.columns} names no state keys "
                             f"{self.spec.key_names}")
        return self._normal(tables.fetch_where(keys.cast({k: types[k] for k in keys.columns})))

    def scan(self) -> Iterator[dict[str, pl.DataFrame]]:
        tables = self._usable()
        for chunk in tables.contents():
            yield self._normal(chunk)

    def size(self) -> dict[str, int]:
        return self._usable().size()

    # -- writes --------------------------------------------------------------------------------------------------

    def replace(self, batch: Batch, rows: Mapping[str, pl.DataFrame]) -> None:
        tables = self._usable()
        batch.take_back(self, self._ticket)
        frames = checked_rows(self.spec, rows, batch.keys)
        self._start_over(tables)
        tables.replace(batch.keys, frames)
        self._dirty = True

    def load(self, frames: Mapping[str, pl.DataFrame]) -> None:
        tables = self._usable()
        tables.load(checked_rows(self.spec, frames))
        self._fresh, self._dirty = False, True

    def load_spark(self, frames: Mapping[str, DataFrame]) -> None:
        """:meth:`load` from Spark DataFrames (a capture computed on the executors: its rows never come to the
        driver); each frame has its component's columns."""
        tables = self._usable()
        tables.write_all(frames)
        self._fresh, self._dirty = False, True

    # -- inside --------------------------------------------------------------------------------------------------

    def _usable(self) -> DeltaGroupStore:
        if self._tables is None:
            raise StateError(f"operator {self.spec.owner}: its state store is closed (aborted, or never opened); "
                             f"open a checkpoint first (this is a bug in imp)")
        return self._tables

    def _start_over(self, tables: DeltaGroupStore) -> None:
        """Before the first write of a store opened empty: the table (earlier writes no version names) is emptied."""
        if self._fresh:
            tables.load({})
            self._fresh = False

    def _normal(self, frames: Mapping[str, pl.DataFrame]) -> dict[str, pl.DataFrame]:
        return {name: normal_form(self.spec, name, frames[name]) for name in self._schemas}


__all__ = ["DeltaStore"]

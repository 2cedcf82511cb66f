"""External operator state: state that does not fit the driver's memory budget lives in a store outside the process
(Delta tables beside the data, maintained by Spark: ``imp_core.spark.state_store``), and a batch reads and rewrites
only the entries of the groups it touches.

The store holds an operator's state frames keyed by its state keys, one or more components per operator. An
aggregation's (``operators/aggregation_external.py``) are its frames as they are saved in memory (``groups``: one
row per group with its accumulators and sketch; ``fcounts``: ``F_g`` as (group, fragment, count); ``mm{j}``: per
argument of MIN/MAX or DISTINCT aggregates the (group, value, count) multiset, named after its first aggregate
``j``); a top-k per group's (``operators/group_topk_external.py``) is ``rows``, its input rows keyed by the partition
key. The operator computes a batch exactly as its in-memory form does, over the touched groups' rows; the store only
finds and replaces rows. ``MemoryGroupStore`` is the same contract over frames in this process, for tests and for the
in-memory oracle. See docs/ARCHITECTURE.md, "Where state lives".
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

import polars as pl

from imp_core.errors import StateError

GROUPS = "groups"
FCOUNTS = "fcounts"


class GroupStore(Protocol):
    """The state frames of one operator, keyed by ``keys``, outside the operator."""

    keys: list[str]

    def fetch(self, keys: pl.DataFrame) -> dict[str, pl.DataFrame]:
        """Every component's rows of the groups in ``keys`` (one row per group; NULL keys equal each other), in the
        component's schema."""
        ...

    def fetch_where(self, keys: pl.DataFrame) -> dict[str, pl.DataFrame]:
        """Like :meth:`fetch`, for ``keys`` over some of the state keys (a join on part of them), and not to be
        followed by :meth:`replace`."""
        ...

    def replace(self, keys: pl.DataFrame, rows: Mapping[str, pl.DataFrame]) -> None:
        """Make ``rows`` (per component) the rows of the groups in ``keys``: rows of those groups not in ``rows`` go.
        Visible to the next :meth:`fetch`."""
        ...

    def load(self, frames: Mapping[str, pl.DataFrame | None]) -> None:
        """Replace the whole state by ``frames`` (a capture computed in this process, or state moved out of
        memory; a component missing or None is empty)."""
        ...

    def contents(self) -> Iterator[dict[str, pl.DataFrame]]:
        """The whole state, in chunks of complete groups (every component's rows of the same groups)."""
        ...

    def size(self) -> dict[str, int]:
        """Rows per component."""
        ...

    def reference(self) -> dict[str, Any]:
        """What a saved version needs to find this state again (location and the component versions it pins)."""
        ...

    def warm(self) -> None:
        """Prepare the next :meth:`fetch` (safe to call from another thread; nothing to do in memory)."""
        ...


class ExternalOperator:
    """What every operator keeping its state in a :class:`GroupStore` offers the pipeline and the placement: its
    state keys and components, the store it is bound to, and its whole result read from the store chunk by chunk."""

    placement = "external"
    op_id: str
    store: GroupStore
    key_names: list[str]
    reference: dict[str, Any] | None = None  # the saved store reference, until the maintenance driver binds it
    _cleared = True  # False after a reset: the store is emptied at the next write

    def component_schemas(self) -> dict[str, dict[str, pl.DataType]]:
        """The schema of each state component, the state keys first."""
        raise NotImplementedError

    def bind(self, store: GroupStore) -> None:
        """Keep the state in ``store`` from now on (its current contents are the state)."""
        self.store = store
        self._cleared = True

    def output_chunks(self) -> Iterator[pl.DataFrame]:
        """The current result, chunk by chunk, as all-insert annotated relations."""
        raise NotImplementedError

    def output_relation(self) -> pl.DataFrame:
        """The whole current result, read from the store."""
        chunks = list(self.output_chunks())
        return pl.concat(chunks) if chunks else self.empty_delta()  # type: ignore[attr-defined]

    def memory_bytes(self) -> int:
        return 0  # the state is in the store

    def state_size_bytes(self) -> int:
        return 0

    def whole_frames(self) -> dict[str, pl.DataFrame]:
        """The state whole in this process, as the operator's in-memory form saves it (moving state back into
        memory, tests)."""
        raise NotImplementedError

    def take_state(self, meta: Mapping[str, Any], stored: Mapping[str, pl.DataFrame | None] | None) -> None:
        """Take over saved state: ``stored`` (every component's rows: state moved out of memory, or relabeled by a
        repartition) written into the store, else the store reference ``meta`` names (bound later by the maintenance
        driver).

        Raises:
            StateError: The saved state is held in memory, not in a store.
        """
        if stored is not None:
            self.store.load(stored)
        elif "external" not in meta:
            raise StateError(f"operator {self.op_id}: saved state is held in memory, the operator keeps it "
                             f"externally; recapture the sketch")
        else:
            self.reference = meta["external"]
        self._cleared = True


def key_types(keys: list[str], schemas: Mapping[str, Mapping[str, pl.DataType]]) -> dict[str, pl.DataType]:
    """The state keys' types (every component holds the keys; the first names them)."""
    first = next(iter(schemas.values()))
    return {k: first[k] for k in keys}


class MemoryGroupStore:
    """:class:`GroupStore` over polars frames in this process (the external path's oracle and its unit tests)."""

    def __init__(self, keys: list[str], schemas: Mapping[str, Mapping[str, pl.DataType]]) -> None:
        self.keys = list(keys)
        self.schemas = {name: dict(schema) for name, schema in schemas.items()}
        self.frames = {name: pl.DataFrame(schema=schema) for name, schema in self.schemas.items()}
        self.writes = 0

    def fetch(self, keys: pl.DataFrame) -> dict[str, pl.DataFrame]:
        wanted = keys.select(self.keys).cast(self._key_types())  # type: ignore[arg-type]
        return {name: df.join(wanted.unique(), on=self.keys, how="semi", nulls_equal=True)
                for name, df in self.frames.items()}

    def fetch_where(self, keys: pl.DataFrame) -> dict[str, pl.DataFrame]:
        types = self._key_types()
        wanted = keys.cast({k: types[k] for k in keys.columns}).unique()
        return {name: df.join(wanted, on=list(keys.columns), how="semi", nulls_equal=True)
                for name, df in self.frames.items()}

    def replace(self, keys: pl.DataFrame, rows: Mapping[str, pl.DataFrame]) -> None:
        wanted = keys.select(self.keys).cast(self._key_types()).unique()  # type: ignore[arg-type]
        for name, df in self.frames.items():
            kept = df.join(wanted, on=self.keys, how="anti", nulls_equal=True)
            new = rows.get(name)
            if new is not None and new.height:
                kept = pl.concat([kept, new.select(list(self.schemas[name])).cast(self.schemas[name])])  # type: ignore[arg-type]
            self.frames[name] = kept
        self.writes += 1

    def load(self, frames: Mapping[str, pl.DataFrame | None]) -> None:
        for name, schema in self.schemas.items():
            df = frames.get(name)
            self.frames[name] = pl.DataFrame(schema=schema) if df is None else \
                df.select(list(schema)).cast(schema)  # type: ignore[arg-type]
        self.writes += 1

    def contents(self) -> Iterator[dict[str, pl.DataFrame]]:
        yield dict(self.frames)

    def size(self) -> dict[str, int]:
        return {name: df.height for name, df in self.frames.items()}

    def reference(self) -> dict[str, Any]:
        return {"store": "memory", "rows": self.size()}

    def warm(self) -> None:
        pass

    def _key_types(self) -> dict[str, pl.DataType]:
        return key_types(self.keys, self.schemas)


def warm_stores(operators: Sequence[ExternalOperator]) -> threading.Thread | None:
    """Warm the stores of ``operators`` (:meth:`GroupStore.warm`) in another thread, deepest first (their fetches
    come first in a pass), while the pass works below them; join it when the pass ends. A store that fails to warm is
    left alone: its fetch reports the error."""
    ops = sorted(operators, key=lambda o: -o.op_id.count("."))
    stores = [op.store for op in ops if getattr(op, "store", None) is not None]
    if not stores:
        return None

    def warm() -> None:
        for store in stores:
            try:
                store.warm()
            except Exception:  # noqa: BLE001, S112 - a cache only; the fetch reads (and reports) for itself
                continue

    thread = threading.Thread(target=warm, name="imp-warm-state", daemon=True)
    thread.start()
    return thread


__all__ = ["FCOUNTS", "GROUPS", "ExternalOperator", "GroupStore", "MemoryGroupStore", "key_types", "warm_stores"]

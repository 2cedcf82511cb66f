"""The keyed-state contract: what every store of one stateful operator's state does, wherever the state lives.

An operator's state is a few named *components*, every one keyed by the same state keys (an aggregation's group
keys, a top-k per group's partition key, an anti join's key). A component is one of two kinds:

* a **map** (:attr:`Kind.MAP`): at most one row per key (an aggregation's accumulators). A map may name a ``count``
  column: a row whose count is 0 is a tombstone, the same as no row.
* a **bag** (:attr:`Kind.BAG`): a Z-set of rows (key, identity columns) with an integer multiplicity in its
  ``count`` column, as DBSP's batches are (``F_g``'s (group, fragment, count), a MIN/MAX value multiset, the rows a
  top-k per group or an anti join keeps). Rows equal in every key and identity column are one row whose count is
  the sum of theirs; a row whose count sums to 0 is absent. A bag declared ``signed=False`` holds positive counts only
  (a replace that would store a negative count raises ``StateError``: the change feed deleted rows the state never
  saw).

A store is batch-grained: a batch :meth:`~KeyedStore.fetch`\\ es the keys it touches (a :class:`Batch` holding their
rows in that normal form), computes their new rows, and hands them back once with :meth:`~KeyedStore.replace`
(the keys' rows are then exactly the given ones, netted). :meth:`~KeyedStore.commit` makes every change since the
last commit a new :class:`~imp_core.engine.keyed_state.versions.StateVersion` (what a sketch version pins);
:meth:`~KeyedStore.abort` drops them and closes the store until it is opened again; :meth:`~KeyedStore.open` starts
from a :class:`Checkpoint` (a committed version and, for a store whose versions live only in the catalog, its
frames). :meth:`~KeyedStore.lookup` reads the rows of keys given by some of the key columns (a join above the
operator) and cannot be replaced: it returns frames, not a batch. Spark's StateStore (``getStore(version)``,
``commit``, ``abort``) and DBSP's trace batches are the models; docs/design/state-contract.md the plan that moves
the operators onto it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import polars as pl

from imp_core.engine.keyed_state.versions import StateVersion
from imp_core.engine.state import Rows
from imp_core.errors import StateError

KEY_SLOT = "__kslot"  # reserved: a store's own column (the slot of a row's key)
ROW = "__row"  # reserved: a row's position, while a store matches rows to the keys of a batch


class Kind(enum.Enum):
    """How a component holds the rows of one key."""

    MAP = "map"  # at most one row per key
    BAG = "bag"  # a Z-set of (identity) rows per key, each with a nonzero multiplicity


class Placement(enum.Enum):
    """Where a stateful operator's state lives: what the placement decides and each sketch version records
    (``sketch_version.state_placement``: the values are the recorded words)."""

    MEMORY = "memory"
    DELTA_TABLES = "external"


@dataclass(frozen=True, slots=True)
class Component:
    """One named part of an operator's state: its ``kind``, its columns besides the state keys (name, polars type),
    its ``count`` column (a bag's multiplicity, required; a map's tombstone mark, optional) and, for a bag, whether
    its counts may be negative.

    Raises:
        StateError: The description cannot work (a bag without an integer count, a reserved or repeated column).
    """

    name: str
    kind: Kind
    columns: tuple[tuple[str, pl.DataType], ...]
    count: str | None = None
    signed: bool = True

    def __post_init__(self) -> None:
        names = [c for c, _ in self.columns]
        if len(set(names)) != len(names) or KEY_SLOT in names or ROW in names:
            raise StateError(f"state component {self.name}: its columns {names} repeat a name or use a reserved one")
        if self.kind is Kind.BAG and self.count is None:
            raise StateError(f"state component {self.name}: a bag needs a count column")
        if self.count is not None:
            types = dict(self.columns)
            if self.count not in types or not types[self.count].is_integer():
                raise StateError(f"state component {self.name}: count column {self.count} is not one of its integer "
                                 f"columns")

    @property
    def schema(self) -> dict[str, pl.DataType]:
        return dict(self.columns)

    @property
    def identity(self) -> tuple[str, ...]:
        """The columns that, with the state keys, make a bag row what it is (all but the count); none for a map."""
        if self.kind is Kind.MAP:
            return ()
        return tuple(c for c, _ in self.columns if c != self.count)


@dataclass(frozen=True, slots=True)
class StateSpec:
    """The state of one operator (``owner``: its id): the state keys (name, polars type) and the components.

    Raises:
        StateError: No key, or a key name repeated or used by a component.
    """

    owner: str
    keys: tuple[tuple[str, pl.DataType], ...]
    components: tuple[Component, ...]

    def __post_init__(self) -> None:
        names = [k for k, _ in self.keys]
        if not names or len(set(names)) != len(names) or KEY_SLOT in names or ROW in names:
            raise StateError(f"operator {self.owner}: state keys {names} are empty, repeated or reserved")
        seen: set[str] = set()
        for c in self.components:
            if c.name in seen or set(names) & {n for n, _ in c.columns}:
                raise StateError(f"operator {self.owner}: state component {c.name} is repeated or names a key column")
            seen.add(c.name)
        if not self.components:
            raise StateError(f"operator {self.owner}: a keyed state needs a component")

    @property
    def key_names(self) -> list[str]:
        return [k for k, _ in self.keys]

    @property
    def key_types(self) -> dict[str, pl.DataType]:
        return dict(self.keys)

    def component(self, name: str) -> Component:
        """The component called ``name``.

        Raises:
            StateError: The state has no such component.
        """
        for c in self.components:
            if c.name == name:
                return c
        raise StateError(f"operator {self.owner}: its state has no component {name}")

    def schema(self, name: str) -> dict[str, pl.DataType]:
        """A component's rows as frames carry them: the state keys, then its columns."""
        return {**self.key_types, **self.component(name).schema}


@dataclass(frozen=True, slots=True)
class StoreTraits:
    """What a store's kind implies for the work around it (never for an operator's rule).

    ``resident``: the whole state is in this process, so reading all of it costs no I/O (the memory store); a store
    that is not (Delta tables) is read by key, and what needs all of its rows is computed where they live instead.
    """

    resident: bool


@dataclass(frozen=True)
class Checkpoint:
    """What opening a store at a committed version needs: the version and, for a store whose versions live only in
    the catalog (the memory store), each component's rows (valid until the store's next replace)."""

    version: StateVersion
    frames: Mapping[str, pl.DataFrame | Rows] = field(default_factory=dict)


class Batch:
    """The keys one batch touches and their rows, as :meth:`KeyedStore.fetch` read them: ``keys`` (distinct, in the
    state keys' types, in the order first given), ``present`` (per key: whether the store holds a row of it in some
    component) and :meth:`rows`. It goes back to the store that made it once, with :meth:`KeyedStore.replace`; a
    later fetch of that store makes it stale."""

    __slots__ = ("_done", "_owner", "_read", "_rows", "_ticket", "keys", "present")

    def __init__(self, keys: pl.DataFrame, present: np.ndarray, read: Callable[[str], pl.DataFrame],
                 owner: object, ticket: int) -> None:
        self.keys = keys
        self.present = present
        self._read = read
        self._rows: dict[str, pl.DataFrame] = {}
        self._owner = owner
        self._ticket = ticket
        self._done = False

    def rows(self, component: str) -> pl.DataFrame:
        """The component's rows of the batch's keys as fetched (a map's live rows; a bag's rows netted, counts
        nonzero).

        Raises:
            StateError: The rows were not read before the batch went back to its store.
        """
        if component not in self._rows:
            if self._done:
                raise StateError(f"rows of state component {component} are read after their batch was replaced; "
                                 f"read them before (this is a bug in imp)")
            self._rows[component] = self._read(component)
        return self._rows[component]

    @property
    def done(self) -> bool:
        """Whether the batch went back to its store (or the store fetched another one since)."""
        return self._done

    def take_back(self, owner: object, ticket: int) -> None:
        """Check that ``owner`` (a store whose latest fetch has ``ticket``) may replace this batch, and mark it done.

        Raises:
            StateError: The batch is another store's, was replaced already, or an older fetch's.
        """
        if self._owner is not owner or self._done or self._ticket != ticket:
            why = "another store's" if self._owner is not owner else "replaced already" if self._done else \
                "stale (the store fetched another batch since)"
            raise StateError(f"a batch handed to replace is {why}; this is a bug in imp")
        self._done = True


class KeyedStore(Protocol):
    """One operator's keyed state (see the module docstring). A store is used by one thread at a time."""

    spec: StateSpec
    traits: StoreTraits

    @property
    def version(self) -> StateVersion:
        """The version the store was opened at or last committed."""
        ...

    def open(self, at: Checkpoint | None = None) -> None:
        """Start from checkpoint ``at`` (None: the empty state): its contents are what reads see, until changes.

        Raises:
            StateError: The checkpoint is of another kind of store, names other components, or cannot be read.
        """
        ...

    def fetch(self, keys: pl.DataFrame) -> Batch:
        """The rows of the keys in ``keys`` (every state key column; repeats allowed; NULL equals NULL), changes since
        the last commit included; keys the store does not hold have no rows."""
        ...

    def replace(self, batch: Batch, rows: Mapping[str, pl.DataFrame]) -> None:
        """Make ``rows`` (per component, keys and columns; a component left out has none) the rows of ``batch``'s keys
        from now on: every other row of those keys goes. Seen by this store's reads at once, by any other only after
        :meth:`commit`.

        Raises:
            StateError: ``batch`` is not this store's latest open batch, a row's key is not one of its keys, a map
                gets two rows of one key, or an unsigned bag a negative count.
        """
        ...

    def load(self, frames: Mapping[str, pl.DataFrame]) -> None:
        """Make ``frames`` (per component, rows in any order, a bag's not netted) the whole state (a capture computed
        in this process, state moved from another store); a component left out is empty."""
        ...

    def lookup(self, keys: pl.DataFrame) -> dict[str, pl.DataFrame]:
        """Every component's rows of the keys whose columns ``keys.columns`` (some of the state keys) equal a row of
        ``keys``: for reading only (a join above the operator), so no batch."""
        ...

    def scan(self) -> Iterator[dict[str, pl.DataFrame]]:
        """The whole state in chunks of complete keys (every component's rows of the same keys)."""
        ...

    def size(self) -> dict[str, int]:
        """Rows per component (a map's live rows, a bag's netted rows)."""
        ...

    def commit(self) -> StateVersion:
        """Make every change since the last commit (or the open) the store's next version, and return it."""
        ...

    def abort(self) -> None:
        """Drop every change since the last commit and close the store: it reads nothing until opened again."""
        ...

    def checkpoint(self) -> Checkpoint:
        """The last committed version as :meth:`open` takes it.

        Raises:
            StateError: There are changes not committed yet.
        """
        ...


class StoreFactory(Protocol):
    """Builds the store an operator's state spec gets: the one place a placement turns into stores."""

    def __call__(self, spec: StateSpec, placement: Placement, at: Checkpoint | None = None) -> KeyedStore: ...


def conform(spec: StateSpec, component: str, frame: pl.DataFrame | None) -> pl.DataFrame:
    """``frame`` as the rows of ``component``: its columns in order and types (an empty frame for None).

    Raises:
        StateError: A column is missing.
    """
    schema = spec.schema(component)
    if frame is None:
        return pl.DataFrame(schema=schema)
    missing = [c for c in schema if c not in frame.columns]
    if missing:
        raise StateError(f"operator {spec.owner}: rows of state component {component} lack {', '.join(missing)}")
    return frame.select(list(schema)).cast(schema)  # type: ignore[arg-type]


def checked_rows(spec: StateSpec, rows: Mapping[str, pl.DataFrame],
                 keys: pl.DataFrame | None = None) -> dict[str, pl.DataFrame]:
    """``rows`` (per component) conformed, after the contract's checks of a replace of the batch keys ``keys`` (None:
    of a load, any key), every component present (empty where left out). Checked before any write, so a refused
    replace or load changes nothing.

    Raises:
        StateError: A component the state lacks, a row of a key not in ``keys``, two rows of one key in a map, or a
            negative count in an unsigned bag.
    """
    unknown = sorted(set(rows) - {c.name for c in spec.components})
    if unknown:
        raise StateError(f"operator {spec.owner}: its state has no component {', '.join(unknown)}")
    names = spec.key_names
    out = {}
    for c in spec.components:
        frame = conform(spec, c.name, rows.get(c.name))
        if frame.height:
            if keys is not None and frame.select(names).join(keys, on=names, how="anti", nulls_equal=True).height:
                raise StateError(f"operator {spec.owner}: a replace gives state component {c.name} rows of keys its "
                                 f"batch did not fetch; this is a bug in imp")
            if c.kind is Kind.MAP and frame.select(names).is_duplicated().any():
                raise StateError(f"operator {spec.owner}: state component {c.name} got two rows of one key")
            if c.kind is Kind.BAG and not c.signed:
                assert c.count is not None
                lowest = normal_form(spec, c.name, frame).get_column(c.count).min()
                if lowest is not None and lowest < 0:  # type: ignore[operator]
                    raise StateError(f"state component {c.name} of operator {spec.owner}: a count became negative — "
                                     f"the change feed deleted rows the state never saw; recapture the sketch")
        out[c.name] = frame
    return out


def normal_form(spec: StateSpec, component: str, frame: pl.DataFrame) -> pl.DataFrame:
    """The rows ``frame`` stands for, as a store returns them: a map's live rows (count not 0); a bag's rows netted
    (one per key and identity, counts summed, those that sum to 0 dropped)."""
    c = spec.component(component)
    frame = conform(spec, component, frame)
    if c.kind is Kind.MAP:
        return frame if c.count is None else frame.filter(pl.col(c.count) != 0)
    assert c.count is not None
    by = [*spec.key_names, *c.identity]
    out = frame.group_by(by, maintain_order=True).agg(pl.col(c.count).sum())
    return out.filter(pl.col(c.count) != 0).select(list(spec.schema(component))).cast(spec.schema(component))  # type: ignore[arg-type]


__all__ = ["KEY_SLOT", "ROW", "Batch", "Checkpoint", "Component", "KeyedStore", "Kind", "Placement", "StateSpec",
           "StoreFactory", "StoreTraits", "checked_rows", "conform", "normal_form"]

"""Versions of keyed state as typed values: what a store's commit returns and a sketch version pins.

A version is saved inside the operator's sealed state (its JSON under the metadata key ``external``), so its JSON
form is part of the saved format: :meth:`DeltaVersion.to_json` writes exactly the reference the Delta store has
always written (format 2), and :func:`version_from_json` reads it back, refusing any other with a ``StateError``
that leads to a recapture.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from imp_core.errors import StateError

DELTA_FORMAT = 2  # the Delta store's reference format (``spark/state_store.py``: ``FORMAT``)
SAVED_KEY = "external"  # the key of an operator's saved metadata that holds a Delta store's reference


@dataclass(frozen=True, slots=True)
class StateVersion:
    """A committed state of one operator's store: live ``rows`` per component (name, count)."""

    store: ClassVar[str] = ""
    rows: tuple[tuple[str, int], ...]

    @property
    def row_counts(self) -> dict[str, int]:
        return dict(self.rows)

    def to_json(self) -> dict[str, Any]:
        raise NotImplementedError

    def saved_meta(self) -> dict[str, Any]:
        """What an operator's saved metadata carries of this version (none: the saved frames are the state)."""
        return {}


@dataclass(frozen=True, slots=True)
class MemoryVersion(StateVersion):
    """A version of the memory store: the number of commits since its state was empty (``serial``). Its contents
    live only as the frames the catalog saves with the sketch version."""

    store: ClassVar[str] = "memory"
    serial: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"store": self.store, "serial": self.serial, "rows": dict(self.rows)}


@dataclass(frozen=True, slots=True)
class DeltaVersion(StateVersion):
    """A version of the Delta store: the table at ``location`` (``<location>/state``) at Delta version
    ``table_version`` (None before its first write), its hash ``buckets``, the rows appended since it was last
    written whole (``log``), the table versions earlier sketch versions pinned (``pins``, oldest first, for
    retention) and the span of its sort key's physical values (``span``, None when unknown or not ranged)."""

    store: ClassVar[str] = "delta"
    location: str = ""
    table_version: int | None = None
    buckets: int = 1
    log: int = 0
    pins: tuple[int, ...] = ()
    span: tuple[int, int] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"store": self.store, "format": DELTA_FORMAT, "location": self.location, "version": self.table_version,
                "buckets": self.buckets, "rows": dict(self.rows), "log": self.log, "pins": list(self.pins),
                "span": list(self.span) if self.span else None}

    def saved_meta(self) -> dict[str, Any]:
        """The reference under the saved metadata's key ``external``, where the sealed state has always kept it."""
        return {SAVED_KEY: self.to_json()}

    @classmethod
    def from_json(cls, reference: Mapping[str, Any]) -> DeltaVersion:
        """The version a saved reference names.

        Raises:
            StateError: The reference is not one this imp writes.
        """
        if reference.get("store") != cls.store or reference.get("format") != DELTA_FORMAT:
            raise StateError(f"external state reference (store {reference.get('store')}, format "
                             f"{reference.get('format')}) is not one this imp reads (format {DELTA_FORMAT}); "
                             f"recapture the sketch")
        try:
            version = reference.get("version")
            span = reference.get("span")
            return cls(rows=tuple((str(k), int(v)) for k, v in dict(reference["rows"]).items()),
                       location=str(reference["location"]), table_version=None if version is None else int(version),
                       buckets=int(reference["buckets"]), log=int(reference.get("log", 0)),
                       pins=tuple(int(p) for p in reference.get("pins", ())),
                       span=(int(span[0]), int(span[1])) if span else None)
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise StateError(f"external state reference is malformed ({type(e).__name__}); recapture the "
                             f"sketch") from e


def version_from_meta(meta: Mapping[str, Any], rows: Mapping[str, int]) -> StateVersion:
    """The version an operator's saved metadata names (``saved_meta``): a Delta store's reference, else a memory
    state whose frames hold ``rows`` per component.

    Raises:
        StateError: The reference is not one this imp reads.
    """
    if SAVED_KEY in meta:
        return DeltaVersion.from_json(meta[SAVED_KEY])
    return MemoryVersion(rows=tuple((str(k), int(v)) for k, v in rows.items()))


def version_from_json(saved: Mapping[str, Any]) -> StateVersion:
    """The version a store's ``to_json`` wrote.

    Raises:
        StateError: It names no store this imp has, or is malformed.
    """
    if saved.get("store") == DeltaVersion.store:
        return DeltaVersion.from_json(saved)
    if saved.get("store") == MemoryVersion.store:
        try:
            return MemoryVersion(rows=tuple((str(k), int(v)) for k, v in dict(saved.get("rows", {})).items()),
                                 serial=int(saved.get("serial", 0)))
        except (TypeError, ValueError) as e:
            raise StateError(f"memory state version is malformed ({type(e).__name__}); recapture the sketch") from e
    raise StateError(f"state version names store {saved.get('store')!r}, which this imp does not have; recapture the "
                     f"sketch")


__all__ = ["DELTA_FORMAT", "SAVED_KEY", "DeltaVersion", "MemoryVersion", "StateVersion", "version_from_json",
           "version_from_meta"]

"""A provenance sketch: for each partitioned table, the set of fragments whose rows the query depends on.

Stored as one bitset per partition (paper Section 8.6.2), shown as sorted fragment ids; see docs/ARCHITECTURE.md,
"State and versions".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from imp_core.sketch.partition import PartitionSet


@dataclass(frozen=True)
class Sketch:
    """Immutable sketch: table -> sorted tuple of local fragment ids."""

    fragments: Mapping[str, tuple[int, ...]]

    @classmethod
    def from_global(cls, partitions: PartitionSet, global_ids: Iterable[int]) -> Sketch:
        return cls({t: tuple(ids) for t, ids in partitions.split_global(list(global_ids)).items()})

    def to_global(self, partitions: PartitionSet) -> set[int]:
        out: set[int] = set()
        for table, frags in self.fragments.items():
            off = partitions.offset(table)
            out.update(off + f for f in frags)
        return out

    def apply(self, partitions: PartitionSet, added: Iterable[int], removed: Iterable[int]) -> Sketch:
        """``P ⊎ ΔP`` with global fragment ids (paper Section 4.2)."""
        current = self.to_global(partitions)
        current.difference_update(removed)
        current.update(added)
        return Sketch.from_global(partitions, current)

    def bits(self, partitions: PartitionSet) -> dict[str, bytes]:
        """One little-endian bitset per table, ``ceil(fragments / 8)`` bytes."""
        out: dict[str, bytes] = {}
        for p in partitions.partitions:
            arr = np.zeros(p.fragments, dtype=bool)
            frags = list(self.fragments.get(p.table, ()))
            if frags:
                arr[frags] = True
            out[p.table] = np.packbits(arr, bitorder="little").tobytes()
        return out

    @classmethod
    def from_bits(cls, partitions: PartitionSet, bits: Mapping[str, bytes]) -> Sketch:
        frags: dict[str, tuple[int, ...]] = {}
        for p in partitions.partitions:
            raw = np.frombuffer(bits.get(p.table, b""), dtype=np.uint8)
            arr = np.unpackbits(raw, bitorder="little")[: p.fragments] if raw.size else np.zeros(0, dtype=np.uint8)
            frags[p.table] = tuple(int(i) for i in np.flatnonzero(arr))
        return cls(frags)

    def covered_share(self, partitions: PartitionSet) -> dict[str, float]:
        """Fraction of fragments in the sketch per table (a proxy for the share of data a query reads)."""
        return {p.table: len(self.fragments.get(p.table, ())) / p.fragments for p in partitions.partitions}

    def to_json(self) -> dict[str, list[int]]:
        return {t: list(f) for t, f in self.fragments.items()}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sketch):
            return NotImplemented
        keys = set(self.fragments) | set(other.fragments)
        return all(tuple(self.fragments.get(k, ())) == tuple(other.fragments.get(k, ())) for k in keys)

    def __hash__(self) -> int:
        return hash(tuple(sorted((k, tuple(v)) for k, v in self.fragments.items() if v)))

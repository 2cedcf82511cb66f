"""Grouping sketches into maintenance jobs: one Spark application maintains a group.

A job's fixed cost (JVM, SparkSession, imports, catalog connection: seconds) dwarfs an incremental batch
(milliseconds), and sketches over the same table share its change feed (:mod:`imp_core.maintenance.feeds`). So the
sketches to maintain are grouped by the tables they read: sketches connected through shared tables stay together
(cut into pieces of at most ``size`` when a component is larger, sketches with the same tables next to each other),
and the remaining room in each job is filled with smaller unrelated components, so that the number of jobs is small.
See docs/ARCHITECTURE.md "Grouped maintenance".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from imp_core.errors import UsageError


def plan_groups(tables: Mapping[str, Iterable[str]], size: int) -> list[tuple[str, ...]]:
    """Cut sketches into groups of at most ``size``, keeping sketches that read the same tables together.

    Args:
        tables: Sketch name -> the tables its query reads.
        size: The largest group.

    Returns:
        The groups, each a tuple of sketch names; deterministic for the same input (names sorted within ties).

    Raises:
        UsageError: ``size`` is below 1.
    """
    if size < 1:
        raise UsageError(f"the maintenance group size must be at least 1, got {size}")
    read = {name: tuple(sorted(set(ts))) for name, ts in tables.items()}
    pieces: list[list[str]] = []
    for component in _components(read):
        ordered = sorted(component, key=lambda n: (read[n], n))
        pieces += [ordered[i:i + size] for i in range(0, len(ordered), size)]
    # first fit decreasing: the fewest jobs for the pieces (a piece is never split again)
    groups: list[list[str]] = []
    for piece in sorted(pieces, key=lambda p: (-len(p), p)):
        for group in groups:
            if len(group) + len(piece) <= size:
                group += piece
                break
        else:
            groups.append(list(piece))
    return [tuple(g) for g in groups]


def _components(read: Mapping[str, tuple[str, ...]]) -> list[list[str]]:
    """Sketches connected through the tables they read (union-find over tables)."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for name, ts in read.items():
        root = find(f"s:{name}")
        for t in ts:
            parent[find(f"t:{t}")] = root
            root = find(root)
    members: dict[str, list[str]] = {}
    for name in sorted(read):
        members.setdefault(find(f"s:{name}"), []).append(name)
    return list(members.values())

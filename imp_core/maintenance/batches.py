"""Eager maintenance batches: pending table versions in commit order, cut into batches of change rows.

A batch ends at the first table version that brings it to at least ``batch_size`` change rows, so a version is never
split and every batch except the last has at least ``batch_size`` rows; each batch is a target version vector (the
iOLAP mini-batch model). See docs/ARCHITECTURE.md, "Data flow".
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PendingVersion:
    """A table version the sketch does not reflect yet: when it was committed and how many change rows it holds."""

    table: str
    version: int
    timestamp: float
    rows: int


def plan_batches(start: dict[str, int], pending: list[PendingVersion], batch_size: int) -> list[dict[str, int]]:
    """Target version vectors, one per batch, in commit order."""
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    ordered = sorted(pending, key=lambda c: (c.timestamp, c.table, c.version))
    reached = dict(start)
    batches: list[dict[str, int]] = []
    rows = 0
    open_batch = False
    for c in ordered:
        reached[c.table] = max(reached.get(c.table, -1), c.version)
        rows += c.rows
        open_batch = True
        if rows >= batch_size:
            batches.append(dict(reached))
            rows = 0
            open_batch = False
    if open_batch:
        batches.append(dict(reached))
    return batches


__all__ = ["PendingVersion", "plan_batches"]

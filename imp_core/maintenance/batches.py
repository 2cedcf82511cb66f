"""Eager maintenance batches: pending table versions in commit order, cut into batches of change rows.

A batch ends at the first commit that brings it to at least ``batch_size`` change rows, so a table version is never
split and every batch except the last has at least ``batch_size`` rows. Each batch is a target version vector; the
maintenance service commits one sketch version per batch (iOLAP's mini-batches), which makes a long backlog a
sequence of small, resumable steps.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Commit:
    table: str
    version: int
    timestamp: float
    rows: int


def plan_batches(start: dict[str, int], commits: list[Commit], batch_size: int) -> list[dict[str, int]]:
    """Target version vectors, one per batch, in commit order."""
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    ordered = sorted(commits, key=lambda c: (c.timestamp, c.table, c.version))
    reached = dict(start)
    batches: list[dict[str, int]] = []
    rows = 0
    pending = False
    for c in ordered:
        reached[c.table] = max(reached.get(c.table, -1), c.version)
        rows += c.rows
        pending = True
        if rows >= batch_size:
            batches.append(dict(reached))
            rows = 0
            pending = False
    if pending:
        batches.append(dict(reached))
    return batches

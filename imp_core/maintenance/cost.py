"""Incremental or full maintenance, chosen by cost (the paper's break-even; Databricks' incremental refresh makes the
same choice per run).

Before a maintenance step the service estimates the incremental passes' cost, a fixed part plus a part per change
row, fitted to the sketch's own recent incremental versions (their recorded durations and change rows; priors for a
sketch without history, higher when state lives outside the process), and a recapture's cost, the duration of its
latest capture scaled by how much its tables grew since. When the incremental estimate is higher, the step is a
recapture, recorded with the two estimates as its reason. The change rows are the commits' changed rows as the Delta
log records them (``sources/delta.changed_rows``), never the rows a rewrite copied. Recaptures are evidence too: after
:data:`REVISIT` recaptures in a row chosen by cost, the next step is incremental once whatever the estimate, so the
fit measures incremental maintenance at today's sizes again (it learns only from incremental versions, and a choice
made on a stale fit would otherwise stand for ever). ``IMP_RECAPTURE_BY_COST=off`` turns the choice off. See
docs/ARCHITECTURE.md, "Incremental or full".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from imp_core.catalog import VersionRecord
from imp_core.maintenance.context import ServiceContext
from imp_core.maintenance.loading import LoadedSketch

HISTORY = 20  # incremental versions the fit looks at
MIN_ROWS = 10_000  # below this many change rows a step is never worth a recapture
PRIORS = {"memory": (0.05, 20e-6), "external": (6.0, 60e-6)}  # (seconds per step, seconds per change row)
CAPTURES = ("capture", "recapture")
REVISIT = 3  # recaptures in a row chosen by cost after which the next step is incremental once
REASON = "cheaper than incremental maintenance"  # how a recapture chosen by cost starts its recorded reason


@dataclass(frozen=True)
class Estimate:
    """The two costs of bringing a sketch to its target versions, in seconds."""

    rows: int
    incremental: float
    recapture: float
    revisit: bool = False  # the last REVISIT versions were recaptures chosen by cost: this step is incremental

    @property
    def recapture_is_cheaper(self) -> bool:
        return self.rows >= MIN_ROWS and self.incremental > self.recapture and not self.revisit

    def reason(self) -> str:
        return (f"{REASON}: about {self.incremental:.1f} s for {self.rows:,} change rows "
                f"against {self.recapture:.1f} s for a recapture (IMP_RECAPTURE_BY_COST=off maintains "
                f"incrementally)")


def estimate(parts: ServiceContext, loaded: LoadedSketch, latest: VersionRecord,
             target: Mapping[str, int]) -> Estimate | None:
    """The costs of the step from ``latest`` to ``target``; None when there is nothing to go by (no capture
    duration recorded, or change row counts the Delta log does not give)."""
    versions = parts.catalog.versions(loaded.record.id)
    capture = next((v for v in reversed(versions) if v.method in CAPTURES and v.duration_ms), None)
    if capture is None or not capture.duration_ms:
        return None
    capture_s = capture.duration_ms / 1000
    rows = 0
    for table, source in loaded.sources.items():
        after, upto = latest.table_versions.get(table, -1), target[table]
        if upto <= after:
            continue
        counts = [c.rows for c in source.commits(after, upto)]
        if any(n is None for n in counts):
            return None
        rows += sum(n for n in counts if n is not None)
    external = any((p or {}).get("where") == "external" for p in (latest.state_placement or {}).values())
    fixed, per_row = fit([v for v in versions if v.method == "incremental"][-HISTORY:],
                         PRIORS["external" if external else "memory"])
    growth = _growth(loaded, capture, target)
    return Estimate(rows, fixed + per_row * rows, capture_s * growth, revisit(versions))


def revisit(history: Sequence[VersionRecord]) -> bool:
    """Whether the latest :data:`REVISIT` versions of ``history`` (oldest first) are all recaptures chosen by cost:
    then the next step is tried incrementally once, and its duration joins the fit."""
    last = list(history)[-REVISIT:]
    return len(last) == REVISIT and all(v.method == "recapture" and (v.reason or "").startswith(REASON) for v in last)


def fit(history: Sequence[VersionRecord], prior: tuple[float, float]) -> tuple[float, float]:
    """Seconds per step and per change row, by least squares over ``history`` (durations and change rows), kept no
    cheaper than none at all; ``prior`` when there are fewer than two distinct batch sizes."""
    points = [(v.delta_rows, v.duration_ms / 1000) for v in history if v.duration_ms is not None]
    if len({x for x, _ in points}) < 2:
        return prior
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    var = sum((x - mx) ** 2 for x, _ in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / var
    slope = max(slope, prior[1] / 10)
    return max(0.0, my - slope * mx), slope


def _growth(loaded: LoadedSketch, capture: VersionRecord, target: Mapping[str, int]) -> float:
    """How much the sketch's tables grew since the capture (rows now over rows then, from the Delta logs)."""
    then = now = 0
    for table, source in loaded.sources.items():
        if table in capture.table_versions:
            then += sum(f.num_records or 0 for f in source.files(capture.table_versions[table]))
            now += sum(f.num_records or 0 for f in source.files(target[table]))
    return max(1.0, now / then) if then else 1.0


__all__ = ["REVISIT", "Estimate", "estimate", "fit", "revisit"]

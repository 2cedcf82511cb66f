"""The benchmark harness: measure side by side, keep every run, summarize with medians, write CSV/JSON/PNG.

Every experiment records *measurements*: one row per run with the case (e.g. a batch size), the variant (e.g. IMP or
FM), the run index and the value, and the commit and date of the run. Variants of one case are measured interleaved
in the same run (IMP run 1, FM run 1, IMP run 2, ...), so a ratio is computed pair by pair within a run and noise on
this shared machine hits both sides. After a warm-up run (not recorded), at least ``runs`` runs are kept; quick mode
(``--quick``: a first look and the CI smoke test, where the figures are not the point) skips the warm-up.

Outputs per experiment: ``docs/bench/<name>.csv`` (every run), ``docs/bench/<name>.json`` (how to present it: title,
ratios, axes, notes) and ``docs/bench/<name>.png`` (medians, log axes where the paper uses them); docs/BENCHMARKS.md is
generated from the CSVs (``benchmarks/report.py``). An experiment with ``merge`` replaces the rows of the cases it
measured and keeps the others (suites that run a subset of their cases by environment variable).
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import os
import statistics
import subprocess
import textwrap
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# IMP_BENCH_OUT redirects CSV/PNG/markdown (the CI smoke test writes to a temp dir, never to docs/)
OUT = Path(os.environ.get("IMP_BENCH_OUT", ROOT / "docs" / "bench"))
DOC = OUT.parent / "BENCHMARKS.md" if "IMP_BENCH_OUT" in os.environ else ROOT / "docs" / "BENCHMARKS.md"
# IMP_BENCH_SCALE shrinks every table (the CI smoke test runs the whole harness on tiny data)
SCALE = float(os.environ.get("IMP_BENCH_SCALE", "1"))
# set by ``python -m benchmarks --quick``: ``measure`` runs no warm-up round (each round of a whole-job case is a JVM)
QUICK = False
COLUMNS = ["experiment", "case", "variant", "run", "value", "unit", "x", "commit", "date"]
# what the JSON beside a CSV holds: how the experiment is presented (the rows are the CSV)
META = ("title", "ratios", "log_x", "log_y", "x_label", "y_label", "notes", "timed", "warmup")


def scaled(rows: int) -> int:
    return max(1000, int(rows * SCALE))


def provenance() -> tuple[str, str]:
    """The commit and UTC date a run records: the checkout's short commit, with ``+dirty`` when the code
    (``imp_core``, ``benchmarks``) has uncommitted changes, or ``unknown`` outside a git checkout."""
    date = dt.datetime.now(dt.timezone.utc).date().isoformat()
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short=7", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True, timeout=30
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "imp_core", "benchmarks"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown", date
    return commit + ("+dirty" if dirty else ""), date


@dataclass
class Row:
    case: str
    variant: str
    run: int
    value: float
    unit: str = "s"
    x: float | None = None  # numeric x for plots (batch size, fragments, ...)
    extra: dict[str, Any] = field(default_factory=dict)
    commit: str = ""  # set when the experiment is written (the run's checkout)
    date: str = ""


@dataclass
class Experiment:
    name: str
    title: str
    rows: list[Row] = field(default_factory=list)
    ratios: list[tuple[str, str]] = field(default_factory=list)  # (numerator variant, denominator variant)
    log_x: bool = False
    log_y: bool = True
    x_label: str = "case"
    y_label: str = "seconds"
    notes: list[str] = field(default_factory=list)
    timed: bool = True  # False: sizes or one whole sequence per case, not repeated timings
    warmup: bool = True  # False: runs recorded with ``add`` with no warm-up round before them
    merge: bool = False  # True: writing keeps the recorded rows of the cases this run did not measure

    def add(
        self, case: str, variant: str, run: int, value: float, unit: str = "s", x: float | None = None, **extra: Any
    ) -> None:
        self.rows.append(Row(case, variant, run, value, unit, x, extra))

    def measure(
        self,
        case: str,
        variants: dict[str, Callable[[], float | None]],
        runs: int,
        warmup: int | None = None,
        x: float | None = None,
        unit: str = "s",
    ) -> None:
        """Run each variant ``warmup + runs`` times, interleaved; a callable returns its own measured value or None
        to be timed as a whole. ``warmup`` defaults to one round, none in quick mode."""
        if warmup is None:
            warmup = 0 if QUICK else 1
        if warmup == 0:
            self.warmup = False
        for i in range(warmup + runs):
            for variant, fn in variants.items():
                t0 = time.perf_counter()
                value = fn()
                elapsed = time.perf_counter() - t0
                if i >= warmup:
                    self.add(case, variant, i - warmup, elapsed if value is None else float(value), unit, x)

    # -- summaries -------------------------------------------------------------------------------------------------

    def cases(self) -> list[str]:
        return list(dict.fromkeys(r.case for r in self.rows))

    def variants(self) -> list[str]:
        return list(dict.fromkeys(r.variant for r in self.rows))

    def values(self, case: str, variant: str) -> list[float]:
        return [r.value for r in self.rows if r.case == case and r.variant == variant]

    def ratio(self, case: str, num: str, den: str) -> list[float]:
        a = {r.run: r.value for r in self.rows if r.case == case and r.variant == num}
        b = {r.run: r.value for r in self.rows if r.case == case and r.variant == den}
        return [a[k] / b[k] for k in sorted(a) if k in b and b[k] > 0]

    def median(self, case: str, variant: str) -> float | None:
        """The median of a variant's runs of ``case`` (None when it has none)."""
        vals = self.values(case, variant)
        return statistics.median(vals) if vals else None

    def ratio_median(self, case: str, num: str, den: str) -> float | None:
        """The median of the per-run ratios ``num / den`` of ``case`` (None when no run has both)."""
        r = self.ratio(case, num, den)
        return statistics.median(r) if r else None

    def extra(self, case: str, key: str, variant: str | None = None) -> Any:
        """A recorded extra column of ``case`` (of ``variant``): its first row that has it, or None."""
        return next(
            (
                r.extra[key]
                for r in self.rows
                if r.case == case and (variant is None or r.variant == variant) and r.extra.get(key) not in (None, "")
            ),
            None,
        )

    def unit(self, variant: str) -> str:
        for r in self.rows:
            if r.variant == variant:
                return r.unit
        return "s"

    def dates(self, cases: Iterable[str] | None = None) -> list[str]:
        """The distinct dates of the rows (of ``cases``), sorted."""
        wanted = None if cases is None else set(cases)
        return sorted({r.date for r in self.rows if r.date and (wanted is None or r.case in wanted)})

    def runs_per_case(self) -> int:
        """Runs per case and variant (the most any has: single measurements beside timings show no range)."""
        counts: dict[tuple[str, str], int] = {}
        for r in self.rows:
            counts[(r.case, r.variant)] = counts.get((r.case, r.variant), 0) + 1
        return max(counts.values()) if counts else 0

    # -- files ---------------------------------------------------------------------------------------------------------

    def write(self) -> None:
        """Write the CSV (every row with the commit and date of its run), its JSON and the plot."""
        commit, date = provenance()
        for r in self.rows:
            if not r.commit:
                r.commit, r.date = commit, date
        OUT.mkdir(parents=True, exist_ok=True)
        if self.merge and (OUT / f"{self.name}.csv").exists():
            measured = set(self.cases())
            self.rows = [r for r in Experiment.load(self.name, OUT).rows if r.case not in measured] + self.rows
        extras = sorted({k for r in self.rows for k in r.extra})
        with open(OUT / f"{self.name}.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow([*COLUMNS, *extras])
            for r in self.rows:
                w.writerow(
                    [
                        self.name,
                        r.case,
                        r.variant,
                        r.run,
                        f"{r.value:.6g}",
                        r.unit,
                        "" if r.x is None else r.x,
                        r.commit,
                        r.date,
                        *[r.extra.get(k, "") for k in extras],
                    ]
                )
        (OUT / f"{self.name}.json").write_text(self.meta_json())
        self.plot()

    def meta_json(self) -> str:
        """The presentation fields as JSON, one per line."""
        fields = [f" {json.dumps(k)}: {json.dumps(getattr(self, k), ensure_ascii=False)}" for k in META]
        return "{\n" + ",\n".join(fields) + "\n}\n"

    @classmethod
    def load(cls, name: str, directory: Path | None = None) -> Experiment:
        """The experiment as written: rows from ``<name>.csv``, presentation from ``<name>.json`` (when present)."""
        directory = OUT if directory is None else directory
        meta_path = directory / f"{name}.json"
        meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
        meta["ratios"] = [tuple(r) for r in meta.get("ratios", [])]
        exp = cls(name, meta.pop("title", name), **{k: v for k, v in meta.items() if k in META})
        with open(directory / f"{name}.csv", newline="") as f:
            for rec in csv.DictReader(f):
                extra = {k: v for k, v in rec.items() if k not in COLUMNS and v not in (None, "")}
                exp.rows.append(
                    Row(
                        rec["case"],
                        rec["variant"],
                        int(rec["run"]),
                        float(rec["value"]),
                        rec.get("unit") or "s",
                        float(rec["x"]) if rec.get("x") else None,
                        extra,
                        rec.get("commit") or "unknown",
                        rec.get("date") or "",
                    )
                )
        return exp

    def plot(self) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        xs_numeric = all(r.x is not None for r in self.rows)
        cases = self.cases()
        for variant in self.variants():
            pts = []
            for i, case in enumerate(cases):
                vals = self.values(case, variant)
                if not vals:
                    continue
                x = next((r.x for r in self.rows if r.case == case), None) if xs_numeric else i
                pts.append((x, statistics.median(vals), min(vals), max(vals)))
            if not pts:
                continue
            pts.sort()
            xs = [p[0] for p in pts]
            med = [p[1] for p in pts]
            lo = [p[1] - p[2] for p in pts]
            hi = [p[3] - p[1] for p in pts]
            ax.errorbar(xs, med, yerr=[lo, hi], marker="o", capsize=3, label=variant)
        if not xs_numeric:
            ax.set_xticks(range(len(cases)))
            ax.set_xticklabels(cases, rotation=30, ha="right", fontsize=8)
        if self.log_x and xs_numeric:
            ax.set_xscale("log")
        if self.log_y:
            ax.set_yscale("log")
        ax.set_xlabel(self.x_label)
        ax.set_ylabel(self.y_label)
        ax.set_title(textwrap.fill(self.title, 90), fontsize=9)  # long titles would be cut at the figure's edges
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(OUT / f"{self.name}.png", dpi=110)
        plt.close(fig)

    # -- markdown ------------------------------------------------------------------------------------------------------

    def how(self) -> str:
        """How the figures were measured, for a table's caption."""
        runs = self.runs_per_case()
        after = " after a warm-up" if self.warmup else ""
        return (
            f"median of {runs} runs{after} (min–max)"
            if self.timed and runs > 1
            else "one measurement per case"
            if not self.timed
            else "one run per case"
        )

    def caption(self) -> str:
        dates = self.dates()
        when = (
            f"; measured {dates[0]}"
            if len(dates) == 1
            else f"; measured {dates[0]} to {dates[-1]} (per row in the CSV)"
            if dates
            else ""
        )
        return f"**{self.title}** — {self.how()}{when}; [CSV](bench/{self.name}.csv), [plot](bench/{self.name}.png)"

    def markdown(self, cases: list[str] | None = None, notes: bool = True, variants: list[str] | None = None) -> str:
        """The caption and one table row per case (all, or ``cases``): each variant's (all, or ``variants``) median
        (min–max), then each ratio's median of per-run ratios."""
        variants = self.variants() if variants is None else variants
        lines = [self.caption(), ""]
        header = [
            "case",
            *[v if v.endswith(f"({self.unit(v)})") else f"{v} ({self.unit(v)})" for v in variants],
            *[f"{a}/{b} (median of per-run ratios)" for a, b in self.ratios],
        ]
        lines.append("| " + " | ".join(header) + " |")
        lines.append("|" + "---|" * len(header))
        for case in cases if cases is not None else self.cases():
            cells = [case]
            for v in variants:
                vals = self.values(case, v)
                cells.append(_fmt(vals) if vals else "")
            for a, b in self.ratios:
                r = self.ratio_median(case, a, b)
                cells.append(f"{r:.3g}x" if r is not None else "")
            lines.append("| " + " | ".join(cells) + " |")
        if notes and self.notes:
            lines += ["", *self.notes]
        return "\n".join(lines)


def _fmt(vals: Iterable[float]) -> str:
    vals = list(vals)
    if len(vals) == 1:
        return num(vals[0])
    med = statistics.median(vals)
    return f"{num(med)} ({num(min(vals))}–{num(max(vals))})"


def num(v: float) -> str:
    """A figure with three significant digits, thousands separated from 1,000 on."""
    if v == 0:
        return "0"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.3g}"


def print_header(columns: list[str]) -> None:
    """A markdown table's header, for the standalone drivers that print their figures as they go."""
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))


def print_row(*cells: object) -> None:
    print("| " + " | ".join(str(c) for c in cells) + " |", flush=True)


def spread(r: dict[str, Any]) -> str:
    """``median (min-max)`` of a result with those keys, in seconds."""
    return f"{r['median']:.4f} ({r['min']:.4f}-{r['max']:.4f})"


def median(vals: list[float]) -> float:
    return statistics.median(vals)

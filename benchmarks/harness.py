"""The benchmark harness: measure side by side, keep every run, summarize with medians, write CSV/PNG/markdown.

Every experiment records *measurements*: one row per run with the case (e.g. a batch size), the variant (e.g. IMP or
FM), the run index and the value. Variants of one case are measured interleaved in the same run (IMP run 1, FM run 1,
IMP run 2, ...), so a ratio is computed pair by pair within a run and noise on this shared machine hits both sides.
After a warm-up run (not recorded), at least ``runs`` runs are kept; quick mode (``--quick``: a first look and the
CI smoke test, where the figures are not the point) skips the warm-up.

Outputs per experiment: ``docs/bench/<name>.csv`` (every run), ``docs/bench/<name>.png`` (medians, log axes where the
paper uses them), and a generated section of ``docs/BENCHMARKS.md`` between ``<!-- bench:<name> -->`` markers;
everything outside the markers (the comparison with the paper, the explanations) is written by hand and kept.
"""

from __future__ import annotations

import csv
import os
import statistics
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


def scaled(rows: int) -> int:
    return max(1000, int(rows * SCALE))


@dataclass
class Row:
    case: str
    variant: str
    run: int
    value: float
    unit: str = "s"
    x: float | None = None  # numeric x for plots (batch size, fragments, ...)
    extra: dict[str, Any] = field(default_factory=dict)


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

    def add(self, case: str, variant: str, run: int, value: float, unit: str = "s", x: float | None = None,
            **extra: Any) -> None:
        self.rows.append(Row(case, variant, run, value, unit, x, extra))

    def measure(self, case: str, variants: dict[str, Callable[[], float | None]], runs: int,
                warmup: int | None = None, x: float | None = None, unit: str = "s") -> None:
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
        seen: list[str] = []
        for r in self.rows:
            if r.case not in seen:
                seen.append(r.case)
        return seen

    def variants(self) -> list[str]:
        seen: list[str] = []
        for r in self.rows:
            if r.variant not in seen:
                seen.append(r.variant)
        return seen

    def values(self, case: str, variant: str) -> list[float]:
        return [r.value for r in self.rows if r.case == case and r.variant == variant]

    def ratio(self, case: str, num: str, den: str) -> list[float]:
        a = {r.run: r.value for r in self.rows if r.case == case and r.variant == num}
        b = {r.run: r.value for r in self.rows if r.case == case and r.variant == den}
        return [a[k] / b[k] for k in sorted(a) if k in b and b[k] > 0]

    def unit(self, variant: str) -> str:
        for r in self.rows:
            if r.variant == variant:
                return r.unit
        return "s"

    # -- output ------------------------------------------------------------------------------------------------------

    def write(self) -> None:
        OUT.mkdir(parents=True, exist_ok=True)
        extras = sorted({k for r in self.rows for k in r.extra})
        with open(OUT / f"{self.name}.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["experiment", "case", "variant", "run", "value", "unit", "x", *extras])
            for r in self.rows:
                w.writerow([self.name, r.case, r.variant, r.run, f"{r.value:.6g}", r.unit,
                            "" if r.x is None else r.x, *[r.extra.get(k, "") for k in extras]])
        self.plot()
        update_doc(self.name, self.markdown())

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

    def markdown(self) -> str:
        variants = self.variants()
        runs = self.runs_per_case()
        after = " after a warm-up" if self.warmup else ""
        how = (f"median of {runs} runs{after} (min–max)" if self.timed and runs > 1 else
               "one measurement per case" if not self.timed else "one run per case")
        lines = [f"**{self.title}** — {how}; [CSV](bench/{self.name}.csv), ![plot](bench/{self.name}.png)", ""]
        header = ["case", *[v if v.endswith(f"({self.unit(v)})") else f"{v} ({self.unit(v)})" for v in variants],
                  *[f"{a}/{b} (median of per-run ratios)" for a, b in self.ratios]]
        lines.append("| " + " | ".join(header) + " |")
        lines.append("|" + "---|" * len(header))
        for case in self.cases():
            cells = [case]
            for v in variants:
                vals = self.values(case, v)
                cells.append(_fmt(vals) if vals else "")
            for a, b in self.ratios:
                r = self.ratio(case, a, b)
                cells.append(f"{statistics.median(r):.3g}x" if r else "")
            lines.append("| " + " | ".join(cells) + " |")
        if self.notes:
            lines += ["", *self.notes]
        return "\n".join(lines)

    def runs_per_case(self) -> int:
        counts = {}
        for r in self.rows:
            counts[(r.case, r.variant)] = counts.get((r.case, r.variant), 0) + 1
        return min(counts.values()) if counts else 0


def _fmt(vals: Iterable[float]) -> str:
    vals = list(vals)
    if len(vals) == 1:
        return _num(vals[0])
    med = statistics.median(vals)
    return f"{_num(med)} ({_num(min(vals))}–{_num(max(vals))})"


def _num(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 1:
        return f"{v:.3g}"
    return f"{v:.3g}"


def update_doc(name: str, body: str) -> None:
    """Replace the generated section of ``name`` in docs/BENCHMARKS.md (append it if missing)."""
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    text = DOC.read_text() if DOC.exists() else "# Benchmarks\n"
    block = f"{start}\n{body}\n{end}"
    if start in text and end in text:
        head, _, rest = text.partition(start)
        _, _, tail = rest.partition(end)
        text = head + block + tail
    else:
        text = text.rstrip("\n") + f"\n\n## {name}\n\n{block}\n"
    DOC.write_text(text)


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

"""How docs/BENCHMARKS.md draws an experiment's table (``Full``, ``Wide``, ``Pivot``), and targets judged on the
recorded figures (``Target`` with its figure helpers). ``benchmarks/registry.py`` picks them per experiment."""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from benchmarks.harness import Experiment, num

Loader = Callable[[str], "Experiment | None"]


# -- views: how an experiment's table is drawn ---------------------------------------------------------------------


@dataclass(frozen=True)
class Full:
    """One row per case (all, or ``cases``), a column per variant (all, or ``variants``) and per ratio (the harness's
    table), and the experiment's notes when ``notes``."""

    cases: tuple[str, ...] = ()
    notes: bool = False
    variants: tuple[str, ...] = ()

    def render(self, exp: Experiment) -> str:
        cases = [c for c in self.cases if c in exp.cases()] if self.cases else None
        variants = [v for v in self.variants if v in exp.variants()] if self.variants else None
        return exp.markdown(cases, notes=self.notes, variants=variants)


@dataclass(frozen=True)
class Wide:
    """One row per variant and per ratio, a column per case (a sweep of one parameter: batch sizes, fragments)."""

    corner: str = ""

    def render(self, exp: Experiment) -> str:
        cases = exp.cases()
        lines = [exp.caption(), "", "| " + " | ".join([self.corner, *cases]) + " |", "|" + "---|" * (len(cases) + 1)]
        for v in exp.variants():
            cells = [num(m) if (m := exp.median(c, v)) is not None else "" for c in cases]
            lines.append("| " + " | ".join([f"{v} ({exp.unit(v)})", *cells]) + " |")
        for a, b in exp.ratios:
            cells = [f"{r:.3g}x" if (r := exp.ratio_median(c, a, b)) is not None else "" for c in cases]
            lines.append("| " + " | ".join([f"{a}/{b}", *cells]) + " |")
        return "\n".join(lines)


@dataclass(frozen=True)
class Grid:
    """One row per case, a column per variant, each cell drawn by ``cell(experiment, case, variant)``."""

    cell: Callable[[Experiment, str, str], str]
    corner: str = "case"
    legend: str = ""

    def render(self, exp: Experiment) -> str:
        variants = exp.variants()
        caption = exp.caption() + (f"; {self.legend}" if self.legend else "")
        lines = [caption, "", "| " + " | ".join([self.corner, *variants]) + " |", "|" + "---|" * (len(variants) + 1)]
        for case in exp.cases():
            lines.append("| " + " | ".join([case, *[self.cell(exp, case, v) for v in variants]]) + " |")
        return "\n".join(lines)


@dataclass(frozen=True)
class Pivot:
    """Cases laid out as a grid: ``split`` names a case's row and column (None: the case is left out), ``cell``
    draws a case's figure; ``columns`` adds per-row columns after the grid (a function of the row's cases)."""

    split: Callable[[str], tuple[str, str] | None]
    cell: Callable[[Experiment, str], str]
    corner: str = "case"
    legend: str = ""
    columns: tuple[tuple[str, Callable[[Experiment, list[str]], str]], ...] = ()

    def render(self, exp: Experiment) -> str:
        grid: dict[str, dict[str, str]] = {}
        cols: list[str] = []
        for case in exp.cases():
            at = self.split(case)
            if at is None:
                continue
            row, col = at
            grid.setdefault(row, {})[col] = case
            if col not in cols:
                cols.append(col)
        header = [self.corner, *cols, *[name for name, _ in self.columns]]
        caption = exp.caption() + (f"; {self.legend}" if self.legend else "")
        lines = [caption, "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for row, at in grid.items():
            cells = [self.cell(exp, at[c]) if c in at else "" for c in cols]
            extra = [fn(exp, list(at.values())) for _, fn in self.columns]
            lines.append("| " + " | ".join([row, *cells, *extra]) + " |")
        return "\n".join(lines)


View = Full | Wide | Grid | Pivot


def ratio_cell(num_variant: str, den_variant: str) -> Callable[[Experiment, str], str]:
    """A case's median of per-run ratios ``num / den``, as ``12.3x``."""

    def cell(exp: Experiment, case: str) -> str:
        r = exp.ratio_median(case, num_variant, den_variant)
        return "" if r is None else f"{r:.3g}x"

    return cell


def median_cell(variant: str, scale: float = 1.0, unit: str = "") -> Callable[[Experiment, str], str]:
    """A variant's median for a case (times ``scale``, with ``unit``)."""

    def cell(exp: Experiment, case: str) -> str:
        m = exp.median(case, variant)
        return "" if m is None else f"{num(m * scale)}{unit}"

    return cell


# -- targets -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """A target an issue set, judged on the recorded figures: ``figure`` computes the figure from the experiments
    (None: not measured), which meets the target when it is ``op`` (``<=`` or ``>=``) ``limit``."""

    issue: str
    goal: str
    experiments: tuple[str, ...]
    figure: Callable[[Loader], float | None]
    op: str
    limit: float
    show: Callable[[float], str] = num

    def judge(self, load: Loader) -> tuple[str, str]:
        """(the figure as shown, met / missed / not measured)."""
        try:
            value = self.figure(load)
        except (KeyError, ValueError, ZeroDivisionError, statistics.StatisticsError):
            value = None
        if value is None:
            return "", "not measured"
        met = value <= self.limit if self.op == "<=" else value >= self.limit
        return self.show(value), "met" if met else "**missed**"


def median_of(name: str, case: str, variant: str) -> Callable[[Loader], float | None]:
    """The median of ``variant``'s runs of ``case`` in experiment ``name``."""

    def figure(load: Loader) -> float | None:
        e = load(name)
        return None if e is None else e.median(case, variant)

    return figure


def ratio_of(name: str, case: str, num_variant: str, den_variant: str) -> Callable[[Loader], float | None]:
    """The median of the per-run ratios ``num / den`` of ``case`` in experiment ``name``."""

    def figure(load: Loader) -> float | None:
        e = load(name)
        return None if e is None else e.ratio_median(case, num_variant, den_variant)

    return figure


def over_cases(
    name: str, pattern: str, stat: Callable[[Experiment, str], float | None], combine: Callable[[list[float]], float]
) -> Callable[[Loader], float | None]:
    """``combine`` (min, max, median, ...) of ``stat`` over the cases matching ``pattern``."""

    def figure(load: Loader) -> float | None:
        e = load(name)
        if e is None:
            return None
        got = [v for c in e.cases() if re.search(pattern, c) and (v := stat(e, c)) is not None]
        return combine(got) if got else None

    return figure


def spread(values: list[float]) -> float:
    """The largest over the smallest."""
    return max(values) / min(values)


def ms(v: float) -> str:
    return f"{v * 1000:.3g} ms"


def times(v: float) -> str:
    return f"{v:.3g}x"


def seconds(v: float) -> str:
    return f"{v:.3g} s"


__all__ = [
    "Full",
    "Grid",
    "Loader",
    "Pivot",
    "Target",
    "View",
    "Wide",
    "median_cell",
    "median_of",
    "ms",
    "over_cases",
    "ratio_cell",
    "ratio_of",
    "seconds",
    "spread",
    "times",
]

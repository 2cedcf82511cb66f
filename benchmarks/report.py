"""docs/BENCHMARKS.md from docs/bench/*.csv: ``python -m benchmarks --report`` (``make bench-report``); a run of
``python -m benchmarks`` does it after each experiment it writes.

The document is hand-written prose around generated blocks between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME
-->`` markers: one block per suite of ``benchmarks/registry.py`` (its experiments' tables, each drawn by the view the
registry gives it, a plain table by default), ``targets`` (every target of the registry, met or missed, computed from
the CSVs) and ``suites`` (what each suite measures and how long it runs). Only the blocks are rewritten, from the
CSVs alone, so running it twice gives the same file; a block missing from the document is appended with a heading,
and an experiment no suite lists gets a block of its own.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks import harness
from benchmarks.harness import Experiment
from benchmarks.registry import SUITES, TARGETS, VIEWS, Suite
from benchmarks.views import Full, Loader, Target


def loader(directory: Path) -> Loader:
    cache: dict[str, Experiment | None] = {}

    def load(name: str) -> Experiment | None:
        if name not in cache:
            cache[name] = Experiment.load(name, directory) if (directory / f"{name}.csv").exists() else None
        return cache[name]

    return load


def blocks(directory: Path) -> list[tuple[str, str, str]]:
    """(name, heading, body) of every generated block, in the document's order."""
    load = loader(directory)
    out = [("suites", "Suites", suites_table()), ("targets", "Targets", targets_table(TARGETS, load))]
    listed: set[str] = set()
    sections: dict[str, tuple[str, list[str]]] = {}
    for suite in SUITES:
        listed |= {*suite.experiments, *suite.hidden}
        tables = [VIEWS.get(name, Full()).render(e) for name in suite.experiments if (e := load(name)) is not None]
        sections.setdefault(suite.block, (suite.title, []))[1].extend(tables)
    out += [(name, title, "\n\n".join(tables)) for name, (title, tables) in sections.items() if tables]
    for path in sorted(directory.glob("*.csv")):
        if path.stem not in listed and (e := load(path.stem)) is not None:
            out.append((path.stem, path.stem, Full(notes=True).render(e)))
    return out


def suites_table(suites: tuple[Suite, ...] = SUITES) -> str:
    lines = ["| suite | what it measures | experiments (docs/bench/) | full run |", "|---|---|---|---|"]
    for s in suites:
        lines.append(f"| `{s.name}` | {s.title} | {', '.join((*s.experiments, *s.hidden))} | {s.duration} |")
    return "\n".join(lines)


def targets_table(targets: tuple[Target, ...], load: Loader) -> str:
    lines = ["| target | issue | measured | | experiment, date |", "|---|---|---|---|---|"]
    for t in targets:
        shown, status = t.judge(load)
        dates = sorted({d for name in t.experiments if (e := load(name)) is not None for d in e.dates()})
        when = dates[-1] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}" if dates else ""
        lines.append(f"| {t.goal} | {t.issue} | {shown} | {status} | {', '.join(t.experiments)}, {when} |")
    return "\n".join(lines)


def replace_block(text: str, name: str, heading: str, body: str) -> str:
    """``text`` with the block ``name`` holding ``body`` (appended under ``## heading`` when missing)."""
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    block = f"{start}\n{body}\n{end}"
    if start in text and end in text:
        head, _, rest = text.partition(start)
        _, _, tail = rest.partition(end)
        return head + block + tail
    return text.rstrip("\n") + f"\n\n## {heading}\n\n{block}\n"


def render(text: str, directory: Path) -> str:
    for name, heading, body in blocks(directory):
        text = replace_block(text, name, heading, body)
    return text


def refresh(doc: Path | None = None, directory: Path | None = None) -> None:
    """Regenerate every block of ``doc`` (docs/BENCHMARKS.md) from the CSVs in ``directory`` (docs/bench)."""
    doc = harness.DOC if doc is None else doc
    directory = harness.OUT if directory is None else directory
    text = doc.read_text() if doc.exists() else "# Benchmarks\n"
    new = render(text, directory)
    if new != text:
        doc.write_text(new)


__all__ = ["blocks", "loader", "refresh", "render", "replace_block", "suites_table", "targets_table"]

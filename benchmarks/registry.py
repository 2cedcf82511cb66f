"""Every benchmark suite, how docs/BENCHMARKS.md shows its experiments, and the targets judged on them.

Adding an experiment:

1. a module ``benchmarks/<suite>.py`` with ``run(quick: bool, runs: int)`` returning (or yielding) the
   ``harness.Experiment`` objects it measured (one per CSV: ``docs/bench/<experiment>.csv``);
2. a ``Suite`` entry below (``python -m benchmarks --only <suite>`` runs it, the document shows it in this order);
3. optionally a view in ``VIEWS`` (a plain table otherwise) and its ``TARGETS``;
4. run it (``python -m benchmarks --only <suite>``): the CSV rows carry the commit and date, and the document is
   regenerated (``python -m benchmarks --report`` regenerates it from the CSVs alone). Write the suite's section
   prose by hand around its ``<!-- bench:<suite> -->`` block, which the first run appends.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from benchmarks.harness import Experiment, num
from benchmarks.views import (
    Full,
    Grid,
    Loader,
    Pivot,
    Target,
    View,
    Wide,
    median_cell,
    median_of,
    ms,
    over_cases,
    ratio_cell,
    ratio_of,
    seconds,
    spread,
    times,
)


@dataclass(frozen=True)
class Suite:
    """``benchmarks/<name>.py``: what it measures, the experiments it writes in the document's order, how long a full
    run takes on the 2-core machine, and the document's block that shows it (``section``; its own by default, which
    the first run appends under the suite's title). ``hidden``: experiments it writes that the document does not
    draw (another table supersedes them, or the prose states their one figure; their CSVs stay)."""

    name: str
    title: str
    experiments: tuple[str, ...]
    duration: str = ""
    section: str = ""
    hidden: tuple[str, ...] = ()

    @property
    def block(self) -> str:
        return self.section or self.name


SUITES: tuple[Suite, ...] = (
    Suite(
        "engine_v2",
        "In-memory engine: engine v2 and the first engine (v1) side by side",
        ("engine_v2_batch", "engine_v2_groups", "engine_v2_q18h", "engine_v2_q_groups"),
        "5 min",
        "engine",
    ),
    Suite(
        "engine",
        "The first engine's pipeline and state (superseded by the v1 columns of `engine_v2`)",
        (),
        "5 min",
        "engine",
        hidden=("engine_throughput", "engine_state"),
    ),
    Suite("skipping", "Capture and data skipping", ("capture", "skipping"), "5 min", "skipping"),
    Suite(
        "floor",
        "Skipping on 100M rows",
        ("skipping_100m",),
        "2 min (plus 20 s to generate the 100M-row table once)",
        "skipping",
    ),
    Suite(
        "maintenance",
        "IMP versus full maintenance: microbenchmarks and memory (paper 8.3, 8.4, 8.6)",
        (
            "q_groups",
            "breakeven_groups",
            "q_having",
            "q_join",
            "q_joinsel",
            "q_sketch",
            "q_selpd",
            "joinsel_optimizations",
            "memory",
        ),
        "1.5 h",
        "maintenance",
        hidden=("sketch_sizes",),
    ),
    Suite("tpch", "TPC-H SF1 (paper Fig. 9a)", ("tpch",), "15 min", "tpch"),
    Suite(
        "tpch22",
        "All 22 TPC-H queries at SF1, and two top-N-per-group queries",
        ("tpch22",),
        "3 h (`IMP_SPARK_DRIVER_MEMORY=12g`)",
        "tpch",
    ),
    Suite(
        "topk",
        "Bounded top-k buffers (paper Fig. 14, 15)",
        ("topk_buffers",),
        "45 min",
        "topk",
        hidden=("topk_memory", "topk_update"),
    ),
    Suite(
        "strategies",
        "Maintenance strategies, the mixed workload, the whole job (paper 8.1, 8.5)",
        ("eager_vs_lazy", "mixed_workload", "compaction", "whole_job"),
        "2.5 h",
        "workloads",
    ),
    Suite("mixed_layout", "The mixed workload with the nightly layout task", ("mixed_layout",), "40 min", "workloads"),
    Suite("skew", "Skewed inserts: range split and merge", ("skew_split",), "10 min", "workloads"),
    Suite(
        "nightly",
        "A night of many sketches (spark-submit, Spark Connect, Airflow)",
        ("nightly",),
        "80 min (`IMP_SPARK_DRIVER_MEMORY=8g`)",
        "operations",
    ),
    Suite(
        "lakehouse",
        "Lakehouse reads: change feed and Delta's connector",
        ("lakehouse_cdf", "lakehouse_connector"),
        "7 min",
        "operations",
    ),
    Suite(
        "scale",
        "Tables of any size: state in memory or in Delta tables, SF1 and SF10",
        ("scale",),
        "3-12 min per SF1 case, up to 1.5 h per SF10 case",
        "state",
    ),
    Suite("state_store", "One external operator's store alone", ("state_store",), "5 min", "state"),
    Suite("state_parts", "In-memory state saved and loaded in parts", ("state_parts",), "7 min", "state"),
    Suite("freshness", "Fresh within a minute of a commit (the real Airflow stack)", ("freshness",), "12 min"),
    Suite(
        "extension",
        "Every Spark query gets the sketch: the session extension's planning cost and its speed-up by client",
        ("extension_planning", "extension_queries", "extension_tpch"),
        "10 min",
    ),
)


def _split_n(case: str) -> tuple[str, str] | None:
    """``"5% sel, n=1,000"`` -> ``("5% sel", "1,000")``."""
    m = re.fullmatch(r"(.+), n=(.+)", case)
    return (m[1], m[2]) if m else None


def _split_first(case: str) -> tuple[str, str] | None:
    """``"Q3 insert 10"`` -> ``("Q3", "insert 10")``."""
    head, _, rest = case.partition(" ")
    return (head, rest) if rest else None


def _split_mixed(case: str) -> tuple[str, str] | None:
    """``"1Q:1U, size 20"`` -> ``("1Q:1U", "size 20")``; ``"1Q:1U, size 20, 240 ops"`` -> its own row."""
    ratio, _, rest = case.partition(", ")
    size, _, ops = rest.partition(", ")
    return (f"{ratio}, {ops}" if ops else ratio, size)


def _split_scale(case: str) -> tuple[str, str] | None:
    """``"SF1 Q18 external 1,000 rows"`` -> ``("SF1 Q18 external", "1,000 rows")``."""
    m = re.fullmatch(r"(SF\S+ \S+ \S+) (capture|[\d,]+ rows)", case)
    return (m[1], m[2]) if m else None


def _split_store(case: str) -> tuple[str, str] | None:
    """``"1,000 groups close together"`` -> ``("1,000 groups", "close together")``; the compaction is its own row."""
    if case.startswith("compaction"):
        return ("compaction (whole table)", "whole domain")
    groups, _, where = case.partition(" groups")
    return (f"{groups} groups", where.strip() or "whole domain")


def _store_cell(exp: Experiment, case: str) -> str:
    if case.startswith("compaction"):
        return median_cell("compact", unit=" s")(exp, case)
    return f"{median_cell('fetch')(exp, case)} / {median_cell('replace')(exp, case)}"


def _scale_cell(exp: Experiment, case: str) -> str:
    if case.endswith("capture"):
        return median_cell("FM", unit=" s")(exp, case)
    imp, ratio = exp.median(case, "IMP"), exp.ratio_median(case, "FM", "IMP")
    return "" if imp is None or ratio is None else f"{num(imp)} s, {ratio:.3g}x"


def _peak(key: str) -> object:
    def column(exp: Experiment, cases: list[str]) -> str:
        got = [float(v) for c in cases if (v := exp.extra(c, key)) is not None]
        return f"{max(got) / 1024:.2g} GB" if got else ""

    return column


def _exact(exp: Experiment, cases: list[str]) -> str:
    got = [str(v) for c in cases if (v := exp.extra(c, "exact")) is not None]
    return "" if not got else "yes" if all(v == "True" for v in got) else "**no**"


VIEWS: dict[str, View] = {
    "engine_v2_groups": Full(variants=("v1", "v2", "v2 in memory", "v2 save", "v2 load")),
    "q_groups": Pivot(_split_n, ratio_cell("FM", "IMP"), "groups \\ n", "FM/IMP, median of per-run ratios"),
    "q_having": Pivot(_split_n, ratio_cell("FM", "IMP"), "aggregates \\ n", "FM/IMP, median of per-run ratios"),
    "q_join": Pivot(_split_n, ratio_cell("FM", "IMP"), "join \\ n", "FM/IMP, median of per-run ratios"),
    "q_joinsel": Pivot(_split_n, ratio_cell("FM", "IMP"), "selectivity \\ n", "FM/IMP, median of per-run ratios"),
    "joinsel_optimizations": Pivot(
        _split_n,
        ratio_cell("none", "all on"),
        "selectivity \\ n",
        "none/all on (cost without the join optimizations over with them), median of per-run ratios",
    ),
    "tpch": Pivot(
        _split_first,
        lambda e, c: f"{ratio_cell('FM', 'IMP')(e, c)} ({ratio_cell('FM', 'IMP v1')(e, c)})",
        "query \\ change",
        "FM/IMP (FM/IMP v1), medians of per-run ratios",
    ),
    "tpch22": Pivot(_split_first, ratio_cell("FM", "IMP"), "query \\ change", "FM/IMP, median of per-run ratios"),
    "mixed_workload": Pivot(
        _split_mixed,
        lambda e, c: f"{ratio_cell('NS', 'IMP')(e, c)} / {ratio_cell('FM', 'IMP')(e, c)}",
        "queries:updates \\ change size",
        "NS/IMP / FM/IMP (total times in the CSV)",
    ),
    "scale": Pivot(
        _split_scale,
        _scale_cell,
        "case \\ change",
        "capture: FM's time; per change size: IMP's time, FM/IMP",
        (("driver peak", _peak("driver_mb")), ("JVM peak", _peak("jvm_mb")), ("IMP = FM", _exact)),
    ),
    "eager_vs_lazy": Wide("batch rows"),
    "breakeven_groups": Wide("change"),
    "q_sketch": Wide("fragments"),
    "q_selpd": Wide("change rows passing the WHERE"),
    "memory": Full(
        cases=(
            "Q_groups 50 groups",
            "Q_groups 500,000 groups",
            "Q_having 10 aggs",
            "Q_joinsel 5%",
            "Q_join 1-20",
            "Q_sketch 5000 fragments",
        )
    ),
    "topk_buffers": Grid(
        lambda e, c, v: f"{median_cell(v, unit=' s')(e, c)}, {e.extra(c, 'recaptures', v)}",
        "deletion strategy",
        "total time of the 500 updates, recaptures of an exhausted buffer",
    ),
    "engine_throughput": Wide("batch"),
    "sketch_sizes": Wide("fragments"),
    "state_store": Pivot(_split_store, _store_cell, "groups per batch", "fetch / replace, medians (s)"),
    "skew_split": Full(cases=("round 0", "round 1", "round 5", "round 10")),
    **{
        name: Full(notes=True)
        for name in (
            "skipping",
            "skipping_100m",
            "compaction",
            "lakehouse_connector",
            "extension_queries",
        )
    },
}


# -- targets ----------------------------------------------------------------------------------------------------------


def _rows_per_s(load: Loader) -> float | None:
    m = median_of("engine_v2_batch", "100,000 rows", "v2")(load)
    return None if not m else 100_000 / m


def _most(*figures: object) -> object:
    """The largest of several figures (each a function of the loader; None when one is not measured)."""

    def figure(load: Loader) -> float | None:
        got = [f(load) for f in figures]  # type: ignore[operator]
        return None if any(v is None for v in got) else max(got)

    return figure


def _tpch22_exact(load: Loader) -> float | None:
    """Queries of the 22 measured with every IMP sketch equal to FM's (the harness stops at a difference): at SF1
    in ``tpch22``, Q11 and Q21 at SF1 in ``scale``."""
    e, s = load("tpch22"), load("scale")
    if e is None:
        return None
    queries = {c.split()[0] for c in e.cases() if re.fullmatch(r"Q\d+", c.split()[0])}
    if s is not None:
        queries |= {
            q
            for q in ("Q11", "Q21")
            if any(c.startswith(f"SF1 {q} ") and s.extra(c, "exact") == "True" for c in s.cases())
        }
    return len(queries)


def _tpch22_slowest(load: Loader) -> float | None:
    """The smallest FM/IMP over every case of up to 1,000 changed rows: ``tpch22``, and Q11 and Q21 at SF1 in
    ``scale``."""
    e, s = load("tpch22"), load("scale")
    if e is None:
        return None
    got = [r for c in e.cases() if (r := e.ratio_median(c, "FM", "IMP")) is not None]
    if s is not None:
        got += [
            r
            for c in s.cases()
            if re.fullmatch(r"SF1 Q(11|21) memory (10|1,000) rows", c)
            and (r := s.ratio_median(c, "FM", "IMP")) is not None
        ]
    return min(got) if got else None


def _inexact(load: Loader) -> float | None:
    s = load("scale")
    return None if s is None else sum(1 for c in s.cases() if s.extra(c, "exact") not in (None, "True"))


def _sf10_peak(load: Loader) -> float | None:
    s = load("scale")
    got = (
        []
        if s is None
        else [float(v) for c in s.cases() if c.startswith("SF10 ") and (v := s.extra(c, "driver_mb")) is not None]
    )
    return max(got) / 1024 if got else None


def _gb(v: float) -> str:
    return f"{v:.3g} GB"


def _mb(v: float) -> str:
    return f"{v:.3g} MB"


def _per_s(v: float) -> str:
    return f"{v / 1e6:.3g}M rows/s"


def _count(v: float) -> str:
    return f"{v:.0f}"


def _added(case: str) -> Callable[[Loader], float | None]:
    """The extension's planning time added to ``case``: the median of per-run differences on - off (seconds)."""

    def figure(load: Loader) -> float | None:
        e = load("extension_planning")
        if e is None:
            return None
        diffs = [b - a for a, b in zip(e.values(case, "off"), e.values(case, "on"))]
        return statistics.median(diffs) / 1000 if diffs else None

    return figure


def _client_vs_imp(load: Loader) -> float | None:
    """spark.sql's speed-up with the extension over imp query's (1.0: the same)."""
    e = load("extension_queries")
    if e is None:
        return None
    a, b = (e.ratio_median(c, "without sketch", "with sketch") for c in ("spark.sql", "imp query"))
    return None if not a or not b else a / b


def _imp(e: Experiment, c: str) -> float | None:
    return e.median(c, "IMP")


def _fm_imp(e: Experiment, c: str) -> float | None:
    return e.ratio_median(c, "FM", "IMP")


TARGETS: tuple[Target, ...] = (
    Target(
        "3, 19",
        "engine: >= 3M delta rows/s at 100K-row batches",
        ("engine_v2_batch",),
        _rows_per_s,
        ">=",
        3e6,
        _per_s,
    ),
    Target(
        "19",
        "engine: 1,000-row batch <= 3 ms",
        ("engine_v2_batch",),
        median_of("engine_v2_batch", "1,000 rows", "v2"),
        "<=",
        0.003,
        ms,
    ),
    Target(
        "19",
        "engine: the same with the change-feed read <= 6 ms",
        ("engine_v2_batch",),
        median_of("engine_v2_batch", "1,000 rows", "v2 with CDF read"),
        "<=",
        0.006,
        ms,
    ),
    Target(
        "3",
        "engine: 1,000-row batch with the change-feed read < 20 ms",
        ("engine_v2_batch",),
        median_of("engine_v2_batch", "1,000 rows", "v2 with CDF read"),
        "<=",
        0.020,
        ms,
    ),
    Target(
        "19",
        "engine: per-batch cost within 2x from 5K to 10M groups",
        ("engine_v2_groups",),
        over_cases("engine_v2_groups", "groups$", lambda e, c: e.median(c, "v2"), spread),
        "<=",
        2.0,
        times,
    ),
    Target(
        "19",
        "engine: TPC-H Q18h <= 20 ms per 1,000-row batch",
        ("engine_v2_q18h",),
        median_of("engine_v2_q18h", "1,000 rows", "v2"),
        "<=",
        0.020,
        ms,
    ),
    Target(
        "3",
        "engine: 500K-group state < 200 MB",
        ("engine_v2_groups",),
        median_of("engine_v2_groups", "500,000 groups", "v2 in memory"),
        "<=",
        200,
        _mb,
    ),
    Target(
        "3",
        "engine: 500K-group state saved and loaded in < 2 s each",
        ("engine_v2_groups",),
        _most(
            median_of("engine_v2_groups", "500,000 groups", "v2 save"),
            median_of("engine_v2_groups", "500,000 groups", "v2 load"),
        ),
        "<=",
        2.0,
        seconds,
    ),
    Target(
        "19",
        "engine: 10M-group state <= 2 GB",
        ("engine_v2_groups",),
        median_of("engine_v2_groups", "10,000,000 groups", "v2 in memory"),
        "<=",
        2048,
        _mb,
    ),
    Target(
        "19, 38",
        "engine: 10M-group state saved and loaded in <= 5 s each (streamed in parts)",
        ("state_parts",),
        _most(
            median_of("state_parts", "10,000,000 groups, parts", "save"),
            median_of("state_parts", "10,000,000 groups, parts", "load"),
        ),
        "<=",
        5.0,
        seconds,
    ),
    Target(
        "7, 19",
        "Q_groups 5K groups, 1,000 rows: FM/IMP >= 300x",
        ("engine_v2_q_groups",),
        ratio_of("engine_v2_q_groups", "n=1,000", "FM", "IMP v2"),
        ">=",
        300,
        times,
    ),
    Target(
        "7, 19",
        "Q_groups 5K groups, 10 rows: FM/IMP >= 1,000x",
        ("engine_v2_q_groups",),
        ratio_of("engine_v2_q_groups", "n=10", "FM", "IMP v2"),
        ">=",
        1000,
        times,
    ),
    Target(
        "4, 7",
        "data skipping >= 10x with a 5% sketch (10M rows)",
        ("skipping",),
        ratio_of("skipping", "Q_skip", "plain", "with sketch"),
        ">=",
        10,
        times,
    ),
    Target(
        "20",
        "data skipping >= 10x with a 5% sketch on 100M rows",
        ("skipping_100m",),
        ratio_of("skipping_100m", "Q_skip", "plain", "with sketch"),
        ">=",
        10,
        times,
    ),
    Target(
        "7",
        "Q_joinsel 5%, 1,000 rows: FM/IMP >= 30x",
        ("q_joinsel",),
        ratio_of("q_joinsel", "5% sel, n=1,000", "FM", "IMP"),
        ">=",
        30,
        times,
    ),
    Target(
        "8",
        "join optimizations: Q_joinsel 5%, 1,000 rows >= 3x cheaper with them",
        ("joinsel_optimizations",),
        ratio_of("joinsel_optimizations", "5% sel, n=1,000", "none", "all on"),
        ">=",
        3,
        times,
    ),
    Target(
        "7",
        "break-even at >= 5% of the table: FM/IMP >= 1 at 5% (Q_groups)",
        ("breakeven_groups",),
        ratio_of("breakeven_groups", "500,000 rows", "FM", "IMP"),
        ">=",
        1,
        times,
    ),
    Target(
        "7",
        "TPC-H SF1: IMP faster than FM in every case (smallest FM/IMP)",
        ("tpch",),
        over_cases("tpch", ".", _fm_imp, min),
        ">=",
        1,
        times,
    ),
    Target(
        "7, 19",
        "TPC-H SF1: median FM/IMP >= 50x",
        ("tpch",),
        over_cases("tpch", ".", _fm_imp, statistics.median),
        ">=",
        50,
        times,
    ),
    Target(
        "21", "TPC-H: >= 20 of the 22 queries maintained exactly", ("tpch22", "scale"), _tpch22_exact, ">=", 20, _count
    ),
    Target(
        "21",
        "TPC-H: IMP faster than FM on every query at 10 to 1,000 rows (smallest FM/IMP)",
        ("tpch22", "scale"),
        _tpch22_slowest,
        ">=",
        1,
        times,
    ),
    Target(
        "7",
        "mixed workload 1:1, size 20 (240 operations): NS/IMP >= 3x",
        ("mixed_workload",),
        ratio_of("mixed_workload", "1Q:1U, size 20, 240 ops", "NS", "IMP"),
        ">=",
        3,
        times,
    ),
    Target(
        "20",
        "the same with the layout task on: NS/IMP >= 3x",
        ("mixed_layout",),
        ratio_of("mixed_layout", "layout on", "NS", "IMP"),
        ">=",
        3,
        times,
    ),
    Target(
        "18",
        "nightly: grouped jobs >= 10x faster than one job per sketch",
        ("nightly",),
        ratio_of("nightly", "jobs alone", "per-sketch jobs", "grouped jobs"),
        ">=",
        10,
        times,
    ),
    Target(
        "18",
        "nightly: <= 0.5 s per sketch (grouped jobs)",
        ("nightly",),
        median_of("nightly", "jobs alone", "grouped jobs per sketch"),
        "<=",
        0.5,
        seconds,
    ),
    Target(
        "18",
        "nightly: <= 0.5 s per sketch through `airflow dags test`",
        ("nightly",),
        median_of("nightly", "airflow dags test", "grouped jobs per sketch"),
        "<=",
        0.5,
        seconds,
    ),
    Target(
        "18",
        "nightly: >= 20x faster than recapturing every sketch",
        ("nightly",),
        ratio_of("nightly", "jobs alone", "recapture all", "grouped jobs"),
        ">=",
        20,
        times,
    ),
    Target(
        "38", "tables of any size: cases where IMP's sketch differs from FM's", ("scale",), _inexact, "<=", 0, _count
    ),
    Target(
        "38",
        "SF1 Q11: IMP faster than FM at every change size",
        ("scale",),
        over_cases("scale", r"^SF1 Q11 memory .* rows$", _fm_imp, min),
        ">=",
        1,
        times,
    ),
    Target(
        "54",
        "extension: planning time added with no sketch for the tables <= 2 ms",
        ("extension_planning",),
        _added("no sketch for its tables: analysis"),
        "<=",
        0.002,
        ms,
    ),
    Target(
        "54",
        "extension: the same with 100 sketches on other tables <= 2 ms",
        ("extension_planning",),
        _added("100 sketches on other tables: analysis"),
        "<=",
        0.002,
        ms,
    ),
    Target(
        "54",
        "extension: planning time added with a match <= 5 ms",
        ("extension_planning",),
        _added("a match (the sketch applies): analysis"),
        "<=",
        0.005,
        ms,
    ),
    Target(
        "54",
        "extension: the 22 TPC-H queries planned within 2% (on/off)",
        ("extension_tpch",),
        ratio_of("extension_tpch", "22 queries", "on", "off"),
        "<=",
        1.02,
        times,
    ),
    Target(
        "54",
        "extension: spark.sql's speed-up at least imp query's, within 5% (>= 0.95)",
        ("extension_queries",),
        _client_vs_imp,
        ">=",
        0.95,
        times,
    ),
    Target("38", "SF10: driver peak <= 3 GB", ("scale",), _sf10_peak, "<=", 3, _gb),
    Target(
        "38",
        "SF10: up to 1,000 changed rows in <= 10 s",
        ("scale",),
        over_cases("scale", r"^SF10 .* (10|1,000) rows$", _imp, max),
        "<=",
        10,
        seconds,
    ),
    Target(
        "38",
        "SF10: up to 1,000 changed rows >= 10x FM",
        ("scale",),
        over_cases("scale", r"^SF10 .* (10|1,000) rows$", _fm_imp, min),
        ">=",
        10,
        times,
    ),
    Target(
        "38",
        "SF10: 100K changed rows >= 3x FM",
        ("scale",),
        over_cases("scale", r"^SF10 .* 100,000 rows$", _fm_imp, min),
        ">=",
        3,
        times,
    ),
)


__all__ = ["SUITES", "TARGETS", "VIEWS", "Suite"]

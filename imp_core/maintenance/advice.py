"""Sketch advice: on which columns a sketch is safe for a query, and how much of the data each would let the query
skip (paper 7.4: the best partition attribute is the one whose sketch covers the least data).

For every column of the query's tables (or of one of them) that a range partition can be built on, the safety check
says whether a sketch on it is safe (docs/SAFETY.md). For each safe column the query's sketch is captured on Spark
over equi-depth fragments of that column, at the tables' current versions, exactly as a registration would, but
nothing is written to the catalog. From the capture: the share of the table's rows in the sketch's fragments (the
rows are counted in the same Spark job as the table's) and, from the Delta file statistics, how many of the table's
data files a scan restricted to the sketch's ranges still reads. Best first: fewest rows, then fewest files.

The estimate is a full capture per safe column, so advice costs what registering every candidate would (one Spark
job for the bounds, one capture and one count each); ``max_columns`` bounds it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from imp_core import inputs
from imp_core.engine.pipeline import Pipeline
from imp_core.engine.support import require_engine_support
from imp_core.errors import UnsafeSketchError, UsageError
from imp_core.maintenance.context import ServiceContext
from imp_core.maintenance.registration import ParsedSql, analyze
from imp_core.maintenance.statistics import equi_depth, sign_oracle, violated_assumption
from imp_core.plan import safety
from imp_core.plan.expr import kind_of_type
from imp_core.sketch.bounds import KINDS
from imp_core.sketch.partition import Partition, PartitionSet, parse_bounds
from imp_core.use.rewrite import prune_files, ranges_sql


@dataclass(frozen=True)
class ColumnAdvice:
    """What a sketch on ``table.column`` would be: safe or why not, and for a safe one the estimated share of rows
    and the data files a sketched scan reads."""

    table: str
    column: str
    safe: bool
    reason: str  # "safe", or why a sketch on the column could make the query wrong
    assumptions: tuple[str, ...] = ()
    fragments: int = 0  # equi-depth fragments of the column
    sketch_fragments: int = 0  # of them, those the query's answer depends on
    files: int = 0  # data files of the table
    files_read: int = 0  # of them, those whose statistics overlap the sketch's ranges
    rows: int = 0  # rows of the table
    rows_in_sketch: int = 0  # of them, those in the sketch's fragments
    notes: list[str] = field(default_factory=list)

    @property
    def row_share(self) -> float | None:
        """Share of the table's rows in the sketch's fragments (what a sketched scan keeps after filtering)."""
        if not self.safe or not self.fragments:
            return None
        return self.rows_in_sketch / self.rows if self.rows else 0.0

    @property
    def file_share(self) -> float | None:
        return self.files_read / self.files if self.safe and self.files else None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["assumptions"] = list(self.assumptions)
        out.update(row_share=self.row_share, file_share=self.file_share)
        return out


def advise(parts: ServiceContext, sql: str, table: str | None = None, fragments: int = 100, dialect: str = "spark",
           max_columns: int = 10) -> list[ColumnAdvice]:
    """Every partitionable column of the query's tables (or of ``table``), safe ones first, best first.

    Raises:
        PlanError: The SQL does not parse against the registered tables.
        UsageError: Bad arguments (``table`` not read by the query, ``fragments`` out of range).
        UnsafeSketchError: No column is safe (the message lists why, per column).
    """
    inputs.check_fragments(fragments, parts.settings.max_fragments)
    if max_columns < 1:
        raise UsageError(f"--max-columns {max_columns}: give at least 1")
    parsed = ParsedSql.parse(sql, dialect)
    query = analyze(parts, parsed)
    require_engine_support(query.plan)
    tables = sorted(query.plan.tables())
    if table is not None and table not in tables:
        raise UsageError(f"--table {table}: the query does not read it (it reads {', '.join(tables)})")
    sources = parts.sources(query.plan.tables())
    versions = {t: s.current_version() for t, s in sources.items()}
    schemas = {t: s.schema(versions[t]) for t, s in sources.items()}
    oracle = sign_oracle(sources, versions)
    verdicts = _verdicts(query.plan, schemas, oracle, table)
    out: list[ColumnAdvice] = []
    safe_ones = [v for v in verdicts if v[2].safe]
    for t, c, report in safe_ones[:max_columns]:
        violation = violated_assumption(parts.spark, sources, versions, report.assumptions)
        if violation:
            out.append(ColumnAdvice(t, c, False, violation))
            continue
        out.append(_estimate(parts, query.plan, sources, versions, schemas, t, c, report, fragments))
    for t, c, report in safe_ones[max_columns:]:
        out.append(ColumnAdvice(t, c, True, "safe", tuple(str(a) for a in report.assumptions),
                                notes=[f"not estimated (more than --max-columns {max_columns} safe columns)"]))
    out += [ColumnAdvice(t, c, False, report.reason) for t, c, report in verdicts if not report.safe]
    if not any(a.safe for a in out):
        where = f"table {table}" if table is not None else "the query's tables"
        why = "; ".join(f"{a.table}.{a.column}: {a.reason}" for a in out) or "no column can be range-partitioned"
        raise UnsafeSketchError(f"no column of {where} is safe for a sketch of this query ({why}); see "
                                f"docs/SAFETY.md for what makes a column safe")
    return sorted(out, key=_rank)


AUTO = "auto"
"""``--on auto`` (and the register DAG's ``on`` = ``auto``): the sketch goes on advice's first choice."""

AUTO_CANDIDATES = 3
"""Safe columns ``auto`` estimates (each a capture) before choosing."""


def safe_candidates(parts: ServiceContext, sql: str, dialect: str = "spark") -> list[str]:
    """``TABLE.COLUMN`` of every column a sketch of ``sql`` is safe on, by the safety check alone (no Spark): what
    ``auto`` will choose among.

    Raises:
        UnsafeSketchError: No column is safe (the message says why, per column).
    """
    query = analyze(parts, ParsedSql.parse(sql, dialect))
    require_engine_support(query.plan)
    sources = parts.sources(query.plan.tables())
    versions = {t: s.current_version() for t, s in sources.items()}
    schemas = {t: s.schema(versions[t]) for t, s in sources.items()}
    verdicts = _verdicts(query.plan, schemas, sign_oracle(sources, versions), None)
    safe = [f"{t}.{c}" for t, c, report in verdicts if report.safe]
    if not safe:
        why = "; ".join(f"{t}.{c}: {r.reason}" for t, c, r in verdicts) or "no column can be range-partitioned"
        raise UnsafeSketchError(f"no column of the query's tables is safe for a sketch of this query ({why}); see "
                                f"docs/SAFETY.md for what makes a column safe")
    return safe


def first_choice(parts: ServiceContext, sql: str, fragments: int = 100, dialect: str = "spark") -> str:
    """``TABLE.COLUMN`` advice ranks first for ``sql`` (estimating at most :data:`AUTO_CANDIDATES` safe columns).

    Raises:
        UnsafeSketchError: No column is safe.
    """
    best = advise(parts, sql, None, fragments, dialect, AUTO_CANDIDATES)[0]
    parts.progress(f"advice: the sketch goes on {best.table}.{best.column} (keeps {best.row_share:.1%} of the rows)"
                   if best.row_share is not None else f"advice: the sketch goes on {best.table}.{best.column}")
    return f"{best.table}.{best.column}"


def _verdicts(plan: Any, schemas: dict[str, Any], oracle: Any,
              table: str | None) -> list[tuple[str, str, safety.SafetyReport]]:
    """The safety check's verdict for a sketch on each partitionable column the query reads (of ``table``)."""
    out = []
    seen: set[tuple[str, str]] = set()
    for scan in plan.scans():
        if (table is not None and scan.table != table) or scan.table not in schemas:
            continue
        for c in scan.columns:
            key = (scan.table, c.name)
            if key in seen or kind_of_type(schemas[scan.table].field(c.name).type) not in KINDS:
                continue
            seen.add(key)
            out.append((scan.table, c.name, safety.check(plan, {scan.table: c.name}, oracle)))
    return out


def _rank(a: ColumnAdvice) -> tuple[int, float, float, str, str]:
    estimated = a.row_share is not None
    return (0 if estimated else 1 if a.safe else 2, a.row_share if estimated else 1.0,  # type: ignore[return-value]
            a.file_share if a.file_share is not None else 1.0, a.table, a.column)


def _estimate(parts: ServiceContext, plan: Any, sources: dict[str, Any], versions: dict[str, int],
              schemas: dict[str, Any], table: str, column: str, report: safety.SafetyReport,
              fragments: int) -> ColumnAdvice:
    """The query's sketch captured over equi-depth fragments of ``table.column`` (nothing committed)."""
    dtype = schemas[table].field(column).type
    kind = kind_of_type(dtype)
    parts.progress(f"advice: capturing the sketch on {table}.{column} ({fragments} equi-depth fragments)")
    raw = equi_depth(parts.spark, sources[table], versions[table], column, fragments, kind)
    bounds, notes = parse_bounds(raw, dtype, f"{table}.{column}")
    partition = Partition(table, column, bounds, kind, dtype)
    pipeline = Pipeline.configured(plan, PartitionSet((partition,)), parts.settings.optimizations)
    pipeline.capture(parts.backend(sources), dict(versions))
    sketch = sorted(pipeline.sketch())
    files = sources[table].files(versions[table])
    read = prune_files(files, partition, sketch) if sketch else []
    kept = ranges_sql(f"`{column.replace('`', '``')}`", partition.ranges(sketch))
    counted = sources[table].scan(parts.spark, versions[table]).selectExpr(
        "count(*) AS n", f"count_if({kept}) AS k").collect()[0]
    return ColumnAdvice(table, column, True, "safe", tuple(str(a) for a in report.assumptions),
                        partition.fragments, len(sketch), len(files), len(read), int(counted["n"]),
                        int(counted["k"] or 0), list(notes))


__all__ = ["AUTO", "AUTO_CANDIDATES", "ColumnAdvice", "advise", "first_choice", "safe_candidates"]

"""Run a query on Spark, restricted by a fresh sketch when one can answer it (IMP paper Fig. 2).

``QueryRunner.run(sql)``: find a sketch whose template key and constants match, maintain it lazily if a table changed
since its version, add the sketch's ranges as filters on the partitioned tables (Delta's connector then skips the
files whose statistics cannot meet them; for tables read from their Parquet files directly, the same rule prunes
the file list first), and run the query. Without a usable sketch the plain query runs and the result says so.
The same restriction is available to PySpark users through ``imp_core.use.api``.
"""

from __future__ import annotations

import datetime as dt
import decimal
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from imp_core.plan.nodes import Plan, Scan
from imp_core.sketch.partition import Partition, PartitionSet
from imp_core.sketch.sketch import Sketch
from imp_core.sources.delta import DeltaSource
from imp_core.spark.compile import PlanCompiler, col
from imp_core.spark.fragment import bound_literal
from imp_core.spark.metrics import scan_metrics
from imp_core.use.rewrite import prune_files

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass
class ScanReport:
    """Files and rows of the tables' pinned versions (from the Delta log) and what the query read of them.

    ``files_read``/``rows_read`` come from the executed plan's scan metrics (what Delta's data skipping left), so
    they are known once the query ran: :func:`collect` fills them in.
    """

    files_read: int = 0
    files_total: int = 0
    rows_read: int = 0
    rows_total: int = 0

    def measure(self, df: DataFrame) -> None:
        """Take ``files_read``/``rows_read`` from the scans of ``df``'s finished execution."""
        done = scan_metrics(df)
        self.files_read, self.rows_read = done.files, done.rows

    def to_json(self) -> dict[str, int]:
        return {"files_read": self.files_read, "files_total": self.files_total, "rows_read": self.rows_read,
                "rows_total": self.rows_total}


@dataclass
class QueryResult:
    columns: list[str]
    rows: list[list[Any]]
    sketch: dict[str, Any] | None
    scanned: ScanReport
    seconds: float
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"columns": self.columns, "rows": [[_jsonable(v) for v in r] for r in self.rows],
                "sketch": self.sketch, "scanned": self.scanned.to_json(), "seconds": round(self.seconds, 4),
                "notes": self.notes}


def _jsonable(v: Any) -> Any:
    if isinstance(v, (dt.date, dt.datetime)):
        return v.isoformat()
    if isinstance(v, decimal.Decimal):
        return float(v) if v != v.to_integral_value() else int(v)
    return v


def range_filter(partition: Partition, fragments: list[int], column_ref: Any = None) -> Any:
    """A Spark Column predicate selecting the rows of the given fragments of ``partition``.

    Bounds are literals of the column's own type (``bound_literal``), so Spark compares exactly as the capture and the
    engine do; NaN satisfies ``col >= lo`` and fails ``col < hi`` (Spark orders it above every number), so it is kept
    exactly when the last fragment is, and NULL is kept with fragment 0.
    """
    c = column_ref if column_ref is not None else F.col(f"`{partition.column}`")
    out = None
    for lo, hi, nulls in partition.ranges(fragments):
        cond = F.lit(True)
        if lo is not None:
            cond = cond & (c >= bound_literal(lo, partition))
        if hi is not None:
            cond = cond & (c < bound_literal(hi, partition))
        if nulls:
            cond = cond | c.isNull()
        out = cond if out is None else out | cond
    return out if out is not None else F.lit(False)


def sketched_scan(spark: SparkSession, source: DeltaSource, version: int, partition: Partition,
                  fragments: list[int]) -> DataFrame:
    """The table at ``version``, only the rows in ``fragments`` of ``partition``: a direct Parquet read is given the
    files whose statistics can meet the ranges, the connector skips files by the filter itself."""
    files = prune_files(source.files(version), partition, fragments) if source.reads_parquet_directly(version) \
        else None
    return source.scan(spark, version, files).filter(range_filter(partition, fragments))


def execute(spark: SparkSession, plan: Plan, sources: dict[str, DeltaSource], versions: dict[str, int],
            partitions: PartitionSet | None = None, sketch: Sketch | None = None) -> tuple[DataFrame, ScanReport]:
    """The plan as a DataFrame over the tables at ``versions``, restricted by ``sketch`` when given."""
    report = ScanReport()
    cache: dict[str, DataFrame] = {}

    def scan_df(scan: Scan) -> DataFrame:
        table = scan.table
        if table in cache:
            return cache[table]
        source = sources[table]
        files = source.files(versions[table])
        report.files_total += len(files)
        report.rows_total += sum(f.num_records or 0 for f in files)
        part = partitions.get(table) if partitions is not None else None
        if part is not None and sketch is not None:
            df = sketched_scan(spark, source, versions[table], part, list(sketch.fragments.get(table, ())))
        else:
            df = source.scan(spark, versions[table])
        cache[table] = df
        return df

    df = PlanCompiler(spark, scan_df, plain=True).compile(plan)
    return df, report


def collect(df: DataFrame, names: list[str], report: ScanReport | None = None) -> list[list[Any]]:
    """The rows of ``df`` (through Arrow); ``report`` gets what the scans read."""
    table = df.toArrow()
    if report is not None:
        report.measure(df)
    cols = [table.column(i).to_pylist() for i in range(table.num_columns)]
    return [list(r) for r in zip(*cols)] if cols else []


__all__ = ["QueryResult", "ScanReport", "execute", "collect", "range_filter", "col"]

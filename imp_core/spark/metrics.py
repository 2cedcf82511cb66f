"""What a finished Spark query read: files and rows of its file scans, from the executed plan's SQL metrics.

Delta's connector decides which files a scan reads (its data skipping over the log's statistics); the scan node's
metrics after execution are the truth about what was read. Adaptive execution wraps the plan in query stages, so
the walk follows ``AdaptiveSparkPlanExec`` to its final plan and each stage to the plan it ran.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from imp_core.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

_SCANS = ("FileSourceScanExec",)


@dataclass(frozen=True)
class ScanMetrics:
    """What the file scans of one Spark execution read: ``files`` data files, ``rows`` rows, over ``scans`` scan
    nodes."""

    files: int
    rows: int
    scans: int


def scan_metrics(df: DataFrame) -> ScanMetrics:
    """Files read and rows produced by the file scans of ``df``'s last execution (zeros before it ran).

    Raises:
        ConfigError: ``df`` belongs to a Spark Connect session (its executed plan is on the server).
    """
    if not hasattr(df, "_jdf"):
        raise ConfigError(
            "imp query reports the files its scans read from the executed plan, which needs a Spark of "
            "its own: unset IMP_SPARK_REMOTE for imp query (maintenance jobs use Spark Connect)"
        )
    plan = df._jdf.queryExecution().executedPlan()  # noqa: SLF001 - the DataFrame's Py4J handle
    files = rows = scans = 0
    stack: list[Any] = [plan]
    while stack:  # a reused exchange is a leaf: what it reuses is counted once, where it ran
        node = stack.pop()
        kind = node.getClass().getSimpleName()
        if kind == "AdaptiveSparkPlanExec":
            stack.append(node.executedPlan())
            continue
        if kind.endswith("QueryStageExec"):
            stack.append(node.plan())
            continue
        if kind in _SCANS:
            metrics = node.metrics()
            files += _value(metrics, "numFiles")
            rows += _value(metrics, "numOutputRows")
            scans += 1
            continue
        children = node.children()
        stack.extend(children.apply(i) for i in range(children.size()))
    return ScanMetrics(files, rows, scans)


def _value(metrics: Any, key: str) -> int:
    option = metrics.get(key)
    return int(option.get().value()) if option.isDefined() else 0


__all__ = ["ScanMetrics", "scan_metrics"]

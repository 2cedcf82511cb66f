"""A PySpark session started without imp: only the Spark properties imp prints (``python -m
imp_core.spark.connector session-conf``). It runs the queries of a spec file through ``spark.sql`` and prints, per
query, its rows, the files its scans read and the sketch versions applied, as one JSON line.

Usage: python tests/spark/extension_client.py SPEC.json (``{"conf": {...}, "master": "local[2]", "queries": [{"sql",
"conf", "forget", "off"}], "probe_python": false}``; with ``probe_python`` a last entry says whether the executors
can run Python). This file imports pyspark only: it is a user's session, not imp's.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from pyspark.sql import SparkSession


def files_read(df: Any) -> int:
    """Files the file scans of ``df``'s execution read (the scan nodes' ``numFiles`` metric)."""
    stack, files = [df._jdf.queryExecution().executedPlan()], 0
    while stack:
        node = stack.pop()
        kind = node.getClass().getSimpleName()
        if kind == "AdaptiveSparkPlanExec":
            stack.append(node.executedPlan())
        elif kind.endswith("QueryStageExec"):
            stack.append(node.plan())
        elif kind == "FileSourceScanExec":
            metric = node.metrics().get("numFiles")
            files += int(metric.get().value()) if metric.isDefined() else 0
        else:
            children = node.children()
            stack.extend(children.apply(i) for i in range(children.size()))
    return files


def python_on_executors(spark: SparkSession) -> bool:
    """Whether the executors can run Python (a Python function over one row succeeds)."""
    try:
        return spark.sparkContext.parallelize([1], 1).map(lambda x: x + 1).collect() == [2]
    except Exception:  # noqa: BLE001 - any failure of the Python worker means: no Python there
        return False


def main(spec_path: str) -> None:
    with open(spec_path) as f:
        spec = json.load(f)
    builder = SparkSession.builder.master(spec.get("master", "local[2]")).appName("a user's session")
    for key, value in {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2", **spec["conf"]}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    api = spark._jvm.imp.spark.ImpSketches
    out = []
    for q in spec["queries"]:
        if q.get("forget"):
            api.forget()
        saved = {k: spark.conf.get(k, None) for k in q.get("conf", {})}
        for k, v in q.get("conf", {}).items():
            spark.conf.set(k, v)
        spark.conf.set("spark.imp.sketches.enabled", "false" if q.get("off") else "true")
        df = spark.sql(q["sql"])
        rows = sorted([[None if v is None else str(v) for v in r] for r in df.collect()])
        out.append({"rows": rows, "files": files_read(df), "applied": json.loads(api.applied(df._jdf))})
        for k, v in saved.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)
    if spec.get("probe_python"):
        out.append({"python_on_executors": python_on_executors(spark)})
    print(json.dumps(out))
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1])

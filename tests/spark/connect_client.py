"""A Spark Connect client (``pyspark.sql.connect``, no JVM in this process, no imp): it runs the queries of a spec
file on a Connect server through ``spark.sql`` and prints, per query, its rows, the files its scans read (the
execution's plan metrics the server sends back) and the sketch versions its plan names (``imp_sketch(...)`` in
``EXPLAIN``), as one JSON line.

Usage: python tests/spark/connect_client.py SPEC.json (``{"remote": "sc://...", "queries": [{"sql", "off"}]}``).
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

from pyspark.sql import SparkSession


def files_read(df: Any) -> int:
    """Files the file scans of ``df``'s last execution read (their "number of files read" metric)."""
    info = df.executionInfo
    if info is None or info.metrics is None:
        raise SystemExit("the server sent no plan metrics")
    return sum(
        int(m.value)
        for node in info.metrics._metrics
        for m in node.metrics
        if m.name in ("numFiles", "number of files read")
    )


def main(spec_path: str) -> None:
    with open(spec_path) as f:
        spec = json.load(f)
    spark = SparkSession.builder.remote(spec["remote"]).getOrCreate()
    assert not hasattr(spark, "_jvm") or spark._jvm is None, "not a Connect session"
    out = []
    for q in spec["queries"]:
        spark.conf.set("spark.imp.sketches.enabled", "false" if q.get("off") else "true")
        df = spark.sql(q["sql"])
        rows = sorted([[None if v is None else str(v) for v in r] for r in df.collect()])
        plan = "\n".join(r[0] for r in spark.sql(f"EXPLAIN {q['sql']}").collect())
        out.append(
            {"rows": rows, "files": files_read(df), "applied": sorted(set(re.findall(r"imp_sketch\([^)]*\)", plan)))}
        )
    print(json.dumps(out))
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1])

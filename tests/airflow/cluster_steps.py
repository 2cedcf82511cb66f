"""Every platform step in one ``spark-submit`` application, for the cluster whose executors have no Python.

Run by tests/airflow/test_cluster.py as ``spark-submit --master spark://... cluster_steps.py DATA_DIR [PREFIX]``
(``PREFIX`` starts every table and sketch name, so that the steps can run twice in one catalog): registers
tables (one of them empty), registers sketches (equi-depth bounds on Spark), appends changes, maintains with the
delta-join on Spark (small sides are not kept in memory: ``IMP_OPTIMIZATIONS=-smallside``), recaptures, and queries
with and without the sketch, including a query with an empty result. Prints one JSON line with what it saw.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pyarrow as pa
from deltalake import write_deltalake

P = sys.argv[2] if len(sys.argv) > 2 else ""
JOIN_SQL = (f"SELECT r.g AS g, SUM(s.w) AS total FROM {P}cs_r r JOIN {P}cs_s s ON r.k = s.k GROUP BY r.g "
            "HAVING SUM(s.w) > 5")
EMPTY_RESULT_SQL = JOIN_SQL.replace("> 5", "> 1000000")
EMPTY_TABLE_SQL = f"SELECT e.g AS g, COUNT(*) AS n FROM {P}cs_e e GROUP BY e.g HAVING COUNT(*) > 1"
CDF = {"delta.enableChangeDataFeed": "true"}


def unprefixed(fragments: dict[str, object]) -> dict[str, object]:
    return {t[len(P):]: f for t, f in fragments.items()}


def rows(result: object) -> list[list[object]]:
    return sorted(result.rows)  # type: ignore[attr-defined]


def main(data: Path) -> dict[str, object]:
    from imp_core.config import Settings
    from imp_core.maintenance.service import SketchService

    started = time.perf_counter()

    def progress(message: str) -> None:
        sys.stderr.write(f"[{time.perf_counter() - started:7.1f}s] {message}\n")

    service = SketchService(Settings.from_env(), progress=progress)
    out: dict[str, object] = {"master": service.spark.sparkContext.master}
    r, s, e = data / f"{P}cs_r", data / f"{P}cs_s", data / f"{P}cs_e"
    write_deltalake(str(r), pa.table({"g": [1, 1, 2, 3], "k": [1, 2, 3, 4]}), configuration=CDF)
    write_deltalake(str(s), pa.table({"k": [1, 2, 3, 9], "w": [3, 4, 2, 7]}), configuration=CDF)
    write_deltalake(str(e), pa.schema([("g", pa.int64())]).empty_table(), configuration=CDF)
    for name, path in ((f"{P}cs_r", r), (f"{P}cs_s", s), (f"{P}cs_e", e)):
        service.register_table(name, str(path))

    _, first = service.create_sketch(f"{P}cs_join", JOIN_SQL, [f"{P}cs_r.g"], fragments=3, trigger="cluster")
    _, empty = service.create_sketch(f"{P}cs_empty", EMPTY_TABLE_SQL, [f"{P}cs_e.g"], bounds=["0,10,20"],
                                     trigger="cluster")
    out["captured"] = {"cs_join": unprefixed(first.fragments), "cs_empty": unprefixed(empty.fragments)}

    # changes on both sides of the join, and rows for the empty table
    write_deltalake(str(r), pa.table({"g": [3, 4], "k": [9, 5]}), mode="append")
    write_deltalake(str(s), pa.table({"k": [5, 4], "w": [1, 8]}), mode="append")
    write_deltalake(str(e), pa.table({"g": [11, 11, 12]}), mode="append")
    maintained = service.maintain(f"{P}cs_join", strategy="eager", batch_size=1, trigger="cluster")
    service.maintain(f"{P}cs_empty", strategy="lazy", trigger="cluster")
    latest = service.catalog.latest_version(service.catalog.get_sketch(f"{P}cs_join").id)
    latest_empty = service.catalog.latest_version(service.catalog.get_sketch(f"{P}cs_empty").id)
    out["maintained"] = {"versions": [v.version for v in maintained.versions], "methods": [
        v.method for v in maintained.versions], "fragments": unprefixed(latest.fragments),
        "empty_table": unprefixed(latest_empty.fragments)}
    out["state"] = {name: service.describe(f"{P}{name}")["state"] for name in ("cs_join", "cs_empty")}

    again = service.recapture(f"{P}cs_join", trigger="cluster")
    again_empty = service.recapture(f"{P}cs_empty", trigger="cluster")
    out["recaptured"] = {"cs_join": unprefixed(again.fragments), "cs_empty": unprefixed(again_empty.fragments)}

    queries = {}
    for label, sql in (("join", JOIN_SQL), ("empty_result", EMPTY_RESULT_SQL), ("empty_table", EMPTY_TABLE_SQL)):
        with_sketch = service.query(sql, capture=False)
        without = service.query(sql, use_sketch=False)
        queries[label] = {"with": rows(with_sketch), "without": rows(without),
                          "sketch": ((with_sketch.sketch or {}).get("name") or "")[len(P):] or None}
    out["queries"] = queries
    return out


if __name__ == "__main__":
    result = main(Path(sys.argv[1]))
    sys.stdout.write("CLUSTER-STEPS " + json.dumps(result, default=str) + "\n")
    sys.stdout.flush()

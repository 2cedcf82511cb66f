"""Range split and merge (paper 7.4, ``imp_core.maintenance.repartition``) on real Spark, Delta and the catalog:
after a skewed stream of inserts the overflowing range is split and the near-empty ones merged, in place; the
repartitioned sketch equals a recapture with the new bounds, later maintenance stays exact, and Spark's answer is
the same with and without the sketch."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from imp_core.errors import UnsupportedError, UsageError
from imp_core.jobs import RepartitionJob
from imp_core.jobs.submit import run
from tests.oracles import answers_with_and_without_sketch, canonical

pytestmark = [pytest.mark.spark, pytest.mark.postgres]

AGG = "SELECT g, SUM(v) AS s FROM {t} GROUP BY g HAVING SUM(v) > 300"
TOPK = "SELECT g, v FROM {t} ORDER BY v DESC, g LIMIT 5"
JOIN = ("SELECT s.g, SUM(s.v * d.w) AS s FROM {t} s JOIN skew_dim d ON s.g = d.g GROUP BY s.g "
        "HAVING SUM(s.v * d.w) > 300")
CDF = {"delta.enableChangeDataFeed": "true"}


def _table(path: Path) -> None:
    g = [x for x in range(100) for _ in range(1 if x >= 70 else 20)]  # 70..99 sparse: their ranges underflow
    write_deltalake(str(path), pa.table({"g": g, "v": [float(x % 7) for x in range(len(g))]}), configuration=CDF)


def _skewed_inserts(path: Path, rounds: int) -> None:
    for i in range(rounds):  # new rows concentrated in 40..49: that range overflows
        g = [40 + (i + k) % 10 for k in range(200)]
        write_deltalake(str(path), pa.table({"g": g, "v": [float(k % 5 + 60) for k in range(200)]}), mode="append")


@pytest.mark.parametrize("sql", [AGG, TOPK, JOIN], ids=["aggregation", "topk", "join"])
def test_split_and_merge_in_place_equal_a_recapture(service, tmp_path: Path, sql: str) -> None:  # noqa: ANN001
    path = tmp_path / "skew"
    _table(path)
    service.register_table("skew", str(path), replace=True)
    query = sql.format(t="skew")
    on, bounds = ["skew.g"], ["0,10,20,30,40,50,60,70,80,90,100"]
    if sql is JOIN:  # both tables partitioned: the dimension's ids shift when the fact table's ranges change
        dim = pa.table({"g": list(range(100)), "w": [1.0 + x % 3 for x in range(100)]})
        write_deltalake(str(tmp_path / "dim"), dim, configuration=CDF)
        service.register_table("skew_dim", str(tmp_path / "dim"), replace=True)
        on, bounds = [*on, "skew_dim.g"], [*bounds, "0,50,100"]
    service.create_sketch("skew_s", query, on, bounds=bounds)
    try:
        _skewed_inserts(path, 3)
        service.maintain("skew_s")
        dry = service.repartition("skew_s", factor=3.0)
        plan = dry.tables[0]
        assert plan.table == "skew" and all(not (t.splits or t.merges) for t in dry.tables[1:])
        old_bounds = service.catalog.get_sketch("skew_s").partitions[0]["bounds"]
        assert not dry.counted and plan.rows == _recount(service, old_bounds)  # tracked through the change feed
        assert dry.version is None and plan.splits and plan.merges
        assert [s["fragment"] for s in plan.splits] == [4] and plan.skew_after < plan.skew_before

        done = service.repartition("skew_s", factor=3.0, apply=True)
        v = done.version
        assert v is not None and v.method == "repartition" and v.delta_rows == done.tables[0].rows_moved > 0
        bounds = v.partitions[0]["bounds"]
        assert v.partitions[1:] == service.catalog.get_sketch("skew_s").partitions[1:]  # the dimension's: unchanged
        assert len(bounds) - 1 == plan.fragments_after != 10 and v.fragment_rows["skew"] == _recount(service, bounds)
        again = service.recapture("skew_s")  # a capture with the new bounds: the same sketch
        assert again.partitions == v.partitions and again.fragments == v.fragments

        history = service.history("skew_s")
        assert [h["method"] for h in history][-2:] == ["repartition", "recapture"]
        _skewed_inserts(path, 1)
        write_deltalake(str(path), pa.table({"g": [45], "v": [1.0]}), mode="append")
        maintained = service.maintain("skew_s").versions[-1]  # incremental on the moved state, rows tracked on
        assert maintained.method == "incremental" and maintained.fragment_rows["skew"] == _recount(service, bounds)
        assert service.recapture("skew_s").fragments == maintained.fragments
        if sql is AGG:  # the nightly job: one sketch's failure is reported and does not stop the others
            job = run(service, RepartitionJob(("ghost", "skew_s"), 3.0))
            assert job["status"] == "failed" and job["failed"] == ["ghost"] and "ghost" in job["error"]
            assert [d["sketch"] for d in job["sketches"]] == ["ghost", "skew_s"] and "error" not in job["sketches"][1]
        applied, used = service.sketch_for_table("skew_s", "skew", maintain_first=False)
        assert used.fragments == len(bounds) - 1 and applied is not None  # the bounds of the version in use
        with_sketch, without = answers_with_and_without_sketch(service, query)
        assert with_sketch.sketch is not None and canonical(with_sketch.rows) == canonical(without.rows)
    finally:
        service.drop_sketch("skew_s")


def _recount(service, bounds: list) -> list[int]:  # noqa: ANN001
    rows = service.spark.read.format("delta").load(service.source("skew").path).select("g").toPandas()["g"]
    inner = bounds[1:-1]
    return [int(((rows >= (inner[i - 1] if i else -10**9)) & (rows < (inner[i] if i < len(inner) else 10**9))).sum())
            for i in range(len(bounds) - 1)]


def test_bad_input(service, tmp_path: Path) -> None:  # noqa: ANN001
    write_deltalake(str(tmp_path / "selfj"), pa.table({"g": list(range(20)), "v": [1.0] * 20}), configuration=CDF)
    service.register_table("selfj", str(tmp_path / "selfj"), replace=True)
    service.create_sketch("selfj_s", "SELECT a.g, COUNT(*) AS n FROM selfj a JOIN selfj b ON a.g = b.g GROUP BY a.g "
                          "HAVING COUNT(*) > 0", ["selfj.g"], bounds=["0,10,20"])
    try:
        latest = service.catalog.latest_version(service.catalog.get_sketch("selfj_s").id)
        with pytest.raises(UnsupportedError, match="reads table selfj more than once"):
            service.repartition("selfj_s", apply=True)
        with pytest.raises(UsageError, match="above 1"):
            service.repartition("selfj_s", factor=1.0)
        assert service.catalog.latest_version(latest.sketch_id).version == latest.version  # nothing committed
    finally:
        service.drop_sketch("selfj_s")

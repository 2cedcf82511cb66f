"""Sketch use: merged ranges, file pruning by Delta statistics, real data skipping, and the PySpark API."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from imp_core.sketch.partition import Partition
from imp_core.sources.delta import FileStats
from imp_core.use.rewrite import file_may_match, prune_files, ranges_sql
from tests.conftest import write_in_files

pytestmark = [pytest.mark.spark, pytest.mark.postgres]

SQL = "SELECT a, SUM(b) AS sb FROM clustered GROUP BY a HAVING SUM(b) > 5000"


def test_adjacent_fragments_merge_into_ranges() -> None:
    p = Partition("t", "x", (0, 10, 20, 30, 40), "int")
    assert p.ranges([1, 2]) == [(10, 30, False)]
    assert p.ranges([0, 3]) == [(None, 10, True), (30, None, False)]
    assert ranges_sql("x", p.ranges([1, 2])) == "(x >= 10 AND x < 30)"
    assert ranges_sql("x", p.ranges([0])) == "(x < 10 OR x IS NULL)"


def test_file_pruning_uses_min_max_and_null_counts() -> None:
    def f(lo, hi, nulls=0):  # noqa: ANN001, ANN202
        return FileStats("u", 1, 10, {"x": lo}, {"x": hi}, {"x": nulls}, {})

    p = Partition("t", "x", (0, 10, 20, 30, 40), "int")
    ranges = [(10, 30, False)]
    assert file_may_match(f(0, 9), p, ranges) is False
    assert file_may_match(f(30, 40), p, ranges) is False
    assert file_may_match(f(25, 35), p, ranges) is True
    assert file_may_match(f(0, 5, nulls=2), p, [(None, 10, True)]) is True
    assert file_may_match(f(50, 60, nulls=2), p, [(None, 10, True)]) is True  # NULLs live in fragment 0
    assert file_may_match(f(50, 60, nulls=0), p, [(None, 10, True)]) is False
    assert file_may_match(FileStats("u", 1, 10, {}, {}, {}, {}), p, ranges) is True  # no stats: keep
    assert len(prune_files([f(0, 9), f(10, 19), f(20, 29), f(30, 39)], p, [1])) == 1


@pytest.fixture(scope="module")
def clustered(service, tmp_path_factory):  # noqa: ANN001, ANN201
    rng = np.random.default_rng(3)
    n = 200_000
    a = np.sort(rng.integers(0, 1000, n))
    b = np.where(a < 40, 100, 1).astype(np.int64)  # groups 0..39 pass HAVING SUM(b) > 5000
    path = tmp_path_factory.mktemp("clustered") / "t"
    write_in_files(path, pa.table({"a": a, "b": b}), files=20)
    service.register_table("clustered", str(path), replace=True)
    service.create_sketch("clustered_a", SQL, ["clustered.a"], fragments=100)
    return path


def test_sketch_reads_a_small_fraction_of_files(service, clustered) -> None:  # noqa: ANN001
    with_sketch = service.query(SQL)
    without = service.query(SQL, use_sketch=False)
    assert sorted(map(tuple, with_sketch.rows)) == sorted(map(tuple, without.rows))
    assert len(without.rows) == 40
    s, w = with_sketch.scanned, without.scanned
    assert w.files_read == w.files_total >= 10
    assert s.files_total == w.files_total
    assert s.files_read <= max(2, w.files_total // 5), (s, w)
    assert s.rows_read < w.rows_read / 4


def test_pyspark_api(service, clustered, spark) -> None:  # noqa: ANN001
    from pyspark.sql import functions as F

    from imp_core.use.api import sketch_filter, sketched_sql, sketched_table

    rows = sorted(tuple(r) for r in sketched_sql(spark, SQL, settings=service.settings).collect())
    assert len(rows) == 40 and rows[0][0] == 0
    table = sketched_table(spark, "clustered", sketch="clustered_a", settings=service.settings)
    assert table.agg(F.max("a")).first()[0] < 100
    pred = sketch_filter(spark, "clustered", sketch="clustered_a", settings=service.settings)
    source = service.source("clustered")
    full = source.scan(spark, source.current_version())
    assert full.filter(pred).count() == table.count()


def test_sketched_view_reads_the_session_and_changes_nothing(service, clustered, spark) -> None:  # noqa: ANN001
    """A caller whose session has its own time zone, ANSI mode and case rules gets the sketched table as a view and
    its settings back untouched (warned that they differ); Spark is the truth: the registered query over the view
    equals it over the whole table, and the SQL predicate selects the same rows."""
    from imp_core.use.api import SketchSemanticsWarning, sketch_predicate, sketched_view

    mine = {"spark.sql.session.timeZone": "America/New_York", "spark.sql.ansi.enabled": "true",
            "spark.sql.caseSensitive": "false"}
    saved = {k: spark.conf.get(k) for k in mine}
    try:
        for k, v in mine.items():
            spark.conf.set(k, v)
        with pytest.warns(SketchSemanticsWarning, match="timeZone"):
            view = sketched_view(spark, "clustered", sketch="clustered_a", view="clustered_sketched",
                                 settings=service.settings)
        assert {k: spark.conf.get(k) for k in mine} == mine
        source = service.source("clustered")
        whole = source.scan(spark, source.current_version())
        whole.createOrReplaceTempView("clustered_whole")
        got = sorted(tuple(r) for r in spark.sql(SQL.replace("clustered", "clustered_sketched")).collect())
        want = sorted(tuple(r) for r in spark.sql(SQL.replace("clustered", "clustered_whole")).collect())
        assert got == want and len(got) == 40
        assert view.count() < whole.count() / 4
        predicate = sketch_predicate("clustered_a", settings=service.settings)
        assert predicate.table == "clustered" and predicate.column == "a"
        assert spark.sql(f"SELECT COUNT(*) FROM clustered_whole WHERE {predicate.predicate}").first()[0] == \
            view.count()
        assert {k: spark.conf.get(k) for k in mine} == mine
    finally:
        for k, v in saved.items():
            spark.conf.set(k, v)


def test_query_reuses_a_sketch_for_a_tighter_constant(service, clustered) -> None:  # noqa: ANN001
    tighter = SQL.replace("> 5000", "> 6000")
    looser = SQL.replace("> 5000", "> 10")
    used = service.query(tighter)
    assert used.sketch is not None and used.sketch["name"] == "clustered_a"
    assert sorted(map(tuple, used.rows)) == sorted(map(tuple, service.query(tighter, use_sketch=False).rows))
    assert service.query(looser).sketch is None  # a looser HAVING may need fragments the sketch lacks

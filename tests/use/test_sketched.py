"""``imp query`` and ``sketched_sql`` through Spark's SQL: the extension's rule applies the sketch (fewer files, Spark's
rows), ``--no-sketch`` turns the rule off, and a version committed by lazy maintenance is applied at once."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from deltalake import write_deltalake

from imp_core.errors import PlanError
from imp_core.maintenance.service import SketchService
from imp_core.spark import connector
from imp_core.use.api import sketched_sql
from imp_core.use.sketched import applied_sketches
from tests.conftest import write_in_files

pytestmark = [pytest.mark.spark, pytest.mark.postgres]

SQL = (
    "SELECT f.a, SUM(f.b) AS sb, COUNT(d.name) AS n FROM sk_f f JOIN sk_d d ON f.a = d.a "
    "GROUP BY f.a HAVING SUM(f.b) > 2000"
)


@pytest.fixture(scope="module")
def tables(service: SketchService, tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = np.random.default_rng(5)
    n = 50_000
    a = np.sort(rng.integers(0, 500, n))
    # even groups 0..18 pass HAVING SUM(f.b) > 2000 (odd ones have no dimension row)
    b = np.where(a < 20, 300, 1).astype(np.int64)
    fact = tmp_path_factory.mktemp("sk") / "f"
    write_in_files(fact, pa.table({"a": a, "b": b}), files=10)
    dim = tmp_path_factory.mktemp("sk") / "d"
    write_in_files(dim, pa.table({"a": np.arange(0, 500, 2), "name": [f"n{i}" for i in range(250)]}), files=1)
    service.register_table("sk_f", str(fact), replace=True)
    service.register_table("sk_d", str(dim), replace=True)
    service.create_sketch("sk_f_a", SQL, ["sk_f.a"], fragments=50)
    return fact


def rows(result: object) -> list[tuple]:
    return sorted(map(tuple, result.rows))  # type: ignore[attr-defined]


def test_the_rule_applies_the_sketch_and_no_sketch_turns_it_off(service: SketchService, tables: Path) -> None:
    spark = service.spark
    with_sketch = service.query(SQL)
    without = service.query(SQL, use_sketch=False)
    assert with_sketch.sketch == {"name": "sk_f_a", "version": 1}, with_sketch.notes
    assert without.sketch is None
    assert rows(with_sketch) == rows(without) and len(without.rows) == 10
    assert with_sketch.scanned.files_read < without.scanned.files_read
    # the session is as it was: the rule on, no expectation left, no view of a pinned version by a table's name
    assert spark.conf.get(connector.SKETCH_ENABLED_CONF, None) in (None, "true")
    assert spark.conf.get(connector.SKETCH_EXPECT_CONF, None) is None
    assert not spark.catalog.tableExists("sk_f")


def test_other_dialects_and_tightened_constants_get_the_sketch(service: SketchService, tables: Path) -> None:
    tighter = SQL.replace("> 2000", "> 3000")
    assert service.query(tighter).sketch == {"name": "sk_f_a", "version": 1}
    postgres = SQL.replace("SUM(f.b) AS sb", 'SUM(f.b) AS "sb"')
    assert service.query(postgres, dialect="postgres").sketch == {"name": "sk_f_a", "version": 1}


def test_a_version_committed_by_lazy_maintenance_is_applied_at_once(service: SketchService, tables: Path) -> None:
    spark = service.spark
    spark.conf.set("spark.imp.sketches.refreshSeconds", "3600")  # only the expectation can refresh the cache
    try:
        before = service.query(SQL)
        write_deltalake(
            str(tables), pa.table({"a": np.array([4, 20]), "b": np.array([5, 7000], np.int64)}), mode="append"
        )
        after = service.query(SQL)
        plain = service.query(SQL, use_sketch=False)
    finally:
        spark.conf.unset("spark.imp.sketches.refreshSeconds")
    assert before.sketch is not None
    assert after.sketch == {"name": "sk_f_a", "version": before.sketch["version"] + 1}, after.notes
    assert any("maintained sketch sk_f_a" in n for n in after.notes)
    assert rows(after) == rows(plain) and len(plain.rows) == 11  # group 20 now passes


def test_sketched_sql_returns_the_rule_restricted_dataframe(service: SketchService, tables: Path) -> None:
    spark = service.spark
    df = sketched_sql(spark, SQL, settings=service.settings)
    assert [a["sketch"] for a in applied_sketches(spark, df)] == ["sk_f_a"]
    plain = service.query(SQL, use_sketch=False)
    assert sorted(tuple(r) for r in df.collect()) == rows(plain)


CDF = {"delta.enableChangeDataFeed": "true"}
RIGHT_JOIN = (
    "SELECT b1.k AS c0, COUNT(a1.y) AS c1 FROM sk_s AS a1 RIGHT JOIN sk_u AS b1 ON a1.c = b1.k "
    "AND (LEAST(a1.y, a1.y) NOT BETWEEN 5 AND CAST(2.75 AS DOUBLE)) "
    "WHERE ((a1.y < CAST(0.25 AS DOUBLE)) AND (a1.c IS NOT NULL)) GROUP BY b1.k"
)


def test_a_query_with_between_gets_the_sketch(service: SketchService, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Spark analyzes BETWEEN into a common subexpression whose id is drawn afresh in every analysis; the signature
    numbers those ids by first use, so the query matches the sketch registered from the same text."""
    root = tmp_path_factory.mktemp("rj")
    write_deltalake(
        str(root / "s"),
        pa.table({"c": np.array([0, 1, 2, 3], np.int64), "y": np.array([0.0, 0.1, 0.5, 0.2])}),
        configuration=CDF,
    )
    write_deltalake(str(root / "u"), pa.table({"k": np.array([0, 1, 2, 3, 4], np.int64)}), configuration=CDF)
    service.register_table("sk_s", str(root / "s"), replace=True)
    service.register_table("sk_u", str(root / "u"), replace=True)
    service.create_sketch("sk_rj", RIGHT_JOIN, ["sk_u.k"], fragments=5)
    try:
        with_sketch = service.query(RIGHT_JOIN)
        without = service.query(RIGHT_JOIN, use_sketch=False)
        explained = service.explain(RIGHT_JOIN).sketches
        assert with_sketch.sketch == {"name": "sk_rj", "version": 1}, [e.get("reason") for e in explained]
        assert rows(with_sketch) == rows(without)
    finally:
        service.catalog.drop_sketch("sk_rj")


def test_a_query_spark_cannot_analyze_is_a_plan_error(
    service: SketchService, tables: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # the planner reads date - date as the days between them; Spark types it as an INTERVAL DAY, which it will not
    # compare with a number: the user's SQL is at fault, said in one line (PySpark's own log of the error, a JSON
    # line with the whole stack trace, stays quiet), and the session is left as it was
    spark = service.spark
    capfd.readouterr()
    sql = "SELECT f.a FROM sk_f f WHERE DATE '2024-01-04' - DATE '2024-01-01' = 3"
    with pytest.raises(
        PlanError, match=r"^Spark cannot run the query: AnalysisException: \[DATATYPE_MISMATCH.*pos 29; fix the SQL"
    ) as caught:
        service.query(sql, use_sketch=False)
    assert "\n" not in str(caught.value)
    assert "QueryContextLogger" not in capfd.readouterr().err
    assert spark.conf.get(connector.SKETCH_ENABLED_CONF, None) in (None, "true")
    assert not spark.catalog.tableExists("sk_f")

"""The sketched query as one SQL text: few JVM round trips, the same answer as without the sketch."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from imp_core.sketch.partition import Partition, PartitionSet
from imp_core.sketch.sketch import Sketch
from imp_core.use.sql_text import sketched_dataframe, sketched_sql_text
from tests.conftest import write_in_files
from tests.jvm_calls import counting_round_trips

pytestmark = [pytest.mark.spark, pytest.mark.postgres]

SQL = ("SELECT f.a, SUM(f.b) AS sb, COUNT(d.name) AS n FROM floor_f f JOIN floor_d d ON f.a = d.a "
       "GROUP BY f.a HAVING SUM(f.b) > 2000")


@pytest.fixture(scope="module")
def floor_tables(service, tmp_path_factory):  # noqa: ANN001, ANN201
    rng = np.random.default_rng(5)
    n = 50_000
    a = np.sort(rng.integers(0, 500, n))
    # even groups 0..18 pass HAVING SUM(f.b) > 2000 (odd ones have no dimension row)
    b = np.where(a < 20, 300, 1).astype(np.int64)
    fact = tmp_path_factory.mktemp("floor") / "f"
    write_in_files(fact, pa.table({"a": a, "b": b}), files=10)
    dim = tmp_path_factory.mktemp("floor") / "d"
    write_in_files(dim, pa.table({"a": np.arange(0, 500, 2), "name": [f"n{i}" for i in range(250)]}), files=1)
    service.register_table("floor_f", str(fact), replace=True)
    service.register_table("floor_d", str(dim), replace=True)
    service.create_sketch("floor_f_a", SQL, ["floor_f.a"], fragments=50)
    return fact


def test_sketched_query_equals_unsketched_answer(service, floor_tables) -> None:  # noqa: ANN001
    with_sketch = service.query(SQL)
    without = service.query(SQL, use_sketch=False)
    assert with_sketch.sketch is not None
    assert sorted(map(tuple, with_sketch.rows)) == sorted(map(tuple, without.rows))
    assert len(without.rows) == 10
    assert with_sketch.scanned.files_read < without.scanned.files_read


def test_sketched_dataframe_takes_a_handful_of_round_trips(service, floor_tables, spark) -> None:  # noqa: ANN001
    prepared = service.prepare_query(SQL)
    applied = prepared.applied
    assert applied is not None
    sketched_dataframe(spark, SQL, "spark", prepared.sources, prepared.versions, applied.partitions, applied.sketch)
    with counting_round_trips() as counter:  # the second build: the JVM's class lookups and the views are done
        df, _ = sketched_dataframe(spark, SQL, "spark", prepared.sources, prepared.versions, applied.partitions,
                                   applied.sketch)
    assert 1 <= counter.calls <= 5, counter.commands
    plain = spark.sql(sketched_sql_text(SQL, "spark", prepared.sources, prepared.versions))
    assert sorted(map(tuple, df.collect())) == sorted(map(tuple, plain.collect()))


def test_text_reads_pinned_versions_and_keeps_aliases_and_ctes() -> None:
    class Src:
        def __init__(self, path: str) -> None:
            self.path = path

    part = Partition("t", "x", (0, 10, 20, 30), "int")
    text = sketched_sql_text("WITH u AS (SELECT * FROM t) SELECT * FROM u JOIN s AS z ON u.x = z.x JOIN t ON 1=1",
                             "spark", {"t": Src("/d/t"), "s": Src("/d/s")}, {"t": 3, "s": 9},  # type: ignore[dict-item]
                             PartitionSet((part,)), Sketch({"t": (1,)}))
    assert "delta.`/d/t` VERSION AS OF 3 WHERE (`x` >= 10 AND `x` < 20)) AS t" in text
    assert "delta.`/d/s` VERSION AS OF 9) AS z" in text
    assert "FROM u JOIN" in text  # the CTE name is not a table

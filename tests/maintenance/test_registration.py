"""Registration refuses unsupported SQL and unsafe columns with a message naming the problem, changing nothing."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from imp_core.errors import PlanError, UnsafeSketchError, UnsupportedError

pytestmark = [pytest.mark.postgres]

UNSUPPORTED = [
    ("SELECT r.g FROM reg r LEFT JOIN reg2 s ON r.g < s.g", "outer join condition"),
    ("SELECT g FROM reg INTERSECT ALL SELECT g FROM reg2", "INTERSECT ALL"),
    ("SELECT g, SUM(v) OVER (PARTITION BY g) AS w FROM reg", "window"),
    ("SELECT g FROM reg WHERE v = 1 OR v IN (SELECT v FROM reg2)", "under OR"),
    ("SELECT g FROM reg LIMIT 3", "LIMIT without ORDER BY"),
    ("SELECT g, AVG(DISTINCT v) AS n FROM reg GROUP BY g", "AVG(DISTINCT"),
    ("SELECT g FROM reg ORDER BY g LIMIT 3 OFFSET 2", "OFFSET"),
    ("SELECT g, COUNT(*) AS n FROM reg GROUP BY ALL", "GROUP BY ALL"),
    ("SELECT g, stddev(v) AS s FROM reg GROUP BY g", "STDDEV"),
    ("INSERT INTO reg VALUES (1, 2, 3)", "only SELECT"),
    # Spark defines these, the engine cannot reproduce them bit for bit (docs/SEMANTICS.md): refused before Spark runs
    ("SELECT g FROM reg WHERE exp(v) > 3", "EXP is not supported in sketched queries"),
    ("SELECT g, concat('x', v * 1.5D) AS s FROM reg", "FLOAT/DOUBLE to STRING"),
]


@pytest.fixture(scope="module")
def tables(service, tmp_path_factory):  # noqa: ANN001, ANN201
    root = tmp_path_factory.mktemp("reg")
    for name in ("reg", "reg2"):
        write_deltalake(str(root / name), pa.table({"id": [1, 2, 3], "g": [1, 1, 2], "v": [5, -6, 7]}),
                        configuration={"delta.enableChangeDataFeed": "true"})
        service.register_table(name, str(root / name), replace=True)


def snapshot(service):  # noqa: ANN001, ANN201
    return ([r.name for r in service.catalog.list_sketches()], len(service.catalog.runs(limit=100_000)),
            [(t.name, t.path) for t in service.catalog.list_tables()])


@pytest.mark.parametrize("sql,named", UNSUPPORTED)
def test_unsupported_construct_is_named_and_nothing_changes(service, tables, sql: str, named: str) -> None:  # noqa: ANN001
    before = snapshot(service)
    with pytest.raises(UnsupportedError) as info:
        service.create_sketch("bad", sql, ["reg.g"], fragments=4)
    assert named.lower() in str(info.value).lower(), str(info.value)
    assert snapshot(service) == before


def test_unsafe_column_lists_the_safe_ones(service, tables) -> None:  # noqa: ANN001
    before = snapshot(service)
    sql = "SELECT g, SUM(v) AS s FROM reg GROUP BY g HAVING SUM(v) > 3"  # v has negative values: SUM not monotone
    with pytest.raises(UnsafeSketchError, match=r"reg\.v is not safe.*safe columns: reg\.g"):
        service.create_sketch("unsafe", sql, ["reg.v"], fragments=4)
    assert snapshot(service) == before


def test_unknown_names_are_plan_errors(service, tables) -> None:  # noqa: ANN001
    before = snapshot(service)
    with pytest.raises(PlanError, match="nope"):
        service.create_sketch("x", "SELECT nope FROM reg", ["reg.g"], fragments=4)
    with pytest.raises(PlanError, match="ghost"):
        service.create_sketch("x", "SELECT g FROM ghost", ["reg.g"], fragments=4)
    assert snapshot(service) == before

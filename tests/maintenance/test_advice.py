"""Sketch advice (``imp_core.maintenance.advice``) on real Spark, Delta and the catalog: safe columns ranked by the
data their sketch lets the query skip, unsafe ones with the reason, and nothing written to the catalog."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from imp_core.errors import PlanError, UnsafeSketchError, UsageError

pytestmark = [pytest.mark.spark, pytest.mark.postgres]

# groups g = 8 and 9 pass the HAVING (with every w): a sketch on g keeps 2 of 10 groups, one on w all of them
SQL = "SELECT g, w, SUM(v) AS s FROM {t} GROUP BY g, w HAVING SUM(v) > 100"


@pytest.fixture(scope="module")
def adv(service, tmp_path_factory: pytest.TempPathFactory) -> str:  # noqa: ANN001
    """Table ``adv``: 10 files, one per value of g (so a range of g skips whole files), 40 rows each."""
    path = tmp_path_factory.mktemp("advice") / "adv"
    for g in range(10):
        rows = 40
        write_deltalake(str(path), pa.table({"id": [g * 100 + i for i in range(rows)], "g": [g] * rows,
                                             "w": [i % 4 for i in range(rows)],
                                             "v": [50.0 if g >= 8 else 1.0] * rows}),
                        mode="append", configuration={"delta.enableChangeDataFeed": "true"})
    service.register_table("adv", str(path), replace=True)
    return "adv"


def test_the_selective_group_key_ranks_first_and_unsafe_columns_say_why(service, adv: str) -> None:  # noqa: ANN001
    before = [r.name for r in service.parts.catalog.list_sketches()]
    advice = service.advise(SQL.format(t=adv), fragments=10)
    by = {a.column: a for a in advice}
    # g and id (ids of a group are contiguous) keep 2 of 10 files and 80 of 400 rows; w keeps all: ranked after them
    assert advice[0].column == "g" and [a.column for a in advice].index("w") > [a.column for a in advice].index("id")
    assert by["g"].safe and by["g"].rows_in_sketch == 80 and by["g"].row_share == pytest.approx(0.2)
    assert (by["g"].files_read, by["g"].files) == (2, 10)
    assert by["w"].safe and by["w"].row_share == pytest.approx(1.0) and by["w"].files_read == 10
    unsafe = [a for a in advice if not a.safe]
    assert all(a.reason and a.reason != "safe" for a in unsafe)
    assert advice[-len(unsafe):] == unsafe if unsafe else True  # unsafe columns come last
    assert [r.name for r in service.parts.catalog.list_sketches()] == before  # advice writes nothing


def test_the_estimate_matches_a_registered_sketch(service, adv: str) -> None:  # noqa: ANN001
    [best] = [a for a in service.advise(SQL.format(t=adv), table="adv", fragments=5) if a.column == "g"]
    service.create_sketch("adv_g", SQL.format(t=adv), ["adv.g"], fragments=5)
    try:
        registered = service.describe("adv_g")["partitions"][0]
        assert (best.sketch_fragments, best.fragments) == (len(registered["fragments"]), registered["fragment_count"])
    finally:
        service.drop_sketch("adv_g")


def test_bad_input_is_refused_with_what_to_do(service, adv: str) -> None:  # noqa: ANN001
    with pytest.raises(UsageError, match="does not read it"):
        service.advise(SQL.format(t=adv), table="elsewhere")
    with pytest.raises(PlanError):
        service.advise("SELECT g FROM adv WHERE")
    with pytest.raises(UnsafeSketchError, match="no column of .* is safe"):
        service.advise("SELECT SUM(v - 10) AS s FROM adv HAVING SUM(v - 10) > 5", fragments=4)
    with pytest.raises(UsageError):
        service.advise(SQL.format(t=adv), fragments=0)


def test_on_auto_registers_advice_first_choice(service, adv: str) -> None:  # noqa: ANN001
    checked = service.check_registration("adv_auto", SQL.format(t=adv), ["auto"], fragments=10)
    assert "adv.g" in checked["candidates"] and "adv.v" in checked["candidates"]  # every safe column, no Spark
    with pytest.raises(UsageError, match="--bounds needs the column"):
        service.create_sketch("adv_auto", SQL.format(t=adv), ["auto"], bounds=["0,5,10"])
    service.create_sketch("adv_auto", SQL.format(t=adv), ["auto"], fragments=10)
    try:
        [part] = service.describe("adv_auto")["partitions"]
        assert (part["table"], part["column"]) == ("adv", "g")  # the selective group key, as advice ranks it
    finally:
        service.drop_sketch("adv_auto")

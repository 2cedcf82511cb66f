"""Tables, sketches, the sketch_catalog view and maintenance runs."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import sqlalchemy as sa

from imp_core.catalog import Catalog, SketchRecord
from imp_core.errors import CatalogError, NotFoundError, SketchUnusableError, UsageError
from tests.catalog.conftest import blob, version

pytestmark = pytest.mark.postgres

MakeSketch = Callable[..., SketchRecord]


def _counts(catalog: Catalog) -> dict[str, int]:
    with catalog.engine.connect() as conn:
        return {t: conn.execute(sa.text(f"SELECT count(*) FROM {t}")).scalar_one()
                for t in ("sketch", "sketch_version", "operator_state", "maintenance_run")}


def test_register_table_is_idempotent_and_refuses_a_silent_move(catalog: Catalog) -> None:
    first = catalog.register_table("orders", "/wh/orders", {"fields": [{"name": "id"}]})
    again = catalog.register_table("orders", "/wh/orders")
    assert again.path == "/wh/orders" and again.schema_json == {"fields": [{"name": "id"}]}
    assert again.registered_at == first.registered_at

    with pytest.raises(UsageError, match="table 'orders' is already registered at /wh/orders; pass replace=True"):
        catalog.register_table("orders", "/elsewhere/orders")
    assert catalog.get_table("orders").path == "/wh/orders"

    catalog.observe_table_version("orders", 4)
    moved = catalog.register_table("orders", "/elsewhere/orders", replace=True)
    assert moved.path == "/elsewhere/orders"
    assert moved.observed_version is None  # versions of another Delta table mean nothing here
    assert [t.name for t in catalog.list_tables()] == ["orders"]


def test_unknown_table(catalog: Catalog) -> None:
    with pytest.raises(NotFoundError, match="table 'nope' is not registered \\(no tables are registered yet\\)"):
        catalog.get_table("nope")
    catalog.register_table("orders", "/wh/orders")
    with pytest.raises(NotFoundError, match="registered tables: orders"):
        catalog.observe_table_version("nope", 3)


def test_observed_version_only_moves_forward(catalog: Catalog) -> None:
    catalog.register_table("orders", "/wh/orders")
    catalog.observe_table_version("orders", 5)
    catalog.observe_table_version("orders", 3)
    assert catalog.get_table("orders").observed_version == 5


def test_create_and_read_sketch(catalog: Catalog, make_sketch: MakeSketch) -> None:
    created = make_sketch(name="revenue", table_versions={"orders": 2})
    got = catalog.get_sketch("revenue")
    assert got == created
    assert got.partitions == {"orders": {"column": "id", "fragments": 8}}
    assert got.plan_json == {"op": "aggregate"} and got.safety == {"safe": True} and got.strategy == "lazy"
    assert catalog.latest_version(got.id).version == 1
    assert catalog.load_states(got.id, 1)["agg#1"].payload == b"state"
    assert [s.name for s in catalog.list_sketches()] == ["revenue"]


def test_duplicate_sketch_name_leaves_catalog_unchanged(catalog: Catalog, make_sketch: MakeSketch) -> None:
    original = make_sketch(name="revenue")
    before = _counts(catalog)

    with pytest.raises(UsageError, match="sketch 'revenue' already exists; pick another name or drop it"):
        catalog.create_sketch("revenue", "SELECT 2", "spark", "other", None, {"orders": {}}, None, "eager",
                              version({"orders": 9}, method="capture"), [blob("x"), blob("y")])

    assert _counts(catalog) == before
    assert catalog.get_sketch("revenue") == original
    assert catalog.versions(original.id)[0].table_versions == {"orders": 1}


def test_drop_frees_the_name_and_keeps_versions(catalog: Catalog, make_sketch: MakeSketch) -> None:
    old = make_sketch(name="revenue")
    catalog.drop_sketch("revenue")
    with pytest.raises(NotFoundError, match="no sketch named 'revenue' \\(no sketches exist yet\\)"):
        catalog.get_sketch("revenue")
    assert catalog.list_sketches() == [] and catalog.sketch_catalog() == []
    assert not catalog.has_states(old.id, 1)
    assert [v.version for v in catalog.versions(old.id)] == [1]  # history stays

    new = make_sketch(name="revenue")
    assert new.id != old.id
    assert catalog.get_sketch("revenue").id == new.id
    with pytest.raises(NotFoundError, match="dropped while it was being maintained"):
        catalog.commit_version(old.id, 1, version({"orders": 2}), [], 5)


def test_unknown_sketch_lists_existing_ones(catalog: Catalog, make_sketch: MakeSketch) -> None:
    make_sketch(name="a")
    make_sketch(name="b")
    with pytest.raises(NotFoundError, match="no sketch named 'c' \\(existing sketches: a, b\\)"):
        catalog.get_sketch("c")
    with pytest.raises(NotFoundError):
        catalog.drop_sketch("c")


def test_catalog_view_reports_staleness(catalog: Catalog, make_sketch: MakeSketch) -> None:
    sketch = make_sketch(name="revenue", table_versions={"orders": 3, "customer": 7})
    fresh = make_sketch(name="other", table_versions={"customer": 9})

    [row, other] = sorted(catalog.sketch_catalog(), key=lambda r: r["name"] != "revenue")
    assert row["latest_version"] == 1 and row["latest_method"] == "capture"
    assert row["table_versions"] == {"orders": 3, "customer": 7}
    assert row["current_table_versions"] == {} and row["is_stale"] is False
    assert catalog.stale_sketches() == []

    catalog.observe_table_version("orders", 3)
    catalog.observe_table_version("customer", 7)
    assert catalog.stale_sketches() == []

    catalog.observe_table_version("customer", 8)  # newer than revenue's 7, older than other's 9
    [row] = [r for r in catalog.sketch_catalog() if r["name"] == "revenue"]
    assert row["current_table_versions"] == {"orders": 3, "customer": 8} and row["is_stale"] is True
    [other] = [r for r in catalog.sketch_catalog() if r["name"] == "other"]
    assert other["sketch_id"] == fresh.id and other["table_versions"] == {"customer": 9}
    assert other["current_table_versions"] == {"customer": 8} and other["is_stale"] is False
    assert catalog.stale_sketches() == ["revenue"]

    catalog.commit_version(sketch.id, 1, version({"orders": 3, "customer": 8}), [], 5)
    assert catalog.stale_sketches() == []
    [row] = [r for r in catalog.sketch_catalog() if r["name"] == "revenue"]
    assert row["latest_version"] == 2 and row["latest_method"] == "incremental"


def test_catalog_view_is_documented(catalog: Catalog) -> None:
    with catalog.engine.connect() as conn:
        columns = conn.execute(sa.text(
            "SELECT a.attname, col_description(a.attrelid, a.attnum) FROM pg_attribute a "
            "WHERE a.attrelid = 'sketch_catalog'::regclass AND a.attnum > 0"
        )).all()
        view_comment = conn.execute(sa.text("SELECT obj_description('sketch_catalog'::regclass)")).scalar()
    assert view_comment
    assert columns and all(comment for _, comment in columns), [name for name, comment in columns if not comment]


def test_runs_are_recorded_and_shown_in_the_view(catalog: Catalog, make_sketch: MakeSketch) -> None:
    capture_run = catalog.start_run(None, "lazy", "cli", "ann@host")
    sketch = make_sketch(name="revenue", run_id=capture_run)
    catalog.finish_run(capture_run, "succeeded", to_version=1, table_versions_to={"orders": 1}, delta_rows=0)
    assert catalog.get_run(capture_run).sketch_id == sketch.id  # linked by create_sketch
    assert catalog.latest_version(sketch.id).run_id == capture_run

    run = catalog.start_run(sketch.id, "lazy", "airflow:imp_maintain/manual__1", from_version=1,
                            table_versions_from={"orders": 1})
    assert catalog.get_run(run).status == "running" and "@" in (catalog.get_run(run).triggered_by or "")
    finished = catalog.finish_run(run, "failed", error="change feed vacuumed", timings={"read_ms": 12.5})
    assert finished.status == "failed" and finished.finished_at is not None
    assert finished.timings == {"read_ms": 12.5} and finished.table_versions_from == {"orders": 1}

    [row] = catalog.sketch_catalog()
    assert (row["last_run_id"], row["last_run_status"], row["last_run_error"]) == (run, "failed",
                                                                                   "change feed vacuumed")
    assert [r.id for r in catalog.runs(sketch.id)] == [run, capture_run]
    assert [r.id for r in catalog.runs(limit=1)] == [run]

    with pytest.raises(CatalogError, match=f"maintenance run {run} already finished \\(failed\\)"):
        catalog.finish_run(run, "succeeded")
    with pytest.raises(UsageError):
        catalog.finish_run(run, "running")
    with pytest.raises(NotFoundError, match="no maintenance run has id 12345"):
        catalog.get_run(12345)


# -- lifecycle: unusable sketches, table identities, engine options ------------------------------------------------


def test_mark_unusable_keeps_the_first_reason_and_the_view_shows_it(catalog: Catalog, make_sketch: MakeSketch) -> None:
    sketch = make_sketch(name="revenue")
    [row] = catalog.sketch_catalog()
    assert row["usable"] is True and row["unusable_reason"] is None and row["unusable_since"] is None

    assert catalog.mark_unusable(sketch.id, "orders.price >= 0 no longer holds") is True
    assert catalog.mark_unusable(sketch.id, "a later reason") is False
    record = catalog.get_sketch("revenue")
    assert not record.usable and record.unusable_reason == "orders.price >= 0 no longer holds"
    [row] = catalog.sketch_catalog()
    assert row["usable"] is False and row["unusable_reason"] == "orders.price >= 0 no longer holds"
    assert row["unusable_since"] == record.unusable_at is not None
    with pytest.raises(NotFoundError, match="no sketch has id 999"):
        catalog.mark_unusable(999, "x")


def test_commit_on_an_unusable_sketch_is_refused(catalog: Catalog, make_sketch: MakeSketch) -> None:
    sketch = make_sketch(name="revenue")
    catalog.mark_unusable(sketch.id, "table orders was re-created")
    before = _counts(catalog)
    with pytest.raises(SketchUnusableError, match="sketch revenue is unusable: table orders was re-created; .*"
                                                  "imp sketch create revenue --replace"):
        catalog.commit_version(sketch.id, 1, version({"orders": 2}), [blob()], 5)
    assert _counts(catalog) == before


def test_replace_marks_the_sketches_reading_the_table_unusable(catalog: Catalog, make_sketch: MakeSketch) -> None:
    reads = make_sketch(name="reads_orders", table_versions={"orders": 1, "customer": 1})
    other = make_sketch(name="reads_customer", table_versions={"customer": 1})
    catalog.register_table("orders", "/warehouse/orders")  # the same path again: nothing happens
    assert catalog.get_sketch("reads_orders").usable

    catalog.register_table("orders", "/elsewhere/orders", replace=True)
    marked = catalog.get_sketch("reads_orders")
    assert not marked.usable
    assert marked.unusable_reason == ("table orders was re-registered from /warehouse/orders to /elsewhere/orders; "
                                      "the sketch's versions refer to the table at /warehouse/orders")
    assert catalog.get_sketch("reads_customer").usable
    assert reads.id != other.id


def test_observation_restarts_when_the_table_id_changes(catalog: Catalog) -> None:
    catalog.register_table("orders", "/wh/orders")
    catalog.observe_table_version("orders", 7, "id-a")
    catalog.observe_table_version("orders", 3, "id-a")  # a slow process: ignored
    catalog.observe_table_version("orders", 4)  # no id known: ignored
    assert catalog.get_table("orders").observed_version == 7
    catalog.observe_table_version("orders", 0, "id-b")  # deleted and re-created at the same path
    assert catalog.get_table("orders").observed_version == 0
    catalog.observe_table_version("orders", 2)
    assert catalog.get_table("orders").observed_version == 2


def test_versions_keep_table_identities_and_engine_options(catalog: Catalog, make_sketch: MakeSketch) -> None:
    sketch = make_sketch(name="revenue")
    ids = {"orders": {"id": "0b8e-uuid", "path": "/warehouse/orders"}}
    opts = {"topk_buffer": 3, "minmax_buffer": 0, "bloom_filters": True}
    catalog.commit_version(sketch.id, 1, version({"orders": 2}, table_identities=ids, state_options=opts), [], 5,
                           safety={"safe": True, "reason": "safe", "assumptions": ["orders.id >= 0"]})
    v2 = catalog.latest_version(sketch.id)
    assert v2.table_identities == ids and v2.state_options == opts
    assert catalog.versions(sketch.id)[0].table_identities is None  # make_sketch records none
    assert catalog.get_sketch("revenue").safety == {"safe": True, "reason": "safe", "assumptions": ["orders.id >= 0"]}
    catalog.commit_version(sketch.id, 2, version({"orders": 3}), [], 5)  # no verdict given: the stored one stays
    assert catalog.get_sketch("revenue").safety["assumptions"] == ["orders.id >= 0"]


def test_stale_sketches_leave_out_unusable_ones(catalog: Catalog, make_sketch: MakeSketch) -> None:
    a = make_sketch(name="a", table_versions={"orders": 1})
    make_sketch(name="b", table_versions={"orders": 1})
    catalog.observe_table_version("orders", 2)
    assert catalog.stale_sketches() == ["a", "b"]
    catalog.mark_unusable(a.id, "x")
    assert catalog.stale_sketches() == ["b"]

"""The Alembic migrations: empty database to head, idempotent upgrades, refusing a newer schema."""

from __future__ import annotations

import threading

import pytest
import sqlalchemy as sa
from alembic import command

from imp_core.catalog import Catalog
from imp_core.catalog.migrations import VERSION_TABLE, alembic_config, current_revision, head_revision, upgrade_to_head
from imp_core.config import Settings
from imp_core.errors import CatalogError

pytestmark = pytest.mark.postgres

TABLES = {"source_table", "table_observation", "sketch", "sketch_version", "operator_state", "maintenance_run",
          "table_identity", "state_chunk"}


def _schema(url: str) -> tuple[set[str], set[str], set[str], str | None]:
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            inspector = sa.inspect(conn)
            triggers = set(conn.execute(sa.text("SELECT tgname FROM pg_trigger WHERE NOT tgisinternal")).scalars())
            return set(inspector.get_table_names()), set(inspector.get_view_names()), triggers, current_revision(conn)
    finally:
        engine.dispose()


def test_empty_database_is_migrated_to_head_on_connect(settings: Settings, empty_db_url: str) -> None:
    tables, views, _, revision = _schema(empty_db_url)
    assert tables == set() and views == set() and revision is None

    Catalog.connect(settings).close()

    tables, views, triggers, revision = _schema(empty_db_url)
    assert tables == TABLES | {VERSION_TABLE}
    assert views == {"sketch_catalog"}
    assert {"sketch_version_immutable", "sketch_version_in_order", "operator_state_immutable",
            "state_chunk_immutable"} <= triggers
    assert revision == head_revision()


def test_second_upgrade_is_a_no_op(settings: Settings, empty_db_url: str) -> None:
    Catalog.connect(settings).close()
    before = _schema(empty_db_url)

    catalog = Catalog.connect(settings)  # connects again: upgrade runs and must change nothing
    with catalog.engine.begin() as conn:
        assert upgrade_to_head(conn) == (head_revision(), head_revision())
    catalog.close()

    assert _schema(empty_db_url) == before


def test_downgrade_to_base_and_back(settings: Settings, empty_db_url: str) -> None:
    Catalog.connect(settings).close()
    command.downgrade(alembic_config(empty_db_url), "base")
    tables, views, triggers, revision = _schema(empty_db_url)
    assert tables == {VERSION_TABLE} and views == set() and triggers == set() and revision is None

    command.upgrade(alembic_config(empty_db_url), "head")
    assert _schema(empty_db_url)[3] == head_revision()


def test_newer_schema_revision_is_refused(settings: Settings, empty_db_url: str) -> None:
    Catalog.connect(settings).close()
    engine = sa.create_engine(empty_db_url, poolclass=sa.pool.NullPool)
    with engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE {VERSION_TABLE} SET version_num = '0099_from_the_future'"))
    engine.dispose()

    with pytest.raises(CatalogError, match="catalog schema revision 0099_from_the_future is newer than this imp "
                                           "version supports.*upgrade imp"):
        Catalog.connect(settings)


def test_concurrent_first_connects_migrate_once(settings: Settings, empty_db_url: str) -> None:
    start = threading.Barrier(3)
    errors: list[BaseException] = []

    def connect() -> None:
        start.wait()
        try:
            Catalog.connect(settings).close()
        except BaseException as e:  # noqa: BLE001 - asserted below
            errors.append(e)

    threads = [threading.Thread(target=connect) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    assert _schema(empty_db_url)[3] == head_revision()


def _columns(url: str, table: str) -> set[str]:
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            return {c["name"] for c in sa.inspect(conn).get_columns(table)}
    finally:
        engine.dispose()


def test_lifecycle_revision_adds_and_removes_its_columns(settings: Settings, empty_db_url: str) -> None:
    """0002_lifecycle over a catalog with a sketch written at 0001: the old rows survive with NULL identities and
    options (read as "recorded before"), and a downgrade to 0001 restores the old view."""
    config = alembic_config(empty_db_url)
    command.upgrade(config, "0001_initial")
    assert "unusable_reason" not in _columns(empty_db_url, "sketch")
    engine = sa.create_engine(empty_db_url, poolclass=sa.pool.NullPool)
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO source_table (name, path) VALUES ('t', '/wh/t')"))
        sketch_id = conn.execute(sa.text(
            "INSERT INTO sketch (name, sql, template_key, partitions) VALUES ('old', 'SELECT 1', 'k', '{}') "
            "RETURNING id")).scalar_one()
        conn.execute(sa.text("INSERT INTO sketch_version (sketch_id, version, table_versions, bits, fragments, "
                             "method) VALUES (:s, 1, '{\"t\": 3}', '{}', '{}', 'capture')"), {"s": sketch_id})
    engine.dispose()

    catalog = Catalog.connect(settings)  # upgrades to head
    try:
        assert {"unusable_reason", "unusable_at"} <= _columns(empty_db_url, "sketch")
        assert {"table_identities", "state_options"} <= _columns(empty_db_url, "sketch_version")
        old = catalog.get_sketch("old")
        assert old.usable and old.unusable_reason is None
        v1 = catalog.latest_version(old.id)
        assert v1.table_versions == {"t": 3} and v1.table_identities is None and v1.state_options is None
        [row] = catalog.sketch_catalog()
        assert row["usable"] is True and row["unusable_reason"] is None and row["unusable_since"] is None
    finally:
        catalog.close()

    command.downgrade(config, "0001_initial")
    assert "unusable_reason" not in _columns(empty_db_url, "sketch")
    assert "table_identities" not in _columns(empty_db_url, "sketch_version")
    assert "usable" not in _columns(empty_db_url, "sketch_catalog")
    assert _schema(empty_db_url)[3] == "0001_initial"

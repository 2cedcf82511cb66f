"""Fixtures for catalog tests: one embedded Postgres per test session, one fresh database per test."""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from imp_core.catalog import Catalog, NewVersion, SketchRecord, StateBlob
from imp_core.catalog.embedded import embedded_url, stop_embedded
from imp_core.catalog.records import States
from imp_core.config import Settings


@pytest.fixture(scope="session")
def embedded_settings() -> Iterator[Settings]:
    """Settings whose IMP_HOME is a fresh temp dir under /tmp with the embedded server running; stopped at the end."""
    root = Path(tempfile.mkdtemp(prefix="imp-catalog-test-", dir="/tmp"))
    settings = Settings(home=root / "imp-home")
    try:
        embedded_url(settings)
        yield settings
    finally:
        stop_embedded(settings)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def admin_engine(embedded_settings: Settings) -> Iterator[sa.Engine]:
    """Autocommit engine on the server's maintenance database, for CREATE/DROP DATABASE."""
    url = sa.make_url(embedded_url(embedded_settings)).set(database="postgres")
    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    yield engine
    engine.dispose()


@pytest.fixture
def empty_db_url(embedded_settings: Settings, admin_engine: sa.Engine) -> Iterator[str]:
    """URL of a brand-new, empty database private to this test (dropped afterwards)."""
    name = f"imp_test_{uuid.uuid4().hex[:12]}"
    with admin_engine.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        # Tests commit many tiny transactions; durability of throw-away databases does not matter.
        conn.exec_driver_sql(f'ALTER DATABASE "{name}" SET synchronous_commit = off')
    url = sa.make_url(embedded_url(embedded_settings)).set(database=name)
    yield url.render_as_string(hide_password=False)
    with admin_engine.connect() as conn:
        conn.exec_driver_sql(f'DROP DATABASE "{name}" WITH (FORCE)')


@pytest.fixture
def settings(embedded_settings: Settings, empty_db_url: str) -> Settings:
    """Settings pointing at this test's database."""
    return Settings(home=embedded_settings.home, catalog_url=empty_db_url)


@pytest.fixture
def catalog(settings: Settings) -> Iterator[Catalog]:
    """A connected catalog on this test's database, schema at head."""
    cat = Catalog.connect(settings)
    yield cat
    cat.close()


def version(table_versions: dict[str, int], frags: dict[str, list[int]] | None = None,
            method: str = "incremental", **kw: object) -> NewVersion:
    """A NewVersion whose bits agree with its fragments (8 fragments per table)."""
    frags = frags if frags is not None else {t: [0] for t in table_versions}
    bits = {t: bytes([sum(1 << f for f in ids)]) for t, ids in frags.items()}
    return NewVersion(table_versions, bits, frags, method, **kw)  # type: ignore[arg-type]


def blob(operator_id: str = "agg#1", payload: bytes = b"state") -> StateBlob:
    return StateBlob(operator_id, "arrow-ipc", 1, payload)


@pytest.fixture
def make_sketch(catalog: Catalog) -> Callable[..., SketchRecord]:
    """Create a sketch with version 1 captured at the given table versions."""

    def make(name: str = "q", table_versions: dict[str, int] | None = None,
             states: States | None = None, **kw: object) -> SketchRecord:
        tvs = table_versions if table_versions is not None else {"orders": 1}
        for table in tvs:
            catalog.register_table(table, f"/warehouse/{table}")
        return catalog.create_sketch(
            name=name, sql=f"SELECT count(*) FROM {next(iter(tvs))}", dialect="spark", template_key=f"tk-{name}",
            plan_json={"op": "aggregate"}, partitions={t: {"column": "id", "fragments": 8} for t in tvs},
            safety={"safe": True}, strategy="lazy", first_version=version(tvs, method="capture"),
            states=states if states is not None else [blob()], **kw,  # type: ignore[arg-type]
        )

    return make

"""Alembic entry point: runs the catalog migrations on a handed-over connection or on a URL.

``Catalog.connect`` passes its open connection in ``config.attributes["connection"]`` (the migration then runs in
the caller's transaction). Developers running Alembic commands directly pass ``sqlalchemy.url`` instead, or get the
catalog the ``IMP_*`` settings point at.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context

from imp_core.catalog.embedded import embedded_url
from imp_core.catalog.migrations import VERSION_TABLE
from imp_core.config import Settings

config = context.config


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url")
    if url:
        return url
    settings = Settings.from_env()
    return settings.catalog_url or embedded_url(settings)


def _run(connection: sa.Connection) -> None:
    # transaction_per_migration=False: all pending revisions commit together or not at all.
    context.configure(connection=connection, target_metadata=None, version_table=VERSION_TABLE, transactional_ddl=True)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    context.configure(url=_url(), target_metadata=None, literal_binds=True, version_table=VERSION_TABLE)
    with context.begin_transaction():
        context.run_migrations()
elif (handed_over := config.attributes.get("connection")) is not None:
    _run(handed_over)
else:
    engine = sa.create_engine(_url(), poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as conn:
            _run(conn)
    finally:
        engine.dispose()

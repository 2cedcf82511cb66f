"""Alembic environment for the sketch catalog schema, driven from code (users never see an ``alembic.ini``).

``Catalog.connect`` calls :func:`upgrade_to_head` on every connect, so a new ``imp`` release migrates the catalog the
first time it touches it. The revision is recorded in ``imp_alembic_version`` rather than Alembic's default
``alembic_version``, because the production catalog may share a database with Airflow's metadata, which has its own
``alembic_version`` table.

To add a revision (developers)::

    from alembic import command
    from imp_core.catalog.migrations import alembic_config
    command.revision(alembic_config(), message="add foo", rev_id="0002_add_foo")

and write ``upgrade()``/``downgrade()`` by hand (there is no autogenerate: the schema is plain SQL with triggers).
"""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from imp_core.errors import CatalogError

VERSION_TABLE = "imp_alembic_version"
SCRIPT_LOCATION = Path(__file__).resolve().parent

# Key of the transaction-level advisory lock taken while migrating, so two processes that connect to a fresh catalog
# at the same time do not both try to create the schema. Two int4 halves: ("imp\0", 0) reads as a namespace.
MIGRATION_LOCK_KEY = (0x696D7000, 0)


def alembic_config(url: str | None = None) -> Config:
    """An Alembic ``Config`` for the catalog migrations, built in code.

    Args:
        url: Database URL for Alembic commands run outside ``Catalog.connect`` (left unset when a connection is
            handed over in ``config.attributes["connection"]``).

    Returns:
        The config, with ``script_location`` pointing at this package.
    """
    config = Config()
    config.set_main_option("script_location", str(SCRIPT_LOCATION))
    config.set_main_option("version_table", VERSION_TABLE)
    if url is not None:
        # ConfigParser interpolation treats '%' specially (URL-encoded passwords contain it).
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def head_revision() -> str:
    """The newest revision this version of imp knows."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, "the catalog migrations directory has no revisions"
    return head


def known_revisions() -> set[str]:
    """Every revision id shipped with this version of imp."""
    return {rev.revision for rev in ScriptDirectory.from_config(alembic_config()).walk_revisions()}


def current_revision(connection: sa.Connection) -> str | None:
    """The revision the catalog database is at, or None if the schema was never created."""
    return MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE}).get_current_revision()


def upgrade_to_head(connection: sa.Connection) -> tuple[str | None, str]:
    """Bring the catalog schema to the head revision, in the caller's transaction.

    A no-op when the schema is already at head. Serialized across processes by an advisory lock held until the
    caller's transaction ends.

    Args:
        connection: A connection inside a transaction (``engine.begin()``); the caller commits.

    Returns:
        ``(revision before, revision after)``.

    Raises:
        CatalogError: The database is at a revision this imp does not know (written by a newer imp).
    """
    connection.execute(sa.select(sa.func.pg_advisory_xact_lock(*MIGRATION_LOCK_KEY)))
    before = current_revision(connection)
    head = head_revision()
    if before is not None and before not in known_revisions():
        raise CatalogError(
            f"catalog schema revision {before} is newer than this imp version supports "
            f"(it knows up to {head}); upgrade imp"
        )
    if before != head:
        config = alembic_config()
        config.attributes["connection"] = connection
        command.upgrade(config, "head")
    return before, head

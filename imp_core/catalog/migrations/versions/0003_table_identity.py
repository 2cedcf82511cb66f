"""Tables registered by name: the Spark catalog name and the Delta table id it resolved to.

Revision ID: 0003_table_identity
Revises: 0002_lifecycle
Create Date: 2026-11-23

A table registered by name (``imp table register NAME --table CATALOG.DB.TABLE``) is resolved to its location at
registration; the name and the Delta table id (``metaData.id``) are kept so every maintenance can check that the
name still points at the same location. Tables registered by path have no row (their identity is recorded with each
sketch version, 0002_lifecycle).
"""

from __future__ import annotations

from alembic import op

revision = "0003_table_identity"
down_revision = "0002_lifecycle"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
CREATE TABLE table_identity (
    table_name     text PRIMARY KEY REFERENCES source_table (name) ON UPDATE CASCADE ON DELETE CASCADE,
    catalog_name   text,
    delta_table_id text NOT NULL
);
COMMENT ON TABLE table_identity IS 'Which Delta table (by its id) a registered name means, and the Spark catalog '
    'name it was registered by.';
""")


def downgrade() -> None:
    op.execute("DROP TABLE table_identity")

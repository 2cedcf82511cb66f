"""Table identity: the Spark catalog name a table was registered by and its Delta table id.

Revision ID: 0002_table_identity
Revises: 0001_initial
Create Date: 2026-11-23

A table registered by name (``imp table register NAME --table CATALOG.DB.TABLE``) is resolved to its location at
registration; the name and the Delta table id (``metaData.id``) are kept so every maintenance can check that the
name still points at the same Delta table. Tables registered by path have an id too (a path re-used for a new
table is caught the same way).
"""

from __future__ import annotations

from alembic import op

revision = "0002_table_identity"
down_revision = "0001_initial"
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
    'name it was registered by (NULL when registered by path).';
""")


def downgrade() -> None:
    op.execute("DROP TABLE table_identity")

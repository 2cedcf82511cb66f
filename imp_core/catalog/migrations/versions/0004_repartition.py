"""Range split and merge: partitions per version, fragment row counts, and layout maintenance switchable per table.

Revision ID: 0004_repartition
Revises: 0003_table_identity
Create Date: 2026-11-24

* ``sketch_version.partitions``: the partitions (bounds) the version's fragment ids refer to; NULL means the
  sketch's registered partitions (``sketch.partitions``). A split or merge of ranges (paper 7.4) commits a version
  with method ``repartition`` and its new bounds; earlier versions keep meaning what they meant.
* ``sketch_version.fragment_rows``: per partitioned table, the table's row count in each fragment at the version's
  table versions (``{table: [n0, n1, ...]}``), carried forward by maintenance from the change feed; NULL when not
  tracked yet.
* ``sketch_version.method`` admits ``repartition``.
* ``source_table.layout_maintenance``: whether the nightly layout task may re-cluster the table.
* the ``sketch_catalog`` view gains ``partitions``: the bounds the latest version's ``fragments`` refer to.
"""

from __future__ import annotations

import importlib

from alembic import op

revision = "0004_repartition"
down_revision = "0003_table_identity"
branch_labels = None
depends_on = None

_COLUMNS = """
ALTER TABLE sketch_version
    ADD COLUMN partitions    jsonb CHECK (partitions IS NULL OR jsonb_typeof(partitions) = 'array'),
    ADD COLUMN fragment_rows jsonb CHECK (fragment_rows IS NULL OR jsonb_typeof(fragment_rows) = 'object'),
    DROP CONSTRAINT sketch_version_method_check,
    ADD CONSTRAINT sketch_version_method_check
        CHECK (method IN ('capture', 'incremental', 'recapture', 'repartition'));

ALTER TABLE source_table ADD COLUMN layout_maintenance boolean NOT NULL DEFAULT true;
"""

_VIEW = """
CREATE OR REPLACE VIEW sketch_catalog AS
SELECT
    s.id                                AS sketch_id,
    s.name,
    s.sql,
    s.strategy,
    v.version                           AS latest_version,
    v.method                            AS latest_method,
    v.table_versions,
    obs.current_table_versions,
    obs.is_stale,
    v.fragments,
    v.created_at                        AS version_created_at,
    r.id                                AS last_run_id,
    r.status                            AS last_run_status,
    r.finished_at                       AS last_run_finished_at,
    r.error                             AS last_run_error,
    s.unusable_reason IS NULL           AS usable,
    s.unusable_reason,
    s.unusable_at                       AS unusable_since,
    coalesce(v.partitions, s.partitions) AS partitions
FROM sketch s
LEFT JOIN LATERAL (
    SELECT sv.version, sv.method, sv.table_versions, sv.fragments, sv.created_at, sv.partitions
    FROM sketch_version sv
    WHERE sv.sketch_id = s.id
    ORDER BY sv.version DESC
    LIMIT 1
) v ON true
LEFT JOIN LATERAL (
    SELECT
        coalesce(jsonb_object_agg(o.table_name, o.version) FILTER (WHERE o.table_name IS NOT NULL), '{}'::jsonb)
            AS current_table_versions,
        coalesce(bool_or(o.version > t.value::bigint), false) AS is_stale
    FROM jsonb_each_text(v.table_versions) AS t (key, value)
    LEFT JOIN table_observation o ON o.table_name = t.key
) obs ON true
LEFT JOIN LATERAL (
    SELECT mr.id, mr.status, mr.finished_at, mr.error
    FROM maintenance_run mr
    WHERE mr.sketch_id = s.id
    ORDER BY mr.id DESC
    LIMIT 1
) r ON true
WHERE s.dropped_at IS NULL;
"""

_COMMENTS = {
    "COLUMN sketch_version.partitions": "The partitions (bounds) this version's fragment ids refer to; null means "
                                        "the sketch's registered partitions.",
    "COLUMN sketch_version.fragment_rows": "Per partitioned table, the table's rows in each fragment at this "
                                           "version's table versions, as {table: [n0, n1, ...]}; null when not "
                                           "tracked.",
    "COLUMN source_table.layout_maintenance": "Whether the nightly layout task may re-cluster this table by its "
                                              "sketches' columns.",
    "COLUMN sketch_catalog.partitions": "The partitions (table, column, bounds) the latest version's fragments "
                                        "refer to.",
}


def upgrade() -> None:
    op.execute(_COLUMNS)
    op.execute(_VIEW)
    for target, text in _COMMENTS.items():
        op.execute(f"COMMENT ON {target} IS '{_quote(text)}'")


def downgrade() -> None:
    lifecycle = importlib.import_module("imp_core.catalog.migrations.versions.0002_lifecycle")
    op.execute("DROP VIEW sketch_catalog")
    op.execute(lifecycle._VIEW)
    for target, text in {**importlib.import_module("imp_core.catalog.migrations.versions.0001_initial")._COMMENTS,
                         **lifecycle._COMMENTS}.items():
        if target.startswith(("VIEW sketch_catalog", "COLUMN sketch_catalog.")):
            op.execute(f"COMMENT ON {target} IS '{_quote(text)}'")
    op.execute("""
        DO $$ BEGIN
            IF EXISTS (SELECT 1 FROM sketch_version WHERE method = 'repartition') THEN
                RAISE EXCEPTION 'sketch versions with method repartition exist; drop those sketches before '
                                'downgrading below 0004_repartition';
            END IF;
        END $$;
        ALTER TABLE source_table DROP COLUMN layout_maintenance;
        ALTER TABLE sketch_version DROP CONSTRAINT sketch_version_method_check,
            DROP COLUMN fragment_rows, DROP COLUMN partitions;
        ALTER TABLE sketch_version ADD CONSTRAINT sketch_version_method_check
            CHECK (method IN ('capture', 'incremental', 'recapture'));
    """)


def _quote(text: str) -> str:
    return text.replace("'", "''")

"""Lifecycle guards: unusable sketches, table identity and engine options recorded with each version.

Revision ID: 0002_lifecycle
Revises: 0001_initial
Create Date: 2026-12-01

* ``sketch.unusable_reason`` / ``unusable_at``: set once when a sketch's assumptions stop holding (an unsafe
  recapture, a sign assumption broken by the data, a table that changed identity or went back in version); queries
  then run without the sketch until it is dropped and created again.
* ``sketch_version.table_identities``: per table, the Delta table's metadata id and the registered path the version's
  table versions refer to (``{table: {"id": ..., "path": ...}}``). Versions of another Delta table are not comparable.
* ``sketch_version.state_options``: the engine options that shape operator state (buffers, join caches) the version's
  state was built with; maintenance loads the state with these, not with the maintaining process's environment.
* ``table_observation.table_id``: the Delta metadata id of the observed version, so a table re-created at the same
  path restarts its observed version instead of keeping the old table's higher one.
* the ``sketch_catalog`` view gains ``usable``, ``unusable_reason`` and ``unusable_since``.

Versions committed before this revision have NULL identities and options: maintenance recaptures them once (their
state's options are unknown), which records both.
"""

from __future__ import annotations

import importlib

from alembic import op

revision = "0002_lifecycle"
down_revision = "0001_initial"
branch_labels = None
depends_on = None

_COLUMNS = """
ALTER TABLE sketch
    ADD COLUMN unusable_reason text,
    ADD COLUMN unusable_at     timestamptz,
    ADD CONSTRAINT sketch_unusable_pair CHECK ((unusable_reason IS NULL) = (unusable_at IS NULL));

ALTER TABLE sketch_version
    ADD COLUMN table_identities jsonb CHECK (table_identities IS NULL OR jsonb_typeof(table_identities) = 'object'),
    ADD COLUMN state_options    jsonb CHECK (state_options IS NULL OR jsonb_typeof(state_options) = 'object');

ALTER TABLE table_observation ADD COLUMN table_id text;
"""

# The 0001 view with three columns appended (CREATE OR REPLACE VIEW may only add columns at the end).
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
    s.unusable_at                       AS unusable_since
FROM sketch s
LEFT JOIN LATERAL (
    SELECT sv.version, sv.method, sv.table_versions, sv.fragments, sv.created_at
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
    "COLUMN sketch.unusable_reason": "Why the sketch can no longer be used (null while usable); set once, cleared only "
                                     "by dropping and re-creating the sketch.",
    "COLUMN sketch.unusable_at": "When the sketch was marked unusable.",
    "COLUMN sketch_version.table_identities": "Per table, the Delta metadata id and registered path the table "
                                              "versions refer to, as {table: {\"id\": ..., \"path\": ...}}.",
    "COLUMN sketch_version.state_options": "Engine options that shape the operator state of this version (buffers, "
                                           "join caches), used when the state is loaded.",
    "COLUMN table_observation.table_id": "Delta metadata id of the observed table version.",
    "COLUMN sketch_catalog.usable": "False once the sketch's assumptions stopped holding or a table it reads changed "
                                    "identity; queries then run without it until it is dropped and created again.",
    "COLUMN sketch_catalog.unusable_reason": "Why the sketch is unusable (null while usable).",
    "COLUMN sketch_catalog.unusable_since": "When the sketch was marked unusable (null while usable).",
}


def upgrade() -> None:
    op.execute(_COLUMNS)
    op.execute(_VIEW)
    for target, text in _COMMENTS.items():
        op.execute(f"COMMENT ON {target} IS '{_quote(text)}'")


def downgrade() -> None:
    initial = importlib.import_module("imp_core.catalog.migrations.versions.0001_initial")
    op.execute("DROP VIEW sketch_catalog")
    op.execute(initial._VIEW)
    for target, text in initial._COMMENTS.items():
        if target.startswith(("VIEW sketch_catalog", "COLUMN sketch_catalog.")):
            op.execute(f"COMMENT ON {target} IS '{_quote(text)}'")
    op.execute("""
        ALTER TABLE table_observation DROP COLUMN table_id;
        ALTER TABLE sketch_version DROP COLUMN state_options, DROP COLUMN table_identities;
        ALTER TABLE sketch DROP CONSTRAINT sketch_unusable_pair, DROP COLUMN unusable_at, DROP COLUMN unusable_reason;
    """)


def _quote(text: str) -> str:
    return text.replace("'", "''")

"""Where each operator's state lives: in the maintaining process, or external (Delta tables beside the data).

Revision ID: 0006_state_placement
Revises: 0005_state_chunks
Create Date: 2026-11-28

* ``sketch_version.state_placement``: per stateful operator of the version, ``{"where": "memory" | "external",
  "bytes": n, "rows": n}`` (bytes in memory, or estimated from the rows kept externally); NULL for versions written
  before placements were recorded (every operator in memory). An external operator's sealed state blob holds the
  reference to its tables (location and pinned Delta versions).
* the ``sketch_catalog`` view gains ``state_placement`` (the latest version's), ``state_memory_bytes`` and
  ``state_external_bytes`` (their sums).

Downgrading deletes the operator state of versions with external state (an older imp cannot read it; the next
maintenance of those sketches recaptures in memory).
"""

from __future__ import annotations

import importlib

from alembic import op

revision = "0006_state_placement"
down_revision = "0005_state_chunks"
branch_labels = None
depends_on = None

_COLUMNS = """
ALTER TABLE sketch_version
    ADD COLUMN state_placement jsonb CHECK (state_placement IS NULL OR jsonb_typeof(state_placement) = 'object');
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
    coalesce(v.partitions, s.partitions) AS partitions,
    v.state_placement,
    place.memory_bytes                  AS state_memory_bytes,
    place.external_bytes                AS state_external_bytes
FROM sketch s
LEFT JOIN LATERAL (
    SELECT sv.version, sv.method, sv.table_versions, sv.fragments, sv.created_at, sv.partitions, sv.state_placement
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
    SELECT
        sum((p.value ->> 'bytes')::bigint) FILTER (WHERE p.value ->> 'where' = 'memory')   AS memory_bytes,
        sum((p.value ->> 'bytes')::bigint) FILTER (WHERE p.value ->> 'where' = 'external') AS external_bytes
    FROM jsonb_each(coalesce(v.state_placement, '{}'::jsonb)) AS p (key, value)
) place ON true
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
    "COLUMN sketch_version.state_placement": "Per stateful operator: where its state lives (memory or external Delta "
                                             "tables) and its size in bytes and rows; null for versions written "
                                             "before placements were recorded (all in memory).",
    "COLUMN sketch_catalog.state_placement": "Where each operator's state of the latest version lives, with its "
                                             "size.",
    "COLUMN sketch_catalog.state_memory_bytes": "Bytes of the latest version's state held in memory by a "
                                                "maintaining process.",
    "COLUMN sketch_catalog.state_external_bytes": "Estimated bytes of the latest version's state kept in Delta "
                                                  "tables beside the data.",
}


def upgrade() -> None:
    op.execute(_COLUMNS)
    op.execute(_VIEW)
    for target, text in _COMMENTS.items():
        op.execute(f"COMMENT ON {target} IS '{text.replace(chr(39), chr(39) * 2)}'")


def downgrade() -> None:
    repartition = importlib.import_module("imp_core.catalog.migrations.versions.0004_repartition")
    op.execute("""
        DELETE FROM operator_state st USING sketch_version sv
        WHERE st.sketch_id = sv.sketch_id AND st.version = sv.version
          AND sv.state_placement::text LIKE '%"external"%';
    """)
    op.execute("DROP VIEW sketch_catalog")
    op.execute(repartition._VIEW)
    op.execute("ALTER TABLE sketch_version DROP COLUMN state_placement")
    earlier = {}
    for name in ("0001_initial", "0002_lifecycle", "0004_repartition"):
        earlier.update(importlib.import_module(f"imp_core.catalog.migrations.versions.{name}")._COMMENTS)
    for target, text in earlier.items():
        if target.startswith(("VIEW sketch_catalog", "COLUMN sketch_catalog.")):
            op.execute(f"COMMENT ON {target} IS '{text.replace(chr(39), chr(39) * 2)}'")

"""Initial catalog schema: tables, sketches, immutable versions with their operator state, runs, the catalog view.

Revision ID: 0001_initial
Revises:
Create Date: 2026-11-22

Written as plain Postgres DDL: the guarantees (insert-only versions, gap-free version numbers, immutable state) live
in triggers, which read best as the SQL they are.
"""

from __future__ import annotations

from alembic import op

revision = "0001_initial"
down_revision = None
branch_labels = None
depends_on = None

_TABLES = """
CREATE TABLE source_table (
    name          text PRIMARY KEY CHECK (name <> ''),
    path          text NOT NULL,
    registered_at timestamptz NOT NULL DEFAULT now(),
    schema_json   jsonb
);

CREATE TABLE table_observation (
    table_name  text PRIMARY KEY REFERENCES source_table (name) ON UPDATE CASCADE ON DELETE CASCADE,
    version     bigint NOT NULL CHECK (version >= 0),
    observed_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE sketch (
    id           serial PRIMARY KEY,
    name         text NOT NULL CHECK (name <> ''),
    sql          text NOT NULL,
    dialect      text,
    template_key text NOT NULL,
    plan_json    jsonb,
    partitions   jsonb NOT NULL,
    safety       jsonb,
    strategy     text NOT NULL DEFAULT 'lazy',
    created_at   timestamptz NOT NULL DEFAULT now(),
    dropped_at   timestamptz
);
-- Unique among live sketches only: a dropped sketch keeps its row (its versions reference it) and its name is free.
CREATE UNIQUE INDEX sketch_live_name_key ON sketch (name) WHERE dropped_at IS NULL;

CREATE TABLE maintenance_run (
    id                  bigserial PRIMARY KEY,
    sketch_id           integer REFERENCES sketch (id),
    strategy            text,
    trigger             text,
    triggered_by        text,
    from_version        integer,
    to_version          integer,
    table_versions_from jsonb,
    table_versions_to   jsonb,
    delta_rows          bigint,
    status              text NOT NULL DEFAULT 'running' CHECK (status IN ('running', 'succeeded', 'failed')),
    error               text,
    started_at          timestamptz NOT NULL DEFAULT now(),
    finished_at         timestamptz,
    timings             jsonb
);
CREATE INDEX maintenance_run_sketch_idx ON maintenance_run (sketch_id, id DESC);

CREATE TABLE sketch_version (
    sketch_id      integer NOT NULL REFERENCES sketch (id),
    version        integer NOT NULL CHECK (version >= 1),
    table_versions jsonb NOT NULL CHECK (jsonb_typeof(table_versions) = 'object'),
    bits           jsonb NOT NULL CHECK (jsonb_typeof(bits) = 'object'),
    fragments      jsonb NOT NULL CHECK (jsonb_typeof(fragments) = 'object'),
    method         text NOT NULL CHECK (method IN ('capture', 'incremental', 'recapture')),
    reason         text,
    delta_rows     bigint NOT NULL DEFAULT 0,
    duration_ms    double precision,
    run_id         bigint REFERENCES maintenance_run (id),
    created_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (sketch_id, version)
);

CREATE TABLE operator_state (
    sketch_id      integer NOT NULL,
    version        integer NOT NULL,
    operator_id    text NOT NULL,
    format         text NOT NULL,
    format_version integer NOT NULL,
    payload        bytea NOT NULL,
    checksum       text NOT NULL CHECK (checksum ~ '^[0-9a-f]{64}$'),
    size_bytes     bigint NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (sketch_id, version, operator_id),
    FOREIGN KEY (sketch_id, version) REFERENCES sketch_version (sketch_id, version)
);
"""

_TRIGGERS = """
CREATE FUNCTION imp_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '%', TG_ARGV[0] USING ERRCODE = 'restrict_violation';
END
$$;

CREATE TRIGGER sketch_version_immutable BEFORE UPDATE OR DELETE ON sketch_version
    FOR EACH ROW EXECUTE FUNCTION imp_refuse_change('sketch versions are immutable');
CREATE TRIGGER sketch_version_no_truncate BEFORE TRUNCATE ON sketch_version
    FOR EACH STATEMENT EXECUTE FUNCTION imp_refuse_change('sketch versions are immutable');
-- Deleting old state is retention and allowed; changing state in place would break the checksum contract.
CREATE TRIGGER operator_state_immutable BEFORE UPDATE ON operator_state
    FOR EACH ROW EXECUTE FUNCTION imp_refuse_change('operator state is immutable');

-- Versions of a sketch are 1, 2, 3, ... without gaps. Concurrent inserts of the same number are caught by the
-- primary key; this catches skipped or stale numbers.
CREATE FUNCTION imp_sketch_version_next() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    expected integer;
BEGIN
    SELECT coalesce(max(version), 0) + 1 INTO expected FROM sketch_version WHERE sketch_id = NEW.sketch_id;
    IF NEW.version <> expected THEN
        RAISE EXCEPTION 'sketch % version % is out of order: the next version is %',
            NEW.sketch_id, NEW.version, expected USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER sketch_version_in_order BEFORE INSERT ON sketch_version
    FOR EACH ROW EXECUTE FUNCTION imp_sketch_version_next();
"""

_VIEW = """
CREATE VIEW sketch_catalog AS
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
    r.error                             AS last_run_error
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
    "TABLE source_table": "Delta tables registered with imp, by the name queries use.",
    "TABLE table_observation": "Latest Delta version seen for each registered table (drives staleness).",
    "TABLE sketch": "Registered provenance sketches: the query, its partitions and maintenance strategy.",
    "TABLE sketch_version": "Immutable, gap-free versions of each sketch: which fragments, at which table versions.",
    "TABLE operator_state": "Saved state of the incremental operators for a sketch version (kept for recent "
                            "versions only).",
    "TABLE maintenance_run": "One row per capture or maintenance attempt, successful or not.",
    "VIEW sketch_catalog": "One row per live sketch: its latest version, whether it is stale, and its last run.",
    "COLUMN sketch_catalog.sketch_id": "Internal id of the sketch.",
    "COLUMN sketch_catalog.name": "Sketch name.",
    "COLUMN sketch_catalog.sql": "The query the sketch was captured for.",
    "COLUMN sketch_catalog.strategy": "Maintenance strategy (lazy: maintained when used; eager: after each change).",
    "COLUMN sketch_catalog.latest_version": "Number of the latest committed sketch version.",
    "COLUMN sketch_catalog.latest_method": "How the latest version was produced: capture, incremental or "
                                           "recapture.",
    "COLUMN sketch_catalog.table_versions": "Delta version of each table the latest sketch version reflects, as "
                                            "{table: version}.",
    "COLUMN sketch_catalog.current_table_versions": "Latest observed Delta version of each of those tables, as "
                                                    "{table: version} (tables never observed are omitted).",
    "COLUMN sketch_catalog.is_stale": "True if any table has an observed version newer than the sketch reflects.",
    "COLUMN sketch_catalog.fragments": "Fragments in the latest sketch version, as {table: [fragment ids]}.",
    "COLUMN sketch_catalog.version_created_at": "When the latest sketch version was committed.",
    "COLUMN sketch_catalog.last_run_id": "Id of the most recent maintenance run of the sketch (null if none).",
    "COLUMN sketch_catalog.last_run_status": "Status of that run: running, succeeded or failed.",
    "COLUMN sketch_catalog.last_run_finished_at": "When that run finished (null while running).",
    "COLUMN sketch_catalog.last_run_error": "Error message of that run if it failed.",
}


def upgrade() -> None:
    op.execute(_TABLES)
    op.execute(_TRIGGERS)
    op.execute(_VIEW)
    for target, text in _COMMENTS.items():
        op.execute(f"COMMENT ON {target} IS '{_quote(text)}'")


def downgrade() -> None:
    op.execute("""
        DROP VIEW sketch_catalog;
        DROP TABLE operator_state, sketch_version, maintenance_run, sketch, table_observation, source_table;
        DROP FUNCTION imp_sketch_version_next(), imp_refuse_change();
    """)


def _quote(text: str) -> str:
    return text.replace("'", "''")

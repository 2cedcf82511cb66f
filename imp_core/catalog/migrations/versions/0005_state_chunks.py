"""State chunks: a large state frame stored once and shared by the versions that keep it unchanged.

Revision ID: 0005_state_chunks
Revises: 0004_repartition
Create Date: 2026-11-26

* ``state_chunk``: per sketch, frames of operator state named by the SHA-256 of their bytes (format version 2 of the
  state blob names them in its sealed header). A top-k sketch over a large table keeps every input row after its
  head; that part changes only when it is compacted, so later versions reference the stored chunk instead of writing
  tens of MB per version. Rows are immutable; a chunk no operator state references any more is deleted with the
  state that released it (retention, drop).
* ``operator_state.chunks``: the digests a state blob names (what keeps its chunks alive).

Downgrading deletes the operator state that references chunks (an older imp cannot read it; the next maintenance of
those sketches recaptures) and the chunks.
"""

from __future__ import annotations

from alembic import op

revision = "0005_state_chunks"
down_revision = "0004_repartition"
branch_labels = None
depends_on = None

_SCHEMA = """
CREATE TABLE state_chunk (
    sketch_id  integer NOT NULL REFERENCES sketch (id),
    digest     text NOT NULL CHECK (digest ~ '^[0-9a-f]{64}$'),
    payload    bytea NOT NULL,
    size_bytes bigint NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (sketch_id, digest)
);
CREATE TRIGGER state_chunk_immutable BEFORE UPDATE ON state_chunk
    FOR EACH ROW EXECUTE FUNCTION imp_refuse_change('state chunks are immutable');

ALTER TABLE operator_state ADD COLUMN chunks text[] NOT NULL DEFAULT '{}';
"""

_COMMENTS = {
    "TABLE state_chunk": "Frames of operator state stored once per sketch and named by the SHA-256 of their bytes; "
                         "state blobs reference them by digest in their sealed header.",
    "COLUMN state_chunk.digest": "SHA-256 (hex) of payload.",
    "COLUMN state_chunk.payload": "One frame as an Arrow IPC stream (zstd).",
    "COLUMN operator_state.chunks": "Digests of the state_chunk rows this blob references.",
}


def upgrade() -> None:
    op.execute(_SCHEMA)
    for target, text in _COMMENTS.items():
        op.execute(f"COMMENT ON {target} IS '{text.replace(chr(39), chr(39) * 2)}'")


def downgrade() -> None:
    op.execute("""
        DELETE FROM operator_state WHERE cardinality(chunks) > 0;
        ALTER TABLE operator_state DROP COLUMN chunks;
        DROP TABLE state_chunk;
    """)

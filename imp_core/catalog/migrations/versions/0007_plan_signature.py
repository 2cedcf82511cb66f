"""What imp's Spark extension matches queries by, and which version of each sketch is published for it.

Revision ID: 0007_plan_signature
Revises: 0006_state_placement
Create Date: 2026-12-02

* ``sketch.signature``: the canonical signature of the sketch query's plan as Spark analyzes it, computed by the
  extension's own code at registration (``{"hash", "tree", "slots": [{"slot", "type", "value", "op"}]}``: the
  literal slots with the constraint under which the sketch serves another constant); NULL for sketches registered
  before (``imp sketch publish NAME`` computes it).
* ``sketch.published_version``: the latest version whose manifest was written to the publish location (NULL: none
  yet); a failed publish leaves it behind, and the next commit or ``imp sketch publish`` catches up.
"""

from __future__ import annotations

from alembic import op

revision = "0007_plan_signature"
down_revision = "0006_state_placement"
branch_labels = None
depends_on = None

_COMMENTS = {
    "COLUMN sketch.signature": "The canonical signature of the query's Spark plan (hash, plan tree, literal slots "
                               "with their constraints), which imp's Spark extension matches queries by.",
    "COLUMN sketch.published_version": "Latest version whose manifest was published for imp's Spark extension; "
                                       "null before the first publish.",
}


def upgrade() -> None:
    op.execute("""
        ALTER TABLE sketch
            ADD COLUMN signature jsonb CHECK (signature IS NULL OR jsonb_typeof(signature) = 'object'),
            ADD COLUMN published_version integer;
    """)
    for target, text in _COMMENTS.items():
        op.execute(f"COMMENT ON {target} IS '{text.replace(chr(39), chr(39) * 2)}'")


def downgrade() -> None:
    op.execute("ALTER TABLE sketch DROP COLUMN signature, DROP COLUMN published_version")

"""Operator state cannot be forged by a catalog writer, and malformed state leads to a recapture (finding 4).

The review found that state checksums were plain SHA-256 (anyone who can write the catalog can replace the state
and its digest) and that a blob with a valid checksum but the wrong shape escaped as a polars error (exit 70)
instead of a state error that leads to the recorded recapture.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import polars as pl
import pytest

from tests.security.conftest import TOP_SQL, Lab

pytestmark = [pytest.mark.spark, pytest.mark.postgres]

HP_ROW = {"id": [9], "brand": ["HP"], "price": [700], "numSold": [1]}  # HP: 6500 -> 7200, still > 5000


def _aggregation_state(lab: Lab, sketch_id: int) -> tuple[str, Any]:
    from imp_core.engine import state

    [(op_id, payload)] = lab.sql("SELECT operator_id, payload FROM operator_state WHERE sketch_id = :s AND version = 1 "
                                 "AND operator_id LIKE 'aggregation%'", s=sketch_id)
    return op_id, state.decode(bytes(payload))


def _write_state(lab: Lab, sketch_id: int, op_id: str, payload: bytes, checksum: str) -> None:
    """What a catalog writer can do: replace a state row (the immutability trigger switched off, as a superuser)."""
    import sqlalchemy as sa

    with lab.catalog.engine.begin() as conn:
        conn.execute(sa.text("SET LOCAL session_replication_role = replica"))
        conn.execute(sa.text("UPDATE operator_state SET payload = :p, checksum = :c, size_bytes = :n "
                             "WHERE sketch_id = :s AND version = 1 AND operator_id = :op"),
                     {"p": payload, "c": checksum, "n": len(payload), "s": sketch_id, "op": op_id})


def _reencode(decoded: Any, frames: dict[str, pl.DataFrame]) -> bytes:
    from imp_core.engine import state

    return state.encode(decoded.kind, decoded.op_id, decoded.fingerprint, decoded.meta, frames)


def _maintain(lab: Lab, name: str) -> dict[str, Any]:
    done = lab.imp_here("sketch", "maintain", name, "--json")  # the recapture runs on the session's Spark
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr}"
    return json.loads(done.stdout)


def test_forged_state_is_detected_and_the_sketch_recaptured(lab: Lab) -> None:
    lab.table("forge_sales")
    record = lab.sketch("forge_top", "forge_sales")
    op_id, decoded = _aggregation_state(lab, record.id)
    groups = decoded.frames["groups"].with_columns(
        pl.when(pl.col("brand") == "HP").then(pl.lit(100, pl.Int64)).otherwise(pl.col("__s0")).alias("__s0"))
    forged = _reencode(decoded, {**decoded.frames, "groups": groups})
    # the forger has imp's code and the catalog, not the key: the digest is what anyone can compute
    _write_state(lab, record.id, op_id, forged, hashlib.sha256(forged).hexdigest())

    lab.append("forge_sales", HP_ROW)
    out = _maintain(lab, "forge_top")
    assert out["recaptured"], f"forged state was used for incremental maintenance: {out}"
    assert "checksum" in out["recaptured"] or "corrupt" in out["recaptured"]

    # the sketch is right again: the query with it returns what Spark returns without it (HP is in both)
    sql = TOP_SQL.format(t="forge_sales")
    with_sketch = lab.service.query(sql)
    without = lab.service.query(sql, use_sketch=False)
    assert with_sketch.sketch is not None and sorted(with_sketch.rows) == sorted(without.rows)
    assert [r[0] for r in without.rows] == ["HP"]
    [run] = [r for r in lab.catalog.runs(record.id, limit=10) if r.to_version == out["versions"][-1]]
    assert run.status == "succeeded"
    assert lab.catalog.latest_version(record.id).reason == out["recaptured"]  # recorded with the reason


def test_state_of_the_wrong_shape_under_a_valid_checksum_leads_to_a_recapture(lab: Lab) -> None:
    lab.table("shape_sales")
    record = lab.sketch("shape_top", "shape_sales")
    op_id, decoded = _aggregation_state(lab, record.id)
    fcounts = decoded.frames["fcounts"].rename({"__n": "__count"})
    bad = _reencode(decoded, {**decoded.frames, "fcounts": fcounts})
    _write_state(lab, record.id, op_id, bad, _valid_checksum(lab, "shape_top", op_id, bad))

    lab.append("shape_sales", HP_ROW)
    out = _maintain(lab, "shape_top")  # not exit 70 with a polars error
    assert out["recaptured"] and "fcounts" in out["recaptured"], out  # a state error, with the reason
    assert lab.catalog.latest_version(record.id).method == "recapture"


def _valid_checksum(lab: Lab, sketch: str, op_id: str, payload: bytes) -> str:
    """The checksum this installation accepts for the payload (the keyed one where there is a key)."""
    try:
        from imp_core.security.integrity import load_state_key, seal
    except ImportError:  # an imp without keyed checksums
        return hashlib.sha256(payload).hexdigest()
    return seal(load_state_key(lab.home), sketch, 1, op_id, payload)

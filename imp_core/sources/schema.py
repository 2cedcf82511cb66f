"""Table schemas as JSON for the catalog (readable column list + the exact Arrow schema)."""

from __future__ import annotations

import base64
from typing import Any

import pyarrow as pa


def schema_to_json(schema: pa.Schema) -> dict[str, Any]:
    return {
        "columns": [[f.name, str(f.type)] for f in schema],
        "arrow": base64.b64encode(schema.serialize().to_pybytes()).decode(),
    }


def schema_from_json(obj: dict[str, Any]) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(obj["arrow"])))


def incompatibility(table: str, registered: pa.Schema, current: pa.Schema, used: set[str]) -> str | None:
    """Why a sketch reading ``used`` columns of ``table`` no longer fits it: a column it reads disappeared (dropped
    or renamed) or changed type since registration; None when every such column is as it was. Columns the sketch
    does not read may change freely."""
    for name in sorted(used):
        if name not in registered.names:
            continue
        if name not in current.names:
            return f"table {table} no longer has column {name} (dropped or renamed), which the sketch reads"
        old, new = registered.field(name).type, current.field(name).type
        if old != new:
            return f"table {table} changed column {name}, which the sketch reads, from {old} to {new}"
    return None

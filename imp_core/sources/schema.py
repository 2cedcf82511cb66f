"""Table schemas as JSON for the catalog (readable column list + the exact Arrow schema)."""

from __future__ import annotations

import base64
from typing import Any

import pyarrow as pa

from imp_core.errors import SchemaChangedError


def schema_to_json(schema: pa.Schema) -> dict[str, Any]:
    return {"columns": [[f.name, str(f.type)] for f in schema],
            "arrow": base64.b64encode(schema.serialize().to_pybytes()).decode()}


def schema_from_json(obj: dict[str, Any]) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(obj["arrow"])))


def check_compatible(table: str, registered: pa.Schema, current: pa.Schema, used: set[str], sketch: str) -> None:
    """Refuse when a column the sketch's query uses disappeared or changed type since registration."""
    for name in sorted(used):
        if name not in registered.names:
            continue
        if name not in current.names:
            raise SchemaChangedError(f"table {table} no longer has column {name}, which sketch {sketch} uses; "
                                     f"drop the sketch (`imp sketch drop {sketch}`) and register it again")
        old, new = registered.field(name).type, current.field(name).type
        if old != new:
            raise SchemaChangedError(f"table {table} changed column {name} from {old} to {new} since sketch {sketch} "
                                     f"was registered; drop the sketch (`imp sketch drop {sketch}`) and register it "
                                     f"again with `imp sketch create`")

"""A manifest: what imp's Spark extension needs of one committed sketch version, derived from the catalog (which
stays the truth), as one small immutable JSON file.

The file is ``{"format": 1, "sha256": <hex>, "body": "<JSON text>"}``: the digest is over the body's exact text, so
the reader checks it without re-serializing, and a damaged or edited file is ignored. The body holds the sketch's
name, id and version, whether it is usable (and why not), its plan signature and slot constraints, the Delta
identity (metadata id, path) and version of every table it depends on, the result-shaping settings it was computed
under, and per partitioned table the column, its Spark type and the ranges its kept fragments merge into, as typed
values (fragment 0 also keeps NULL, as :mod:`imp_core.use.rewrite` writes them).
"""

from __future__ import annotations

import datetime as dt
import decimal
import hashlib
import json
import math
from typing import Any

from imp_core.catalog import SketchRecord, VersionRecord
from imp_core.sketch.bounds import sql_type_name
from imp_core.sketch.partition import Bound, PartitionSet
from imp_core.sources import storage
from imp_core.spark.connector import RESULT_SEMANTICS

FORMAT = 1


def bound_text(value: Bound) -> str:
    """A bound as the text Spark casts back to the exact value (timestamps in UTC, the extension casts in UTC)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.timezone.utc).replace(tzinfo=None)
        return value.isoformat(sep=" ")
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return format(value, "f")
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return repr(value)
    return str(value)


def body(record: SketchRecord, version: VersionRecord, partitions: PartitionSet) -> dict[str, Any]:
    """The manifest body of ``version`` of ``record`` (``partitions``: the ones the version's fragments refer to)."""
    identities = version.table_identities or {}
    tables = []
    for name in sorted(version.table_versions):
        ident = identities.get(name) or {}
        tables.append({"name": name, "id": ident.get("id"), "path": storage.spark_uri(ident.get("path") or ""),
                       "version": int(version.table_versions[name])})
    ids = {t["name"]: t["id"] for t in tables}
    parts = []
    for p in partitions.partitions:
        kept = sorted(version.fragments.get(p.table, []))
        parts.append({"table": p.table, "table_id": ids.get(p.table), "column": p.column,
                      "type": sql_type_name(p.column_type).lower(),
                      "ranges": [{"lo": None if lo is None else bound_text(lo),
                                  "hi": None if hi is None else bound_text(hi), "nulls": bool(nulls)}
                                 for lo, hi, nulls in p.ranges(kept)],
                      "fragments_kept": len(kept), "fragments_total": p.fragments})
    signature = record.signature or {}
    usable, reason = record.usable, record.unusable_reason
    if usable and not signature.get("hash"):
        usable = False
        reason = (f"its plan cannot be matched by the Spark extension ({signature['unmatchable']})"
                  if signature.get("unmatchable") else
                  f"no plan signature is recorded; run `imp sketch publish {record.name}`")
    if usable and any(t["id"] is None for t in tables):
        usable, reason = False, "a table's Delta identity is not recorded with this version"
    return {
        "sketch_id": record.id, "sketch": record.name, "version": version.version,
        "created": version.created_at.isoformat() if version.created_at else None,
        "usable": usable, "unusable_reason": reason,
        "signature": {"hash": signature.get("hash"), "tree": signature.get("tree"),
                      "slots": signature.get("slots", [])},
        "semantics": dict(RESULT_SEMANTICS), "tables": tables, "partitions": parts,
    }


def encode(content: dict[str, Any]) -> bytes:
    """The manifest file for ``content`` (a :func:`body`)."""
    text = json.dumps(content, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(text.encode()).hexdigest()
    return (json.dumps({"format": FORMAT, "sha256": digest, "body": text}) + "\n").encode()


def decode(data: bytes) -> dict[str, Any] | None:
    """The body of a manifest file, None when it is damaged (bad JSON, format or checksum)."""
    try:
        outer = json.loads(data)
        text = outer["body"]
        if outer.get("format") != FORMAT or hashlib.sha256(text.encode()).hexdigest() != outer.get("sha256"):
            return None
        content = json.loads(text)
    except (ValueError, KeyError, TypeError):
        return None
    return content if isinstance(content, dict) else None


__all__ = ["FORMAT", "body", "bound_text", "decode", "encode"]

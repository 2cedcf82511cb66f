"""A fast path for a small range of a local Delta table's Change Data Feed, read straight from the commit JSON and
its ``cdc``/``add``/``remove`` files with pyarrow; anything unusual returns None and the caller falls back to
delta-rs. It also owns the meaning of Delta's ``_change_type`` values as signed multiplicities. See
docs/ARCHITECTURE.md, "Optimizations".
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from imp_core.engine.schema import MULT
from imp_core.errors import SourceError

MAX_COMMITS = 64  # beyond this, delta-rs' planning cost is amortized anyway
VERSION = "__version"
INSERT_TYPES = ("insert", "update_postimage")
DELETE_TYPES = ("delete", "update_preimage")
_SIGN = {"insert": 1, "delete": -1}


def local_root(path: str) -> Path | None:
    if "://" in path and not path.startswith("file://"):
        return None
    root = Path(path[len("file://"):] if path.startswith("file://") else path)
    return root if (root / "_delta_log").is_dir() else None


def read_range(root: Path, after: int, upto: int, columns: list[str], schema: pa.Schema,
               partition_columns: list[str]) -> pa.Table | None:
    """Signed change rows of commits ``(after, upto]``: ``columns``, ``__mult`` (+1/-1) and ``__version``; None
    when only delta-rs can read the range exactly."""
    if upto - after > MAX_COMMITS:
        return None
    fields = [schema.field(c) for c in columns]
    out_schema = pa.schema(fields + [pa.field(MULT, pa.int64(), False), pa.field(VERSION, pa.int64())])
    parts: list[pa.Table] = []
    for version in range(after + 1, upto + 1):
        actions = _commit(root, version)
        files = _change_files(actions) if actions is not None else None
        if files is None:
            return None
        for f, change_type in files:
            table = _read(root, f, columns, schema, partition_columns, change_type, version, out_schema)
            if table is None:
                return None
            parts.append(table)
    if not parts:
        return out_schema.empty_table()
    return parts[0] if len(parts) == 1 else pa.concat_tables(parts)


def multiplicity(kind: pa.Array | pa.ChunkedArray) -> tuple[pa.Array, int]:
    """Delta's ``_change_type`` values as signed multiplicities (+1 insert / update post-image, -1 delete / update
    pre-image), and how many rows have a type that is neither."""
    kind = kind.cast(pa.string())
    is_insert = pc.is_in(kind, pa.array(INSERT_TYPES))
    is_delete = pc.is_in(kind, pa.array(DELETE_TYPES))
    unknown = pc.sum(pc.invert(pc.or_(is_insert, is_delete))).as_py() or 0
    return pc.if_else(is_insert, pa.scalar(1, pa.int64()), pa.scalar(-1, pa.int64())), unknown


def _change_files(actions: list[dict[str, Any]]) -> list[tuple[dict[str, Any], str | None]] | None:
    """The files holding one commit's change rows, each with the change type its rows get (None: the file's own
    ``_change_type`` column), or None when only the slow, exact way can tell."""
    cdc, adds, removes = [], [], []
    for action in actions:
        if "metaData" in action or "protocol" in action:
            return None  # the caller re-checks CDF settings and schema the slow, exact way
        if "cdc" in action:
            cdc.append(action["cdc"])
        elif "add" in action and action["add"].get("dataChange", True):
            adds.append(action["add"])
        elif "remove" in action and action["remove"].get("dataChange", True):
            removes.append(action["remove"])
    if cdc:  # the commit's change rows are exactly its cdc files (Delta protocol), deletion vectors or not
        return [(f, None) for f in cdc]
    if any(a.get("deletionVector") for a in adds + removes):
        return None  # rows deleted by a deletion vector: delta-rs computes them from the vectors
    return [(f, "insert") for f in adds] + [(f, "delete") for f in removes]


def confined(root: Path, raw: Any) -> Path:
    """The local file a log action names, which must lie inside the table's directory.

    The Delta protocol stores data file paths as URIs relative to the table root (absolute URIs appear only in
    shallow clones). A path that leaves the root (``../``, an absolute path or ``file://`` URI elsewhere, a symlink
    pointing out) would make imp read files the table's writer chose from anywhere this process can read, so it is
    refused, never followed.

    Raises:
        SourceError: The path is missing, not a string, or outside the table's directory.
    """
    if not isinstance(raw, str) or not raw:
        raise SourceError(f"Delta table {root}: a commit names a data file without a path; the log is corrupt")
    base = _resolved(str(root))
    path = Path(os.path.realpath(base / _local_text(root, raw)))
    if path != base and base not in path.parents:
        raise SourceError(f"Delta table {root}: a commit names the data file {raw!r}, which lies outside the table's "
                          f"directory; imp refuses to read it (files of a table must be under its root)")
    return path


@lru_cache(maxsize=256)
def _resolved(root: str) -> Path:
    return Path(root).resolve()


def _local_text(root: Path, raw: str) -> str:
    """A log action's path as a local path (absolute, or relative to the table root)."""
    text = raw
    if "://" in text:
        parts = urlsplit(text)
        if parts.scheme != "file":
            raise SourceError(f"Delta table {root}: a commit names the data file {raw!r} on other storage; imp reads "
                              f"only files under the table's own directory")
        text = unquote(parts.path)
    else:
        text = unquote(text)
    return text


def _commit(root: Path, version: int) -> list[dict[str, Any]] | None:
    path = root / "_delta_log" / f"{version:020d}.json"
    try:
        with open(path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, json.JSONDecodeError):
        return None


def _read(root: Path, action: dict[str, Any], columns: list[str], schema: pa.Schema, partition_columns: list[str],
          change_type: str | None, version: int, out_schema: pa.Schema) -> pa.Table | None:
    path = confined(root, action.get("path"))
    stored = [c for c in columns if c not in partition_columns]
    read_cols = stored + ([] if change_type else ["_change_type"])
    try:
        # ParquetFile, not read_table: no dataset discovery for one known file; no pre-buffering: its I/O threads
        # cost more than reading a small file
        with pq.ParquetFile(path, pre_buffer=False) as f:
            table = f.read(columns=read_cols, use_threads=False)
    except (OSError, pa.ArrowInvalid, KeyError):
        return None  # a missing or unreadable file: delta-rs reports it
    n = table.num_rows
    out = []
    values = action.get("partitionValues") or {}
    for c in columns:
        field = schema.field(c)
        if c in partition_columns:
            raw = values.get(c)
            scalar = pa.scalar(raw, pa.string()).cast(field.type) if raw is not None else pa.scalar(None, field.type)
            out.append(pa.array([scalar.as_py()] * n, field.type))
        else:
            out.append(table.column(c).cast(field.type))
    if change_type is None:
        mult, unknown = multiplicity(table.column("_change_type"))
        if unknown:
            return None  # delta-rs' path reports the unknown change type
    else:
        mult = pa.array(np.full(n, _SIGN[change_type], dtype=np.int64))
    return pa.table(out + [mult, pa.array(np.full(n, version, dtype=np.int64))], schema=out_schema)


__all__ = ["DELETE_TYPES", "INSERT_TYPES", "VERSION", "confined", "local_root", "multiplicity", "read_range"]

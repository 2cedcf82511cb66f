"""The binary format of operator state: versioned, self-describing, checksummed, no pickle.

A blob is ``b"IMPS" | u16 format version | u32 header length | header (JSON) | frames``, each frame a polars
DataFrame as an Arrow IPC stream with a u64 length prefix. The header names the operator kind and id, the frames,
the plan fingerprint, operator metadata and the SHA-256 of the frames. Operator ids (``<kind>@<node path>``) and frame
names are part of the format. See docs/ARCHITECTURE.md, "State and versions".
"""

from __future__ import annotations

import hashlib
import io
import json
import struct
from dataclasses import dataclass
from typing import Any

import polars as pl
import pyarrow as pa

from imp_core.errors import StateError

_WRITE_OPTIONS = pa.ipc.IpcWriteOptions(compression="zstd")
MAGIC = b"IMPS"
FORMAT = "imp-arrow-ipc"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class StatePayload:
    """Decoded state of one operator: the header fields that tie it to an operator of a plan (``kind``, ``op_id``,
    ``fingerprint``), the operator's JSON metadata and its named frames."""

    kind: str
    op_id: str
    fingerprint: str
    meta: dict[str, Any]
    frames: dict[str, pl.DataFrame]


def encode(kind: str, op_id: str, fingerprint: str, meta: dict[str, Any], frames: dict[str, pl.DataFrame]) -> bytes:
    body = io.BytesIO()
    names = []
    for name, df in frames.items():
        sink = io.BytesIO()
        table = df.to_arrow()
        # zstd inside the IPC stream (self-describing: readers need no option); counters and ids compress well
        with pa.ipc.new_stream(sink, table.schema, options=_WRITE_OPTIONS) as writer:
            writer.write_table(table)
        data = sink.getvalue()
        body.write(struct.pack("<Q", len(data)))
        body.write(data)
        names.append(name)
    raw = body.getvalue()
    header = json.dumps({"format": FORMAT, "kind": kind, "op_id": op_id, "fingerprint": fingerprint,
                         "frames": names, "meta": meta, "sha256": hashlib.sha256(raw).hexdigest()},
                        sort_keys=True, default=str).encode()
    return MAGIC + struct.pack("<HI", FORMAT_VERSION, len(header)) + header + raw


def decode(blob: bytes, *, kind: str | None = None, op_id: str | None = None,
           fingerprint: str | None = None) -> StatePayload:
    where = f"operator {op_id}" if op_id else "operator state"
    header, raw = _read_header(blob, where)
    if kind is not None and header.get("kind") != kind:
        raise StateError(f"{where}: state belongs to a {header.get('kind')} operator, expected {kind}; "
                         f"recapture the sketch")
    if op_id is not None and header.get("op_id") != op_id:
        raise StateError(f"{where}: state belongs to operator {header.get('op_id')}; recapture the sketch")
    if fingerprint is not None and header.get("fingerprint") != fingerprint:
        raise StateError(f"{where}: state was built for a different plan; recapture the sketch")
    frames = _read_frames(header["frames"], raw, where)
    if not all(isinstance(header.get(k), str) for k in ("kind", "op_id", "fingerprint")):
        raise StateError(f"{where}: state header is malformed (kind, op_id or fingerprint missing); recapture the "
                         f"sketch")
    return StatePayload(header["kind"], header["op_id"], header["fingerprint"], header.get("meta", {}), frames)


def _read_header(blob: bytes, where: str) -> tuple[dict[str, Any], memoryview]:
    """A blob's header, checked for shape, and its payload, checked against the header's checksum."""
    if len(blob) < 10 or blob[:4] != MAGIC:
        raise StateError(f"{where}: not an IMP state blob (bad magic); recapture the sketch")
    blob = bytes(blob) if not isinstance(blob, (bytes, memoryview)) else blob
    version, hlen = struct.unpack("<HI", blob[4:10])
    if 10 + hlen > len(blob):
        raise StateError(f"{where}: state header runs past the end of the blob; recapture the sketch")
    if version != FORMAT_VERSION:
        raise StateError(f"{where}: state format version {version} is not supported by this imp version "
                         f"(expects {FORMAT_VERSION}); recapture the sketch")
    try:
        header = json.loads(blob[10:10 + hlen].decode())
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise StateError(f"{where}: state header is corrupt; recapture the sketch") from e
    # a header that parses can still be damaged (a flipped bit turns the key "frames" into "grames")
    if not (isinstance(header, dict) and header.get("format") == FORMAT and isinstance(header.get("frames"), list)
            and all(isinstance(n, str) for n in header["frames"]) and isinstance(header.get("meta", {}), dict)):
        raise StateError(f"{where}: state header is malformed; recapture the sketch")
    raw = memoryview(blob)[10 + hlen:]  # no copy of a state of many MB
    if hashlib.sha256(raw).hexdigest() != header.get("sha256"):
        raise StateError(f"{where}: state payload is corrupt (checksum mismatch); recapture the sketch")
    return header, raw


def _read_frames(names: list[str], raw: memoryview, where: str) -> dict[str, pl.DataFrame]:
    """The frames ``names`` from the payload, each a length-prefixed Arrow IPC stream, filling it exactly."""
    frames: dict[str, pl.DataFrame] = {}
    pos = 0
    try:
        for name in names:
            (n,) = struct.unpack("<Q", raw[pos:pos + 8])
            pos += 8
            if pos + n > len(raw):
                raise ValueError(f"frame {name} runs past the end of the blob")
            reader = pa.ipc.open_stream(pa.BufferReader(pa.py_buffer(raw[pos:pos + n])))
            frames[name] = pl.from_arrow(reader.read_all(), rechunk=False)  # type: ignore[assignment]
            pos += n
    except (struct.error, ValueError, TypeError, OverflowError, MemoryError, pa.ArrowException,
            pl.exceptions.PolarsError) as e:
        raise StateError(f"{where}: state frames do not match the header; recapture the sketch") from e
    if pos != len(raw):
        raise StateError(f"{where}: state has {len(raw) - pos} bytes after its last frame; recapture the sketch")
    return frames


def check_frames(frames: dict[str, pl.DataFrame], expected: dict[str, pl.DataFrame],
                 where: str) -> dict[str, pl.DataFrame]:
    """``frames`` checked against the frames of an operator's empty state: same names, columns and (castable) types.

    Frames the operator keeps without a fixed schema (no columns when empty) are passed through; extra frames too.

    Raises:
        StateError: A frame is missing, has other columns, or values that do not fit the expected types.
    """
    out = dict(frames)
    for name, empty in expected.items():
        if name not in frames:
            raise StateError(f"{where}: saved state lacks the frame {name!r}; recapture the sketch")
        if empty.width == 0:
            continue
        got = frames[name]
        if got.columns != empty.columns:
            raise StateError(f"{where}: saved frame {name!r} has columns {got.columns}, expected {empty.columns}; "
                             f"recapture the sketch")
        if got.schema != empty.schema:
            try:
                out[name] = got.cast(dict(empty.schema), strict=True)
            except (pl.exceptions.PolarsError, TypeError, ValueError) as e:
                raise StateError(f"{where}: saved frame {name!r} has values of the wrong type; recapture the "
                                 f"sketch") from e
    return out

"""The binary format of operator state: versioned, self-describing, checksummed, no pickle.

A blob is ``b"IMPS" | u16 format version | u32 header length | header (JSON) | frames``, each frame a polars
DataFrame as an Arrow IPC stream with a u64 length prefix. The header names the operator kind and id, the frames,
the plan fingerprint, operator metadata and the SHA-256 of the frames. Operator ids (``<kind>@<node path>``) and frame
names are part of the format.

Format version 2 adds **detached frames**: a large frame an operator keeps unchanged across versions (a
:class:`Chunk`, the top-k's compacted rest) can be stored once, outside the blob, and named in the header by the
SHA-256 of its Arrow IPC stream (header key ``"external": {name: digest}``, kept as stored). The header is covered
by the blob's sealed checksum, so a chunk fetched by its digest is as trustworthy as the blob. A blob without
detached frames is written as version 1, which earlier imp versions read.

Format version 3 adds **parts**: when the catalog saves state it hands the codec a sink, and a frame of at least
:data:`PART_FROM` bytes in memory is written to it as consecutive row slices of about :data:`PART_BYTES`, each its own
Arrow IPC stream named by its SHA-256 (``"parts": {name: [digest, ...]}`` in the header). A slice is encoded, stored
and dropped before the next one, so saving a large state never holds a second, encoded copy of it; loading fetches,
verifies and decodes one part at a time (:class:`Parts`): an operator that takes a frame slice by slice
(``StatefulOperator.streamed_frames``) copies each decoded slice into its own state and drops it before the next is
fetched, so a load never holds a whole decoded copy of that frame; any other operator gets the slices as one frame's
chunks (no concatenating copy). The header also records each part's rows (``"part_rows"``), so the state can be
allocated once. See docs/ARCHITECTURE.md, "State and versions".
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import struct
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Union

import polars as pl
import pyarrow as pa

from imp_core.errors import StateError

_WRITE_OPTIONS = pa.ipc.IpcWriteOptions(compression="zstd")
MAGIC = b"IMPS"
FORMAT = "imp-arrow-ipc"
FORMAT_VERSION = 1  # blobs whose frames are all inline
DETACHED_VERSION = 2  # blobs naming detached frames (chunks) by digest
PARTS_VERSION = 3  # blobs naming frames stored as parts
DETACH_FROM = 8 << 20  # a chunk frame of at least this many bytes in memory is stored outside the blob
PART_FROM = 32 << 20  # with a sink, a frame of at least this many bytes in memory is written as parts
PART_BYTES = 16 << 20  # about this many bytes in memory per part

Fetch = Callable[[str], bytes]  # a chunk's stored bytes by digest (the catalog's); raises StateError when gone
Sink = Callable[[str, bytes], None]  # stores one part's bytes under their SHA-256 (in the committing transaction)


class Chunk:
    """A frame that may be stored outside its operator's blob, named by the SHA-256 of its Arrow IPC encoding, so
    a version that keeps it unchanged references the stored copy instead of writing it again.

    Built from a frame (:meth:`of`: encoded on first need, once) or from a stored digest (:meth:`stored`: fetched,
    verified and decoded on first use of :meth:`frame`, so an operator that does not touch it never reads it). An
    operator holds on to its chunk for as long as the frame is unchanged; that is what makes the encoding and the
    write happen once.
    """

    def __init__(self, frame: pl.DataFrame | None, digest: str | None = None, fetch: Fetch | None = None,
                 where: str = "operator state") -> None:
        self._frame = frame
        self._digest = digest
        self._data: bytes | None = None
        self._fetch = fetch
        self._where = where
        self._check: Callable[[pl.DataFrame], pl.DataFrame] | None = None

    @classmethod
    def of(cls, frame: pl.DataFrame) -> Chunk:
        return cls(frame)

    @classmethod
    def stored(cls, digest: str, fetch: Fetch | None, where: str) -> Chunk:
        return cls(None, digest, fetch, where)

    @property
    def loaded(self) -> bool:
        return self._frame is not None

    def checked(self, check: Callable[[pl.DataFrame], pl.DataFrame]) -> Chunk:
        """This chunk with ``check`` (which raises ``StateError`` on a frame of the wrong shape) applied to its frame,
        now if it is loaded, else when it is."""
        if self._frame is not None:
            self._frame = check(self._frame)
        else:
            self._check = check
        return self

    def frame(self) -> pl.DataFrame:
        if self._frame is None:
            if self._fetch is None or self._digest is None:
                raise StateError(f"{self._where}: state refers to a stored frame, and it was loaded without the "
                                 f"catalog; load it through the catalog or recapture the sketch")
            data = self._fetch(self._digest)
            if hashlib.sha256(data).hexdigest() != self._digest:
                raise StateError(f"{self._where}: stored state frame {self._digest[:12]} is corrupt (checksum "
                                 f"mismatch); recapture the sketch")
            frame = _read_frame(memoryview(data), self._where)
            self._frame = self._check(frame) if self._check is not None else frame
            self._data = data
        return self._frame

    def data(self) -> bytes:
        """The frame's Arrow IPC stream (what is stored and hashed): a stored chunk's own bytes (fetched if not yet),
        else the frame encoded once."""
        if self._data is None:
            if self._frame is None:
                self.frame()  # fetches and keeps the stored bytes
            else:
                self._data = _frame_bytes(self._frame)
        assert self._data is not None
        return self._data

    @property
    def digest(self) -> str:
        if self._digest is None:
            self._digest = hashlib.sha256(self.data()).hexdigest()
        return self._digest

    def size_bytes(self) -> int:
        """Memory held: the frame's estimated size when loaded, else its stored bytes (0 when not fetched)."""
        if self._frame is not None:
            return int(self._frame.estimated_size())
        return len(self._data) if self._data is not None else 0

    def detached(self, threshold: int | None) -> bool:
        """Whether this chunk is stored outside the blob: one that was (not loaded), or a frame of at least
        ``threshold`` bytes (None: never, every frame inline)."""
        if threshold is None:
            return False
        return self._frame is None or self._frame.estimated_size() >= threshold


Frame = Union[pl.DataFrame, Chunk]


class Rows:
    """A frame an operator hands over for saving as row slices made on demand (``take(start, length)``): a save that
    writes it as parts builds one slice at a time, never the whole frame; written inline it is built whole."""

    def __init__(self, height: int, take: Callable[[int, int], pl.DataFrame]) -> None:
        self.height = height
        self._take = take
        sample = take(0, min(height, 4096))
        self._row_bytes = sample.estimated_size() / max(1, sample.height)

    def estimated_size(self) -> int:
        return int(self.height * self._row_bytes)

    def slice(self, start: int, length: int) -> pl.DataFrame:
        return self._take(start, min(length, self.height - start))

    def frame(self) -> pl.DataFrame:
        return self._take(0, self.height)


class Parts:
    """A frame stored as parts, read lazily: :meth:`slices` fetches, verifies, decodes (and checks) one part at a
    time, so an operator that copies each slice into its own state holds one decoded part besides it."""

    def __init__(self, digests: list[str], fetch: Fetch | None, where: str, rows: list[int] | None = None) -> None:
        if fetch is None:
            raise StateError(f"{where}: state refers to stored frame parts, and it was loaded without the catalog; "
                             f"load it through the catalog or recapture the sketch")
        self.digests = digests
        self._fetch = fetch
        self._where = where
        self._rows = rows
        self._checks: list[Callable[[pl.DataFrame], pl.DataFrame]] = []

    @property
    def height(self) -> int | None:
        """The frame's rows as the header records them (None for a blob written before it did)."""
        return sum(self._rows) if self._rows is not None else None

    def checked(self, check: Callable[[pl.DataFrame], pl.DataFrame]) -> Parts:
        """These parts with ``check`` applied to every slice as it is decoded."""
        self._checks.append(check)
        return self

    def slices(self) -> Iterator[pl.DataFrame]:
        """The decoded slices in order; each part's bytes are dropped once decoded, a slice once the caller lets go.

        Raises:
            StateError: A part is gone, corrupt, or has other rows than the header records.
        """
        for i, digest in enumerate(self.digests):
            data = self._fetch(digest)
            if hashlib.sha256(data).hexdigest() != digest:
                raise StateError(f"{self._where}: stored state part {digest[:12]} is corrupt (checksum mismatch); "
                                 f"recapture the sketch")
            part = _read_frame(memoryview(data), self._where)
            del data
            if self._rows is not None and part.height != self._rows[i]:
                raise StateError(f"{self._where}: stored state part {digest[:12]} has {part.height} rows, its "
                                 f"header says {self._rows[i]}; recapture the sketch")
            for check in self._checks:
                part = check(part)
            yield part

    def frame(self) -> pl.DataFrame:
        """The whole frame, its slices kept as chunks (no concatenating copy)."""
        try:
            return pl.concat(list(self.slices()), how="vertical", rechunk=False)
        except pl.exceptions.PolarsError as e:
            raise StateError(f"{self._where}: the parts of a stored state frame do not fit together; recapture the "
                             f"sketch") from e


def slices(frame: pl.DataFrame | Parts) -> tuple[int, Iterator[pl.DataFrame]]:
    """A frame's rows and its slices in order: a :class:`Parts` read one part at a time, a frame as itself."""
    if isinstance(frame, Parts):
        if frame.height is not None:
            return frame.height, frame.slices()
        frame = frame.frame()
    return frame.height, iter([frame] if frame.height else [])


@dataclass(frozen=True)
class StatePayload:
    """Decoded state of one operator: the header fields that tie it to an operator of a plan (``kind``, ``op_id``,
    ``fingerprint``), the operator's JSON metadata and its named frames."""

    kind: str
    op_id: str
    fingerprint: str
    meta: dict[str, Any]
    frames: dict[str, Frame | Parts]


def encode(kind: str, op_id: str, fingerprint: str, meta: dict[str, Any], frames: Mapping[str, Frame | Rows]) -> bytes:
    """A self-contained blob: every frame inline, chunks too."""
    return encode_parts(kind, op_id, fingerprint, meta, frames, detach_from=None)[0]


def encode_parts(kind: str, op_id: str, fingerprint: str, meta: dict[str, Any], frames: Mapping[str, Frame | Rows],
                 *, detach_from: int | None, sink: Sink | None = None) -> tuple[bytes, dict[str, Chunk]]:
    """The blob and the chunks it names by digest: chunks of at least ``detach_from`` bytes, or never loaded.

    With a ``sink``, frames of at least :data:`PART_FROM` bytes go to it as parts (format version 3) instead of into
    the blob; the blob names them in order.
    """
    body = io.BytesIO()
    names = []
    detached: dict[str, str] = {}
    chunks: dict[str, Chunk] = {}
    parts: dict[str, list[str]] = {}
    part_rows: dict[str, list[int]] = {}
    for name, df in frames.items():
        if isinstance(df, Chunk) and df.detached(detach_from):
            detached[name] = df.digest
            chunks[df.digest] = df
            continue
        if sink is not None and isinstance(df, (pl.DataFrame, Rows)) and df.height and df.estimated_size() >= PART_FROM:
            parts[name], part_rows[name] = _write_parts(df, sink)
            continue
        if isinstance(df, Rows):
            df = df.frame()
        data = df.data() if isinstance(df, Chunk) else _frame_bytes(df)
        body.write(struct.pack("<Q", len(data)))
        body.write(data)
        names.append(name)
    raw = body.getvalue()
    fields: dict[str, Any] = {"format": FORMAT, "kind": kind, "op_id": op_id, "fingerprint": fingerprint,
                              "frames": names, "meta": meta, "sha256": hashlib.sha256(raw).hexdigest()}
    if detached:
        fields["external"] = detached
    if parts:
        fields["parts"] = parts
        fields["part_rows"] = part_rows
    header = json.dumps(fields, sort_keys=True, default=str).encode()
    version = PARTS_VERSION if parts else DETACHED_VERSION if detached else FORMAT_VERSION
    return MAGIC + struct.pack("<HI", version, len(header)) + header + raw, chunks


def format_version(blob: bytes) -> int:
    """The format version a blob of :func:`encode_parts` was written in."""
    return int(struct.unpack("<H", blob[4:6])[0])


def state_parts(blob: bytes) -> list[str]:
    """The digests of the parts a blob's header names, in order (none below format version 3)."""
    header, _ = _read_header(blob, "operator state")
    return [d for ds in header.get("parts", {}).values() for d in ds]


def _write_parts(df: pl.DataFrame | Rows, sink: Sink) -> tuple[list[str], list[int]]:
    """``df`` handed to ``sink`` as row slices of about :data:`PART_BYTES` each, encoded one at a time; their digests
    and rows.

    The slices are views of a frame, or made one at a time from :class:`Rows`; each one's bytes are dropped once the
    sink has them, so at most one part's encoding exists at a time."""
    rows = max(1, int(df.height * PART_BYTES / max(1, df.estimated_size())))
    digests, heights = [], []
    for start in range(0, df.height, rows):
        part = df.slice(start, rows)
        data = _frame_bytes(part)
        digest = hashlib.sha256(data).hexdigest()
        sink(digest, data)
        digests.append(digest)
        heights.append(part.height)
        del data, part
    return digests, heights


def _frame_bytes(df: pl.DataFrame) -> bytes:
    sink = io.BytesIO()
    table = df.to_arrow()
    # zstd inside the IPC stream (self-describing: readers need no option); counters and ids compress well
    with pa.ipc.new_stream(sink, table.schema, options=_WRITE_OPTIONS) as writer:
        writer.write_table(table)
    return sink.getvalue()


def decode(blob: bytes, *, kind: str | None = None, op_id: str | None = None,
           fingerprint: str | None = None, fetch: Fetch | None = None) -> StatePayload:
    """The payload of a blob, checked against its checksum and, when given, the operator it must belong to.

    Detached frames come back as :class:`Chunk` s fetched with ``fetch`` on first use (without it, using one is a
    ``StateError``); frames stored as parts as :class:`Parts`, read when the operator takes them over.
    """
    where = f"operator {op_id}" if op_id else "operator state"
    header, raw = _read_header(blob, where)
    if kind is not None and header.get("kind") != kind:
        raise StateError(f"{where}: state belongs to a {header.get('kind')} operator, expected {kind}; "
                         f"recapture the sketch")
    if op_id is not None and header.get("op_id") != op_id:
        raise StateError(f"{where}: state belongs to operator {header.get('op_id')}; recapture the sketch")
    if fingerprint is not None and header.get("fingerprint") != fingerprint:
        raise StateError(f"{where}: state was built for a different plan; recapture the sketch")
    frames: dict[str, Frame | Parts] = dict(_read_frames(header["frames"], raw, where))
    for name, digest in header.get("external", {}).items():
        frames[name] = Chunk.stored(digest, fetch, where)
    for name, digests in header.get("parts", {}).items():
        frames[name] = Parts(digests, fetch, where, header.get("part_rows", {}).get(name))
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
    if version not in (FORMAT_VERSION, DETACHED_VERSION, PARTS_VERSION):
        raise StateError(f"{where}: state format version {version} is not supported by this imp version "
                         f"(reads {FORMAT_VERSION} to {PARTS_VERSION}); recapture the sketch")
    try:
        header = json.loads(blob[10:10 + hlen].decode())
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise StateError(f"{where}: state header is corrupt; recapture the sketch") from e
    # a header that parses can still be damaged (a flipped bit turns the key "frames" into "grames")
    if not (isinstance(header, dict) and header.get("format") == FORMAT and isinstance(header.get("frames"), list)
            and all(isinstance(n, str) for n in header["frames"]) and isinstance(header.get("meta", {}), dict)
            and _valid_detached(header.get("external", {}), version, header["frames"])
            and _valid_parts(header.get("parts", {}), version, [*header["frames"], *header.get("external", {})])
            and _valid_part_rows(header.get("part_rows", {}), header.get("parts", {}))):
        raise StateError(f"{where}: state header is malformed; recapture the sketch")
    raw = memoryview(blob)[10 + hlen:]  # no copy of a state of many MB
    if hashlib.sha256(raw).hexdigest() != header.get("sha256"):
        raise StateError(f"{where}: state payload is corrupt (checksum mismatch); recapture the sketch")
    return header, raw


def _valid_detached(detached: Any, version: int, inline: list[str]) -> bool:
    """Whether a header's detached frames are well formed: a map of new frame names to SHA-256 digests, present
    in format version 2 (and possibly 3)."""
    if not isinstance(detached, dict) or (version == FORMAT_VERSION and detached) or (
            version == DETACHED_VERSION and not detached):
        return False
    return all(_is_digest(d) and n not in inline for n, d in detached.items())


def _valid_parts(parts: Any, version: int, others: list[str]) -> bool:
    """Whether a header's parts are well formed: a map of new frame names to non-empty lists of SHA-256 digests,
    present exactly in format version 3."""
    if not isinstance(parts, dict) or bool(parts) != (version == PARTS_VERSION):
        return False
    return all(isinstance(ds, list) and ds and all(_is_digest(d) for d in ds) and n not in others
               for n, ds in parts.items())


def _valid_part_rows(rows: Any, parts: dict[str, list[str]]) -> bool:
    """Whether a header's part rows (optional) give a count of rows to every part of a frame it names."""
    if not isinstance(rows, dict):
        return False
    return all(n in parts and isinstance(rs, list) and len(rs) == len(parts[n])
               and all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in rs) for n, rs in rows.items())


def _is_digest(d: Any) -> bool:
    return isinstance(d, str) and len(d) == 64 and all(c in "0123456789abcdef" for c in d)


def _ipc_frame(data: memoryview) -> pl.DataFrame:
    """One Arrow IPC stream as a frame, without copying its buffers."""
    reader = pa.ipc.open_stream(pa.BufferReader(pa.py_buffer(data)))
    return pl.from_arrow(reader.read_all(), rechunk=False)  # type: ignore[return-value]


def _read_frame(data: memoryview, where: str) -> pl.DataFrame:
    try:
        return _ipc_frame(data)
    except (ValueError, TypeError, OverflowError, MemoryError, pa.ArrowException, pl.exceptions.PolarsError) as e:
        raise StateError(f"{where}: a stored state frame does not decode; recapture the sketch") from e



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
            frames[name] = _ipc_frame(raw[pos:pos + n])
            pos += n
    except (struct.error, ValueError, TypeError, OverflowError, MemoryError, pa.ArrowException,
            pl.exceptions.PolarsError) as e:
        raise StateError(f"{where}: state frames do not match the header; recapture the sketch") from e
    if pos != len(raw):
        raise StateError(f"{where}: state has {len(raw) - pos} bytes after its last frame; recapture the sketch")
    return frames


def check_frames(frames: Mapping[str, Frame | Parts], expected: Mapping[str, Frame],
                 where: str) -> dict[str, Frame | Parts]:
    """``frames`` checked against the frames of an operator's empty state: same names, columns and (castable) types.

    Frames the operator keeps without a fixed schema (no columns when empty) are passed through; extra frames too.
    A chunk not loaded yet is checked when it is, parts as each is read.

    Raises:
        StateError: A frame is missing, has other columns, or values that do not fit the expected types.
    """
    out = dict(frames)
    for name, empty in expected.items():
        if name not in frames:
            raise StateError(f"{where}: saved state lacks the frame {name!r}; recapture the sketch")
        shape = empty.frame() if isinstance(empty, Chunk) else empty
        if shape.width == 0:
            continue
        got = frames[name]
        if isinstance(got, (Chunk, Parts)):
            out[name] = got.checked(functools.partial(conform, shape=shape, name=name, where=where))
        else:
            out[name] = conform(got, shape, name, where)
    return out


def conform(got: pl.DataFrame, shape: pl.DataFrame, name: str, where: str) -> pl.DataFrame:
    """Saved frame ``name`` with the columns and types of ``shape``.

    Raises:
        StateError: Other columns, or values that do not fit the types.
    """
    if got.columns != shape.columns:
        raise StateError(f"{where}: saved frame {name!r} has columns {got.columns}, expected {shape.columns}; "
                         f"recapture the sketch")
    if got.schema == shape.schema:
        return got
    try:
        return got.cast(shape.schema, strict=True)
    except (pl.exceptions.PolarsError, TypeError, ValueError) as e:
        raise StateError(f"{where}: saved frame {name!r} has values of the wrong type; recapture the sketch") from e

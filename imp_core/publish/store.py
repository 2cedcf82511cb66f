"""Where manifests live and how they are written: one immutable JSON file per sketch version, ``s<sketch id>-v<version>
.json``, flat in the publish location so one listing finds the newest of every sketch.

The location is ``IMP_PUBLISH_LOCATION``, else ``_imp_sketches`` beside the sketch's first table (where the extension
looks when no location is configured). A local file is written to a temporary name and renamed; on ``s3://`` a file
is one PUT, with the tables' credentials (:mod:`imp_core.sources.storage`). Only the maintaining identity writes here;
readers need read access only (docs/SECURITY.md).
"""

from __future__ import annotations

import os
import posixpath
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pyarrow import fs as pafs

from imp_core.errors import ConfigError
from imp_core.sources import storage

DEFAULT_DIR = "_imp_sketches"
APPLICATIONS_DIR = "_applications"
_NAME = re.compile(r"^s(\d+)-v(\d+)\.json$")


def file_name(sketch_id: int, version: int) -> str:
    return f"s{sketch_id:08d}-v{version:010d}.json"


def parse_name(name: str) -> tuple[int, int] | None:
    """(sketch id, version) of a manifest's file name, None for any other file."""
    m = _NAME.match(name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def location_for(configured: str | None, table_paths: Iterable[str]) -> str:
    """The publish location: ``configured``, else ``_imp_sketches`` beside the first table (by name order of the
    caller's paths)."""
    if configured:
        return configured.rstrip("/")
    first = next(iter(table_paths), None)
    if first is None:
        raise ConfigError("a sketch without tables has no publish location; set IMP_PUBLISH_LOCATION")
    return posixpath.join(posixpath.dirname(first.rstrip("/")), DEFAULT_DIR)


def _local(uri: str) -> Path:
    return Path(uri[len("file://"):] if uri.startswith("file://") else uri[len("file:"):]
                if uri.startswith("file:") else uri)


def _s3() -> Any:
    c = storage.s3_config()
    return pafs.S3FileSystem(access_key=c.access_key_id, secret_key=c.secret_access_key, session_token=c.session_token,
                           region=c.region or "us-east-1",
                           endpoint_override=(c.endpoint.split("://", 1)[-1] if c.endpoint else None),
                           scheme="http" if c.plain_http else "https",
                           force_virtual_addressing=not c.path_style if c.path_style is not None else False)


def _s3_key(uri: str) -> str:
    return uri.split("://", 1)[1]


def write(location: str, name: str, data: bytes) -> str:
    """Write ``data`` as ``location/name`` atomically; returns the file's URI."""
    if storage.is_s3(location):
        target = f"{_s3_key(location)}/{name}"
        with _s3().open_output_stream(target) as out:  # a small object: one PUT
            out.write(data)
        return f"{location}/{name}"
    folder = _local(location)
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=folder)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, folder / name)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return str(folder / name)


def read(location: str, name: str) -> bytes:
    if storage.is_s3(location):
        with _s3().open_input_stream(f"{_s3_key(location)}/{name}") as f:
            return bytes(f.read())
    return (_local(location) / name).read_bytes()


def names(location: str, folder: str | None = None) -> list[str]:
    """The file names at ``location`` (or its subfolder ``folder``); none when it does not exist."""
    if storage.is_s3(location):
        base = _s3_key(location) + (f"/{folder}" if folder else "")
        infos = _s3().get_file_info(pafs.FileSelector(base, allow_not_found=True))
        return sorted(posixpath.basename(i.path) for i in infos if i.type == pafs.FileType.File)
    path = _local(location) / folder if folder else _local(location)
    return sorted(p.name for p in path.iterdir() if p.is_file()) if path.is_dir() else []


def delete(location: str, files: Iterable[str]) -> None:
    files = list(files)
    if not files:
        return
    if storage.is_s3(location):
        s3 = _s3()
        for name in files:
            s3.delete_file(f"{_s3_key(location)}/{name}")
        return
    for name in files:
        (_local(location) / name).unlink(missing_ok=True)


__all__ = ["APPLICATIONS_DIR", "DEFAULT_DIR", "delete", "file_name", "location_for", "names", "parse_name", "read",
           "write"]

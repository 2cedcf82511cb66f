"""New versions of a Delta table from its ``_delta_log`` alone, as cheaply as they can be found (no Spark, no
delta-rs snapshot): what the commit trigger (:mod:`imp_core.airflow.triggers`) runs in the triggerer, in a thread.

A Delta commit is the atomic creation of ``_delta_log/<version, 20 digits>.json``. So, after the last version seen:

* local tables: one ``stat`` of the next version's file (then of the one after it, while they exist);
* ``s3://`` tables: one ``ListObjectsV2`` of the log folder starting after the last version's file (keys come in
  order; checkpoints and checksums of older versions sort before it), not descending into ``_sidecars/``.

Each commit comes with the file's modification time (S3: ``LastModified``), the time the version was committed. A
log that is gone (the table was dropped) is reported as None. When versions were cleaned from the log while nobody
watched (``delta.logRetentionDuration``), the remaining ones are reported from the first that exists.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import boto3
from botocore.config import Config

from imp_core.errors import SourceError
from imp_core.sources import storage

LOG_DIR = "_delta_log"
_COMMIT = re.compile(r"(\d{20})\.json")


@dataclass(frozen=True)
class Commit:
    """One committed version of a table and when it was committed (seconds since the epoch)."""

    version: int
    committed_at: float


def commit_file(version: int) -> str:
    return f"{version:020d}.json"


class DeltaLog:
    """The ``_delta_log`` of one table (local or ``s3://``); every method is blocking I/O."""

    def __init__(self, location: str, client: Any = None) -> None:
        """``client``: a boto3 S3 client for ``s3://`` tables (built from the S3 settings in force when None)."""
        self.location = location.rstrip("/")
        self._s3 = storage.is_s3(location)
        self._client = client
        if self._s3:
            parts = urlsplit(storage.delta_rs_uri(self.location))
            self._bucket, self._prefix = parts.netloc, f"{parts.path.strip('/')}/{LOG_DIR}/".lstrip("/")
        else:
            self._dir = os.path.join(self.location.removeprefix("file://"), LOG_DIR)

    def commits_after(self, version: int) -> list[Commit] | None:
        """The versions after ``version`` (-1: all), oldest first; None when the log does not exist.

        Raises:
            SourceError: The log could not be read (permissions, the object store refused): the watch retries.
        """
        try:
            return self._s3_commits(version) if self._s3 else self._local_commits(version)
        except OSError as e:
            raise SourceError(f"cannot read the Delta log of {storage.redact(self.location)}: {e}; check the "
                              f"table's location and its storage credentials") from e

    def latest(self) -> Commit | None:
        """The table's current version (a listing of the whole log: used once, when a watch starts)."""
        commits = self.commits_after(-1)
        return commits[-1] if commits else None

    # -- local ------------------------------------------------------------------------------------------------

    def _local_commits(self, version: int) -> list[Commit] | None:
        found = list(self._probe(version + 1))
        if found:
            return found
        try:
            names = os.listdir(self._dir) if version < 0 else None
        except FileNotFoundError:
            return None
        if names is None:
            if not os.path.isdir(self._dir):
                return None
            return self._after_cleanup(version)
        versions = sorted(int(m.group(1)) for n in names if (m := _COMMIT.fullmatch(n)))
        return [c for v in versions if (c := self._stat(v)) is not None]

    def _probe(self, start: int) -> Iterator[Commit]:
        """``start``, ``start + 1``, ... while their commit files exist (one ``stat`` each)."""
        v = start
        while (commit := self._stat(v)) is not None:
            yield commit
            v += 1

    def _stat(self, version: int) -> Commit | None:
        try:
            return Commit(version, os.stat(os.path.join(self._dir, commit_file(version))).st_mtime)
        except FileNotFoundError:
            return None

    def _after_cleanup(self, version: int) -> list[Commit]:
        """Versions after ``version`` when the next one's file is missing: none, unless the log was cleaned past it
        (then a checkpoint names a later version; the commits from the first remaining one on are returned)."""
        try:
            with open(os.path.join(self._dir, "_last_checkpoint")) as f:
                checkpoint = int(re.search(r'"version"\s*:\s*(\d+)', f.read()).group(1))  # type: ignore[union-attr]
        except (FileNotFoundError, AttributeError, ValueError):
            return []
        if checkpoint <= version + 1:
            return []
        names = os.listdir(self._dir)
        versions = sorted(v for n in names if (m := _COMMIT.fullmatch(n)) and (v := int(m.group(1))) > version)
        return [c for v in versions if (c := self._stat(v)) is not None]

    # -- s3 ---------------------------------------------------------------------------------------------------

    def _s3_commits(self, version: int) -> list[Commit] | None:
        client = self._client = self._client or s3_client()
        start = f"{self._prefix}{commit_file(version)}" if version >= 0 else ""
        commits: list[Commit] = []
        token: str | None = None
        while True:
            args: dict[str, Any] = {"Bucket": self._bucket, "Prefix": self._prefix, "Delimiter": "/"}
            args.update({"ContinuationToken": token} if token else {"StartAfter": start} if start else {})
            try:
                page = client.list_objects_v2(**args)
            except Exception as e:  # botocore's errors: one message naming the table
                if type(e).__name__ == "NoSuchBucket":
                    return None
                raise OSError(str(e)) from e
            for item in page.get("Contents") or ():
                m = _COMMIT.fullmatch(item["Key"][len(self._prefix):])
                if m:
                    commits.append(Commit(int(m.group(1)), item["LastModified"].timestamp()))
            if not page.get("IsTruncated"):
                break
            token = page["NextContinuationToken"]
        if not commits and version >= 0 and not self._s3_exists():
            return None
        return commits

    def _s3_exists(self) -> bool:
        """Whether the log folder still has any object (one request of one key)."""
        assert self._client is not None
        page = self._client.list_objects_v2(Bucket=self._bucket, Prefix=self._prefix, MaxKeys=1)
        return bool(page.get("KeyCount"))


def s3_client() -> Any:
    """A boto3 S3 client from the S3 settings in force (``imp_storage`` connection, ``IMP_S3_*``, ``AWS_*``)."""
    config = storage.s3_config()
    style = {"addressing_style": "path" if config.path_style else "virtual"} if config.path_style is not None else {}
    return boto3.client("s3", endpoint_url=config.endpoint, region_name=config.region or "us-east-1",
                        aws_access_key_id=config.access_key_id, aws_secret_access_key=config.secret_access_key,
                        aws_session_token=config.session_token,
                        config=Config(s3=style, retries={"max_attempts": 2}, connect_timeout=10, read_timeout=20))


__all__ = ["Commit", "DeltaLog", "LOG_DIR", "commit_file", "s3_client"]

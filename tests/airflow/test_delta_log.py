"""New Delta versions from the log alone, on real tables written by delta-rs: local (one stat per poll) and on the
S3 server the suite starts (one listing from the last version), a log cleaned past the last version seen, and a
dropped table; and the commit trigger's events from them, run in process (no Airflow)."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import write_deltalake

from imp_core.airflow.assets import table_uri
from imp_core.airflow.delta_log import DeltaLog, commit_file
from imp_core.airflow.triggers import MAX_EVENTS_PER_POLL, DeltaCommitTrigger


def _commit(where: str, i: int, options: dict[str, str] | None = None) -> None:
    write_deltalake(where, pa.table({"id": [i]}), mode="append", storage_options=options)


def test_local_log_reports_each_new_version_with_its_commit_time(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    _commit(path, 0)
    log = DeltaLog(path)
    assert [c.version for c in log.commits_after(-1)] == [0] and log.latest().version == 0
    assert log.commits_after(0) == []
    before = time.time()
    for i in range(1, 4):
        _commit(path, i)
    found = log.commits_after(0)
    assert [c.version for c in found] == [1, 2, 3]
    assert all(before - 2 <= c.committed_at <= time.time() + 1 for c in found)
    assert [c.version for c in log.commits_after(2)] == [3]

    # versions cleaned from the log while nobody watched: the remaining ones, from a later checkpoint
    for v in (1, 2):
        (tmp_path / "t" / "_delta_log" / commit_file(v)).unlink()
    (tmp_path / "t" / "_delta_log" / "_last_checkpoint").write_text('{"version": 3, "size": 4}')
    assert [c.version for c in log.commits_after(0)] == [3]

    shutil.rmtree(tmp_path / "t")
    assert log.commits_after(3) is None and log.commits_after(-1) is None


def test_s3_log_is_listed_from_the_last_version(s3_server: str) -> None:
    import boto3

    from tests.conftest import s3_write_options

    options = s3_write_options()
    where = "s3://lake/watch/t"
    _commit(where, 0, options)
    log = DeltaLog(where)
    assert [c.version for c in log.commits_after(-1)] == [0]
    for i in range(1, 3):
        _commit(where, i, options)
    assert [c.version for c in log.commits_after(0)] == [1, 2]
    assert log.commits_after(2) == []
    client = log._client
    calls: list[dict[str, Any]] = []
    client.meta.events.register("provide-client-params.s3.ListObjectsV2", lambda params, **_: calls.append(params))
    log.commits_after(1)
    assert calls[0]["StartAfter"].endswith(f"_delta_log/{commit_file(1)}") and calls[0]["Delimiter"] == "/"

    s3 = boto3.resource("s3", endpoint_url=s3_server, region_name="us-east-1",
                        aws_access_key_id=options["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=options["AWS_SECRET_ACCESS_KEY"])
    s3.Bucket("lake").objects.filter(Prefix="watch/t/").delete()
    assert log.commits_after(2) is None


def _events(trigger: DeltaCommitTrigger, write: Any, count: int, timeout: float = 20) -> list[dict[str, Any]]:
    async def main() -> list[dict[str, Any]]:
        gen = trigger.run()
        first = asyncio.create_task(gen.__anext__())
        await asyncio.sleep(0.5)  # the watch starts at the current version
        write()
        out = [(await asyncio.wait_for(first, timeout)).payload]
        while len(out) < count:
            out.append((await asyncio.wait_for(gen.__anext__(), timeout)).payload)
        await gen.aclose()
        return out

    return asyncio.run(main())


def test_the_trigger_fires_one_chained_event_per_version_and_a_backlog_as_one(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    _commit(path, 0)
    trigger = DeltaCommitTrigger(table_uri(path), ["t", "t_alias"], poll_seconds=0.2)
    assert trigger.serialize() == ("imp_core.airflow.triggers.DeltaCommitTrigger",
                                   {"table_uri": table_uri(path), "tables": ["t", "t_alias"], "poll_seconds": 0.2})

    def three() -> None:
        for i in range(1, 4):
            _commit(path, i)

    got = _events(trigger, three, 3)
    assert [(e["previous_version"], e["version"]) for e in got] == [(0, 1), (1, 2), (2, 3)]
    assert all(e["tables"] == ["t", "t_alias"] and e["table_uri"] == table_uri(path) for e in got)
    assert all(abs(time.time() - e["committed_at"]) < 60 for e in got)

    # a backlog too large for one poll (a long pause) is one event for the range
    for i in range(MAX_EVENTS_PER_POLL + 1):
        _commit(path, 10 + i)
    backlog = trigger.events(DeltaLog(path).commits_after(3), 3)
    assert [(e.payload["previous_version"], e.payload["version"]) for e in backlog] == [(3, MAX_EVENTS_PER_POLL + 4)]
    assert [e.payload["version"] for e in trigger.events(DeltaLog(path).commits_after(100), 100)] == [101, 102, 103,
                                                                                                     104]

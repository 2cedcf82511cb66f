"""The example queries of docs/CATALOG.md run on a real catalog holding a sketch whose state has parts."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa

from imp_core.catalog import Catalog, PartSink, SketchRecord, StateBlob

pytestmark = pytest.mark.postgres

DOC = Path(__file__).resolve().parents[2] / "docs" / "CATALOG.md"


def _queries() -> list[str]:
    block = re.search(r"```sql\n(.*?)```", DOC.read_text(), re.S)
    assert block, "docs/CATALOG.md has no sql block"
    text = "\n".join(line for line in block.group(1).splitlines() if not line.startswith("--"))
    return [q.strip() for q in text.split(";") if q.strip()]


def test_the_documented_queries_run_and_count_parts(catalog: Catalog, make_sketch: Callable[..., SketchRecord]) -> None:
    part = b"a slice of a large frame" * 100

    def write(sink: PartSink) -> list[StateBlob]:
        digest = hashlib.sha256(part).hexdigest()
        sink(digest, part)
        return [
            StateBlob("aggregation@0", "arrow-ipc", 3, b"header", chunks={digest: lambda: part}, parts_bytes=len(part))
        ]

    make_sketch(name="top", states=write)
    queries = _queries()
    assert len(queries) >= 6
    with catalog.engine.connect() as conn:
        results = [conn.execute(sa.text(q)).mappings().all() for q in queries]
    sizes = next(r for q, r in zip(queries, results) if "AS state_bytes" in q)
    stored = next(r for q, r in zip(queries, results) if "AS chunk_bytes" in q)
    assert [(r["name"], r["state_bytes"]) for r in sizes] == [("top", len(b"header") + len(part))]
    assert [(r["name"], r["blob_bytes"], r["chunk_bytes"]) for r in stored] == [("top", len(b"header"), len(part))]

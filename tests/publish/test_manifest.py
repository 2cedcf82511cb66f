"""Manifests without Spark or a catalog: their content from a committed version, the checksum, the typed bound
texts, file names and the atomic local write."""

from __future__ import annotations

import datetime as dt
import decimal
from pathlib import Path

import pyarrow as pa

from imp_core.catalog import SketchRecord, VersionRecord
from imp_core.publish import manifest, store
from imp_core.sketch.partition import Partition, PartitionSet

NOW = dt.datetime(2026, 12, 2, tzinfo=dt.timezone.utc)


def _record(signature: dict | None) -> SketchRecord:
    return SketchRecord(7, "top", "SELECT 1", "spark", "k", {}, None, {}, "lazy", NOW, signature=signature)


def _version() -> VersionRecord:
    return VersionRecord(7, 3, {"sales": 12}, {}, {"sales": [0, 2, 3]}, "incremental", None, 0, None, None, NOW,
                         table_identities={"sales": {"id": "abc", "path": "s3://lake/sales"}})


def _partitions() -> PartitionSet:
    return PartitionSet((Partition("sales", "price", (0, 10, 20, 30, 40), "int", pa.int32()),))


def test_a_manifest_holds_ranges_identities_and_its_checksum() -> None:
    body = manifest.body(_record({"hash": "h", "tree": None, "slots": []}), _version(), _partitions())
    assert body["usable"] and body["tables"] == [{"name": "sales", "id": "abc", "path": "s3a://lake/sales",
                                                  "version": 12}]
    part = body["partitions"][0]
    assert part["type"] == "int" and part["table_id"] == "abc" and (part["fragments_kept"], part["fragments_total"]) \
        == (3, 4)
    assert part["ranges"] == [{"lo": None, "hi": "10", "nulls": True}, {"lo": "20", "hi": None, "nulls": False}]
    data = manifest.encode(body)
    assert manifest.decode(data) == body
    assert manifest.decode(data.replace(b"abc", b"abd")) is None  # damaged: the checksum no longer holds


def test_a_sketch_without_signature_is_published_unusable() -> None:
    body = manifest.body(_record(None), _version(), _partitions())
    assert not body["usable"] and "imp sketch publish top" in body["unusable_reason"]


def test_bounds_are_written_as_the_texts_spark_casts_back_exactly() -> None:
    assert manifest.bound_text(decimal.Decimal("1E+3")) == "1000"
    assert manifest.bound_text(float("nan")) == "NaN" and manifest.bound_text(float("-inf")) == "-Infinity"
    assert manifest.bound_text(dt.datetime(2020, 1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=1)))) == \
        "2020-01-01 00:00:00"
    assert manifest.bound_text(dt.date(2020, 2, 29)) == "2020-02-29"


def test_files_are_named_by_sketch_id_and_version_and_written_whole(tmp_path: Path) -> None:
    name = store.file_name(7, 3)
    assert store.parse_name(name) == (7, 3) and store.parse_name("notes.txt") is None
    store.write(str(tmp_path), name, b"x")
    store.write(str(tmp_path), name, b"y")
    assert store.names(str(tmp_path)) == [name] and store.read(str(tmp_path), name) == b"y"
    assert store.location_for(None, ["file:/lake/sales"]) == "file:/lake/_imp_sketches"
    assert store.location_for("s3://b/m/", ["file:/lake/sales"]) == "s3://b/m"

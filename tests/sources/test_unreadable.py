"""Every reader meets a table it cannot read, and each ends in one line with its exit code (never an internal error):
a table feature imp cannot read (at registration and appearing later), a data file removed outside Delta (read by
Spark from its Parquet files, through Delta's connector, and in this process), and a change file removed outside
Delta (the log fast path and delta-rs, and Spark's change feed). The commands run as a user runs them, through the
CLI's entry point, against the test session's catalog and Spark."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from imp_core.cli.main import main
from imp_core.errors import SourceError
from imp_core.sources import reader

pytestmark = [pytest.mark.spark, pytest.mark.postgres]

SQL = "SELECT g, SUM(price) AS s FROM {t} GROUP BY g HAVING SUM(price) > 100"
CDF = {"delta.enableChangeDataFeed": "true"}
MISSING_FILE = "a data file of a table is missing"


@pytest.fixture
def imp(service, monkeypatch, capsys) -> Callable[..., tuple[int, str]]:  # noqa: ANN001
    """``imp ARGS`` in this process: its exit code and its one error line (asserted to be the only one)."""
    monkeypatch.setenv("IMP_HOME", str(service.settings.home))
    monkeypatch.delenv("IMP_CATALOG_URL", raising=False)

    def run(*argv: str) -> tuple[int, str]:
        capsys.readouterr()
        code = main(list(argv))
        lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("imp:")]
        assert len(lines) <= 1, lines
        assert not any("internal error" in ln for ln in lines), lines
        return code, lines[0] if lines else ""

    return run


def rows(start: int, n: int) -> pa.Table:
    return pa.table({"id": pa.array(range(start, start + n), pa.int64()),
                     "g": pa.array([i % 3 for i in range(start, start + n)], pa.int64()),
                     "price": pa.array([(i % 10) * 40 for i in range(start, start + n)], pa.int64())})


def plain_table(path: Path, commits: int = 3) -> None:
    for i in range(commits):
        write_deltalake(str(path), rows(i * 10, 10), mode="append", configuration=CDF if i == 0 else None)


def upgrade(path: Path, feature: str) -> None:
    """A commit that adds ``feature`` to the table's protocol (as a newer writer would)."""
    version = DeltaTable(str(path)).version() + 1
    protocol = {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": [feature],
                "writerFeatures": [feature, "changeDataFeed"]}
    (path / "_delta_log" / f"{version:020d}.json").write_text(
        json.dumps({"commitInfo": {"timestamp": 1, "operation": "UPGRADE PROTOCOL"}}) + "\n"
        + json.dumps({"protocol": protocol}) + "\n")


def remove_a_data_file(path: Path) -> None:
    files = DeltaTable(str(path)).file_uris()
    Path(files[0].replace("file://", "")).unlink()


def test_a_feature_imp_cannot_read_is_refused_by_register(imp, service, tmp_path: Path) -> None:  # noqa: ANN001
    for feature, name in (("variantShredding-preview", "unr_shred"), ("geospatial", "unr_geo")):
        path = tmp_path / name
        plain_table(path, 1)
        upgrade(path, feature)
        code, line = imp("table", "register", name, str(path))
        assert code == 3 and f"table {name} uses Delta" in line and feature in line, line
        assert "register a copy written without it" in line
        assert name not in {t.name for t in service.catalog.list_tables()}


def test_a_feature_that_appears_after_registration_stops_every_read(imp, tmp_path: Path) -> None:  # noqa: ANN001
    path, name = tmp_path / "unr_later", "unr_later"
    plain_table(path)
    assert imp("table", "register", name, str(path))[0] == 0
    assert imp("sketch", "create", name, "--sql", SQL.format(t=name), "--on", f"{name}.price",
               "--bounds", "0,100,200,400")[0] == 0
    write_deltalake(str(path), rows(100, 5), mode="append")
    upgrade(path, "variantShredding-preview")
    for argv in (("sketch", "maintain", name), ("sketch", "recapture", name), ("query", SQL.format(t=name)),
                 ("query", SQL.format(t=name), "--no-sketch")):
        code, line = imp(*argv)
        assert code == 3 and "reader feature(s) variantShredding-preview" in line, (argv, line)


def test_a_missing_data_file_read_by_spark_from_parquet_files(imp, service, tmp_path: Path) -> None:  # noqa: ANN001
    path, name = tmp_path / "unr_parquet", "unr_parquet"
    plain_table(path)
    assert imp("table", "register", name, str(path))[0] == 0
    assert imp("sketch", "create", name, "--sql", SQL.format(t=name), "--on", f"{name}.price",
               "--bounds", "0,100,200,400")[0] == 0
    source = service.source(name)
    assert reader.choice(source, source.current_version()).spark is reader.SparkRead.PARQUET
    before = service.history(name)
    remove_a_data_file(path)
    for argv in (("sketch", "recapture", name), ("query", SQL.format(t=name), "--no-sketch"),
                 ("sketch", "advise", "--sql", SQL.format(t=name))):
        code, line = imp(*argv)
        assert code == 4 and MISSING_FILE in line and str(path) in line, (argv, line)
    assert service.history(name) == before  # the catalog is as it was


def test_a_missing_data_file_read_through_the_connector(imp, service, spark, tmp_path: Path) -> None:  # noqa: ANN001
    path, name = tmp_path / "unr_dv", "unr_dv"
    spark.sql(f"CREATE TABLE delta.`{path}` (id BIGINT, g BIGINT, price BIGINT) USING delta TBLPROPERTIES "
              f"('delta.enableChangeDataFeed' = 'true', 'delta.enableDeletionVectors' = 'true')")
    for i in range(3):
        spark.sql(f"INSERT INTO delta.`{path}` SELECT id, id % 3, (id % 10) * 40 FROM range({i * 10}, {i * 10 + 10})")
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id = 3")  # a deletion vector: Spark reads through the connector
    assert imp("table", "register", name, str(path))[0] == 0
    source = service.source(name)
    assert reader.choice(source, source.current_version()).spark is reader.SparkRead.CONNECTOR
    remove_a_data_file(path)
    for argv in (("sketch", "create", name, "--sql", SQL.format(t=name), "--on", f"{name}.price", "--fragments", "3"),
                 ("query", SQL.format(t=name), "--no-sketch")):
        code, line = imp(*argv)
        assert code == 4 and MISSING_FILE in line, (argv, line)


def test_a_missing_data_file_read_in_this_process(tmp_path: Path) -> None:
    from imp_core.sources.delta import DeltaSource

    path = tmp_path / "unr_local"
    plain_table(path)
    source = DeltaSource("unr_local", str(path))
    version = source.current_version()
    assert reader.choice(source, version).in_process
    assert sum(b.num_rows for b in reader.batches(source, version, ["price"])) == 30
    remove_a_data_file(path)
    with pytest.raises(SourceError, match="table unr_local: a data file of version 2 cannot be read .*FSCK") as info:
        list(reader.batches(source, version, ["price"]))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("mapped", [False, True], ids=["delta-rs", "spark"])
def test_a_missing_change_file(imp, service, spark, tmp_path: Path, mapped: bool) -> None:  # noqa: ANN001
    """The log fast path falls back to delta-rs, which cannot read the range either (column-mapped tables: Spark's
    change feed): maintenance recaptures, and with --no-recapture stops in one line."""
    name = f"unr_cdc_{'spark' if mapped else 'rs'}"
    path = tmp_path / name
    props = "'delta.enableChangeDataFeed' = 'true'" + (", 'delta.columnMapping.mode' = 'name'" if mapped else "")
    spark.sql(f"CREATE TABLE delta.`{path}` (id BIGINT, g BIGINT, price BIGINT) USING delta TBLPROPERTIES ({props})")
    spark.sql(f"INSERT INTO delta.`{path}` SELECT id, id % 3, (id % 10) * 40 FROM range(0, 30)")
    assert imp("table", "register", name, str(path))[0] == 0
    assert imp("sketch", "create", name, "--sql", SQL.format(t=name), "--on", f"{name}.price",
               "--bounds", "0,100,200,400")[0] == 0
    spark.sql(f"UPDATE delta.`{path}` SET price = price + 1 WHERE g = 1")  # writes change files
    changes = list(path.rglob("cdc-*.parquet"))  # under _change_data/, or random prefixes with column mapping
    assert changes
    for f in changes:
        f.unlink()
    before = service.history(name)
    code, line = imp("sketch", "maintain", name, "--no-recapture")
    assert code == 4 and "the change feed for versions 2..2 cannot be read" in line, line
    assert service.history(name) == before
    assert imp("sketch", "maintain", name)[0] == 0  # a recapture, recorded with its reason
    assert service.history(name)[-1]["method"] == "recapture"

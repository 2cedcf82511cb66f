"""The lakehouse matrix: Delta table features (alone and combined) x writers x storage x every command that touches
table files, generated rather than listed.

A *sequence* builds one table with one feature set, written by one writer (Delta Lake's Spark connector or delta-rs)
on one storage (a local path or the S3 server on 127.0.0.1), and runs the commands in order on it; each command on
it is a *cell*. Every cell checks what matters: ``imp query`` returns the same rows with the sketch as without it
(Spark is the truth), and a maintained sketch equals a recapture. A feature the platform cannot support is refused
by ``table register`` in one line naming it.

CI runs a covering subset (``covering()``: every pair of dimension values at least once, checked by
``test_the_subset_covers_every_pair``); the whole product runs as a command, and rewrites its section of
docs/DEPLOYMENT.md with the cell counts::

    .venv/bin/python -m tests.lakehouse_matrix --full          # every sequence (about 40 minutes)
    .venv/bin/python -m tests.lakehouse_matrix --only deletion_vectors
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from imp_core.maintenance.service import SketchService

WRITERS = ("delta-spark", "delta-rs")
STORAGES = ("local", "s3")
COMMANDS = ("table register", "sketch create --bounds", "sketch create --fragments", "sketch advise",
            "maintain lazy", "maintain eager", "recapture", "repartition --apply", "table layout --apply", "query",
            "sketch predicate", "nightly group job")
SHORT = ("table register", "sketch create --bounds", "maintain lazy", "query")

SQL_A = "SELECT g, SUM(price) AS rev FROM {t} GROUP BY g HAVING SUM(price) > 500"
BOUNDS_A = "0,100,200,300,400"
SQL_B = "SELECT g, COUNT(*) AS n FROM {t} WHERE price > 50 GROUP BY g HAVING COUNT(*) > 3"
CDF = {"delta.enableChangeDataFeed": "true"}


@dataclass(frozen=True)
class Feature:
    """A table feature set: how each writer creates it (``None``: that writer cannot), the schema change made after
    the sketches exist (``add`` a column, ``rename`` the unused column ``note``, ``widen`` the unused INT ``small``),
    and the reader features the table must then list when delta-spark wrote it."""

    name: str
    spark_props: dict[str, str] = field(default_factory=dict)
    rs_config: dict[str, str] | None = field(default_factory=dict)
    cluster_by: str | None = None
    ntz: bool = False  # a TIMESTAMP_NTZ column ``ts``, which sketch B partitions
    change: str | None = None
    checkpoints: bool = False  # a checkpoint every 2 commits (delta-rs: written after each commit)
    reader_features: frozenset[str] = frozenset()

    def writers(self) -> tuple[str, ...]:
        return WRITERS if self.rs_config is not None else WRITERS[:1]


_DV = {"delta.enableDeletionVectors": "true"}
_CM = {"delta.columnMapping.mode": "name"}
FEATURES = (
    Feature("plain"),
    Feature("deletion_vectors", _DV, _DV, reader_features=frozenset({"deletionVectors"})),
    Feature("column_mapping_name", _CM, _CM),
    Feature("column_mapping_id", {"delta.columnMapping.mode": "id"}, {"delta.columnMapping.mode": "id"}),
    Feature("deletion_vectors_and_column_mapping", {**_DV, **_CM}, None,
            reader_features=frozenset({"deletionVectors", "columnMapping"})),
    Feature("liquid_clustering", rs_config=None, cluster_by="price"),
    # a checkpoint every 2 commits: v2 checkpoints by delta-spark, classic ones by delta-rs
    Feature("checkpoints", {"delta.checkpointInterval": "2", "delta.checkpointPolicy": "v2"}, checkpoints=True,
            reader_features=frozenset({"v2Checkpoint"})),
    Feature("timestamp_ntz", ntz=True, reader_features=frozenset({"timestampNtz"})),
    Feature("type_widening", {"delta.enableTypeWidening": "true"}, None, change="widen"),
    Feature("row_tracking", {"delta.enableRowTracking": "true"}, None),
    Feature("added_column", change="add"),
    Feature("renamed_unused_column", {**_DV, **_CM}, None, change="rename",
            reader_features=frozenset({"deletionVectors", "columnMapping"})),
)


@dataclass(frozen=True)
class Sequence:
    feature: Feature
    writer: str
    storage: str
    commands: tuple[str, ...] = COMMANDS

    @property
    def id(self) -> str:
        size = "all" if self.commands == COMMANDS else "short"
        return f"{self.feature.name}-{self.writer}-{self.storage}-{size}"


def full_product() -> list[Sequence]:
    return [Sequence(f, w, s) for f in FEATURES for w in f.writers() for s in STORAGES]


def covering() -> list[Sequence]:
    """Every feature with every command once, alternating writers and storages, plus a short sequence that gives
    each feature its other writer and its other storage."""
    out = []
    for i, f in enumerate(FEATURES):
        writers = f.writers()
        writer, storage = writers[i % len(writers)], STORAGES[(i // 2) % 2]
        out.append(Sequence(f, writer, storage))
        out.append(Sequence(f, writers[(i + 1) % len(writers)], STORAGES[1 - (i // 2) % 2], SHORT))
    return out


def pairs(sequences: list[Sequence]) -> set[tuple[str, str]]:
    """The pairs of dimension values ``sequences`` cover (feature, writer, storage, command)."""
    out: set[tuple[str, str]] = set()
    for s in sequences:
        values = [f"feature={s.feature.name}", f"writer={s.writer}", f"storage={s.storage}"]
        for c in s.commands:
            row = [*values, f"command={c}"]
            out |= {(a, b) for i, a in enumerate(row) for b in row[i + 1:]}
    return out


# --- writers ---------------------------------------------------------------------------------------------------------

Row = tuple[Any, ...]
T0 = dt.datetime(2024, 1, 1)


def make_row(i: int, price: int | None = None, ntz: bool = False) -> Row:
    """Row ``i``; ``price`` puts it at that price plus ``i % 90`` (a skewed insert whose values still differ)."""
    row: Row = (i, i % 7, (i * 37) % 450 if price is None else price + i % 90, f"n{i % 3}", i % 100)
    return (*row, T0 + dt.timedelta(hours=i)) if ntz else row


class SparkWriter:
    """Writes through Delta Lake's Spark connector with SQL, as users of Spark do."""

    def __init__(self, spark: SparkSession, uri: str, feature: Feature) -> None:
        self.spark, self.feature = spark, feature
        self.target = f"delta.`{uri.replace('s3://', 's3a://', 1)}`"
        self.note = "note"

    def create(self, chunks: list[list[Row]]) -> None:
        cols = "id BIGINT, g BIGINT, price BIGINT, note STRING, small INT" + (", ts TIMESTAMP_NTZ"
                                                                              if self.feature.ntz else "")
        props = ", ".join(f"'{k}' = '{v}'" for k, v in {**CDF, **self.feature.spark_props}.items())
        cluster = f" CLUSTER BY ({self.feature.cluster_by})" if self.feature.cluster_by else ""
        self.spark.sql(f"CREATE TABLE {self.target} ({cols}) USING delta{cluster} TBLPROPERTIES ({props})")
        for rows in chunks:
            self.insert(rows)

    def _values(self, rows: list[Row]) -> str:
        def lit(v: Any) -> str:
            if isinstance(v, dt.datetime):
                return f"TIMESTAMP_NTZ'{v:%Y-%m-%d %H:%M:%S}'"
            return f"'{v}'" if isinstance(v, str) else str(v)

        return ", ".join("(" + ", ".join(lit(v) for v in r) + ")" for r in rows)

    def _columns(self) -> str:
        return "id, g, price, " + self.note + ", small" + (", ts" if self.feature.ntz else "")

    def insert(self, rows: list[Row]) -> None:
        self.spark.sql(f"INSERT INTO {self.target} ({self._columns()}) VALUES {self._values(rows)}")

    def delete(self, predicate: str) -> None:
        self.spark.sql(f"DELETE FROM {self.target} WHERE {predicate}")

    def update(self, assignment: str, predicate: str) -> None:
        self.spark.sql(f"UPDATE {self.target} SET {assignment} WHERE {predicate}")

    def merge(self, rows: list[Row]) -> None:
        names = self._columns()
        self.spark.sql(f"MERGE INTO {self.target} t USING (SELECT * FROM VALUES {self._values(rows)} AS s({names})) s "
                       f"ON t.id = s.id WHEN MATCHED AND s.id % 2 = 0 THEN DELETE "
                       f"WHEN MATCHED THEN UPDATE SET price = s.price WHEN NOT MATCHED THEN INSERT ({names}) VALUES "
                       f"({', '.join('s.' + c.strip() for c in names.split(','))})")

    def change_schema(self, kind: str) -> None:
        if kind == "add":
            self.spark.sql(f"ALTER TABLE {self.target} ADD COLUMNS (extra INT)")
        elif kind == "rename":
            self.spark.sql(f"ALTER TABLE {self.target} RENAME COLUMN note TO remark")
            self.note = "remark"
        elif kind == "widen":
            self.spark.sql(f"ALTER TABLE {self.target} ALTER COLUMN small TYPE BIGINT")


class RsWriter:
    """Writes with delta-rs (``write_deltalake`` and ``DeltaTable``'s DML), as Python pipelines do."""

    def __init__(self, uri: str, feature: Feature, options: dict[str, str] | None) -> None:
        self.uri, self.feature, self.options = uri, feature, options
        self.extra = False

    def _arrow(self, rows: list[Row]) -> pa.Table:
        cols = {"id": pa.int64(), "g": pa.int64(), "price": pa.int64(), "note": pa.string(), "small": pa.int32()}
        if self.feature.ntz:
            cols["ts"] = pa.timestamp("us")
        data = {c: pa.array([r[i] for r in rows], t) for i, (c, t) in enumerate(cols.items())}
        if self.extra:
            data["extra"] = pa.array([r[0] % 5 for r in rows], pa.int32())
        return pa.table(data)

    def _table(self) -> Any:
        from deltalake import DeltaTable

        return DeltaTable(self.uri, storage_options=self.options)

    def _after(self) -> None:
        if self.feature.checkpoints:
            self._table().create_checkpoint()

    def create(self, chunks: list[list[Row]]) -> None:
        from deltalake import write_deltalake

        write_deltalake(self.uri, self._arrow(chunks[0]), configuration={**CDF, **(self.feature.rs_config or {})},
                        storage_options=self.options)
        for rows in chunks[1:]:
            self.insert(rows)

    def insert(self, rows: list[Row]) -> None:
        from deltalake import write_deltalake

        write_deltalake(self.uri, self._arrow(rows), mode="append", storage_options=self.options,
                        schema_mode="merge" if self.extra else None)
        self._after()

    def delete(self, predicate: str) -> None:
        self._table().delete(predicate)
        self._after()

    def update(self, assignment: str, predicate: str) -> None:
        column, value = (x.strip() for x in assignment.split("=", 1))
        self._table().update(predicate=predicate, updates={column: value})
        self._after()

    def merge(self, rows: list[Row]) -> None:
        (self._table().merge(self._arrow(rows), predicate="t.id = s.id", source_alias="s", target_alias="t")
         .when_matched_delete(predicate="s.id % 2 = 0").when_matched_update(updates={"price": "s.price"})
         .when_not_matched_insert_all().execute())
        self._after()

    def change_schema(self, kind: str) -> None:
        assert kind == "add", f"delta-rs cannot {kind} a column"
        self.extra = True
        self.insert([make_row(900, ntz=self.feature.ntz)])


# --- running a sequence ----------------------------------------------------------------------------------------------


@dataclass
class Cell:
    sequence: str
    command: str
    ok: bool
    detail: str = ""
    seconds: float = 0.0


class Run:
    """One sequence on its own table and sketches."""

    def __init__(self, service: SketchService, spark: SparkSession, seq: Sequence, root: str) -> None:
        self.service, self.spark, self.seq = service, spark, seq
        f = seq.feature
        self.table = re.sub(r"[^a-z0-9_]", "_", f"mx_{f.name}_{seq.writer}_{seq.storage}")[:60]
        self.uri = f"{root.rstrip('/')}/{self.table}"
        if seq.writer == "delta-spark":
            self.writer: SparkWriter | RsWriter = SparkWriter(spark, self.uri, f)
        else:
            from tests.conftest import s3_write_options

            self.writer = RsWriter(self.uri, f, s3_write_options() if seq.storage == "s3" else None)
        self.a, self.b = f"{self.table}_a", f"{self.table}_b"
        self.next_id = 100

    def rows(self, n: int, price: int | None = None) -> list[Row]:
        out = [make_row(self.next_id + i, price, self.seq.feature.ntz) for i in range(n)]
        self.next_id += n
        return out

    # the oracles

    def same_answer(self, sketch: str) -> None:
        """``imp query`` with the sketch returns Spark's rows without it."""
        sql = (SQL_A if sketch == self.a else SQL_B).format(t=self.table)
        with_sketch, without = self.service.query(sql), self.service.query(sql, use_sketch=False)
        assert with_sketch.sketch is not None and with_sketch.sketch["name"] == sketch, with_sketch.notes
        assert sorted(map(tuple, with_sketch.rows)) == sorted(map(tuple, without.rows)), (with_sketch.rows,
                                                                                        without.rows)

    def maintained_equals_recapture(self, sketch: str, versions_before: int | None = None) -> None:
        catalog = self.service.catalog
        latest = catalog.latest_version(catalog.get_sketch(sketch).id)
        if versions_before is not None:
            assert latest.version > versions_before, "nothing was committed"
        assert latest.method in ("incremental", "repartition"), (latest.method, latest.reason)
        again = self.service.recapture(sketch, trigger="matrix-oracle")
        assert again.fragments == latest.fragments, (latest.fragments, again.fragments)
        self.same_answer(sketch)

    def version(self, sketch: str) -> int:
        catalog = self.service.catalog
        return catalog.latest_version(catalog.get_sketch(sketch).id).version

    # the commands

    def table_register(self) -> None:
        self.writer.create([[make_row(i, ntz=self.seq.feature.ntz) for i in range(j * 10, j * 10 + 10)]
                            for j in range(3)])
        self.service.register_table(self.table, self.uri)
        listed = set(self.service.source(self.table).protocol().reader_features or [])
        if self.seq.writer == "delta-spark":
            assert self.seq.feature.reader_features <= listed, listed

    def sketch_create_bounds(self) -> None:
        self.service.create_sketch(self.a, SQL_A.format(t=self.table), [f"{self.table}.price"], bounds=[BOUNDS_A],
                                   trigger="matrix")
        self.same_answer(self.a)

    def sketch_create_fragments(self) -> None:
        column = "ts" if self.seq.feature.ntz else "id"
        self.service.create_sketch(self.b, SQL_B.format(t=self.table), [f"{self.table}.{column}"], fragments=4,
                                   trigger="matrix")
        self.same_answer(self.b)

    def sketch_advise(self) -> None:
        advice = self.service.advise(SQL_A.format(t=self.table), self.table, fragments=8, max_columns=2)
        safe = {a.column for a in advice if a.safe}
        assert "price" in safe and "g" in safe, advice
        estimated = [a for a in advice if a.safe and a.fragments]
        assert estimated and all(a.rows > 0 and a.files > 0 for a in estimated), advice

    def schema_change(self) -> None:
        if self.seq.feature.change is not None:
            self.writer.change_schema(self.seq.feature.change)

    def maintain_lazy(self) -> None:
        self.schema_change()
        before = self.version(self.a)
        self.writer.delete("id % 5 = 0")
        self.writer.update("price = price + 120", "g = 3")
        result = self.service.maintain(self.a, strategy="lazy", trigger="matrix")
        assert result.recaptured is None, result.recaptured
        self.maintained_equals_recapture(self.a, before)

    def maintain_eager(self) -> None:
        before = self.version(self.a)
        self.writer.merge(self.rows(6, price=444) + [make_row(i, 333, self.seq.feature.ntz) for i in (11, 12, 13)])
        self.writer.insert(self.rows(5))
        result = self.service.maintain(self.a, strategy="eager", batch_size=1, trigger="matrix")
        assert result.recaptured is None and len(result.versions) >= 2, (result.recaptured, result.versions)
        self.maintained_equals_recapture(self.a, before)

    def recapture(self) -> None:
        self.writer.insert(self.rows(3))
        version = self.service.recapture(self.a, trigger="matrix")
        assert version.method == "recapture"
        self.same_answer(self.a)

    def repartition_apply(self) -> None:
        self.writer.insert(self.rows(60, price=100))  # one range gets most rows
        self.service.maintain(self.a, strategy="lazy", trigger="matrix")
        result = self.service.repartition(self.a, factor=2.0, apply=True, trigger="matrix")
        assert result.changed and result.version is not None and result.version.method == "repartition", result
        self.same_answer(self.a)
        self.writer.insert(self.rows(4, price=100))
        self.service.maintain(self.a, strategy="lazy", trigger="matrix")
        self.maintained_equals_recapture(self.a)

    def table_layout_apply(self) -> None:
        from imp_core.maintenance.layout import MIN_FILES

        source = self.service.source(self.table)
        while len(source.files(source.current_version())) < MIN_FILES:  # DML may have compacted the files
            self.writer.insert(self.rows(1))
        before = source.current_version()
        done = self.service.relayout(self.table, threshold=0.0)
        assert len(done) == 1 and not done[0].failed, [d.to_json() for d in done]
        if self.seq.feature.cluster_by:
            assert done[0].outcome.startswith("liquid-clustered"), done[0].outcome
        else:
            assert done[0].outcome == "re-clustered", done[0].outcome
            assert source.current_version() > before
        result = self.service.maintain(self.a, strategy="lazy", trigger="matrix")
        assert result.recaptured is None, result.recaptured
        self.same_answer(self.a)

    def query(self) -> None:
        self.writer.insert(self.rows(2))
        self.same_answer(self.a)  # maintains lazily first
        if self.b in {r.name for r in self.service.catalog.list_sketches()}:
            self.same_answer(self.b)

    def sketch_predicate(self) -> None:
        pred = self.service.sketch_predicate(self.a)
        uri = self.uri.replace("s3://", "s3a://", 1)
        inner = f"SELECT * FROM delta.`{uri}` VERSION AS OF {pred.table_version}"
        sql = "SELECT g, SUM(price) AS rev FROM ({}) t GROUP BY g HAVING SUM(price) > 500"
        mine = self.spark.sql(sql.format(f"{inner} WHERE {pred.predicate}")).collect()
        whole = self.spark.sql(sql.format(inner)).collect()
        assert sorted(map(tuple, mine)) == sorted(map(tuple, whole)), (mine, whole)

    def nightly_group_job(self) -> None:
        sketches = [s for s in (self.a, self.b) if s in {r.name for r in self.service.catalog.list_sketches()}]
        before = {s: self.version(s) for s in sketches}
        self.writer.insert(self.rows(4))
        self.writer.delete("id % 7 = 1")
        result = self.service.maintain_group(sketches, strategy="eager", trigger="matrix")
        assert not result.failed and not result.unusable, (result.failed, result.unusable)
        for s in sketches:
            assert result.results[s].recaptured is None, result.results[s].recaptured
            self.maintained_equals_recapture(s, before[s])


def run_sequence(service: SketchService, spark: SparkSession, seq: Sequence, root: str,
                 report: Callable[[Cell], None] = lambda c: None) -> list[Cell]:
    """Run ``seq``'s commands in order; a failed command fails the cells after it too (they need its work)."""
    run = Run(service, spark, seq, root)
    cells: list[Cell] = []
    failed = ""
    for command in seq.commands:
        start = time.monotonic()
        if failed:
            cell = Cell(seq.id, command, False, f"not run: {failed}")
        else:
            try:
                getattr(run, re.sub(r"\W+", "_", command.replace("--", "")).strip("_"))()
                cell = Cell(seq.id, command, True)
            except Exception as e:  # noqa: BLE001 - a cell records any failure, the run goes on
                detail = "".join(traceback.format_exception_only(type(e), e)).strip().splitlines()
                cell = Cell(seq.id, command, False, " ".join(detail)[:800])
                failed = f"{command} failed"
        cell.seconds = time.monotonic() - start
        cells.append(cell)
        report(cell)
    return cells


# --- the command -------------------------------------------------------------------------------------------------

DOC = Path(__file__).resolve().parents[1] / "docs" / "DEPLOYMENT.md"


def _summary(cells: list[Cell], seconds: float) -> str:
    by_feature: dict[str, list[Cell]] = {}
    for c in cells:
        by_feature.setdefault(c.sequence.split("-", 1)[0], []).append(c)
    lines = ["| feature | writers | sequences | cells passed |", "|---|---|---|---|"]
    for f in FEATURES:
        mine = by_feature.get(f.name, [])
        seqs = {c.sequence for c in mine}
        lines.append(f"| `{f.name}` | {', '.join(f.writers())} | {len(seqs)} | {sum(c.ok for c in mine)} / "
                     f"{len(mine)} |")
    total = sum(c.ok for c in cells)
    lines.append(f"\n{total} of {len(cells)} cells passed ({len({c.sequence for c in cells})} sequences, "
                 f"{seconds / 60:.0f} minutes; `python -m tests.lakehouse_matrix --full`, {dt.date.today()}).")
    return "\n".join(lines)


def _write_doc(text: str) -> None:
    begin, end = "<!-- matrix:full -->", "<!-- /matrix:full -->"
    doc = DOC.read_text()
    block = f"{begin}\n{text}\n{end}"
    doc = re.sub(re.escape(begin) + r".*?" + re.escape(end), lambda _: block, doc, flags=re.S) if begin in doc \
        else doc.rstrip("\n") + "\n\n" + block + "\n"
    DOC.write_text(doc)


@dataclass
class _Env:
    service: SketchService
    spark: SparkSession
    roots: dict[str, str]


@contextmanager
def _environment(folder: Path) -> Iterator[_Env]:
    from imp_core.catalog.embedded import stop_embedded
    from imp_core.config import Settings
    from imp_core.maintenance.service import SketchService
    from imp_core.spark.session import get_spark
    from tests.s3server import S3Server

    settings = Settings.from_env({}, home=folder / "home", spark_master="local[2]", shuffle_partitions=2)
    spark = get_spark(settings)
    service = SketchService(settings, spark=spark)
    with S3Server(folder):
        from imp_core.sources.storage import configure_spark

        configure_spark(spark)
        try:
            yield _Env(service, spark, {"local": str(folder / "lake"), "s3": "s3://lake/matrix"})
        finally:
            service.catalog.close()
            stop_embedded(settings)
            spark.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.lakehouse_matrix", description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="every sequence of the product (else the CI subset)")
    parser.add_argument("--only", action="append", default=[], help="only these features (repeatable)")
    args = parser.parse_args(argv)
    chosen = full_product() if args.full else covering()
    if args.only:
        chosen = [s for s in chosen if s.feature.name in args.only]
    start = time.monotonic()
    cells: list[Cell] = []
    with tempfile.TemporaryDirectory(prefix="imp-matrix-") as tmp:
        with _environment(Path(tmp)) as env:
            for i, seq in enumerate(chosen, 1):
                print(f"[{i}/{len(chosen)}] {seq.id}", flush=True)
                cells += run_sequence(env.service, env.spark, seq, env.roots[seq.storage],
                                      lambda c: print(f"    {'ok  ' if c.ok else 'FAIL'} {c.command} "
                                                      f"({c.seconds:.1f} s) {c.detail}", flush=True))
    summary = _summary(cells, time.monotonic() - start)
    print(summary)
    if args.full and not args.only:
        _write_doc(summary)
    return 0 if all(c.ok for c in cells) else 1


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["COMMANDS", "FEATURES", "Cell", "Sequence", "covering", "full_product", "pairs", "run_sequence"]

"""External operator state as one Delta table per operator beside the data, read and written by Spark (the JVM only).

The components of an operator's state (an aggregation's ``groups``, ``fcounts`` = ``F_g``, ``mm{j}`` value
multisets; a top-k per group's ``rows``: ``engine/external.py``) share one Delta table at ``<location>/state``: the
state keys, ``__c`` (the component), a component's other columns as ``<component>$<column>`` (NULL in the other
components' rows), ``__seq`` (the store version that wrote the row) and a hash-bucket column ``__bucket`` (the keys'
``xxhash64`` modulo the bucket count) the table is partitioned by. A batch costs one read and one append, whatever
the number of components:

* **fetch**: the batch's keys' buckets are computed in the driver (Spark's ``xxhash64``, ``spark/xxhash.py``; one
  small Spark job for a key type it does not cover), and the rows of those keys are read in one job at the pinned
  version (Delta's cached latest snapshot when that is the pinned one), matched by the keys as literals (one key
  column, at most :data:`LITERAL_KEYS`) or a broadcast semi join, pruned to the buckets and, by
  the files' key statistics, to the ranges the batch's sort key (the first integer or date key) falls in: a whole
  write sorts each bucket by that key into files of at most :data:`FILE_ROWS` rows, so a batch whose keys lie close
  to each other (new orders, recent dates) reads a few files whatever the table's size. The ranges filter only a
  batch whose ranges cover at most :data:`SELECTIVE` of the table's span of that key (kept in the reference): a
  filter that keeps most rows costs more per row than the files it skips (keys spread over the whole domain read
  every file, unfiltered);
* **replace**: the groups whose rows changed are appended whole (every component's new rows plus a ``#`` marker row
  per group, ``__seq`` the new version): a group's rows are those of its latest ``__seq``, so the append replaces the
  older rows without a ``MERGE`` (no file of the table is rewritten). When the rows appended since the last
  compaction exceed a quarter of the live rows (and :data:`COMPACT_MIN_ROWS`), the table is rewritten with the
  latest rows only.

A version of the sketch pins the Delta version of the table (its ``reference``, sealed in the catalog with the
operator state, with the live rows per component and the versions earlier sketch versions pinned). Appends remove no
file; a compaction does, and then vacuums the files that no sketch version within ``IMP_STATE_RETENTION`` reads.
Nothing else reads a state table, so versions written by a job
that then died before its catalog commit are never read: the next job that writes restores the table to its pinned
version first. A group's sketch ``__sk`` is not stored: it is the group's fragments with a positive count in
``fcounts``. See docs/ARCHITECTURE.md, "Where state lives".
"""

from __future__ import annotations

import math
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import unquote

import polars as pl
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from imp_core.engine.annotation import FRAG_DTYPE, SET_DTYPE
from imp_core.engine.external import FCOUNTS, GROUPS, key_types
from imp_core.engine.schema import COUNT, FRAG, SET
from imp_core.errors import StateError, first_line
from imp_core.sources import storage
from imp_core.spark import xxhash
from imp_core.spark.frames import spark_schema, to_polars, to_spark

BUCKET = "__bucket"
COMPONENT = "__c"  # the component a row belongs to
SEQ = "__seq"  # the store version that wrote the row: a group's rows are those of its latest
MARKER = "#"  # the component of the row every append writes per replaced group (a group whose new rows are none)
TABLE = "state"
FORMAT = 2
CHUNK_ROWS = 1 << 20  # rows per chunk when the whole state is read (a capture's output, a move back into memory)
COMPACT_MIN_ROWS = 1 << 20  # appended rows below which a table is never compacted
FILE_ROWS = 1 << 18  # rows per file of a whole write (each a narrow key range the fetch's filter skips by)
MAX_RANGES = 8  # key ranges the fetch's skipping filter has at most (the batch's sort key split at its widest gaps)
LITERAL_KEYS = 100  # a fetch of at most this many single-column keys filters by them as literals (no join; 1,000
# literals took 2.9 s against 1.3 s joined at 1.5M groups: docs/BENCHMARKS.md)
SELECTIVE = 0.25  # the part of the table's key span a batch's ranges may cover for the fetch to filter by them
VACUUM_MARGIN_HOURS = 1  # files removed this long before the oldest kept version's commit stay (clock skew)
MAX_PINS = 64  # earlier sketch versions' pinned table versions a reference remembers (for retention)
_TABLE_PROPERTIES = {"delta.enableDeletionVectors": "false", "delta.enableChangeDataFeed": "false"}  # no row is ever
# deleted in place (appends and whole rewrites only), and a scan without deletion vectors reads faster


def bucket_count(groups: int) -> int:
    """Buckets for about ``groups`` groups: one per million, between 1 and 256 (a batch's fetch reads the buckets of
    its keys; a capture writes one file per bucket at least)."""
    return max(1, min(256, -(-groups // 1_000_000)))


def retain_hours(age_seconds: float) -> int:
    """The whole hours a VACUUM keeps removed files for so that a version committed ``age_seconds`` ago still reads
    (Delta rounds the retention to whole hours: rounded up here, plus :data:`VACUUM_MARGIN_HOURS`)."""
    return math.ceil(max(0.0, age_seconds) / 3600) + VACUUM_MARGIN_HOURS


class DeltaGroupStore:
    """:class:`~imp_core.engine.external.GroupStore` over one Delta table at ``location`` (a local path or ``s3://``)."""

    def __init__(self, spark: SparkSession, location: str, keys: list[str],
                 schemas: Mapping[str, Mapping[str, pl.DataType]], version: int | None = None,
                 buckets: int = 1, rows: Mapping[str, int] | None = None, log: int = 0, pins: Sequence[int] = (),
                 retention: int = 5, span: Sequence[int] | None = None) -> None:
        self.spark = spark
        self.location = location.rstrip("/")
        self.keys = list(keys)
        self.schemas = {name: dict(schema) for name, schema in schemas.items()}
        self.pinned = version  # the table's Delta version this store reads (None before the first write)
        self.buckets = buckets
        self.rows = {name: int((rows or {}).get(name, 0)) for name in self.schemas}  # live rows per component
        self.log = log  # rows appended since the table was last written whole
        self.pins = [int(p) for p in pins][-MAX_PINS:]  # the versions earlier sketch versions pinned, oldest first
        self.retention = retention  # sketch versions whose state is kept (IMP_STATE_RETENTION)
        # the key the files are sorted and skipped by: the first integer or date key (else the first, not skipped)
        self.key_types = key_types(self.keys, self.schemas)
        self.sort_key = next((k for k in self.keys if self.key_types[k] in _RANGED), self.keys[0])
        self.ranged = self.key_types[self.sort_key] in _RANGED
        self.span = (int(span[0]), int(span[1])) if span and self.ranged else None  # its lowest, highest (physical)
        self._columns = self._wide_schema()
        self._fetched: pl.DataFrame | None = None  # the wide rows of the last fetch
        # the keys of the last replace and their groups' rows since (see _known)
        self._recent: tuple[pl.DataFrame, pl.DataFrame] | None = None
        self._checked = False  # orphaned versions rolled back
        self._latest_seen: int | None = None  # the table's latest version, once looked up (see _sync)
        self._warm: int | None = None  # the version whose snapshot warm() built
        self._lock = threading.RLock()  # warm() runs in another thread
        if storage.is_s3(self.location):
            storage.configure_spark(spark)

    @classmethod
    def from_reference(cls, spark: SparkSession, keys: list[str], schemas: Mapping[str, Mapping[str, pl.DataType]],
                       reference: Mapping[str, Any], retention: int = 5) -> DeltaGroupStore:
        """The store a saved version names (``retention``: sketch versions whose state is kept).

        Raises:
            StateError: The reference is not one this imp writes.
        """
        if reference.get("store") != "delta" or reference.get("format") != FORMAT:
            raise StateError(f"external state reference (store {reference.get('store')}, format "
                             f"{reference.get('format')}) is not one this imp reads (format {FORMAT}); recapture the "
                             f"sketch")
        rows = {str(k): int(v) for k, v in reference["rows"].items()}
        if set(rows) != set(schemas):
            raise StateError(f"external state at {storage.redact(reference['location'])} has components "
                             f"{sorted(rows)}, the operator {sorted(schemas)}; recapture the sketch")
        version = reference["version"]  # None: the store was never written (an operator that saw no row yet)
        return cls(spark, reference["location"], keys, schemas, None if version is None else int(version),
                   int(reference["buckets"]),
                   rows, int(reference.get("log", 0)), reference.get("pins", ()), retention, reference.get("span"))

    # -- the contract ------------------------------------------------------------------------------------------------

    def warm(self) -> None:
        """Build the snapshot of the pinned version now, ahead of this batch's fetch: the pipeline calls it from
        another thread while the pass works below this operator. Delta rebuilds a table's snapshot from its log once
        per version (a second or so per table, Spark jobs of their own); a read of an older version than the latest
        builds its own, so nothing is warmed for it."""
        with self._lock:
            if self.pinned is None or self._warm == self.pinned:
                return
            self._sync()
            if self._latest_seen == self.pinned:
                with _small_log(self.spark):
                    self._table().inputFiles()
                self._warm = self.pinned

    def fetch(self, keys: pl.DataFrame) -> dict[str, pl.DataFrame]:
        wanted = keys.select(self.keys).unique()
        known = self._known(wanted)
        self._fetched = known if known is not None else self._read(wanted)
        return self._split(self._fetched)

    def fetch_where(self, keys: pl.DataFrame) -> dict[str, pl.DataFrame]:
        wanted = keys.unique()
        known = self._known(wanted)
        return self._split(known if known is not None else self._read(wanted))

    def replace(self, keys: pl.DataFrame, rows: Mapping[str, pl.DataFrame]) -> None:
        if self._fetched is None:  # the groups' current rows are what the append supersedes (and the counts drop)
            self.fetch(keys)
        old = self._fetched if self._fetched is not None else self._empty_wide()
        seq = (self.pinned if self.pinned is not None else -1) + 1
        new = self._wide({name: self._stored_rows(name, rows.get(name)) for name in self.schemas}, seq)
        changed = _changed_groups(old.drop(SEQ), new.drop(SEQ), self.keys)
        self._fetched = None
        self._recent = None
        if changed.height == 0:
            self._recent = (keys.select(self.keys).unique().cast(self.key_types), new)  # type: ignore[arg-type]
            return
        written = new.join(changed, on=self.keys, how="semi", nulls_equal=True)
        markers = changed.with_columns(pl.lit(MARKER).alias(COMPONENT), pl.lit(seq, dtype=pl.Int64).alias(SEQ))
        append = pl.concat([written, markers], how="diagonal_relaxed").select(list(self._columns))
        replaced = old.join(changed, on=self.keys, how="semi", nulls_equal=True)
        for name in self.schemas:
            self.rows[name] += (_count(written, name) - _count(replaced, name))
        self._restore()
        self._append(to_spark(self.spark, append.cast(self._columns)))  # type: ignore[arg-type]
        self.log += append.height
        self._widen(append.get_column(self.sort_key))
        self._recent = (keys.select(self.keys).unique().cast(self.key_types), new)  # type: ignore[arg-type]
        if self.log >= max(COMPACT_MIN_ROWS, sum(self.rows.values()) // 4):
            self.compact()

    def load(self, frames: Mapping[str, pl.DataFrame | None]) -> None:
        self.write_all({name: to_spark(self.spark, self._stored_rows(name, frames.get(name)))
                        for name in self.schemas})

    def write_all(self, frames: Mapping[str, DataFrame]) -> None:
        """Replace the whole state by ``frames`` (a component's stored columns each; a component missing is empty),
        written by the executors in one job, and count each component's rows."""
        parts = [self._wide_frame(name, frames[name], 0) for name in self.schemas if name in frames]
        out = self._empty_spark() if not parts else parts[0]
        for p in parts[1:]:
            out = out.unionByName(p)
        self._overwrite(out)
        first = F.col(_q(self.sort_key))
        # the span of a ranged key only: another type (a TIMESTAMP_NTZ, a string) has no physical value Spark casts
        physical = ((F.unix_date(first) if self.key_types[self.sort_key] == pl.Date else first).cast("long")
                    if self.ranged else F.lit(None).cast("long"))
        stats = self._table().groupBy(COMPONENT).agg(F.count(F.lit(1)), F.min(physical), F.max(physical)).collect()
        self.rows = {name: 0 for name in self.schemas}
        self.rows.update({str(r[0]): int(r[1]) for r in stats if str(r[0]) in self.rows})
        ends = [(int(r[2]), int(r[3])) for r in stats if r[2] is not None]
        self.span = (min(e[0] for e in ends), max(e[1] for e in ends)) if ends and self.ranged else None

    def contents(self) -> Iterator[dict[str, pl.DataFrame]]:
        if self.pinned is None:
            yield self._split(self._empty_wide())
            return
        first = next(iter(self.schemas))  # groups, or a top-k's rows
        per_chunk = max(1, self.buckets * CHUNK_ROWS // max(1, self.rows.get(first, 0)))
        for start in range(0, self.buckets, per_chunk):
            chosen = list(range(start, min(self.buckets, start + per_chunk)))
            yield self._split(self._latest_rows(to_polars(self._table().where(F.col(BUCKET).isin(chosen))
                                                          .drop(BUCKET))))

    def size(self) -> dict[str, int]:
        return dict(self.rows)

    def table(self, name: str) -> DataFrame | None:
        """Component ``name`` at the pinned version as a Spark DataFrame of its stored columns (None before the
        first write): the state read by the executors, for a capture computed on Spark above it."""
        wide = self.wide_table([name])
        if wide is None:
            return None
        return wide.select(*[F.col(_q(self.physical(name, c))).alias(c) for c in self.stored(name)])

    def wide_table(self, names: Sequence[str]) -> DataFrame | None:
        """The latest rows of components ``names`` at the pinned version in one frame as stored: the state keys,
        ``__c`` (the component) and each component's columns as :meth:`physical` names them (NULL in the other
        components' rows); None before the first write. One scan, so that a filter on the keys reaches every
        component's rows (a join of two components' frames stops it at the join)."""
        if self.pinned is None:
            return None
        df = self._table()
        if self.log:
            latest = F.max(F.col(SEQ)).over(Window.partitionBy(*[F.col(_q(k)) for k in self.keys]))
            df = df.withColumn("__latest", latest).where(F.col(SEQ) == F.col("__latest"))
        return df.where(F.col(COMPONENT).isin(list(names))).drop("__latest", BUCKET, SEQ)

    def physical(self, name: str, column: str) -> str:
        """The table's column holding ``column`` of component ``name``."""
        return column if column in self.keys else f"{name}${column}"

    def stored(self, name: str) -> dict[str, pl.DataType]:
        """A component's columns as stored (the groups' sketch is derived from ``F_g``)."""
        return {c: t for c, t in self.schemas[name].items() if c != SET or name != GROUPS}

    def reference(self) -> dict[str, Any]:
        pins = [*self.pins, *([self.pinned] if self.pinned is not None else [])]
        return {"store": "delta", "format": FORMAT, "location": self.location, "version": self.pinned,
                "buckets": self.buckets, "rows": dict(self.rows), "log": self.log, "pins": pins[-MAX_PINS:],
                "span": list(self.span) if self.span else None}

    def compact(self) -> None:
        """Rewrite the table with each group's latest rows only (the appended history goes)."""
        df = self._table()
        latest = F.max(F.col(SEQ)).over(Window.partitionBy(*[F.col(_q(k)) for k in self.keys]))
        current = (F.col(SEQ) == F.col("__latest")) & (F.col(COMPONENT) != MARKER)
        live = (df.withColumn("__latest", latest).where(current)
                .drop("__latest", BUCKET).withColumn(SEQ, F.lit(0).cast("long")))
        self._overwrite(live)  # Delta reads the pinned snapshot while the overwrite commits a new one
        kept = self.pins[-(self.retention - 1):] if self.retention > 1 else []
        if kept:  # the files older compactions replaced that no kept sketch version reads go
            self.vacuum(kept[0])

    # -- housekeeping ---------------------------------------------------------------------------------------------

    def vacuum(self, oldest: int) -> None:
        """Remove the files no version from ``oldest`` on needs (older sketch versions' state goes). Delta's
        retention is in whole hours: the files removed within ``VACUUM_MARGIN_HOURS`` plus the rounding before that
        version's commit stay too. ``LITE``: the files to delete come from the log, not a listing of the table.
        When the log no longer covers the removals since the last vacuum (``LITE`` refuses), a full VACUUM is not the
        fallback: it judges a file whose removal left the log by its age, and would delete files a kept version older
        than the retention reads; :meth:`_remove_unread` deletes only what no kept version reads."""
        uri = _uri_sql(self._uri())
        history = self.spark.sql(f"DESCRIBE HISTORY delta.`{uri}`")
        age = history.where(F.col("version") == oldest).select(
            F.unix_micros(F.current_timestamp()) - F.unix_micros(F.col("timestamp"))).collect()
        if not age:
            return
        retain = retain_hours(age[0][0] / 1e6)
        key = "spark.databricks.delta.retentionDurationCheck.enabled"
        before = self.spark.conf.get(key, None)
        self.spark.conf.set(key, "false")
        try:
            try:
                self.spark.sql(f"VACUUM delta.`{uri}` LITE RETAIN {retain} HOURS")
            except Exception:  # noqa: BLE001 - the log no longer covers the removals since the last vacuum
                self._remove_unread(oldest)
        finally:
            if before is None:
                self.spark.conf.unset(key)
            else:
                self.spark.conf.set(key, before)
        self.pinned = self._latest_seen = self._latest()  # the vacuum's own commits change no row

    def _remove_unread(self, oldest: int) -> None:
        """Delete the data files written after version ``oldest`` that no kept version reads (``oldest``, the later
        versions sketch versions pinned, the latest): the files of appends a compaction replaced. Files written up to
        ``oldest`` stay (a kept version may read them, and the log may no longer say which), and so does everything
        when a commit after ``oldest`` has left the log."""
        latest = self._latest()
        written = self._written_since(oldest, latest)
        if not written:
            return
        pinned = [self.pinned] if self.pinned is not None else []
        kept = sorted({oldest, *(p for p in self.pins if p > oldest), *pinned, latest})
        read: set[str] = set()
        for v in kept:
            read |= self._files_at(v)
        storage.remove_files([f"{self._uri()}/{path}" for path in sorted(written - read)], self.spark)

    def _written_since(self, oldest: int, latest: int) -> set[str]:
        """The data files (paths relative to the table, decoded) that the commits ``(oldest, latest]`` added, from
        their log entries; none when one of those entries has left the log or names a file outside the table."""
        log = f"{self.location}/{TABLE}/_delta_log"
        commits = [f"{log}/{v:020d}.json" for v in range(oldest + 1, latest + 1)]
        if not commits or not all(storage.exists(c, self.spark) for c in commits):
            return set()
        entries = self.spark.read.json([storage.spark_uri(c) for c in commits])
        if "add" not in entries.columns:
            return set()
        paths = [str(r[0]) for r in entries.where(F.col("add").isNotNull()).select("add.path").collect()]
        if any("://" in p or p.startswith("/") for p in paths):
            return set()
        return {unquote(p) for p in paths}

    def _files_at(self, version: int) -> set[str]:
        """The data files version ``version`` of the table reads (paths relative to the table, decoded)."""
        files = self.spark.read.format("delta").option("versionAsOf", version).load(self._uri()).inputFiles()
        return {unquote(f).rsplit(f"/{TABLE}/", 1)[-1] for f in files}

    # -- inside ---------------------------------------------------------------------------------------------------

    def _uri(self) -> str:
        return storage.spark_uri(f"{self.location}/{TABLE}")

    def _table(self) -> DataFrame:
        """The table at the pinned version: Delta's latest snapshot when that is the pinned one (cached in the JVM
        and kept current by this job's own commits; time travel builds a snapshot per read, about a second each)."""
        self._sync()
        reader = self.spark.read.format("delta")
        if self._latest_seen != self.pinned:
            reader = reader.option("versionAsOf", self.pinned)
        try:
            return reader.load(self._uri())
        except Exception as e:  # noqa: BLE001 - Spark's AnalysisException
            raise self._unreadable(e) from e

    def _unreadable(self, e: Exception) -> StateError:
        return StateError(f"external state at {storage.redact(self.location)} (version {self.pinned}) cannot be "
                          f"read: {storage.redact(first_line(e))}; recapture the sketch")

    def _latest(self) -> int:
        row = self.spark.sql(f"DESCRIBE HISTORY delta.`{_uri_sql(self._uri())}` LIMIT 1").select("version").first()
        assert row is not None
        return int(row[0])

    def _sync(self) -> None:
        """Look the table's latest version up once per store. Only a job holding the sketch's maintenance lock
        writes its state, so afterwards the store knows it: each of its own appends commits the next version.
        The log keeps every commit file after the oldest one it keeps (its clean-up removes the oldest only), so the
        pinned version's commit file present and the next one absent means the pinned version is the latest (two file
        lookups; the table's history otherwise, as when a job that died wrote after it)."""
        if self._latest_seen is not None or self.pinned is None:
            return
        try:
            log = f"{self.location}/{TABLE}/_delta_log"
            if storage.exists(f"{log}/{self.pinned:020d}.json", self.spark) and \
                    not storage.exists(f"{log}/{self.pinned + 1:020d}.json", self.spark):
                self._latest_seen = self.pinned
            else:
                self._latest_seen = self._latest()
        except Exception as e:  # noqa: BLE001 - Spark's AnalysisException
            raise self._unreadable(e) from e

    def _restore(self) -> None:
        """Before the first write of this job: roll back versions after the pinned one (a job that died before its
        catalog commit wrote them; no version of the sketch names them)."""
        if self._checked or self.pinned is None:
            self._checked = True
            return
        self._checked = True
        self._sync()
        assert self._latest_seen is not None
        if self._latest_seen > self.pinned:
            self._recent = None
            self.spark.sql(f"RESTORE TABLE delta.`{_uri_sql(self._uri())}` TO VERSION AS OF {self.pinned}")
            self._latest_seen = self._latest()

    def _overwrite(self, df: DataFrame) -> None:
        order = [self.sort_key, *[k for k in self.keys if k != self.sort_key]]
        out = self._bucketed(df).repartition(BUCKET).sortWithinPartitions(BUCKET, *[_q(k) for k in order])
        writer = (out.write.format("delta").mode("overwrite").partitionBy(BUCKET).option("overwriteSchema", "true")
                  .option("maxRecordsPerFile", FILE_ROWS))
        for k, v in _TABLE_PROPERTIES.items():
            writer = writer.option(k, v)
        self._restore()
        self._recent = None
        writer.save(self._uri())
        self.pinned, self.log = self._latest(), 0
        self._latest_seen = self.pinned

    def _append(self, df: DataFrame) -> None:
        """Append ``df`` (after :meth:`_restore`): one commit, checked to be the version after the latest (see
        :meth:`_sync`): that version's commit file there and the next one's absent (two file lookups). Otherwise
        another writer committed too, and the commit is found in the history by the token it carries.

        Raises:
            StateError: The append's commit is not in the table's recent history.
        """
        token = f"imp-append-{uuid.uuid4().hex}"
        with self._lock, _small_log(self.spark):
            (self._bucketed(df).coalesce(1).write.format("delta").mode("append").partitionBy(BUCKET)
             .option("userMetadata", token).save(self._uri()))
        expected = None if self._latest_seen is None else self._latest_seen + 1
        log = f"{self.location}/{TABLE}/_delta_log"
        if expected is not None and storage.exists(f"{log}/{expected:020d}.json", self.spark) and \
                not storage.exists(f"{log}/{expected + 1:020d}.json", self.spark):
            self.pinned = self._latest_seen = expected
            return
        self.pinned = self._committed(token)
        self._latest_seen = self._latest()

    def _committed(self, token: str) -> int:
        """The version of this store's commit that carries ``token`` (its ``userMetadata``).

        Raises:
            StateError: No recent commit carries it.
        """
        uri = _uri_sql(self._uri())
        found = (self.spark.sql(f"DESCRIBE HISTORY delta.`{uri}` LIMIT {MAX_PINS}")
                 .where(F.col("userMetadata") == token).select("version").first())
        if found is None:
            raise StateError(f"external state at {storage.redact(self.location)}: the commit of an append is not in "
                             f"the table's history (another writer?); recapture the sketch")
        return int(found[0])

    def _known(self, wanted: pl.DataFrame) -> pl.DataFrame | None:
        """The rows of the groups keyed by ``wanted`` (every state key) without a read, when the last replace covered
        them all (a join above asks for the groups its batch touched: Q21's summaries by the changed orders). Only this
        store writes its table (the sketch's lock): they are its rows until its next write; no row, no group."""
        if self._recent is None or set(wanted.columns) != set(self.keys) or wanted.height == 0:
            return None
        keys, rows = self._recent
        wanted = wanted.select(self.keys)
        if wanted.schema != keys.schema or wanted.join(keys, on=self.keys, how="anti", nulls_equal=True).height:
            return None
        return rows.join(wanted, on=self.keys, how="semi", nulls_equal=True)

    def _bucketed(self, df: DataFrame) -> DataFrame:
        cols = [F.col(_q(k)) for k in self.keys]
        return df.withColumn(BUCKET, F.pmod(F.xxhash64(*cols), F.lit(self.buckets)).cast("int"))

    def _read(self, wanted: pl.DataFrame) -> pl.DataFrame:
        """The latest rows (every component's, and the markers) of the groups matching a row of ``wanted`` on its
        columns: one Spark job reads them, pruned to the keys' buckets when ``wanted`` has every state key."""
        if self.pinned is None or wanted.height == 0:
            return self._empty_wide()
        with self._lock, _small_log(self.spark):
            return self._read_rows(wanted)

    def _read_rows(self, wanted: pl.DataFrame) -> pl.DataFrame:
        columns = list(wanted.columns)
        table = self._table()
        if columns == self.keys:
            table = table.where(F.col(BUCKET).isin(self._buckets(wanted)))
        if self.sort_key in columns and self.span is not None:
            skip = _skipping_filter(wanted.get_column(self.sort_key), _q(self.sort_key), self.span)
            if skip is not None:
                table = table.where(skip)
        if len(columns) == 1 and wanted.height <= LITERAL_KEYS and xxhash.supported(wanted.dtypes[0]):
            # the keys as literals: no join, and Parquet skips by them
            values = wanted.get_column(columns[0])
            kind = spark_schema({"v": values.dtype}).fields[0].dataType
            match = F.col(_q(columns[0])).isin([F.lit(v).cast(kind) for v in values.drop_nulls().to_list()])
            if values.null_count():
                match = match | F.col(_q(columns[0])).isNull()
            found = table.where(match)
        else:
            keys = F.broadcast(to_spark(self.spark, wanted))
            cond: Column | None = None
            for k in columns:
                term = table[_q(k)].eqNullSafe(keys[_q(k)])
                cond = term if cond is None else cond & term
            found = table.join(keys, on=cond, how="left_semi")
        raw = to_polars(found.drop(BUCKET))
        return self._latest_rows(raw).cast(self._columns, strict=False)  # type: ignore[arg-type]

    def _buckets(self, keys: pl.DataFrame) -> list[int]:
        """The buckets of ``keys`` (every state key), computed in the driver where Spark's hash can be (one small
        Spark job otherwise)."""
        local = xxhash.buckets(keys.select(self.keys), self.buckets)
        if local is not None:
            return local
        hashed = self._bucketed(to_spark(self.spark, keys.select(self.keys)))
        return sorted(int(r[0]) for r in hashed.select(BUCKET).distinct().collect())

    def _widen(self, keys: pl.Series) -> None:
        """The key span after an append of ``keys`` (a compaction keeps it: a span too wide only filters less)."""
        present = keys.drop_nulls().to_physical()
        if self.span is None or present.len() == 0:
            return
        self.span = (min(self.span[0], int(present.min())), max(self.span[1], int(present.max())))  # type: ignore[arg-type]

    def _latest_rows(self, wide: pl.DataFrame) -> pl.DataFrame:
        if not self.log or wide.height == 0:
            return wide
        return wide.filter(pl.col(SEQ) == pl.col(SEQ).max().over(self.keys))

    def _wide_schema(self) -> dict[str, pl.DataType]:
        """The table's columns (but the bucket) with their polars types."""
        out: dict[str, pl.DataType] = dict(self.key_types)
        out[COMPONENT] = pl.String()
        out[SEQ] = pl.Int64()
        for name in self.schemas:
            for c, t in self.stored(name).items():
                if c not in self.keys:
                    out[self.physical(name, c)] = t
        return out

    def _wide(self, frames: Mapping[str, pl.DataFrame], seq: int) -> pl.DataFrame:
        parts = [df.rename({c: self.physical(name, c) for c in df.columns})
                 .with_columns(pl.lit(name).alias(COMPONENT), pl.lit(seq, dtype=pl.Int64).alias(SEQ))
                 for name, df in frames.items()]
        out = pl.concat([self._empty_wide(), *parts], how="diagonal_relaxed")
        return out.select(list(self._columns)).cast(self._columns)  # type: ignore[arg-type]

    def _wide_frame(self, name: str, df: DataFrame, seq: int) -> DataFrame:
        types = spark_schema(self._columns)
        own = {self.physical(name, c): c for c in self.stored(name)}
        return df.select(*[(F.col(_q(own[f.name])) if f.name in own else
                            F.lit(name) if f.name == COMPONENT else F.lit(seq) if f.name == SEQ else
                            F.lit(None)).cast(f.dataType).alias(f.name) for f in types.fields])

    def _empty_wide(self) -> pl.DataFrame:
        return pl.DataFrame(schema=self._columns)

    def _empty_spark(self) -> DataFrame:
        return to_spark(self.spark, self._empty_wide())

    def _split(self, wide: pl.DataFrame) -> dict[str, pl.DataFrame]:
        """The wide rows per component, as the operator holds them."""
        raw = {}
        for name in self.schemas:
            stored = self.stored(name)
            own = wide.filter(pl.col(COMPONENT) == name)
            raw[name] = own.select([pl.col(self.physical(name, c)).alias(c) for c in stored]).cast(
                stored, strict=False)  # type: ignore[arg-type]
        return {name: self._engine(name, df, raw.get(FCOUNTS)) for name, df in raw.items()}

    def _stored_rows(self, name: str, df: pl.DataFrame | None) -> pl.DataFrame:
        schema = self.stored(name)
        if df is None:
            return pl.DataFrame(schema=schema)
        return df.select(list(schema)).cast(schema)  # type: ignore[arg-type]

    def _engine(self, name: str, df: pl.DataFrame, fcounts: pl.DataFrame | None) -> pl.DataFrame:
        """A component as the operator holds it: the groups with their sketches rebuilt from ``F_g``."""
        if name != GROUPS or SET not in self.schemas[name] or fcounts is None:
            return df
        sets = (fcounts.filter(pl.col(COUNT) > 0).group_by(self.keys)
                .agg(pl.col(FRAG).cast(FRAG_DTYPE).unique().sort().alias(SET)))
        out = df.join(sets, on=self.keys, how="left", nulls_equal=True, maintain_order="left")
        out = out.with_columns(pl.col(SET).fill_null(pl.lit([], dtype=SET_DTYPE)).cast(SET_DTYPE))
        return out.select(list(self.schemas[name]))


_RANGED = (pl.Int8, pl.Int16, pl.Int32, pl.Int64, pl.Date)  # key types whose order Spark and polars agree on


def key_runs(values: pl.Series, limit: int = MAX_RANGES) -> list[tuple[Any, Any]] | None:
    """At most ``limit`` closed ranges (lowest, highest) that hold every non-NULL value of ``values``: the sorted
    distinct values split at their widest gaps. None for a type other than signed integers and dates (floats: NaN;
    timestamps: time zones; strings: no gaps to measure)."""
    if values.dtype not in _RANGED:
        return None
    present = values.drop_nulls().unique().sort()
    n = present.len()
    if n == 0:
        return []
    if n <= limit:
        cuts = list(range(1, n))
    else:
        gaps = present.to_physical().cast(pl.Float64).diff().slice(1)  # gap i lies between values i and i + 1
        cuts = sorted(int(i) + 1 for i in gaps.arg_sort(descending=True).slice(0, limit - 1))
    bounds = [0, *cuts, n]
    return [(present[a], present[b - 1]) for a, b in zip(bounds, bounds[1:], strict=False)]


def _skipping_filter(values: pl.Series, column: str, span: tuple[int, int]) -> Column | None:
    """A filter that keeps every row whose ``column`` is one of ``values`` (NULL included) and lets Delta skip the
    files, and Parquet the row groups, whose key range holds none of them (:func:`key_runs`); None when the ranges
    cover more than :data:`SELECTIVE` of ``span`` (the table's lowest and highest key, physical values)."""
    runs = key_runs(values)
    if runs is None:
        return None
    physical = [(int(pl.Series([lo], dtype=values.dtype).to_physical()[0]),
                 int(pl.Series([hi], dtype=values.dtype).to_physical()[0])) for lo, hi in runs]
    if sum(hi - lo + 1 for lo, hi in physical) > SELECTIVE * (span[1] - span[0] + 1):
        return None
    col, kind = F.col(column), spark_schema({"v": values.dtype}).fields[0].dataType
    terms = [col == F.lit(lo).cast(kind) if lo == hi else col.between(F.lit(lo).cast(kind), F.lit(hi).cast(kind))
             for lo, hi in runs]
    if values.null_count():
        terms.append(col.isNull())
    if not terms:
        return None
    out = terms[0]
    for t in terms[1:]:
        out = out | t
    return out


_LOG_KEY = "spark.databricks.delta.snapshotPartitions"
_log_lock = threading.Lock()
_log_before: list[str | None] = []  # per block open (in any thread): the setting before the first of them


@contextmanager
def _small_log(spark: SparkSession) -> Iterator[None]:
    """Within the block Delta rebuilds a table's snapshot from its log in one task (``snapshotPartitions``, the
    session's shuffle partitions otherwise): a state table's log is small, and a batch's read after the previous
    batch's append took 1.0 s so against 1.8 s with eight (SF1, local[2]). Blocks may overlap across threads; the
    last to close restores the setting."""
    with _log_lock:
        _log_before.append(_log_before[0] if _log_before else spark.conf.get(_LOG_KEY, None))
        spark.conf.set(_LOG_KEY, "1")
    try:
        yield
    finally:
        with _log_lock:
            before = _log_before.pop()
            if not _log_before:
                if before is None:
                    spark.conf.unset(_LOG_KEY)
                else:
                    spark.conf.set(_LOG_KEY, before)


def _changed_groups(old: pl.DataFrame, new: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """The keys of the groups whose rows (any component's) differ between ``old`` and ``new`` as bags: a row held
    twice in ``old`` and once in ``new`` is a change (else the copy left behind would be read back)."""
    old = _row_multiplicities(old.filter(pl.col(COMPONENT) != MARKER))
    new = _row_multiplicities(new.filter(pl.col(COMPONENT) != MARKER))
    columns = list(new.columns)
    only_new = new.join(old, on=columns, how="anti", nulls_equal=True)
    only_old = old.join(new, on=columns, how="anti", nulls_equal=True)
    return pl.concat([only_new.select(keys), only_old.select(keys)]).unique()


_COPIES = "__copies"


def _row_multiplicities(rows: pl.DataFrame) -> pl.DataFrame:
    """``rows`` as a bag: each distinct row once, with the number of its copies in :data:`_COPIES`."""
    return rows.group_by(list(rows.columns)).agg(pl.len().cast(pl.Int64).alias(_COPIES))


def _count(wide: pl.DataFrame, name: str) -> int:
    return wide.filter(pl.col(COMPONENT) == name).height


def _q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _uri_sql(uri: str) -> str:
    return uri.replace("`", "``")


__all__ = ["BUCKET", "DeltaGroupStore", "bucket_count", "key_runs", "retain_hours"]

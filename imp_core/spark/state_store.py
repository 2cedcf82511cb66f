"""External operator state as Delta tables beside the data, read and written by Spark (the JVM only).

One Delta table per state component of an operator (``groups``, ``fcounts`` = ``F_g``, ``mm{j}`` value multisets:
``engine/external.py``), at ``<location>/<component>``, with a hash-bucket column ``__bucket`` (the state keys'
``xxhash64`` modulo the bucket count) it is partitioned by, deletion vectors on. A batch:

* **fetch**: the batch's keys go to Spark as a small frame; their buckets are computed there (one small job), and
  each component's rows of those keys are read at the pinned version (``versionAsOf``), pruned to the buckets;
* **replace**: the touched groups' new rows against the rows fetched for them give, per component, the rows to
  upsert and the rows to delete; one ``MERGE`` per changed component writes them (a new Delta version).

A version of the sketch pins the Delta version of each component (its ``reference``, sealed in the catalog with the
operator state). Nothing else reads a state table, so versions written by a job that then died before its catalog
commit are never read: the next job that writes restores the table to its pinned version first. A group's sketch
``__sk`` is not stored: it is the group's fragments with a positive count in ``fcounts``. See docs/ARCHITECTURE.md,
"Where state lives".
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

import polars as pl
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from imp_core.engine.annotation import FRAG_DTYPE, SET_DTYPE
from imp_core.engine.external import FCOUNTS, GROUPS
from imp_core.engine.schema import COUNT, FRAG, SET, VALUE
from imp_core.errors import StateError, first_line
from imp_core.sources import storage
from imp_core.spark.frames import to_polars, to_spark

BUCKET = "__bucket"
OP = "__op"  # in a MERGE's source: U (upsert) or D (delete)
FORMAT = 1
CHUNK_ROWS = 1 << 20  # rows per chunk when the whole state is read (a capture's output, a move back into memory)
_TABLE_PROPERTIES = {"delta.enableDeletionVectors": "true", "delta.enableChangeDataFeed": "false"}


def bucket_count(groups: int) -> int:
    """Buckets for about ``groups`` groups: one per million, between 1 and 256 (a batch's fetch reads the buckets of
    its keys; a capture writes one file per bucket at least)."""
    return max(1, min(256, -(-groups // 1_000_000)))


class DeltaGroupStore:
    """:class:`~imp_core.engine.external.GroupStore` over Delta tables at ``location`` (a local path or ``s3://``)."""

    def __init__(self, spark: SparkSession, location: str, keys: list[str],
                 schemas: Mapping[str, Mapping[str, pl.DataType]], versions: Mapping[str, int] | None = None,
                 buckets: int = 1) -> None:
        self.spark = spark
        self.location = location.rstrip("/")
        self.keys = list(keys)
        self.schemas = {name: dict(schema) for name, schema in schemas.items()}
        self.pinned: dict[str, int] = dict(versions or {})
        self.buckets = buckets
        self._fetched: dict[str, pl.DataFrame] = {}
        self._touched: list[int] = []  # the buckets of the last fetch's keys
        self._checked: set[str] = set()  # components whose orphaned versions were rolled back
        if storage.is_s3(self.location):
            storage.configure_spark(spark)

    @classmethod
    def from_reference(cls, spark: SparkSession, keys: list[str], schemas: Mapping[str, Mapping[str, pl.DataType]],
                       reference: Mapping[str, Any]) -> DeltaGroupStore:
        """The store a saved version names.

        Raises:
            StateError: The reference is not one this imp writes.
        """
        if reference.get("store") != "delta" or reference.get("format") != FORMAT:
            raise StateError(f"external state reference {dict(reference)} is not one this imp reads; recapture the "
                             f"sketch")
        versions = {str(k): int(v) for k, v in reference["versions"].items()}
        if set(versions) != set(schemas):
            raise StateError(f"external state at {storage.redact(reference['location'])} has components "
                             f"{sorted(versions)}, the operator {sorted(schemas)}; recapture the sketch")
        return cls(spark, reference["location"], keys, schemas, versions, int(reference["buckets"]))

    # -- the contract ------------------------------------------------------------------------------------------------

    def fetch(self, keys: pl.DataFrame) -> dict[str, pl.DataFrame]:
        wanted = keys.select(self.keys).unique()
        if not self.pinned or wanted.height == 0:
            out = {name: pl.DataFrame(schema=self._stored(name)) for name in self.schemas}
        else:
            kdf = F.broadcast(self._bucketed(to_spark(self.spark, wanted)))
            self._touched = sorted(int(r[0]) for r in kdf.select(BUCKET).distinct().collect())
            out = {name: self._read_keys(name, kdf, self._touched) for name in self.schemas}
        self._fetched = out
        return {name: self._engine(name, df, out[FCOUNTS]) for name, df in out.items()}

    def fetch_where(self, keys: pl.DataFrame) -> dict[str, pl.DataFrame]:
        wanted = keys.unique()
        if not self.pinned or wanted.height == 0:
            raw = {name: pl.DataFrame(schema=self._stored(name)) for name in self.schemas}
        else:
            kdf = to_spark(self.spark, wanted)
            buckets = None
            if list(wanted.columns) == self.keys:
                kdf = self._bucketed(kdf)
                buckets = sorted(int(r[0]) for r in kdf.select(BUCKET).distinct().collect())
            kdf = F.broadcast(kdf)
            raw = {name: self._read_keys(name, kdf, buckets, list(wanted.columns)) for name in self.schemas}
        return {name: self._engine(name, df, raw[FCOUNTS]) for name, df in raw.items()}

    def replace(self, keys: pl.DataFrame, rows: Mapping[str, pl.DataFrame]) -> None:
        for name in self.schemas:
            old = self._fetched.get(name, pl.DataFrame(schema=self._stored(name)))
            new = self._stored_rows(name, rows.get(name))
            source = _changed_rows(old, new, self._identity(name))
            if source is not None:
                self._merge(name, source)
        self._fetched, self._touched = {}, []

    def load(self, frames: Mapping[str, pl.DataFrame]) -> None:
        for name in self.schemas:
            self.write(name, to_spark(self.spark, self._stored_rows(name, frames.get(name))))

    def write(self, name: str, df: DataFrame) -> None:
        """Replace component ``name`` with ``df`` (its stored columns; bucketed here), written by the executors."""
        out = self._bucketed(df.select(*[F.col(_q(c)) for c in self._stored(name)]))
        writer = out.repartition(BUCKET).write.format("delta").mode("overwrite").partitionBy(BUCKET)
        writer = writer.option("overwriteSchema", "true")
        for k, v in _TABLE_PROPERTIES.items():
            writer = writer.option(k, v)
        self._restore(name)
        writer.save(self._uri(name))
        self.pinned[name] = self._latest(name)

    def contents(self) -> Iterator[dict[str, pl.DataFrame]]:
        if not self.pinned:
            yield {name: pl.DataFrame(schema=self._engine_schema(name)) for name in self.schemas}
            return
        rows = max(1, self.size()[GROUPS])
        per_chunk = max(1, self.buckets * CHUNK_ROWS // rows)
        for first in range(0, self.buckets, per_chunk):
            chosen = list(range(first, min(self.buckets, first + per_chunk)))
            raw = {name: to_polars(self._table(name).where(F.col(BUCKET).isin(chosen)).drop(BUCKET))
                   for name in self.schemas}
            raw = {name: self._cast(name, df) for name, df in raw.items()}
            yield {name: self._engine(name, df, raw[FCOUNTS]) for name, df in raw.items()}

    def size(self) -> dict[str, int]:
        return {name: int(self._table(name).count()) if self.pinned else 0 for name in self.schemas}

    def table(self, name: str) -> DataFrame | None:
        """Component ``name`` at its pinned version as a Spark DataFrame of its stored columns (None before the
        first write): the state read by the executors, for a capture computed on Spark above it."""
        if name not in self.pinned:
            return None
        return self._table(name).drop(BUCKET)

    def reference(self) -> dict[str, Any]:
        return {"store": "delta", "format": FORMAT, "location": self.location, "versions": dict(self.pinned),
                "buckets": self.buckets}

    # -- housekeeping ---------------------------------------------------------------------------------------------

    def vacuum(self, oldest: Mapping[str, int]) -> None:
        """Remove the files no version from ``oldest[component]`` on needs (older sketch versions' state goes)."""
        for name, version in oldest.items():
            history = self.spark.sql(f"DESCRIBE HISTORY delta.`{_uri_sql(self._uri(name))}`")
            stamp = history.where(F.col("version") == version).select("timestamp").collect()
            if not stamp:
                continue
            hours = self.spark.sql("SELECT (unix_timestamp(current_timestamp()) - unix_timestamp("
                                   f"TIMESTAMP'{stamp[0][0]}')) / 3600.0").collect()[0][0]
            retain = max(0.0, float(hours)) + 1.0
            key = "spark.databricks.delta.retentionDurationCheck.enabled"
            before = self.spark.conf.get(key, None)
            self.spark.conf.set(key, "false")
            try:
                self.spark.sql(f"VACUUM delta.`{_uri_sql(self._uri(name))}` RETAIN {retain:.2f} HOURS")
            finally:
                if before is None:
                    self.spark.conf.unset(key)
                else:
                    self.spark.conf.set(key, before)

    # -- inside ---------------------------------------------------------------------------------------------------

    def _uri(self, name: str) -> str:
        return storage.spark_uri(f"{self.location}/{name}")

    def _table(self, name: str) -> DataFrame:
        try:
            return self.spark.read.format("delta").option("versionAsOf", self.pinned[name]).load(self._uri(name))
        except Exception as e:  # noqa: BLE001 - Spark's AnalysisException
            raise StateError(f"external state {name} at {storage.redact(self.location)} (version "
                             f"{self.pinned.get(name)}) cannot be read: {storage.redact(first_line(e))}; recapture "
                             f"the sketch") from e

    def _latest(self, name: str) -> int:
        row = self.spark.sql(f"DESCRIBE HISTORY delta.`{_uri_sql(self._uri(name))}` LIMIT 1").select("version").first()
        assert row is not None
        return int(row[0])

    def _restore(self, name: str) -> None:
        """Before the first write of this job: roll back versions after the pinned one (a job that died before its
        catalog commit wrote them; no version of the sketch names them)."""
        if name in self._checked or name not in self.pinned:
            self._checked.add(name)
            return
        self._checked.add(name)
        if self._latest(name) > self.pinned[name]:
            self.spark.sql(f"RESTORE TABLE delta.`{_uri_sql(self._uri(name))}` TO VERSION AS OF {self.pinned[name]}")

    def _bucketed(self, df: DataFrame) -> DataFrame:
        cols = [F.col(_q(k)) for k in self.keys]
        return df.withColumn(BUCKET, F.pmod(F.xxhash64(*cols), F.lit(self.buckets)).cast("int"))

    def _read_keys(self, name: str, keys: DataFrame, buckets: list[int] | None,
                   columns: list[str] | None = None) -> pl.DataFrame:
        table = self._table(name)
        if buckets is not None:
            table = table.where(F.col(BUCKET).isin(buckets))
        cond: Column | None = None
        for k in columns or self.keys:
            term = table[_q(k)].eqNullSafe(keys[_q(k)])
            cond = term if cond is None else cond & term
        return self._cast(name, to_polars(table.join(keys, on=cond, how="left_semi").drop(BUCKET)))

    def _merge(self, name: str, source: pl.DataFrame) -> None:
        self._restore(name)
        ident = self._identity(name)
        src = self._bucketed(to_spark(self.spark, source))
        view = f"imp_state_src_{re.sub(r'[^0-9A-Za-z_]', '_', name)}"
        src.createOrReplaceTempView(view)
        on = " AND ".join(f"t.{_q(c)} <=> s.{_q(c)}" for c in ident) + f" AND t.{BUCKET} = s.{BUCKET}"
        if self._touched:  # the partitions a MERGE may touch, as literals (Delta prunes the others)
            on += f" AND t.{BUCKET} IN ({', '.join(str(b) for b in self._touched)})"
        cols = [*self._stored(name), BUCKET]
        sets = ", ".join(f"t.{_q(c)} = s.{_q(c)}" for c in cols)
        values = ", ".join(f"s.{_q(c)}" for c in cols)
        names = ", ".join(_q(c) for c in cols)
        try:
            self.spark.sql(f"MERGE INTO delta.`{_uri_sql(self._uri(name))}` AS t USING {view} AS s ON {on} "
                           f"WHEN MATCHED AND s.{OP} = 'D' THEN DELETE WHEN MATCHED THEN UPDATE SET {sets} "
                           f"WHEN NOT MATCHED AND s.{OP} = 'U' THEN INSERT ({names}) VALUES ({values})")
        finally:
            self.spark.catalog.dropTempView(view)
        self.pinned[name] = self._latest(name)

    def _identity(self, name: str) -> list[str]:
        """The columns that name one row of a component: the state keys, plus the fragment or the value."""
        if name == GROUPS:
            return list(self.keys)
        return [*self.keys, *[c for c in self._stored(name) if c in (FRAG, VALUE) and c not in self.keys]]

    def _stored(self, name: str) -> dict[str, pl.DataType]:
        """A component's columns as stored (the groups' sketch is derived from ``F_g``)."""
        return {c: t for c, t in self.schemas[name].items() if c != SET}

    def _engine_schema(self, name: str) -> dict[str, pl.DataType]:
        return self.schemas[name]

    def _stored_rows(self, name: str, df: pl.DataFrame | None) -> pl.DataFrame:
        schema = self._stored(name)
        if df is None:
            return pl.DataFrame(schema=schema)
        return df.select(list(schema)).cast(schema)  # type: ignore[arg-type]

    def _cast(self, name: str, df: pl.DataFrame) -> pl.DataFrame:
        schema = self._stored(name)
        return df.select(list(schema)).cast(schema, strict=False)  # type: ignore[arg-type]

    def _engine(self, name: str, df: pl.DataFrame, fcounts: pl.DataFrame) -> pl.DataFrame:
        """A component as the operator holds it: the groups with their sketches rebuilt from ``F_g``."""
        if name != GROUPS or SET not in self.schemas[name]:
            return df
        sets = (fcounts.filter(pl.col(COUNT) > 0).group_by(self.keys)
                .agg(pl.col(FRAG).cast(FRAG_DTYPE).unique().sort().alias(SET)))
        out = df.join(sets, on=self.keys, how="left", nulls_equal=True, maintain_order="left")
        out = out.with_columns(pl.col(SET).fill_null(pl.lit([], dtype=SET_DTYPE)).cast(SET_DTYPE))
        return out.select(list(self.schemas[name]))


def _changed_rows(old: pl.DataFrame, new: pl.DataFrame, identity: list[str]) -> pl.DataFrame | None:
    """The rows a MERGE must write to turn ``old`` into ``new`` (``__op`` U or D), None when they are equal."""
    if old.height == 0 and new.height == 0:
        return None
    same = new.join(old, on=list(new.columns), how="semi", nulls_equal=True)
    upserts = new.join(same, on=list(new.columns), how="anti", nulls_equal=True)
    gone = old.join(new.select(identity), on=identity, how="anti", nulls_equal=True)
    if upserts.height == 0 and gone.height == 0:
        return None
    return pl.concat([upserts.with_columns(pl.lit("U").alias(OP)), gone.with_columns(pl.lit("D").alias(OP))])


def _q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _uri_sql(uri: str) -> str:
    return uri.replace("`", "``")


__all__ = ["BUCKET", "DeltaGroupStore", "bucket_count"]

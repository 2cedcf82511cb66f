"""Delta Lake tables as sources: versions, files with statistics, pinned scans, and the change feed.

Change rows leave this module as Arrow with a signed multiplicity ``__mult`` (+1 insert / update post-image, -1
delete / update pre-image); Delta's ``_change_type`` never leaks further. See docs/ARCHITECTURE.md, "Data flow".
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import deltalake
import pyarrow as pa

from imp_core.errors import ChangeFeedUnavailableError, ImpError, SourceError, UnsupportedError, first_line
from imp_core.sources import reader, storage

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

VERSION = reader.VERSION
CDF_PROPERTY = "delta.enableChangeDataFeed"

# writer features under which delta-rs rewrites a table it can read (its Rust writer; the Python constant lists less)
_DELTA_RS_WRITER_FEATURES = frozenset({"appendOnly", "invariants", "timestampNtz", "changeDataFeed", "checkConstraints",
                                       "generatedColumns", "variantType", "variantType-preview"})

# Operations that may change table properties; the CDF flag is re-checked at each of these versions.
_METADATA_OPERATIONS = {"SET TBLPROPERTIES", "UNSET TBLPROPERTIES", "CREATE TABLE", "CREATE OR REPLACE TABLE",
                        "REPLACE TABLE", "REPLACE TABLE AS SELECT", "CREATE TABLE AS SELECT", "CHANGE COLUMN",
                        "ADD COLUMNS", "RENAME COLUMN", "DROP COLUMNS", "UPGRADE PROTOCOL"}


ESTIMATED_ROW_BYTES = 4  # bytes per row of a Parquet file without statistics, for a row count: fewer than rows
# take (two numeric columns about 11, TPC-H's lineitem about 40), so such a table's rows are overestimated


@dataclass(frozen=True)
class FileStats:
    """One data file of a pinned version with its per-column statistics (None where Delta has none)."""

    uri: str
    size_bytes: int
    num_records: int | None
    min_values: dict[str, Any]
    max_values: dict[str, Any]
    null_counts: dict[str, int | None]
    partition_values: dict[str, Any]


@dataclass(frozen=True)
class Commit:
    """One commit of a table; ``rows``: its change rows (:func:`changed_rows`), None when the log does not say."""

    version: int
    timestamp: dt.datetime | None
    operation: str
    rows: int | None


# Commits that change no row (dataChange false, or metadata only): their change feed is empty.
_NO_ROW_OPERATIONS = frozenset({"CREATE TABLE", "OPTIMIZE", "REORG", "VACUUM START", "VACUUM END", "SET TBLPROPERTIES",
                                "UNSET TBLPROPERTIES", "ADD CONSTRAINT", "DROP CONSTRAINT", "UPGRADE PROTOCOL"})
# Per operation, the metrics whose sum is its change rows, with the weight of each (an updated row is two change
# rows: its pre- and post-image), as delta-rs (snake_case) and Delta's Spark writer (camelCase) record them. Copied
# rows (a rewritten file's rows that did not change) are not change rows.
_CHANGE_METRICS: dict[str, tuple[tuple[tuple[str, ...], int], ...]] = {
    "DELETE": ((("num_deleted_rows", "numDeletedRows"), 1),),
    "UPDATE": ((("num_updated_rows", "numUpdatedRows"), 2),),
    "MERGE": ((("num_target_rows_inserted", "numTargetRowsInserted"), 1),
              (("num_target_rows_updated", "numTargetRowsUpdated"), 2),
              (("num_target_rows_deleted", "numTargetRowsDeleted"), 1)),
    "WRITE": ((("num_added_rows", "numOutputRows"), 1),),
    "STREAMING UPDATE": ((("num_added_rows", "numOutputRows"), 1),),
}


def changed_rows(operation: str, parameters: dict[str, Any] | None, metrics: dict[str, Any] | None) -> int | None:
    """The change rows a commit holds by its log entry (inserted + deleted + twice the updated rows), or None when
    the entry does not say: the metrics are missing, or a write replaced rows it does not count (an overwrite, a
    stream in complete mode). Never the rows a rewrite copied unchanged: a 10-row DELETE in a file of 500K rows is
    10 change rows, not 500K.

    ``parameters`` and ``metrics``: the entry's ``operationParameters`` and ``operationMetrics`` (values as numbers
    or as the strings Delta's Spark writer records)."""
    op = operation.upper()
    if op in _NO_ROW_OPERATIONS:
        return 0
    terms = _CHANGE_METRICS.get(op)
    metrics = metrics or {}
    if terms is None:
        return None
    params = parameters or {}
    if op in ("WRITE", "STREAMING UPDATE"):
        mode = str(params.get("mode", params.get("outputMode", "Append"))).strip('"').lower()
        removed = metrics.get("num_removed_files", metrics.get("numRemovedFiles", 0))
        if mode not in ("append", "errorifexists") or _int(removed):
            return None  # rows replaced by the write are not counted in its metrics
    total = 0
    for names, weight in terms:
        count = _int(next((metrics[n] for n in names if n in metrics), None))
        if count is None:
            return None
        total += weight * count
    return total


def _collations(metadata: Any) -> list[str]:
    """The collation names a Delta field's metadata gives (``__COLLATIONS``: a map of field path to collation, as
    JSON text or a mapping)."""
    raw = (metadata or {}).get("__COLLATIONS")
    if raw is None:
        return []
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            return [raw]
    if isinstance(raw, dict):
        return [str(v) for v in raw.values()]
    return [str(raw)]


def _collations_in(field: Any) -> list[str]:
    """The collations of a Delta schema field and of the fields nested in it."""
    out = _collations(getattr(field, "metadata", None))
    kind = getattr(field, "type", None)
    for child in getattr(kind, "fields", None) or ():
        out += _collations_in(child)
    for name in ("element_type", "key_type", "value_type"):
        inner = getattr(kind, name, None)
        for child in getattr(inner, "fields", None) or ():
            out += _collations_in(child)
    return out


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


class DeltaSource:
    """A registered table: a name (used in SQL) and the path of a Delta table."""

    def __init__(self, name: str, path: str | Path, spark: Callable[[], SparkSession] | None = None) -> None:
        """``spark`` starts (or returns) the session used when a change range must be read with Spark (column
        mapping, or a range above ``IMP_CDF_SPARK_ROWS``): ``imp_core.spark.session.get_spark`` or the caller's."""
        self.name = name
        self.path = str(path)
        self.spark_supplier = spark
        self.read_choices: dict[tuple[int, str], reader.Choice] = {}  # the readers of each version (reader.py)

    def __repr__(self) -> str:
        return f"DeltaSource({self.name!r}, {self.path!r})"

    # -- opening -------------------------------------------------------------------------------------------------

    def _open(self, version: int | None = None) -> Any:
        uri, options = storage.delta_rs_uri(self.path), storage.delta_rs_options(self.path)
        try:
            if version is None:
                return deltalake.DeltaTable(uri, storage_options=options)
            return deltalake.DeltaTable(uri, version=version, storage_options=options)
        except deltalake.exceptions.TableNotFoundError as e:
            raise SourceError(f"table {self.name}: {self.path} is not a Delta table (no _delta_log found); "
                              f"check the path or create the table with deltalake/Spark") from e
        except Exception as e:  # noqa: BLE001 - delta-rs raises generic errors for bad versions
            if version is not None:
                current = self.current_version()
                if version < 0 or version > current:
                    raise SourceError(f"table {self.name}: version {version} is out of range "
                                      f"(the table has versions 0..{current})") from e
                raise SourceError(f"table {self.name}: version {version} can no longer be read (its log was "
                                  f"cleaned up?): {storage.redact(first_line(e))}") from e
            feature = _unsupported_feature(str(e))
            if feature is not None:
                raise UnsupportedError(f"table {self.name} uses Delta table feature {feature}, which imp does not "
                                       f"support (readable: {', '.join(sorted(reader.SUPPORTED_READER_FEATURES))}); "
                                       f"register a copy written without it") from e
            raise SourceError(f"table {self.name}: cannot open Delta table at {self.path}: "
                              f"{storage.redact(first_line(e))}") from e

    @cached_property
    def _latest(self) -> Any:
        return self._open()

    @property
    def latest(self) -> Any:
        """The table at its latest version as delta-rs opened it (refreshed by :meth:`refresh`)."""
        return self._latest

    @cached_property
    def _pinned(self) -> dict[int, Any]:
        # opening a version replays its log (~10 ms); versions are immutable, so keep the handles
        return {}

    def z_order(self, columns: list[str], target_size: int | None = None) -> dict[str, Any]:
        """Compact the table's files and cluster them by ``columns`` (OPTIMIZE ZORDER BY) into files of about
        ``target_size`` bytes (the writer's default when None): one new version that changes no data (its change
        feed is empty). delta-rs rewrites the tables it reads and writes itself; Delta's Spark connector the others
        (deletion vectors, column mapping, other writer features). Returns the writer's metrics.

        Raises:
            SourceError: The rewrite failed, or the table is liquid-clustered (Delta clusters it by its own
                ``CLUSTER BY`` columns; ZORDER BY does not apply).
        """
        version = self.current_version()
        if self.clustered(version):
            raise SourceError(f"table {self.name} is liquid-clustered (CLUSTER BY): Delta keeps its layout with "
                              f"OPTIMIZE; change its clustering with ALTER TABLE ... CLUSTER BY ({', '.join(columns)})")
        by_delta_rs = reader.choice(self, version).in_process and \
            set(self.protocol(version).writer_features or []) <= _DELTA_RS_WRITER_FEATURES
        what = f"OPTIMIZE ZORDER BY ({', '.join(columns)})"
        try:
            if by_delta_rs:
                metrics = dict(self._open().optimize.z_order(columns, target_size=target_size))
            else:
                metrics = self._z_order_on_spark(columns, target_size)
        except Exception as e:  # noqa: BLE001 - delta-rs and Spark raise generic errors
            if isinstance(e, ImpError):
                raise
            raise SourceError(f"table {self.name}: {what} failed: {storage.redact(first_line(e))}") from e
        self.refresh()
        return metrics

    def clustered(self, version: int | None = None) -> bool:
        """Whether the table uses liquid clustering (Delta's ``clustering`` writer feature)."""
        return "clustering" in set(self.protocol(version).writer_features or [])

    def _z_order_on_spark(self, columns: list[str], target_size: int | None) -> dict[str, Any]:
        if self.spark_supplier is None:
            raise SourceError(f"table {self.name}: rewriting it needs Delta's Spark connector, and this source was "
                              f"opened without a Spark session; open it with DeltaSource(..., spark=get_spark)")
        spark = self.spark_supplier()
        if storage.is_s3(self.path):
            storage.configure_spark(spark)
        key = "spark.databricks.delta.optimize.maxFileSize"
        before = spark.conf.get(key, None)
        if target_size is not None:
            spark.conf.set(key, str(int(target_size)))
        try:
            uri = storage.spark_uri(self.path).replace("`", "``")
            cols = ", ".join("`" + c.replace("`", "``") + "`" for c in columns)
            row = spark.sql(f"OPTIMIZE delta.`{uri}` ZORDER BY ({cols})").first()
        finally:
            if before is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, before)
        metrics = row["metrics"].asDict() if row is not None and "metrics" in row else {}
        return {k: v for k, v in metrics.items() if isinstance(v, (int, float, str))}

    def refresh(self) -> None:
        """Catch up with commits made since the table was opened (reads only the new log entries)."""
        if "_latest" in self.__dict__:
            try:
                self._latest.update_incremental()
                return
            except Exception:  # noqa: BLE001 - fall back to reopening
                pass
        self.__dict__.pop("_latest", None)

    def current_version(self) -> int:
        """The latest committed version (re-read from the log on every call)."""
        self.refresh()
        return int(self._latest.version())

    def table_at(self, version: int) -> Any:
        """The table pinned at ``version`` (cached per source object)."""
        if version in self._pinned:
            return self._pinned[version]
        latest = self._latest
        if int(latest.version()) == version:
            return latest
        table = self._open(version)
        if len(self._pinned) >= 16:
            self._pinned.pop(next(iter(self._pinned)))
        self._pinned[version] = table
        return table

    def check_version(self, version: int) -> None:
        if "_latest" in self.__dict__ and 0 <= version <= int(self._latest.version()):
            return  # versions never disappear from the range (only their files can be vacuumed)
        current = self.current_version()
        if version < 0 or version > current:
            raise SourceError(f"table {self.name}: version {version} is out of range (the table has versions "
                              f"0..{current})")

    # -- schema and metadata -------------------------------------------------------------------------------------

    def schema(self, version: int | None = None) -> pa.Schema:
        table = self._latest if version is None else self.table_at(version)
        schema = pa.schema(table.schema().to_arrow())
        return pa.schema([pa.field(f.name, _plain_type(f.type), f.nullable) for f in schema])

    def table_id(self, version: int | None = None) -> str:
        """The Delta table's metadata id (a UUID written when the table is created).

        A table deleted and re-created at the same path gets a new id, so the id tells whether version numbers
        recorded earlier still refer to this table.
        """
        table = self._latest if version is None else self.table_at(version)
        return str(table.metadata().id)

    def partition_columns(self, version: int | None = None) -> list[str]:
        table = self._latest if version is None else self.table_at(version)
        return list(table.metadata().partition_columns)

    def cdf_enabled(self, version: int | None = None) -> bool:
        table = self._latest if version is None else self.table_at(version)
        return str(table.metadata().configuration.get(CDF_PROPERTY, "false")).lower() == "true"

    def protocol(self, version: int | None = None) -> Any:
        """The version's protocol (reader and writer versions and features)."""
        table = self._latest if version is None else self.table_at(version)
        return table.protocol()

    def require_readable_by_spark(self, version: int | None = None) -> None:
        """Refuse tables that use a Delta reader feature the platform cannot read correctly (one line naming it)."""
        reader.require_readable(self, version)

    def physical_names(self, version: int | None = None) -> dict[str, str]:
        """Logical -> physical column names under column mapping (empty when the table does not map names)."""
        table = self._latest if version is None else self.table_at(version)
        mode = str(table.metadata().configuration.get("delta.columnMapping.mode", "none")).lower()
        if mode == "none":
            return {}
        return {f.name: str(f.metadata.get("delta.columnMapping.physicalName", f.name)) for f in table.schema().fields}

    def collations(self, version: int | None = None) -> dict[str, str]:
        """The columns (top-level names) holding strings under a collation other than ``UTF8_BINARY``, each with its
        collation (Delta keeps it in the field's ``__COLLATIONS`` metadata, for the field or strings nested in it)."""
        table = self._latest if version is None else self.table_at(version)
        out = {}
        for f in table.schema().fields:
            named = _collations_in(f)
            other = sorted({c for c in named if "UTF8_BINARY" not in c.upper().split(".")})
            if other:
                out[f.name] = ", ".join(other)
        return out

    def require_binary_collations(self, columns: set[str], version: int | None = None) -> None:
        """Fail when one of ``columns`` holds strings under a non-binary collation: Spark compares, groups and
        orders them by it (``UTF8_LCASE``: case-insensitively), sketches byte-wise.

        Raises:
            UnsupportedError: Such a column is among ``columns``.
        """
        collated = {c: n for c, n in self.collations(version).items() if c in columns}
        if collated:
            listed = ", ".join(f"{c} ({n})" for c, n in sorted(collated.items()))
            raise UnsupportedError(f"table {self.name}: column collations are not supported ({listed}): sketches "
                                   f"compare strings byte-wise (UTF8_BINARY); alter the column to STRING COLLATE "
                                   f"UTF8_BINARY or sketch a query that does not read it")

    def require_cdf(self) -> None:
        if not self.cdf_enabled():
            raise ChangeFeedUnavailableError(
                f"table {self.name} does not have Change Data Feed enabled; enable it with "
                f"ALTER TABLE ... SET TBLPROPERTIES ({CDF_PROPERTY} = true) or write the table with "
                f"configuration {{'{CDF_PROPERTY}': 'true'}}")

    # -- files and statistics ------------------------------------------------------------------------------------

    def row_count(self, version: int) -> int:
        """The table's rows at ``version`` from its log: the files' ``numRecords``, and for a file written without
        statistics an estimate from its size (:data:`ESTIMATED_ROW_BYTES` per row: generous, so that a large table
        never counts as small)."""
        return sum(f.num_records if f.num_records is not None else f.size_bytes // ESTIMATED_ROW_BYTES
                   for f in self.files(version))

    def files(self, version: int) -> list[FileStats]:
        table = self.table_at(version)
        actions = pa.table(table.get_add_actions(flatten=True)).to_pylist()
        root = self.path.rstrip("/")
        # under column mapping the log's statistics and partition values are keyed by physical names
        logical = {p: n for n, p in self.physical_names(version).items()}
        out = []
        for a in actions:
            mins = {logical.get(k[4:], k[4:]): v for k, v in a.items() if k.startswith("min.")}
            maxs = {logical.get(k[4:], k[4:]): v for k, v in a.items() if k.startswith("max.")}
            nulls = {logical.get(k[11:], k[11:]): v for k, v in a.items() if k.startswith("null_count.")}
            parts = {logical.get(k[10:], k[10:]): v for k, v in a.items() if k.startswith("partition.")}
            path = a["path"]
            uri = path if "://" in path or path.startswith("/") else f"{root}/{path}"
            out.append(FileStats(uri, int(a["size_bytes"]), a.get("num_records"), mins, maxs, nulls, parts))
        return out

    def column_stats(self, version: int, column: str) -> tuple[Any, Any, int] | None:
        """(min, max, non-NULL count) of a column from the file statistics, or None unless they are exact.

        Exact means: every file has them, and the column's type keeps them exact in the log. Timestamps are written
        at millisecond precision, decimals of more than 15 digits through a JSON double and long strings as
        prefixes, so those columns return None (the caller computes min and max itself). Float statistics leave
        NaN out, which is what bounds need (NaN belongs to the last fragment).
        """
        dtype = self.schema(version).field(column).type
        if not (pa.types.is_integer(dtype) or pa.types.is_floating(dtype) or pa.types.is_date(dtype)
                or (pa.types.is_decimal(dtype) and dtype.precision <= 15)):
            return None
        lo = hi = None
        count = 0
        for f in self.files(version):
            nulls = f.null_counts.get(column)
            if f.num_records is None or nulls is None:
                return None
            if f.num_records == nulls:
                continue
            fmin, fmax = f.min_values.get(column), f.max_values.get(column)
            if fmin is None or fmax is None or _is_nan(fmin) or _is_nan(fmax):
                return None
            lo = fmin if lo is None else min(lo, fmin)
            hi = fmax if hi is None else max(hi, fmax)
            count += f.num_records - nulls
        return (lo, hi, count) if lo is not None else None

    # -- change feed ---------------------------------------------------------------------------------------------

    def commits(self, after: int, upto: int) -> list[Commit]:
        """The commits ``(after, upto]`` in version order, with the change rows each holds when the log says so
        (:func:`changed_rows`)."""
        table = self._latest
        out = []
        latest = int(table.version())
        for h in table.history(limit=max(1, latest - after)):
            v = int(h["version"])
            if after < v <= upto:
                rows = changed_rows(str(h.get("operation", "")), h.get("operationParameters"),
                                    h.get("operationMetrics"))
                ts = h.get("timestamp")
                out.append(Commit(v, dt.datetime.fromtimestamp(ts / 1000, tz=dt.timezone.utc) if ts else None,
                                  str(h.get("operation", "")), rows))
        return sorted(out, key=lambda c: c.version)

    def check_cdf_range(self, after: int, upto: int) -> None:
        """Fail unless the change feed covers every version in ``(after, upto]``.

        The CDF flag is checked at ``upto`` and at every commit in the range that may have changed table properties
        (its metadata is otherwise the same at every version of the range), plus at ``after + 1``.
        """
        self.check_version(upto)
        if after < -1 or after > upto:
            raise SourceError(f"table {self.name}: bad change range ({after}, {upto}]")
        if after == upto:
            return
        if not self.cdf_enabled(upto):
            raise ChangeFeedUnavailableError(f"table {self.name} has Change Data Feed disabled at version {upto}; "
                                             f"changes ({after}, {upto}] cannot be read incrementally")
        check = set()
        for c in self.commits(after, upto):
            if c.operation.upper() in _METADATA_OPERATIONS:
                check.add(c.version)
                if c.version > after + 1:
                    check.add(c.version - 1)  # the version just before the change, still in the range
        if check:
            check.add(after + 1)
        for v in sorted(check):
            if after < v <= upto and not self.cdf_enabled(v):
                raise ChangeFeedUnavailableError(
                    f"table {self.name} had Change Data Feed disabled at version {v}; changes ({after}, {upto}] "
                    f"cannot be read incrementally")

    def changes(self, after: int, upto: int, columns: list[str] | None = None,
                predicate: str | None = None) -> pa.Table:
        """Change rows of versions ``(after, upto]`` with ``__mult`` (+1/-1) and ``__version`` columns
        (:func:`reader.changes`: the log fast path, delta-rs or Spark)."""
        return reader.changes(self, after, upto, columns, predicate)

    @cached_property
    def _metadata_at(self) -> dict[int, tuple[pa.Schema, list[str], bool, bool]]:
        # (schema, partition columns, mapping on, CDF on) per version, carried forward over commits without metaData
        return {}

    def metadata(self, version: int) -> tuple[pa.Schema, list[str], bool, bool]:
        """(schema, partition columns, column mapping on, CDF on) at ``version``, whose reader features imp must be
        able to read (carried forward by :meth:`carry_metadata` over commits without metadata or protocol changes).

        Raises:
            UnsupportedError: The version lists a reader feature imp cannot read.
        """
        if version not in self._metadata_at:
            reader.require_readable(self, version)
            self._metadata_at[version] = (self.schema(version), self.partition_columns(version),
                                          bool(self.physical_names(version)),
                                          self.cdf_enabled(version))
        return self._metadata_at[version]

    def carry_metadata(self, after: int, upto: int) -> None:
        """Record that no commit in ``(after, upto]`` changed the metadata (the change feed's fast path saw none)."""
        self._metadata_at[upto] = self.metadata(after)

    # -- Spark ---------------------------------------------------------------------------------------------------

    def reads_parquet_directly(self, version: int) -> bool:
        """True when Spark reads the version's Parquet files itself instead of going through the connector
        (:func:`reader.choice`)."""
        return reader.choice(self, version).spark is reader.SparkRead.PARQUET

    def scan(self, spark: SparkSession, version: int, files: list[FileStats] | None = None) -> DataFrame:
        """The table at ``version`` as a Spark DataFrame (:func:`reader.dataframe`), optionally only ``files`` (the
        caller's pruning by statistics) where Spark reads the Parquet files itself."""
        return reader.dataframe(spark, self, version, files)


def _plain_type(t: pa.DataType) -> pa.DataType:
    """Normalize view and large types so that downstream code sees one representation."""
    if pa.types.is_string(t) or pa.types.is_large_string(t) or t == pa.string_view():
        return pa.string()
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return pa.binary()
    if pa.types.is_timestamp(t) and t.unit != "us":
        return pa.timestamp("us", tz=t.tz)
    return t


def _unsupported_feature(message: str) -> str | None:
    """The table feature delta-rs refused to open a table for (None for any other failure)."""
    found = re.search(r"Feature '([^']+)' is not supported", message)
    if found:
        return found.group(1)
    return "catalogManaged (a catalog-managed table)" if "catalog-managed table" in message else None


def _is_nan(v: Any) -> bool:
    return isinstance(v, float) and math.isnan(v)


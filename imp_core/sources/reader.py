"""The one boundary through which table data is read: snapshots (by Spark or in this process) and change feeds.

Which reader serves a table version is decided here, from the version's protocol, features and files, and nowhere
else:

* **Spark** reads a version's Parquet files itself (pruned by their statistics) when they hold exactly its rows and
  columns: no column mapping, no deletion vector on any file of the version, no reader feature that changes how a
  file is read. Otherwise, and always with ``IMP_SPARK_SCAN=connector``, it reads through Delta Lake's connector
  (``versionAsOf``), which applies deletion vectors and column mapping. The direct read skips the connector's
  snapshot reconstruction (a Spark job per pinned version; docs/BENCHMARKS.md ``lakehouse_connector``).
* **This process** reads a version with delta-rs' Arrow dataset only when delta-rs supports every reader feature the
  protocol lists (it refuses a table that merely *allows* deletion vectors, and column-mapped tables); otherwise the
  caller does the work on Spark (:func:`in_process` says which).
* **Change feeds**: the commit JSON and its ``cdc`` files for a small range of a local table (``changelog.py``),
  else delta-rs' ``load_cdf``, else Spark's ``readChangeFeed`` (``spark_cdf.py``: column-mapped tables, and ranges
  above ``IMP_CDF_SPARK_ROWS`` change rows).

A reader feature none of these can read is refused in one line (:func:`require_readable`), at registration and on
every read. Change rows leave here as Arrow with a signed ``__mult`` (+1 insert / update post-image, -1 delete /
update pre-image) and ``__version``; Delta's ``_change_type`` never leaks further. No other module of the platform
calls delta-rs' or Spark's data readers (``tests/test_architecture.py``).
"""

from __future__ import annotations

import enum
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa

from imp_core.engine.schema import MULT
from imp_core.errors import ChangeFeedUnavailableError, ConfigError, ImpError, SourceError, UnsupportedError, first_line
from imp_core.sources import changelog, spark_cdf, storage

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

VERSION = changelog.VERSION
ENV_SCAN = "IMP_SPARK_SCAN"

# reader features the platform reads correctly (Spark through the connector; delta-rs for the log)
SUPPORTED_READER_FEATURES = frozenset({"deletionVectors", "columnMapping", "timestampNtz", "v2Checkpoint",
                                       "vacuumProtocolCheck", "typeWidening", "typeWidening-preview", "variantType",
                                       "variantType-preview"})
# reader features under which a file's Parquet content is still exactly the table's rows (deletion vectors: only
# while no file of the version has one)
_DIRECT_READER_FEATURES = frozenset({"timestampNtz", "v2Checkpoint", "vacuumProtocolCheck", "deletionVectors"})
# reader features delta-rs' Arrow dataset reads (it refuses every other listed feature, in use or not)
_DELTA_RS_READER_FEATURES = frozenset({"timestampNtz", "variantType", "variantType-preview"})
# reader features under which delta-rs reads a change feed (it refuses type widening; column mapping is a property)
_DELTA_RS_CDF_READER_FEATURES = SUPPORTED_READER_FEATURES - {"columnMapping", "typeWidening", "typeWidening-preview"}


class SparkRead(enum.Enum):
    """How Spark reads a table version."""

    PARQUET = "parquet"  # the version's Parquet files, pruned by statistics
    CONNECTOR = "connector"  # Delta Lake's Spark connector (deletion vectors, column mapping)


@dataclass(frozen=True)
class Choice:
    """The readers of one table version: Spark's, and whether this process may read it with delta-rs."""

    spark: SparkRead
    in_process: bool
    why: str


class DataFile(Protocol):
    """A data file of a pinned version, as the reader reads it (``delta.FileStats``)."""

    @property
    def uri(self) -> str: ...


class CommitInfo(Protocol):
    """A commit of a table, as the reader estimates a change range by it (``delta.Commit``)."""

    @property
    def rows(self) -> int | None: ...


class Table(Protocol):
    """What the reader reads of a registered table: ``delta.DeltaSource``, which builds on this module (so this
    module names what it needs rather than importing it)."""

    name: str
    path: str
    spark_supplier: Callable[[], SparkSession] | None
    read_choices: dict[tuple[int, str], Choice]

    @property
    def latest(self) -> Any: ...

    def table_at(self, version: int) -> Any: ...

    def protocol(self, version: int | None = None) -> Any: ...

    def schema(self, version: int | None = None) -> pa.Schema: ...

    def partition_columns(self, version: int | None = None) -> list[str]: ...

    def physical_names(self, version: int | None = None) -> dict[str, str]: ...

    def files(self, version: int) -> Sequence[DataFile]: ...

    def commits(self, after: int, upto: int) -> Sequence[CommitInfo]: ...

    def metadata(self, version: int) -> tuple[pa.Schema, list[str], bool, bool]: ...

    def check_version(self, version: int) -> None: ...

    def check_cdf_range(self, after: int, upto: int) -> None: ...

    def carry_metadata(self, after: int, upto: int) -> None: ...


def require_readable(source: Table, version: int | None = None) -> None:
    """Refuse a table that uses a Delta reader feature the platform cannot read correctly (one line naming it)."""
    features = _reader_features(source, version)
    unknown = sorted(features - SUPPORTED_READER_FEATURES)
    if unknown:
        raise UnsupportedError(f"table {source.name} uses Delta reader feature(s) {', '.join(unknown)}, which imp "
                               f"does not support (supported: {', '.join(sorted(SUPPORTED_READER_FEATURES))}); "
                               f"register a copy written without it")


def choice(source: Table, version: int) -> Choice:
    """The readers of ``version`` (cached per source: a version never changes)."""
    mode = (os.environ.get(ENV_SCAN) or "auto").lower()
    if mode not in ("auto", "connector"):
        raise ConfigError(f"{ENV_SCAN} must be auto or connector, got {mode!r}")
    key = (version, mode)
    cached = source.read_choices.get(key)
    if cached is not None:
        return cached
    require_readable(source, version)
    features = _reader_features(source, version)
    mapped = bool(source.physical_names(version))
    in_process = not mapped and features <= _DELTA_RS_READER_FEATURES
    if mode == "connector":
        found = Choice(SparkRead.CONNECTOR, in_process, f"{ENV_SCAN}=connector")
    elif mapped:
        found = Choice(SparkRead.CONNECTOR, in_process, "column mapping: files hold physical column names")
    elif features - _DIRECT_READER_FEATURES:
        found = Choice(SparkRead.CONNECTOR, in_process,
                       f"reader feature(s) {', '.join(sorted(features - _DIRECT_READER_FEATURES))}")
    elif "deletionVectors" in features and _has_deletion_vectors(source, version):
        found = Choice(SparkRead.CONNECTOR, in_process, "deletion vectors on some files")
    else:
        found = Choice(SparkRead.PARQUET, in_process, "plain Parquet files")
    source.read_choices[key] = found
    return found


def dataframe(spark: SparkSession, source: Table, version: int,
              files: Sequence[DataFile] | None = None) -> DataFrame:
    """The table at ``version`` as a Spark DataFrame.

    Read from its Parquet files (only ``files``, the caller's pruning by statistics, when given) or through Delta
    Lake's connector (``versionAsOf``; ``files`` is ignored and the connector skips files for any filter the caller
    puts on the result), as :func:`choice` decides. An empty table is an empty relation built in the JVM (no Python
    on executors).
    """
    if storage.is_s3(source.path):
        storage.configure_spark(spark)
    if choice(source, version).spark is SparkRead.PARQUET:
        every = source.files(version)
        chosen = every if files is None else files
        if every:
            from pyspark.sql import functions as F  # Spark starts only when a scan is asked for
            from pyspark.sql.pandas.types import from_arrow_schema

            schema = pa.schema([f.with_nullable(True) for f in source.schema(version)])
            reader = spark.read.schema(from_arrow_schema(schema))
            if source.partition_columns(version):
                reader = reader.option("basePath", storage.spark_uri(source.path))
            df = reader.parquet(*[storage.spark_uri(f.uri) for f in (chosen or every[:1])])
            return df if chosen else df.where(F.lit(False))  # nothing survived pruning: no file is read
    return spark.read.format("delta").option("versionAsOf", version).load(storage.spark_uri(source.path))


def relation_sql(source: Table, version: int, predicate: str | None = None, view: str | None = None) -> str:
    """``SELECT * FROM`` the table at ``version`` as Spark SQL text: temporary view ``view`` (registered from
    :func:`dataframe` for a Parquet read) when given, else Delta's connector; filtered by ``predicate``."""
    uri = storage.spark_uri(source.path).replace("`", "``")
    text = f"SELECT * FROM `{view}`" if view else f"SELECT * FROM delta.`{uri}` VERSION AS OF {int(version)}"
    return f"{text} WHERE {predicate}" if predicate else text


def batches(source: Table, version: int, columns: list[str]) -> Iterator[pa.RecordBatch]:
    """``columns`` of the table at ``version``, batch by batch in this process (the caller holds one batch, not the
    table). Only for versions :func:`choice` lets this process read (``in_process``).

    Raises:
        SourceError: The version cannot be read here (ask :func:`choice` first), or a data file is missing.
    """
    if not choice(source, version).in_process:
        raise SourceError(f"table {source.name}: version {version} cannot be read in this process "
                          f"({choice(source, version).why}); read it with Spark")
    try:
        yield from source.table_at(version).to_pyarrow_dataset().to_batches(columns=columns)
    except (OSError, pa.ArrowException) as e:
        raise SourceError(f"table {source.name}: a data file of version {version} cannot be read "
                          f"({storage.redact(first_line(e))}); files removed outside Delta (VACUUM with a short "
                          f"retention, or by hand) need FSCK REPAIR TABLE or a restore") from e


# -- change feeds -------------------------------------------------------------------------------------------------


def changes(source: Table, after: int, upto: int, columns: list[str] | None = None,
            predicate: str | None = None) -> pa.Table:
    """Change rows of versions ``(after, upto]`` with ``__mult`` (+1/-1) and ``__version`` columns.

    ``predicate`` (DataFusion SQL over the table's columns) is a pre-filter hint: rows failing it *may* be left
    out (selection push-down); callers apply their exact filter afterwards.
    """
    source.check_version(upto)
    fast = _from_log(source, after, upto, columns)
    if fast is not None:
        return fast
    require_readable(source, upto)
    schema = source.schema(upto)
    wanted = columns if columns is not None else schema.names
    missing = [c for c in wanted if c not in schema.names]
    if missing:
        raise SourceError(f"table {source.name}: column(s) {', '.join(missing)} do not exist at version {upto}")
    source.check_cdf_range(after, upto)
    if after == upto:
        return empty_changes(schema, wanted)
    if _needs_spark(source, after, upto):
        return signed(source.name, _from_spark(source, after, upto, wanted), wanted, schema)
    return signed(source.name, _from_delta_rs(source, after, upto, wanted, predicate), wanted, schema)


def _needs_spark(source: Table, after: int, upto: int) -> bool:
    """Column mapping or type widening (delta-rs cannot read such feeds), or more change rows than the switch-over
    point."""
    if source.physical_names(upto) or _reader_features(source, upto) - _DELTA_RS_CDF_READER_FEATURES:
        return True
    threshold = spark_cdf.spark_rows_threshold()
    estimated = sum(c.rows or 0 for c in source.commits(after, upto))
    return estimated >= threshold > 0


def _from_spark(source: Table, after: int, upto: int, wanted: list[str]) -> pa.Table:
    if source.spark_supplier is None:
        raise ChangeFeedUnavailableError(
            f"table {source.name}: the change feed for versions {after + 1}..{upto} must be read with Spark, and "
            f"this source was opened without one; open it with DeltaSource(..., spark=get_spark)")
    try:
        return spark_cdf.read_change_feed(source.spark_supplier(), source.path, after, upto, wanted)
    except Exception as e:  # Spark's AnalysisException etc.
        if isinstance(e, ImpError):
            raise
        raise ChangeFeedUnavailableError(
            f"table {source.name}: the change feed for versions {after + 1}..{upto} cannot be read by Spark "
            f"(vacuumed or expired?): {storage.redact(first_line(e))}") from e


def _from_log(source: Table, after: int, upto: int, columns: list[str] | None) -> pa.Table | None:
    """The fast path (``changelog.py``), as signed change rows; None when the range needs delta-rs.

    The reader gives up on any metaData action inside the range, so when it succeeds the table's schema,
    partitioning and CDF setting at ``upto`` are those at ``after``: they are carried forward instead of
    opening the table at ``upto`` (which replays its log). An eager run of many small batches then opens the
    table once, not once per batch.
    """
    root = changelog.local_root(source.path)
    if root is None or after < 0 or after > upto:
        return None
    schema, partition_columns, mapped, cdf = source.metadata(after)  # checks the reader features too
    wanted = columns if columns is not None else schema.names
    if not cdf or any(c not in schema.names for c in wanted) or mapped:
        return None  # column mapping: files hold physical names; the slow paths map them
    if after == upto:
        return empty_changes(schema, wanted)
    rows = changelog.read_range(root, after, upto, wanted, schema, partition_columns)
    if rows is None:
        return None
    source.carry_metadata(after, upto)
    return rows


def _from_delta_rs(source: Table, after: int, upto: int, wanted: list[str], predicate: str | None) -> pa.Table:
    try:
        # delta-rs resolves names through DataFusion, which lower-cases unquoted identifiers
        quoted = ['"' + c.replace('"', '""') + '"' for c in wanted]
        reader = source.latest.load_cdf(starting_version=after + 1, ending_version=upto,
                                        columns=quoted + ["_change_type", "_commit_version"], predicate=predicate)
        return pa.RecordBatchReader.from_stream(reader).read_all()
    except Exception as e:
        raise ChangeFeedUnavailableError(
            f"table {source.name}: the change feed for versions {after + 1}..{upto} cannot be read (vacuumed or "
            f"expired?): {storage.redact(first_line(e))}") from e


def signed(table: str, raw: pa.Table, wanted: list[str], schema: pa.Schema) -> pa.Table:
    """Map ``_change_type`` to the signed multiplicity ``__mult``; keep ``_commit_version`` as ``__version``."""
    mult, unknown = changelog.multiplicity(raw.column("_change_type"))
    if unknown:
        raise SourceError(f"table {table}: change feed has {unknown} rows of an unknown change type")
    cols = [raw.column(c).cast(schema.field(c).type) for c in wanted]
    fields = [schema.field(c) for c in wanted]
    return pa.table(cols + [mult, raw.column("_commit_version").cast(pa.int64())],
                    schema=pa.schema(fields + [pa.field(MULT, pa.int64(), False), pa.field(VERSION, pa.int64())]))


def empty_changes(schema: pa.Schema, columns: list[str]) -> pa.Table:
    fields = [schema.field(c) for c in columns]
    return pa.schema(fields + [pa.field(MULT, pa.int64(), False), pa.field(VERSION, pa.int64())]).empty_table()


def _reader_features(source: Table, version: int | None) -> set[str]:
    return set(source.protocol(version).reader_features or [])


def _has_deletion_vectors(source: Table, version: int) -> bool:
    return pa.RecordBatchReader.from_stream(source.table_at(version).deletion_vectors()).read_all().num_rows > 0


__all__ = ["ENV_SCAN", "SUPPORTED_READER_FEATURES", "Choice", "SparkRead", "batches", "changes", "choice",
           "dataframe", "empty_changes", "relation_sql", "require_readable", "signed"]

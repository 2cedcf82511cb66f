"""What the catalog hands out and takes in: records of tables, sketches, versions, operator state and runs.

See docs/ARCHITECTURE.md, "State and versions".
"""

from __future__ import annotations

import getpass
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Union

from imp_core.errors import UsageError

METHODS = ("capture", "incremental", "recapture", "repartition")
FINAL_RUN_STATUSES = ("succeeded", "failed")


@dataclass(frozen=True)
class TableRecord:
    """A registered Delta table and the latest version of it the platform has observed."""

    name: str
    path: str
    registered_at: datetime
    schema_json: Any
    observed_version: int | None
    observed_at: datetime | None
    layout_maintenance: bool = True  # the nightly layout task may re-cluster it


@dataclass(frozen=True)
class SketchRecord:
    """A registered sketch: the query and how its provenance is partitioned and maintained."""

    id: int
    name: str
    sql: str
    dialect: str | None
    template_key: str
    plan_json: Any
    partitions: Any
    safety: Any
    strategy: str
    created_at: datetime
    unusable_reason: str | None = None
    unusable_at: datetime | None = None
    signature: Any = None  # the Spark plan signature (imp_core.publish.signature); None: not computed
    published_version: int | None = None  # latest version published for the Spark extension

    @property
    def usable(self) -> bool:
        """False once the sketch was marked unusable (``Catalog.mark_unusable``)."""
        return self.unusable_reason is None


@dataclass(frozen=True)
class NewVersion:
    """A sketch version about to be committed (the catalog assigns its number).

    Attributes:
        table_versions: Delta version of each input table this sketch version reflects.
        bits: One bitset per partitioned table (``Sketch.bits``).
        fragments: Fragment ids per partitioned table (``Sketch.to_json``).
        method: ``capture``, ``incremental`` or ``recapture``.
        reason: Why a recapture happened (e.g. the change feed was vacuumed).
        delta_rows: Change rows processed to produce this version.
        duration_ms: Wall time of the capture or maintenance.
        run_id: The maintenance run that produced it.
        table_identities: Per table, ``{"id": Delta metadata id, "path": registered path}`` the table versions
            refer to.
        state_options: Engine options that shaped the operator state (``imp_core.maintenance.options``).
        partitions: The partitions (``PartitionSet.to_json``) the fragment ids refer to.
        fragment_rows: Per partitioned table, the table's rows in each fragment at ``table_versions``; None when not
            tracked.
        state_placement: Per stateful operator, where its state lives and how big it is (``{"where": "memory" |
            "external", "bytes": n, "rows": n}``); None when not recorded.
    """

    table_versions: Mapping[str, int]
    bits: Mapping[str, bytes]
    fragments: Mapping[str, Sequence[int]]
    method: str
    reason: str | None = None
    delta_rows: int = 0
    duration_ms: float | None = None
    run_id: int | None = None
    table_identities: Mapping[str, Mapping[str, str]] | None = None
    state_options: Mapping[str, Any] | None = None
    partitions: Any = None
    fragment_rows: Mapping[str, Sequence[int]] | None = None
    state_placement: Mapping[str, Mapping[str, Any]] | None = None

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise UsageError(f"unknown sketch version method {self.method!r}; use one of {', '.join(METHODS)}")


@dataclass(frozen=True)
class VersionRecord:
    """A committed, immutable sketch version."""

    sketch_id: int
    version: int
    table_versions: dict[str, int]
    bits: dict[str, bytes]
    fragments: dict[str, list[int]]
    method: str
    reason: str | None
    delta_rows: int
    duration_ms: float | None
    run_id: int | None
    created_at: datetime
    table_identities: dict[str, dict[str, str]] | None = None  # None: committed before identities were recorded
    state_options: dict[str, Any] | None = None  # None: committed before options were recorded
    partitions: Any = None  # None: the sketch's registered partitions (committed before versions recorded them)
    fragment_rows: dict[str, list[int]] | None = None  # None: not tracked
    state_placement: dict[str, dict[str, Any]] | None = None  # None: not recorded (every operator in memory)


@dataclass(frozen=True)
class StateBlob:
    """Serialized state of one stateful operator, as handed back by the operator.

    ``checksum``, when given, is the sha256 hex of ``payload`` and is checked before writing. The catalog stores a
    keyed checksum instead (:mod:`imp_core.security.integrity`); a blob read back has been verified against it and
    carries the sha256 of its payload.

    ``chunks`` are the state chunks the payload names (format version 2), by digest, each with a function giving its
    bytes: called only when the catalog does not hold that chunk for the sketch yet, so a chunk kept from version to
    version is written once. A blob read back carries functions that read its chunks from the catalog. The parts of
    a blob of format version 3 are among them (stored by its writer already); ``parts_bytes`` is their size, which
    the catalog counts in the state's ``size_bytes``.
    """

    operator_id: str
    format: str
    format_version: int
    payload: bytes
    checksum: str | None = None
    chunks: Mapping[str, Callable[[], bytes]] = field(default_factory=dict)
    parts_bytes: int = 0  # bytes of the parts (among ``chunks``) its writer stored with it: part of its stored size


PartSink = Callable[[str, bytes], None]
"""Stores one part of a state frame (its bytes, named by their SHA-256) in the transaction committing the state."""

StateWriter = Callable[[PartSink], Sequence[StateBlob]]
"""Operator state written inside the committing transaction: large frames go to the sink as parts as they are
encoded (one at a time, so no encoded copy of the whole state is held), and the blobs naming them come back."""

States = Union[Sequence[StateBlob], StateWriter]


@dataclass(frozen=True)
class RunRecord:
    """One capture or maintenance attempt."""

    id: int
    sketch_id: int | None
    strategy: str | None
    trigger: str | None
    triggered_by: str | None
    from_version: int | None
    to_version: int | None
    table_versions_from: dict[str, int] | None
    table_versions_to: dict[str, int] | None
    delta_rows: int | None
    status: str
    error: str | None
    started_at: datetime
    finished_at: datetime | None
    timings: dict[str, Any] | None


def unusable_message(name: str, reason: str) -> str:
    """The one-line error for using or maintaining an unusable sketch: what happened and what to do."""
    return (f"sketch {name} is unusable: {reason}; queries run without it until it is registered again "
            f"(`imp sketch create {name} --replace ...`)")


def default_triggered_by() -> str:
    """``user@host`` of this process, for ``maintenance_run.triggered_by``."""
    try:
        user = getpass.getuser()
    except (OSError, KeyError):  # no login name in some containers
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def table_record(row: Mapping[Any, Any]) -> TableRecord:
    return TableRecord(row["name"], row["path"], row["registered_at"], row["schema_json"], row["observed_version"],
                       row["observed_at"], bool(row.get("layout_maintenance", True)))


def sketch_record(row: Mapping[Any, Any]) -> SketchRecord:
    return SketchRecord(row["id"], row["name"], row["sql"], row["dialect"], row["template_key"], row["plan_json"],
                        row["partitions"], row["safety"], row["strategy"], row["created_at"],
                        row.get("unusable_reason"), row.get("unusable_at"), row.get("signature"),
                        row.get("published_version"))


def version_record(row: Mapping[Any, Any]) -> VersionRecord:
    return VersionRecord(
        sketch_id=row["sketch_id"],
        version=row["version"],
        table_versions={t: int(v) for t, v in row["table_versions"].items()},
        bits={t: bytes.fromhex(h) for t, h in row["bits"].items()},
        fragments={t: [int(f) for f in frags] for t, frags in row["fragments"].items()},
        method=row["method"],
        reason=row["reason"],
        delta_rows=row["delta_rows"],
        duration_ms=row["duration_ms"],
        run_id=row["run_id"],
        created_at=row["created_at"],
        table_identities=row.get("table_identities"),
        state_options=row.get("state_options"),
        partitions=row.get("partitions"),
        fragment_rows=row.get("fragment_rows"),
        state_placement=row.get("state_placement"),
    )


def run_record(row: Mapping[Any, Any]) -> RunRecord:
    return RunRecord(**{f: row[f] for f in RunRecord.__dataclass_fields__})


__all__ = ["FINAL_RUN_STATUSES", "METHODS", "NewVersion", "PartSink", "RunRecord", "SketchRecord", "StateBlob",
           "StateWriter", "States", "TableRecord",
           "VersionRecord", "default_triggered_by", "run_record", "sketch_record", "table_record", "unusable_message",
           "version_record"]

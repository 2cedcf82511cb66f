"""Where each stateful operator's state lives: in the maintaining process, or in Delta tables beside the data.

A sketch's operators may hold ``IMP_STATE_MEMORY_BUDGET`` bytes of state in memory (default: a quarter of the
machine's memory). At every capture each grouped aggregation, DISTINCT, top-k per group and anti join (the
operators with an external form, ``engine/operators/registry.py``) is sized: from the tables' row counts in the Delta
log first (a group count never exceeds its input's rows; a top-k per group and an anti join keep every input row),
and where that bound does not fit, from an approximate count of its groups (input rows) on Spark. The largest are
placed *external* until the rest fits; the others stay in memory. Every version records where each
operator's state lives and how big it is (``sketch_version.state_placement``), and a load places them as recorded.

External state lives at ``IMP_STATE_LOCATION`` (default: ``_imp_state`` beside the sketch's first table, on the same
storage with the same credentials), one folder per capture: ``<root>/<sketch>-r<run>/<operator>/<component>``.
See docs/ARCHITECTURE.md, "Where state lives".
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from imp_core.engine.external import ExternalOperator
from imp_core.engine.operators.registry import can_be_external
from imp_core.engine.pipeline import Pipeline
from imp_core.errors import StateError
from imp_core.maintenance.context import ServiceContext
from imp_core.plan.nodes import Aggregate, AntiJoin, GroupTopK, Plan
from imp_core.sources import storage
from imp_core.sources.delta import DeltaSource

if TYPE_CHECKING:
    from imp_core.spark.state_store import DeltaGroupStore

STATE_DIR = "_imp_state"
GROUP_BYTES = 96  # per group of a keyed aggregation: key, accumulators, hash index, one F_g pair (85 B measured)
COLUMN_BYTES = 16  # per further key or accumulator column of a group
ROW_BYTES = 64  # per input row of a top-k per group: annotation, its text, multiplicity, group hash
STORED_PER_GROUP = 2  # stored rows per group of an aggregation's external state (groups and F_g, about one each)


def group_bytes(node: Plan) -> int:
    """Bytes one group of ``node``'s operator (one input row of a top-k per group) holds in memory (an estimate
    from its layout)."""
    if isinstance(node, GroupTopK):
        return ROW_BYTES + COLUMN_BYTES * len(node.child.names)
    if isinstance(node, AntiJoin):  # per left row (and right key): the left rows dominate
        return ROW_BYTES + COLUMN_BYTES * len(node.left.names)
    columns = len(node.keys) + len(node.aggs) if isinstance(node, Aggregate) else len(node.names)
    return GROUP_BYTES + COLUMN_BYTES * max(0, columns - 2)


def stored_bytes(node: Plan, rows: int) -> int:
    """The bytes in memory of an external state of ``rows`` stored rows."""
    return rows * group_bytes(node) // (1 if isinstance(node, (GroupTopK, AntiJoin)) else STORED_PER_GROUP)


def decide(parts: ServiceContext, pipeline: Pipeline, sources: Mapping[str, DeltaSource],
           versions: Mapping[str, int]) -> dict[str, int]:
    """The estimated bytes of every operator that can keep its state externally, by node path, given the tables at
    ``versions``. Row counts come from the Delta log; Spark counts groups only where those bounds exceed the
    budget."""
    budget = parts.settings.memory_budget
    rows = {t: s.row_count(versions[t]) for t, s in sources.items()}
    estimates: dict[str, int] = {}
    for path, node in pipeline.node_paths():
        if can_be_external(node):
            bound = max((rows.get(t, 0) for t in node.tables()), default=0)
            estimates[path] = bound * group_bytes(node)
    if budget == 0 or sum(estimates.values()) <= budget:
        return estimates
    backend = parts.backend(sources)
    for path in estimates:
        if estimates[path] > budget // 4:
            groups = pipeline.count_groups(path, backend, dict(versions))
            if groups is not None:
                estimates[path] = groups * group_bytes(pipeline.stage_at(path).node)
    return estimates


def external_paths(estimates: Mapping[str, int], budget: int) -> frozenset[str]:
    """The largest operators, placed external until the others fit the budget (all of them with a budget of 0)."""
    if budget == 0:
        return frozenset(estimates)
    out: set[str] = set()
    held = sum(estimates.values())
    for path, size in sorted(estimates.items(), key=lambda kv: -kv[1]):
        if held <= budget:
            break
        out.add(path)
        held -= size
    return frozenset(out)


def state_root(parts: ServiceContext, sources: Mapping[str, DeltaSource]) -> str:
    """Where external state lives: ``IMP_STATE_LOCATION``, else ``_imp_state`` beside the sketch's first table."""
    if parts.settings.state_location:
        return parts.settings.state_location.rstrip("/")
    first = sources[sorted(sources)[0]].path.rstrip("/")
    return posixpath.join(posixpath.dirname(first), STATE_DIR)


def bind_new(parts: ServiceContext, pipeline: Pipeline, sources: Mapping[str, DeltaSource], sketch: str, run_id: int,
             estimates: Mapping[str, int]) -> None:
    """Give a capture's external operators new stores at ``<root>/<sketch>-r<run_id>/<operator>``."""
    if not pipeline.external:
        return
    from imp_core.spark.state_store import DeltaGroupStore, bucket_count  # lazy start of Spark

    root = f"{state_root(parts, sources)}/{_safe(sketch)}-r{run_id}"

    def store_of(op: ExternalOperator) -> DeltaGroupStore:
        path = op.op_id.split("@", 1)[1]
        groups = estimates.get(path, 0) // max(1, group_bytes(pipeline.stage_at(path).node))
        return DeltaGroupStore(parts.spark, f"{root}/{_safe(op.op_id)}", op.key_names, op.component_schemas(),
                               buckets=bucket_count(groups))

    pipeline.bind_stores(store_of)


def for_capture(parts: ServiceContext, build: Callable[[frozenset[str]], Pipeline], sources: Mapping[str, DeltaSource],
                versions: Mapping[str, int], sketch: str, run_id: int) -> Pipeline:
    """The pipeline a capture at ``versions`` runs: ``build(external paths)`` with the operators placed by
    :func:`decide`, the external ones bound to new stores."""
    probe = build(frozenset())
    estimates = decide(parts, probe, sources, versions)
    external = external_paths(estimates, parts.settings.memory_budget)
    if not external:
        return probe
    parts.progress(f"state of {', '.join(sorted(external))} is placed in Delta tables (about "
                   f"{sum(estimates[p] for p in external) >> 20} MB, over the budget of "
                   f"{parts.settings.memory_budget >> 20} MB)")
    pipeline = build(external)
    bind_new(parts, pipeline, sources, sketch, run_id, estimates)
    return pipeline


def rebalance(parts: ServiceContext, pipeline: Pipeline, sources: Mapping[str, DeltaSource], sketch: str,
              run_id: int) -> Pipeline:
    """A loaded pipeline placed for its state's measured sizes: in-memory operators by their bytes, external ones by
    their tables' rows (Delta logs); the largest external until the rest fits the budget. An operator that moves is
    written to its new place now (into new tables at ``<root>/<sketch>-r<run_id>``, or read back into memory)."""
    sizes: dict[str, int] = {}
    for path, node in pipeline.node_paths():
        if not can_be_external(node):
            continue
        op = pipeline.stage_at(path).op
        if isinstance(op, ExternalOperator):
            rows, _ = _stored(op.store.reference())
            sizes[path] = stored_bytes(node, rows)
        else:
            sizes[path] = op.state_size_bytes()  # type: ignore[attr-defined]
    external = external_paths(sizes, parts.settings.memory_budget)
    if external == pipeline.external:
        return pipeline
    moved = sorted(external ^ pipeline.external)
    parts.progress(f"sketch {sketch}: moving the state of {', '.join(moved)} "
                   f"({'into Delta tables' if external - pipeline.external else 'into memory'}) for its size")
    if not external - pipeline.external:
        return pipeline.placed(external, lambda op: op.store)
    from imp_core.spark.state_store import DeltaGroupStore, bucket_count  # lazy start of Spark

    root = f"{state_root(parts, sources)}/{_safe(sketch)}-r{run_id}"
    return pipeline.placed(external, lambda op: DeltaGroupStore(
        parts.spark, f"{root}/{_safe(op.op_id)}", op.key_names, op.component_schemas(),
        buckets=bucket_count(sizes[op.op_id.split("@", 1)[1]] // max(1, GROUP_BYTES))))


def bind_saved(parts: ServiceContext, pipeline: Pipeline) -> None:
    """Give a loaded pipeline's external operators the stores their saved state names.

    Raises:
        StateError: A saved external state has no reference, or one this imp cannot read.
    """
    if not pipeline.external:
        return
    from imp_core.spark.state_store import DeltaGroupStore  # lazy start of Spark

    def store_of(op: ExternalOperator) -> DeltaGroupStore:
        reference = op.reference
        if not reference:
            raise StateError(f"operator {op.op_id}: its saved state names no external tables; recapture the sketch")
        return DeltaGroupStore.from_reference(parts.spark, op.key_names, op.component_schemas(), reference,
                                              parts.settings.state_retention)

    pipeline.bind_stores(store_of)


def recorded(pipeline: Pipeline) -> dict[str, dict[str, Any]]:
    """Where each stateful operator's state lives now and how big it is (``sketch_version.state_placement``): bytes
    in memory, or the external tables' rows and bytes on storage (from their Delta logs)."""
    out: dict[str, dict[str, Any]] = {}
    external = {op.op_id for op in pipeline.external_operators()}
    for op in pipeline.stateful():
        if op.op_id in external:
            assert isinstance(op, ExternalOperator)
            reference = op.store.reference()
            rows, size = _stored(reference)
            out[op.op_id] = {"where": "external", "bytes": size, "rows": rows,
                             "folder": posixpath.basename(posixpath.dirname(str(reference["location"]).rstrip("/")))}
        else:
            out[op.op_id] = {"where": "memory", "bytes": int(op.state_size_bytes())}
    return out


def external_of(placement: Mapping[str, Mapping[str, Any]] | None) -> frozenset[str]:
    """The node paths of the operators a version recorded as external."""
    return frozenset(op.split("@", 1)[1] for op, p in (placement or {}).items() if p.get("where") == "external")


def clean_up(parts: ServiceContext, sketch: str, sources: Mapping[str, DeltaSource]) -> list[str]:
    """Remove the run folders ``<sketch>-r<run>`` under the state root that no version whose state the catalog keeps
    names (of this sketch, or of a live sketch whose folders are named alike) and no running run may be writing: the
    state of earlier captures once retention dropped their versions, of a dropped sketch of the same name, and of a
    job that died before its commit. Call with the sketch's lock held, after its run finished. Only the current
    state root is looked at. Returns the folders removed.

    Nothing is removed while a kept version predates the recorded folders (``state_placement`` without ``folder``):
    which folder it reads is then unknown.
    """
    catalog = parts.catalog
    safe = _safe(sketch)
    keep: set[str] = set()
    ever_external = False
    for record in catalog.list_sketches():
        if _safe(record.name) != safe:
            continue
        versions = catalog.versions(record.id)
        ever_external |= any(external_of(v.state_placement) for v in versions)
        for version in versions[-max(1, parts.settings.state_retention):]:
            for placed in (version.state_placement or {}).values():
                if placed.get("where") != "external":
                    continue
                if "folder" not in placed:
                    return []
                keep.add(str(placed["folder"]))
    if not ever_external:
        return []
    root = state_root(parts, sources)
    spark = None if storage.is_local(root) else parts.spark
    running = catalog.running_ids()
    pattern = re.compile(rf"{re.escape(safe)}-r(\d+)")
    removed = []
    for name in storage.child_dirs(root, spark):
        found = pattern.fullmatch(name)
        if found is None or name in keep or int(found.group(1)) in running:
            continue
        storage.remove_tree(f"{root}/{name}", spark)
        removed.append(name)
    return removed


def _stored(reference: Mapping[str, Any]) -> tuple[int, int]:
    """Rows and bytes of an external state at its pinned version: the live rows the reference counts, the bytes of
    the table's files from its Delta log."""
    rows = int(sum((reference.get("rows") or {}).values()))
    if reference.get("store") != "delta" or reference.get("version") is None:
        return rows, 0
    from imp_core.spark.state_store import TABLE
    files = DeltaSource(TABLE, f"{reference['location']}/{TABLE}").files(int(reference["version"]))
    return rows, sum(f.size_bytes for f in files)


def _safe(name: str) -> str:
    return re.sub(r"[^0-9A-Za-z_.-]", "_", name)


__all__ = ["STATE_DIR", "bind_new", "bind_saved", "clean_up", "decide", "external_of", "external_paths", "group_bytes",
           "recorded", "state_root"]

"""Loading a registered sketch: its plan (stored with it, or parsed again from its SQL for sketches registered
before plans were stored), partitions, tables, and its operators with their saved state.

See docs/ARCHITECTURE.md, "State and versions".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa

from imp_core.catalog import SketchRecord, VersionRecord
from imp_core.engine.pipeline import Pipeline, plan_fingerprint
from imp_core.errors import ImpError, PlanError, StateError, first_line
from imp_core.maintenance import placement
from imp_core.maintenance.changes import used_columns
from imp_core.maintenance.context import ServiceContext
from imp_core.maintenance.options import with_state_options
from imp_core.plan.nodes import Plan
from imp_core.plan.safety import SignAssumption
from imp_core.plan.serialize import plan_from_json
from imp_core.plan.sql import Query, parse_query
from imp_core.sketch.partition import PartitionSet
from imp_core.sketch.sketch import Sketch
from imp_core.sources.delta import DeltaSource
from imp_core.sources.schema import schema_from_json


@dataclass(frozen=True)
class LoadedSketch:
    """A registered sketch ready to maintain: its record, query, partitions, tables and safety assumptions."""

    record: SketchRecord
    query: Query
    partitions: PartitionSet
    sources: dict[str, DeltaSource]
    schemas: dict[str, pa.Schema]  # the tables' schemas at registration
    assumptions: tuple[SignAssumption, ...]

    @property
    def name(self) -> str:
        return self.record.name

    @property
    def plan(self) -> Plan:
        return self.query.plan

    def used_columns(self, table: str) -> list[str]:
        return used_columns(self.plan, table)

    def at(self, version: VersionRecord) -> LoadedSketch:
        """The sketch with the partitions ``version``'s fragment ids refer to (a repartition changes them)."""
        return replace(self, partitions=version_partitions(self.record, version))


def version_partitions(record: SketchRecord, version: VersionRecord) -> PartitionSet:
    """The partitions a version's fragment ids refer to: its own, or the sketch's registered ones for versions
    committed before versions recorded them."""
    return PartitionSet.from_json(version.partitions if version.partitions is not None else record.partitions)


def load_sketch(parts: ServiceContext, name: str) -> LoadedSketch:
    """The live sketch ``name``, its plan read from the catalog (no SQL parsing for sketches with a stored plan).

    Raises:
        NotFoundError: No live sketch has that name.
        PlanError: Neither the stored plan nor the SQL makes a plan with this imp, or a stored sign assumption is
            malformed.
    """
    record = parts.catalog.get_sketch(name)
    plan_json = record.plan_json or {}
    schemas = {t: schema_from_json(s) for t, s in plan_json.get("schemas", {}).items()}
    query = stored_query(record, schemas)
    assumptions = tuple(SignAssumption.parse(a) for a in (record.safety or {}).get("assumptions", ()))
    return LoadedSketch(record, query, PartitionSet.from_json(record.partitions), parts.sources(query.plan.tables()),
                        schemas, assumptions)


def stored_query(record: SketchRecord, schemas: Mapping[str, pa.Schema]) -> Query:
    """The sketch's query: the plan stored at registration, else (a sketch registered before plans were stored, or
    a stored plan this imp cannot read) its SQL parsed against the schemas recorded with it.

    Raises:
        PlanError: Neither works; the sketch must be registered again.
    """
    plan_json = record.plan_json or {}
    stored = plan_json.get("ir")
    names = tuple(plan_json.get("output_names") or ())
    why = "no plan is stored with it"
    if stored is not None:
        try:
            plan = plan_from_json(stored)
            return Query(plan, names or plan.names, record.sql)
        except ImpError as e:
            why = f"its stored plan cannot be read ({first_line(e)})"
    try:
        return parse_query(record.sql, schemas, record.dialect or "spark")
    except ImpError as e:
        raise PlanError(f"sketch {record.name} cannot be loaded: {why}, and its SQL does not parse with this imp "
                        f"({first_line(e)}); create it again (`imp sketch create {record.name} --replace ...`)") from e


def pipeline(parts: ServiceContext, loaded: LoadedSketch, options: Mapping[str, Any],
             external: frozenset[str] = frozenset()) -> Pipeline:
    """The sketch's operators, configured with the state-shaping ``options`` recorded with its state.

    Raises:
        StateError: The options are not this imp's, or the plan's operators are not those the sketch was captured
            with (a recapture follows).
    """
    opts = with_state_options(parts.settings.optimizations, options, loaded.name)
    built = Pipeline.configured(loaded.plan, loaded.partitions, opts, external)
    expected = (loaded.record.plan_json or {}).get("fingerprint")
    # recorded at registration, under the registered partitions (a repartition changes the bounds, not the plan)
    registered = built.fingerprint if loaded.partitions.to_json() == loaded.record.partitions else \
        plan_fingerprint(loaded.plan, PartitionSet.from_json(loaded.record.partitions))
    if expected and expected != registered:
        raise StateError(f"sketch {loaded.name}: its plan no longer builds the operators it was captured with (imp "
                         f"was upgraded?); recapture the sketch")
    return built


def load_state(parts: ServiceContext, loaded: LoadedSketch, latest: VersionRecord) -> Pipeline:
    """The sketch's operators with the state saved with version ``latest``.

    Raises:
        StateError: The state is missing, corrupt, from another plan or options, or disagrees with the saved sketch
            (a recapture follows).
    """
    if latest.state_options is None:
        raise StateError(f"sketch {loaded.name} version {latest.version} was written by an older imp that did not "
                         f"record the engine options of its state")
    built = pipeline(parts, loaded, latest.state_options, placement.external_of(latest.state_placement))
    catalog = parts.catalog
    if not catalog.has_states(loaded.record.id, latest.version):
        raise StateError(f"sketch {loaded.name} version {latest.version} has no operator state (removed by "
                         f"retention?)")
    blobs = catalog.load_states(loaded.record.id, latest.version)
    sketch_id = loaded.record.id
    built.load_state_blobs({k: b.payload for k, b in blobs.items()},
                           fetch=lambda digest: catalog.load_chunk(sketch_id, digest))
    placement.bind_saved(parts, built)  # external state: the tables the sealed blobs name, at their pinned versions
    if built.sketch() != Sketch({t: tuple(f) for t, f in latest.fragments.items()}).to_global(loaded.partitions):
        raise StateError(f"sketch {loaded.name} version {latest.version}: the saved merge state does not match the "
                         f"saved sketch")
    return built


__all__ = ["LoadedSketch", "load_sketch", "load_state", "pipeline", "stored_query", "version_partitions"]

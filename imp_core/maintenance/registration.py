"""Registration: tables under a name, and sketches (SQL parsed once, safety checked, bounds picked, version 1
captured on Spark and committed with its plan and operator state).

See docs/ARCHITECTURE.md, "Data flow".
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from dataclasses import replace as replace_field
from functools import cached_property
from typing import Any

import pyarrow as pa
from sqlglot import exp

from imp_core import inputs
from imp_core.catalog import SketchRecord, TableRecord, VersionRecord
from imp_core.engine.pipeline import Pipeline
from imp_core.engine.support import require_engine_support
from imp_core.errors import PlanError, UnsafeSketchError, UsageError, first_line
from imp_core.maintenance import placement
from imp_core.maintenance.context import ServiceContext
from imp_core.maintenance.options import state_options
from imp_core.maintenance.repartition import tracked_rows
from imp_core.maintenance.runs import maintenance_run, new_version, table_identities
from imp_core.maintenance.statistics import equi_depth, sign_oracle, violated_assumption
from imp_core.maintenance.strategy import Strategy
from imp_core.plan.columns import narrowed
from imp_core.plan.expr import kind_of_type
from imp_core.plan.nodes import explain
from imp_core.plan.safety import SafetyReport, require_safe
from imp_core.plan.serialize import plan_to_json
from imp_core.plan.sql import Query, parse_query, parse_statement
from imp_core.plan.template import template_key
from imp_core.publish import publisher, signature
from imp_core.sketch.bounds import KINDS
from imp_core.sketch.partition import Partition, PartitionSet, parse_bounds
from imp_core.sources import names, storage
from imp_core.sources.delta import DeltaSource
from imp_core.sources.schema import schema_from_json, schema_to_json


@dataclass(frozen=True)
class ParsedSql:
    """A query's text parsed once; everything a command needs from the text is derived from this parse."""

    sql: str
    dialect: str
    statement: exp.Expression

    @classmethod
    def parse(cls, sql: str, dialect: str = "spark") -> ParsedSql:
        """Raises: PlanError, UnsupportedError: The text is not one SELECT query in ``dialect``."""
        return cls(sql, dialect, parse_statement(sql, dialect))

    @classmethod
    def of(cls, sql: str | ParsedSql, dialect: str = "spark") -> ParsedSql:
        """``sql`` itself when it is parsed already, else ``sql`` parsed in ``dialect``."""
        return sql if isinstance(sql, ParsedSql) else cls.parse(sql, dialect)

    @cached_property
    def tables(self) -> frozenset[str]:
        """The (lower-cased) names of the tables the text reads."""
        return frozenset(t.name.lower() for t in self.statement.find_all(exp.Table))

    @cached_property
    def template(self) -> tuple[str, tuple[Any, ...]]:
        """The template key and its constants (:func:`imp_core.plan.template.template_key`)."""
        return template_key(self.sql, self.dialect, statement=self.statement)


@dataclass(frozen=True)
class Registration:
    """Everything a sketch registration checked before Spark starts."""

    name: str
    parsed: ParsedSql
    query: Query
    sources: dict[str, DeltaSource]
    versions: dict[str, int]
    schemas: dict[str, pa.Schema]
    targets: dict[str, str]  # table -> partition column
    report: SafetyReport


def register_table(parts: ServiceContext, name: str, path: str | None = None, replace: bool = False,
                   table: str | None = None) -> TableRecord:
    """Register a Delta table (Change Data Feed on) under a name usable in SQL, its current version observed.

    Give its ``path`` (local or ``s3://``; stored as an absolute URI) or its Spark catalog name ``table``
    (``CATALOG.DB.TABLE``), resolved to its location now and re-checked on every maintenance.
    """
    inputs.check_table_name(name)
    if (path is None) == (table is None):
        raise UsageError("give the table's PATH or --table CATALOG.DB.TABLE (one of them)")
    resolved_id = None
    if table is not None:
        path, resolved_id = names.resolve(parts.spark, table)
    path = storage.normalize(inputs.table_uri(str(path)))
    source = DeltaSource(name, path)
    version = source.current_version()
    source.require_cdf()
    source.require_readable_by_spark()
    table_id = source.table_id()
    if resolved_id is not None and resolved_id != table_id:
        raise UsageError(f"--table {table}: the catalog's table id {resolved_id} differs from the Delta log's "
                         f"{table_id} at {path}; is the metastore out of date?")
    catalog = parts.catalog
    catalog.register_table(name, path, schema_to_json(source.schema()), replace=replace)
    if table is not None:
        catalog.set_table_identity(name, table_id, table)
    catalog.observe_table_version(name, version, table_id)
    return catalog.get_table(name)


def analyze(parts: ServiceContext, parsed: ParsedSql) -> Query:
    """The query's plan against the registered tables (those it reads at their current schemas)."""
    registered = {t.name: t for t in parts.catalog.list_tables()}
    if not registered:
        raise UsageError("no tables are registered; register one with `imp table register NAME PATH`")
    schemas: dict[str, pa.Schema] = {}
    for name, rec in registered.items():
        if name.lower() in parsed.tables:
            schemas[name] = DeltaSource(name, rec.path).schema()  # the table as it is now
        elif rec.schema_json:
            schemas[name] = schema_from_json(rec.schema_json)  # only for error messages
    return parse_query(parsed.sql, schemas, parsed.dialect, statement=parsed.statement)


def check(parts: ServiceContext, name: str, sql: str | ParsedSql, on: list[str], fragments: int | None,
          bounds: list[str] | None, dialect: str, replace: bool = False) -> Registration:
    """Everything a registration checks before Spark starts: arguments, SQL, tables, columns, safety. The plan it
    returns reads only the columns the query uses and the partition columns (``plan/columns.py``).

    Raises:
        UsageError: Bad arguments, or a live sketch named ``name`` exists (and not ``replace``).
        PlanError: The SQL does not parse against the registered tables, or the column is not safe.
    """
    _check_arguments(parts, name, on, fragments, bounds, replace)
    parsed = ParsedSql.of(sql, dialect)
    query = analyze(parts, parsed)
    require_engine_support(query.plan)  # refuse what the engine cannot compute as Spark does, before Spark runs
    sources = parts.sources(query.plan.tables())
    for s in sources.values():
        s.require_cdf()
        s.require_readable_by_spark()
    versions = {t: s.current_version() for t, s in sources.items()}
    schemas = {t: s.schema(versions[t]) for t, s in sources.items()}
    targets = _targets(on, schemas, bounds)
    report = require_safe(query.plan, targets, sign_oracle(sources, versions))
    query = replace_field(query, plan=narrowed(query.plan, {t: {c} for t, c in targets.items()}))
    for scan in query.plan.scans():
        sources[scan.table].require_binary_collations({f.name for f in scan.columns}, versions[scan.table])
    return Registration(name, parsed, query, sources, versions, schemas, targets, report)


def _check_arguments(parts: ServiceContext, name: str, on: list[str], fragments: int | None,
                     bounds: list[str] | None, replace: bool) -> None:
    if (fragments is None) == (bounds is None):
        raise UsageError("give exactly one of --fragments N or --bounds b0,b1,...,bn")
    if bounds is not None and len(bounds) != len(on):
        raise UsageError(f"give one --bounds per --on ({len(on)} partitioned columns, {len(bounds)} --bounds)")
    if fragments is not None:
        inputs.check_fragments(fragments, parts.settings.max_fragments)
    for text in bounds or ():
        inputs.check_bounds_count(text, parts.settings.max_fragments)
    inputs.check_sketch_name(name)
    if not replace and any(r.name == name for r in parts.catalog.list_sketches()):  # before any Spark work
        raise UsageError(f"sketch {name!r} already exists; pick another name, drop it (`imp sketch drop {name}`) "
                         f"or replace it (`imp sketch create {name} --replace ...`)")


def _targets(on: list[str], schemas: dict[str, pa.Schema], bounds: list[str] | None) -> dict[str, str]:
    """Table -> partition column of each ``--on TABLE.COLUMN``, checked against the query's tables (and its
    ``--bounds`` against the column's type)."""
    targets: dict[str, str] = {}
    for i, item in enumerate(on):
        table, _, column = item.partition(".")
        if not column:
            raise UsageError(f"--on {item!r}: write TABLE.COLUMN")
        if table not in schemas:
            raise UsageError(f"--on {item}: table {table} is not used by the query (it reads "
                             f"{', '.join(sorted(schemas))})")
        if column not in schemas[table].names:
            raise PlanError(f"--on {item}: column {column} does not exist in table {table}; columns: "
                            f"{', '.join(schemas[table].names)}")
        if table in targets:
            raise UsageError(f"--on {item}: table {table} is partitioned twice; one partition per table")
        targets[table] = column
        dtype = schemas[table].field(column).type
        if kind_of_type(dtype) not in KINDS:
            raise UsageError(f"cannot partition on {table}.{column} of type {dtype}")
        if bounds is not None:  # bad bounds are a usage error before any Spark work
            parse_bounds([b.strip() for b in bounds[i].split(",")], dtype, item)
    return targets


def create_sketch(parts: ServiceContext, name: str, sql: str | ParsedSql, on: list[str], fragments: int | None = None,
                  bounds: list[str] | None = None, dialect: str = "spark", strategy: str = Strategy.LAZY,
                  trigger: str = "cli", replace: bool = False) -> tuple[SketchRecord, VersionRecord]:
    """Parse (unless ``sql`` is parsed already), check safety, pick bounds, capture at pinned versions and commit
    version 1; with ``replace``, in the same transaction that drops the live sketch of that name."""
    strategy = Strategy.parse(strategy, default_only=True)
    started = time.perf_counter()
    reg = check(parts, name, sql, on, fragments, bounds, dialect, replace)
    replaced = next((r.id for r in parts.catalog.list_sketches() if r.name == name), None) if replace else None
    partitions = _partitions(parts, reg, fragments, bounds)
    violation = violated_assumption(parts.spark, reg.sources, reg.versions, reg.report.assumptions)
    if violation:
        raise UnsafeSketchError(f"a sketch on {', '.join(f'{t}.{c}' for t, c in reg.targets.items())} is not safe "
                                f"for this query: {violation}")
    catalog = parts.catalog
    catalog.clear_abandoned_captures()
    with maintenance_run(catalog, trigger, "capture", table_versions=reg.versions) as run:
        options = state_options(parts.settings.optimizations)
        pipeline = placement.for_capture(
            parts, lambda external: Pipeline.configured(reg.query.plan, partitions, parts.settings.optimizations,
                                                        external), reg.sources, reg.versions, name, run.id)
        parts.progress(f"capturing sketch {name} on Spark at versions {reg.versions}")
        t0 = time.perf_counter()
        pipeline.capture(parts.backend(reg.sources), dict(reg.versions))
        rows = tracked_rows(parts, reg.query.plan, partitions, reg.sources, reg.versions)
        first, blobs = new_version(pipeline, partitions, run, method="capture", table_versions=reg.versions,
                                   identities=table_identities(reg.sources, reg.versions), options=options,
                                   started=t0, fragment_rows=rows)
        key, constants = reg.parsed.template
        record = catalog.create_sketch(name, reg.parsed.sql, reg.parsed.dialect, key,
                                       _plan_json(reg, pipeline, constants),
                                       partitions.to_json(), reg.report.to_json(), strategy.value, first, blobs, run.id,
                                       replaces=replaced, signature=signature_of(parts, reg))
        run.reached = catalog.latest_version(record.id)
        run.timings = {"capture_ms": first.duration_ms or 0.0, "total_ms": (time.perf_counter() - started) * 1000}
    for t, v in reg.versions.items():
        catalog.observe_table_version(t, v, reg.sources[t].table_id(v))
    publisher.after_commit(catalog, record.id, run.reached, parts.settings)
    return record, run.reached


def signature_of(parts: ServiceContext, reg: Registration) -> dict[str, Any]:
    """The sketch query's Spark plan signature (:mod:`imp_core.publish.signature`); a failure is recorded in it
    (the sketch is then published unusable for the Spark extension, and imp's own use is unaffected)."""
    from imp_core.spark.session import is_remote  # lazy start of Spark

    if is_remote(parts.spark):
        return {"hash": None, "unmatchable": "registered through Spark Connect (no JVM here to compute the plan "
                                             "signature); run `imp sketch publish` with a local Spark"}
    try:
        return signature.plan_signature(parts.spark, reg.parsed.sql, reg.parsed.dialect,
                                        {t: s.path for t, s in reg.sources.items()}, reg.schemas,
                                        {t: {c} for t, c in reg.targets.items()})
    except Exception as e:  # noqa: BLE001 - the signature only serves the Spark extension; registration stands
        return {"hash": None, "unmatchable": f"the plan signature could not be computed: {first_line(e)}"}


def _partitions(parts: ServiceContext, reg: Registration, fragments: int | None,
                bounds: list[str] | None) -> PartitionSet:
    """The sketch's partitions: explicit bounds, or equi-depth bounds computed on Spark at the pinned versions."""
    out = []
    for i, (table, column) in enumerate(reg.targets.items()):
        dtype = reg.schemas[table].field(column).type
        kind = kind_of_type(dtype)
        if bounds is not None:
            values: Any = tuple(b.strip() for b in bounds[i].split(","))
        else:
            parts.progress(f"computing {fragments} equi-depth bounds on {table}.{column}")
            values = equi_depth(parts.spark, reg.sources[table], reg.versions[table], column, fragments or 1, kind)
        values, notes = parse_bounds(values, dtype, f"{table}.{column}")  # exact values of the column's type
        for note in notes:
            parts.progress(note)
        out.append(Partition(table, column, values, kind, dtype))
    return PartitionSet(tuple(out))


def _plan_json(reg: Registration, pipeline: Pipeline, constants: tuple[Any, ...]) -> dict[str, Any]:
    """What the catalog keeps of the plan: the IR itself (loading reuses it), its explanation and fingerprint, the
    tables' schemas, the result's column names and the template's constants."""
    return {"ir": plan_to_json(reg.query.plan), "explain": explain(reg.query.plan),
            "fingerprint": pipeline.fingerprint, "schemas": {t: schema_to_json(s) for t, s in reg.schemas.items()},
            "output_names": list(reg.query.output_names), "constants": [str(c) for c in constants]}


__all__ = ["ParsedSql", "Registration", "analyze", "check", "create_sketch", "register_table"]

"""Running a differential stream: Delta tables, three sketches kept three ways, and the checks after every step.

A stream's tables are written with delta-rs (Change Data Feed on, a hidden row id so that a delete removes one copy
of a row), registered in the catalog, and sketched three times: in memory (the default budget), with every
external-capable operator's state in Delta tables (``IMP_STATE_MEMORY_BUDGET=0``), and *moved*: created in memory,
then maintained alternately with the budget of 0 and the default one, so that each job moves its state between
memory and Delta tables. Each batch is committed to the tables and then maintained by its own ``maintain`` job per
sketch (state saved to the catalog and loaded again). After the capture and after every batch:

* **answer**: the query with each sketch (the same SQL text ``imp query`` runs with a sketch) equals Spark's answer
  over all rows (``imp query --no-sketch``);
* **recapture**: each maintained sketch's fragments equal those of a recapture at the same table versions.

Every failure, an error of imp as well as a mismatch, becomes a ``Difference``; ``Outcome.report`` prints them with
the stream's reproduction (seed, plan SQL, the batches). Floats are compared to 12 significant digits (Spark adds
in another order when the sketch prunes files); a mismatch only in float values is noted as ``float_order``, not
counted as a difference.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from imp_core.errors import NotFoundError, OrderDependentValueError, PlanError, UsageError
from imp_core.maintenance.sketch_use import prepare, sketch_for_use
from imp_core.publish import signature
from imp_core.spark.connector import SKETCH_ENABLED_CONF, SKETCH_EXPECT_CONF
from imp_core.use.extension import register_views
from imp_core.use.query import collect, sketched_scan
from imp_core.use.sketched import session_conf
from tests.differential.generate import Row, Stream, _key, columns, renamed

if TYPE_CHECKING:
    from imp_core.maintenance.service import SketchService

log = logging.getLogger(__name__)
RID = "__rid"
MODES = ("memory", "outside", "moved")
_ids = itertools.count()


@dataclass
class Difference:
    step: int  # 0: after the capture, i: after batch i
    mode: str
    check: str  # answer | recapture | error
    detail: str


@dataclass
class Outcome:
    stream: Stream
    steps: int = 0  # checks made (one per mode and step)
    differences: list[Difference] = field(default_factory=list)
    skipped: str | None = None  # the sketch could not be registered (an unsafe or unsupported plan)
    float_order: int = 0
    rule_checks: int = 0  # steps whose query also ran through spark.sql with the extension's rule on
    rule_applied: int = 0  # of those, the steps where the rule applied a sketch
    seconds: float = 0.0
    refused: int = 0  # captures and maintain jobs refused by a guarded wide decimal sum (``engine/running_sums.py``)
    timings: Counter[str] = field(default_factory=Counter)  # seconds per phase (create, maintain, ...) and mode

    def report(self) -> str:
        lines = [
            f"stream seed={self.stream.seed}: {len(self.differences)} difference(s), {self.steps} checks, "
            f"the rule applied a sketch in {self.rule_applied} of {self.rule_checks} queries through spark.sql, "
            f"{self.seconds:.1f} s (" + ", ".join(f"{k} {v:.1f}" for k, v in self.timings.most_common()) + ")"
        ]
        lines += [f"  step {d.step} {d.mode} {d.check}: {d.detail}" for d in self.differences]
        return "\n".join(lines + ["reproduction:", self.stream.reproduction()])


@contextmanager
def timed(out: Outcome, phase: str) -> Iterator[None]:
    t0 = time.perf_counter()
    try:
        yield
    finally:
        out.timings[phase] += time.perf_counter() - t0


class DeltaTables:
    """A stream's tables as Delta tables with a hidden row id; ``commit`` applies one batch."""

    def __init__(self, root: Path, suffix: str, initial: dict[str, list[Row]]) -> None:
        self.root, self.suffix = root, suffix
        self.next_rid = 0
        self.live: dict[str, list[tuple[int, Row]]] = {t: [] for t in initial}
        for table, rows in initial.items():
            write_deltalake(
                str(self.path(table)),
                self._with_ids(table, rows),
                mode="overwrite",
                configuration={"delta.enableChangeDataFeed": "true"},
            )

    def name(self, table: str) -> str:
        return f"{table}_{self.suffix}"

    def path(self, table: str) -> Path:
        return self.root / self.name(table)

    def _with_ids(self, table: str, rows: list[Row]) -> pa.Table:
        ids = list(range(self.next_rid, self.next_rid + len(rows)))
        self.next_rid += len(rows)
        self.live[table] += list(zip(ids, rows))
        data = {c.name: pa.array([r[i] for r in rows], type=c.arrow) for i, c in enumerate(columns(table))}
        data[RID] = pa.array(ids, type=pa.int64())
        return pa.table(data)

    def commit(self, table: str, deleted: list[Row], inserted: list[Row]) -> None:
        """Delete one copy of each of ``deleted`` (one commit), then append ``inserted`` in one file, in order."""
        gone = []
        for row in deleted:
            key = _key(row)
            hit = next((i for i, (_, r) in enumerate(self.live[table]) if _key(r) == key), None)
            if hit is not None:
                gone.append(self.live[table].pop(hit)[0])
        if gone:
            DeltaTable(str(self.path(table))).delete(f"{RID} IN ({', '.join(map(str, gone))})")
        if inserted:
            write_deltalake(str(self.path(table)), self._with_ids(table, inserted), mode="append")


def _norm(v: Any) -> Any:
    if isinstance(v, float):
        if math.isnan(v):
            return "NaN"
        return 0.0 if v == 0 else float(f"{v:.12g}")
    return v


def bag(rows: list[list[Any]], cols: list[int] | None = None, floats: bool = True) -> Counter:
    """Rows as a multiset (floats to 12 significant digits; without ``floats``, float values blanked)."""
    keep = lambda v: _norm(v) if floats or not isinstance(v, float) else "float"
    return Counter(tuple(keep(r[i]) for i in (cols if cols is not None else range(len(r)))) for r in rows)


class Harness:
    """Runs streams against one catalog and Spark session: ``memory`` has the default state budget, ``outside`` a
    budget of 0 (both services share the catalog and the session)."""

    def __init__(self, memory: SketchService, outside: SketchService, root: Path) -> None:
        self.memory, self.outside, self.root = memory, outside, root

    def service(self, mode: str, step: int) -> SketchService:
        """Which budget maintains ``mode``'s sketch at ``step`` (the moved sketch alternates, starting in memory)."""
        if mode == "outside" or (mode == "moved" and step % 2 == 1):
            return self.outside
        return self.memory

    def run(self, stream: Stream) -> Outcome:
        t0 = time.perf_counter()
        out = Outcome(stream)
        suffix = f"{stream.seed}_{next(_ids)}".replace("-", "m")
        tables = DeltaTables(self.root, suffix, stream.initial)
        for t in stream.initial:
            self.memory.register_table(tables.name(t), str(tables.path(t)), replace=True)
        sql = renamed(stream.sql, suffix)
        on = [f"{tables.name(o.split('.')[0])}.{o.split('.')[1]}" for o in stream.on]
        names = {m: f"diff{suffix}_{m}" for m in MODES}
        twin = f"diff{suffix}_recaptured"
        try:
            self._run(stream, out, tables, sql, on, names, twin)
        finally:
            for n in [*names.values(), twin]:
                try:
                    self.memory.catalog.drop_sketch(n)
                except NotFoundError:
                    pass
            out.seconds = time.perf_counter() - t0
        return out

    def _run(
        self,
        stream: Stream,
        out: Outcome,
        tables: DeltaTables,
        sql: str,
        on: list[str],
        names: dict[str, str],
        twin: str,
    ) -> None:
        live = self._create(stream, out, sql, on, names)
        if out.skipped is not None:
            return
        self._check(out, 0, sql, names, live, recaptured=None)
        twin_exists = False
        for step, batch in enumerate(stream.batches, 1):
            with timed(out, "commit"):
                for t in batch.tables():
                    tables.commit(t, batch.deleted.get(t, []), batch.inserted.get(t, []))
            refused = set()  # modes whose sketch stays at its last version: the next batch's job maintains it
            for mode in sorted(live):
                try:
                    with timed(out, f"maintain {mode}"):
                        self.service(mode, step).maintain(names[mode], strategy="lazy")
                except OrderDependentValueError:  # a refusal the data calls for, not a difference
                    out.refused += 1
                    refused.add(mode)
                except Exception as e:
                    log.warning("stream %s step %s %s: maintain failed", stream.seed, step, mode, exc_info=True)
                    out.differences.append(Difference(step, mode, "error", f"maintain: {type(e).__name__}: {e}"))
                    live.discard(mode)
            recaptured = None
            try:
                with timed(out, "recapture"):
                    if twin_exists:
                        self.memory.recapture(twin)
                    else:
                        self.memory.create_sketch(twin, sql, on, bounds=stream.bounds)
                        twin_exists = True
                recaptured = self._fragments(twin)
            except OrderDependentValueError:  # the data makes Spark's answer order-dependent: nothing to compare
                out.refused += 1
            except Exception as e:  # noqa: BLE001
                out.differences.append(Difference(step, "recapture", "error", f"{type(e).__name__}: {e}"))
            self._check(out, step, sql, names, live - refused, recaptured)

    def _create(self, stream: Stream, out: Outcome, sql: str, on: list[str], names: dict[str, str]) -> set[str]:
        """Register the three sketches; the modes whose sketch exists. A generated plan the engine refuses (an
        unsafe or unsupported plan) marks the stream skipped; any other failure is a difference."""
        live = set()
        for mode in MODES:
            try:
                with timed(out, f"create {mode}"):
                    self.service(mode, 0).create_sketch(names[mode], sql, on, bounds=stream.bounds)
                live.add(mode)
            except OrderDependentValueError:  # a refusal the data calls for, not a difference
                out.refused += 1
            except (PlanError, UsageError) as e:
                if mode == "memory" and stream.family == "generated":
                    out.skipped = f"{type(e).__name__}: {str(e).splitlines()[0]}"
                    return live
                out.differences.append(Difference(0, mode, "error", f"create: {type(e).__name__}: {e}"))
            except Exception as e:  # noqa: BLE001
                out.differences.append(Difference(0, mode, "error", f"create: {type(e).__name__}: {e}"))
        return live

    def _fragments(self, name: str) -> list[list[int]]:
        return [p["fragments"] for p in self.memory.describe(name)["partitions"]]

    def _check(
        self,
        out: Outcome,
        step: int,
        sql: str,
        names: dict[str, str],
        live: set[str],
        recaptured: list[list[int]] | None,
    ) -> None:
        if not live:
            return
        with timed(out, "truth"):
            truth = self.memory.query(sql, use_sketch=False).rows
        for mode in sorted(live):
            out.steps += 1
            if recaptured is not None and (got := self._fragments(names[mode])) != recaptured:
                out.differences.append(
                    Difference(step, mode, "recapture", f"maintained {got} != recaptured {recaptured}")
                )
            try:
                with timed(out, "sketched query"):
                    rows = self.sketched_rows(sql, names[mode])
            except Exception as e:  # noqa: BLE001
                out.differences.append(Difference(step, mode, "error", f"query: {type(e).__name__}: {e}"))
                continue
            self._compare(out, step, mode, rows, truth, "with the sketch")
        try:
            with timed(out, "through the rule"):
                applied, rows = self.rule_rows(sql, [names[m] for m in sorted(live)])
        except Exception as e:  # noqa: BLE001
            out.differences.append(Difference(step, "rule", "error", f"spark.sql: {type(e).__name__}: {e}"))
            return
        out.rule_checks += 1
        out.rule_applied += bool(applied)
        self._compare(out, step, "rule", rows, truth, f"through the extension's rule (applied {applied})")

    def _compare(
        self, out: Outcome, step: int, mode: str, rows: list[list[Any]], truth: list[list[Any]], what: str
    ) -> None:
        cols = out.stream.compared
        if bag(rows, cols) == bag(truth, cols):
            return
        if bag(rows, cols, floats=False) == bag(truth, cols, floats=False):
            out.float_order += 1
            return
        out.differences.append(
            Difference(step, mode, "answer", f"{what} {sorted(map(repr, rows))} != Spark {sorted(map(repr, truth))}")
        )

    def rule_rows(self, sql: str, names: list[str]) -> tuple[list[dict[str, Any]], list[list[Any]]]:
        """Spark's answer to ``sql`` through ``spark.sql`` with the extension's rule on, as a client's query runs:
        each table a temporary view of its Delta table at its current version, the latest published versions of
        the sketches ``names`` expected (so the rule sees them at once); with the sketch versions the rule applied.
        """
        parts = self.memory.parts
        prepared = prepare(parts, sql, use_sketch=False)
        spark = parts.spark
        register_views(spark, prepared.sources)
        records = [parts.catalog.get_sketch(n) for n in names]
        expect = ",".join(f"{r.id}:{parts.catalog.latest_version(r.id).version}" for r in records)
        try:
            with session_conf(spark, {SKETCH_ENABLED_CONF: "true", SKETCH_EXPECT_CONF: expect}):
                df = spark.sql(sql)
                applied = json.loads(signature.api(spark).applied(df._jdf))
                return applied, collect(df, list(prepared.query.output_names))
        finally:
            for table in prepared.sources:
                spark.catalog.dropTempView(table)

    def sketched_rows(self, sql: str, name: str) -> list[list[Any]]:
        """Spark's answer to ``sql`` over only the rows in sketch ``name``'s fragments (its latest version, not
        maintained first), at the table versions it reflects: each table of the query a temporary view of its rows
        in the sketch (``sketched_scan``, what the extension's filter keeps), the extension's rule off so no other
        sketch of the same query is applied instead."""
        parts = self.memory.parts
        prepared = prepare(parts, sql, use_sketch=False)
        record = parts.catalog.get_sketch(name)
        applied = sketch_for_use(
            parts, name, parts.catalog.latest_version(record.id).table_versions, maintain_first=False
        )
        assert applied is not None
        spark = parts.spark
        for table, source in prepared.sources.items():
            version = applied.version.table_versions[table]
            part = applied.partitions.get(table)
            df = (
                source.scan(spark, version)
                if part is None
                else sketched_scan(spark, source, version, part, applied.fragments(table))
            )
            df.createOrReplaceTempView(table)
        try:
            with session_conf(spark, {SKETCH_ENABLED_CONF: "false"}):
                return collect(spark.sql(sql), list(prepared.query.output_names))
        finally:
            for table in prepared.sources:
                spark.catalog.dropTempView(table)


def summary(outcomes: list[Outcome]) -> str:
    """Streams, checks and differences of a run, and the reproduction of every stream with a difference."""
    ran = [o for o in outcomes if o.skipped is None]
    failed = [o for o in ran if o.differences]
    seconds = sum(o.seconds for o in outcomes)
    lines = [
        f"{len(outcomes)} streams ({len(outcomes) - len(ran)} not sketchable), {sum(o.steps for o in ran)} "
        f"checks, {sum(len(o.differences) for o in ran)} differences in {len(failed)} streams, "
        f"{sum(o.float_order for o in ran)} float-order notes, {sum(o.refused for o in ran)} refusals of an "
        f"order-dependent wide decimal sum, {seconds:.0f} s "
        f"({seconds / max(1, len(outcomes)):.1f} s per stream)"
    ]
    families: Counter[str] = Counter(o.stream.family for o in ran)
    lines.append("families: " + ", ".join(f"{f} {n}" for f, n in sorted(families.items())))
    lines += [o.report() for o in failed]
    return "\n".join(lines)

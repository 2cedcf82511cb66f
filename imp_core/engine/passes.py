"""One pass of a pipeline (``engine/pipeline.py``) up its tree of stages: a maintenance pass pushes the change rows
of one table from its scans to the root; a capture (full maintenance) starts at the frontier stateful operators,
whose inputs the backend computes whole, or captures external operators on the backend in one go.

See docs/ARCHITECTURE.md, "Passes and backends" and "Where state lives".
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import polars as pl

from imp_core.engine.annotation import consolidate
from imp_core.engine.backend import CaptureBackend, JoinCacheBackend, Relation, StoreReadingBackend, Versions
from imp_core.engine.evaluate import polars_type
from imp_core.engine.external import ExternalOperator
from imp_core.engine.join_sides import StageSide
from imp_core.engine.operators.aggregation import Aggregation
from imp_core.engine.operators.anti_join import AntiJoinOp
from imp_core.engine.operators.base import BinaryOperator, OutputStateOperator, UnaryOperator
from imp_core.engine.operators.group_topk import GroupTopKOp
from imp_core.engine.operators.join import JoinOp
from imp_core.engine.operators.topk import TopKOp
from imp_core.engine.operators.union import UnionOp
from imp_core.engine.schema import COUNT, MULT
from imp_core.engine.stages import Stage, backend_roots, contents_for, holds_external, is_external, state_roots
from imp_core.plan.nodes import Scan

if TYPE_CHECKING:
    from imp_core.engine.pipeline import Pipeline

ALL_KEYS = 2**31 - 2  # no limit on the keys a backend counts (Spark's LIMIT takes a 32-bit count)


class TreePass:
    """One pass up the tree. A capture (no ``table``) starts at the frontier stateful operators, whose inputs the
    backend computes whole; a maintenance pass starts at the scans of ``table``. Within a pass every stage is
    processed once, before its parent reads it, so contents computed from state are cached for the pass; a shared
    stage's delta is computed once and read by each of its parents."""

    def __init__(self, pipeline: Pipeline, backend: Any, versions: Versions, *, capture: bool = False,
                 table: str = "", changes: pl.DataFrame | None = None, netting: bool = True,
                 inject: dict[str, pl.DataFrame] | None = None) -> None:
        """``inject``: deltas of stages given by path (the pass starts there instead of at the scans)."""
        self.pipeline, self.backend, self.versions = pipeline, backend, versions
        self.capture, self.table, self.changes, self.netting = capture, table, changes, netting
        self.inject = inject
        self.deferred: list[Stage] = []  # a capture's external stages whose output goes up after it
        self._stacking = 0  # > 0 while the results below a capture on the backend are captured (see _speculative)
        self._speculative: set[str] = set()  # deferred only because an operator above may read them on the backend
        self._captured: dict[str, pl.DataFrame | None] = {}  # deltas of stages captured ahead of their parent
        self._contents: dict[str, pl.DataFrame] = {}
        self._relations: dict[str, Relation] = {}
        self._deltas: dict[str, pl.DataFrame | None] = {}
        self._locks: dict[str, threading.RLock] = {}
        self._guard = threading.Lock()
        # rows of stages read by key for the joins above them: (path, key columns) -> (keys read, their rows)
        self._keyed: dict[tuple[str, tuple[str, ...]], tuple[pl.DataFrame, pl.DataFrame]] = {}

    def delta(self, stage: Stage) -> pl.DataFrame | None:
        """The delta of ``stage``'s output, or None when nothing below it changed (computed once per pass: the
        parents of a shared stage read the same delta, and its operator folds the batch once; a parent in another
        thread waits for it)."""
        with self._guard:
            lock = self._locks.setdefault(stage.path, threading.RLock())
        with lock:  # taken parent before child, so no two threads wait for each other
            if stage.path not in self._deltas or stage.path in self._captured:  # a kept result is read by its parent
                self._deltas[stage.path] = self._delta(stage)
            return self._deltas[stage.path]

    def deltas(self, stages: Sequence[Stage]) -> list[pl.DataFrame | None]:
        """The deltas of the inputs ``stages`` of one operator. In a maintenance pass, inputs that each hold external
        state are computed side by side, in threads: their store reads and writes and the joins below them are Spark
        jobs, each mostly waiting on Spark's planning and on small tasks (Q21: one per-order summary's fetch and
        append beside the other's, the NOT EXISTS beside the EXISTS join), which two jobs at a time overlap."""
        busy = [s for s in stages if self._changes_below(s) and holds_external(s)]
        if self.capture or self.inject is not None or len(busy) < 2:
            return [self.delta(s) for s in stages]
        with ThreadPoolExecutor(max_workers=len(busy) - 1, thread_name_prefix="imp-pass") as pool:
            ahead = {id(s): pool.submit(self.delta, s) for s in busy[1:]}
            out = [self.delta(s) if id(s) not in ahead else None for s in stages]
            return [ahead[id(s)].result() if id(s) in ahead else d for s, d in zip(stages, out)]

    def _delta(self, stage: Stage) -> pl.DataFrame | None:
        if not self._changes_below(stage):
            return None
        if self.inject is not None and stage.path in self.inject:
            return self.inject[stage.path]
        if stage.path in self._captured:
            out = self._captured.pop(stage.path)
            if stage.path in self._speculative:  # it goes up through this pass after all: whole, now
                self._speculative.discard(stage.path)
                self.deferred = [d for d in self.deferred if d is not stage]
                out = stage.op.output_relation()  # type: ignore[attr-defined]
            return out
        op = stage.op
        if isinstance(stage.node, Scan):
            assert isinstance(op, UnaryOperator) and self.changes is not None
            out = op.process(self.changes)
            return consolidate(out) if self.netting else out
        if self.capture and isinstance(op, OutputStateOperator) and stage.inputs[0].stateless:
            return self._bootstrap(stage)
        if isinstance(op, BinaryOperator):
            return self._binary_delta(stage, op)
        if isinstance(op, UnionOp):
            return self._union_delta(stage, op)
        assert isinstance(op, UnaryOperator)
        return self._unary_delta(stage, op)

    def _binary_delta(self, stage: Stage, op: BinaryOperator) -> pl.DataFrame | None:
        """The delta of a join's (or anti join's) output from its inputs' deltas; a capture of an anti join starts
        its state from both inputs whole (an external one on the backend, where it can)."""
        left, right = stage.inputs
        dl: pl.DataFrame | None
        dr: pl.DataFrame | None
        if self.capture and isinstance(op, AntiJoinOp):
            if isinstance(op, ExternalOperator) and (kept := self._capture_anti_join(stage)) is not None:
                return kept
            dl, dr = self._anti_join_inputs(left, right, op.right_keys, op.certain_right)
        else:
            dl, dr = self.deltas([left, right])
        self.pipeline.stats.join_calls += int(dl is not None and dl.height > 0) + \
            int(dr is not None and dr.height > 0)
        return op.process(dl, dr, StageSide(self, stage, left), StageSide(self, stage, right))

    def _unary_delta(self, stage: Stage, op: UnaryOperator) -> pl.DataFrame | None:
        """The delta of a one-input operator's output: its input's delta processed, or (a capture of an external
        operator above other operators' results) its state captured on the backend in one go."""
        if self.capture and isinstance(op, ExternalOperator):
            stacked = self._capture_stacked(stage)
            if stacked is not None:
                return stacked
        child = self.delta(stage.inputs[0])
        if child is None:
            return None
        out = op.process(child)
        if self.capture and isinstance(op, OutputStateOperator):
            # A capture hands Q(D) upward as an all-insert delta. From reset state that is what `process` returns,
            # except for an aggregation without GROUP BY: its one row exists even over an empty input.
            return op.output_relation()
        return out

    def _changes_below(self, stage: Stage) -> bool:
        """Whether ``stage``'s output can change in this pass: it is or holds an injected stage, it reads the changed
        table, or (a capture) it holds state."""
        if self.inject is not None:
            return any(s.path in self.inject for s in stage.walk())
        return not stage.stateless if self.capture else self.table in stage.tables

    def _union_delta(self, stage: Stage, op: UnionOp) -> pl.DataFrame | None:
        """The union of the inputs' deltas; a capture reads a stateless input whole from the backend (it has no
        delta of its own there)."""
        parts = []
        inputs = [self._input_relation(s) for s in stage.inputs] if self.capture else self.deltas(stage.inputs)
        for i, d in enumerate(inputs):
            if d is not None:
                parts.append(op.process(d, i))
        return op.combine(parts) if parts else None

    def _input_relation(self, stage: Stage) -> pl.DataFrame:
        """In a capture, ``stage``'s whole contents as an all-insert delta: its delta when it has state, else read
        whole by the backend (a stateless input has no delta of its own there)."""
        d = self.delta(stage)
        return d if d is not None else self.backend.relation(self.relation(stage), self.versions)

    def _key_rows(self, stage: Stage, keys: list[str]) -> pl.DataFrame:
        """In a capture, an anti join's subquery side as all the operator keeps of it: one row per key with its
        count as multiplicity, counted by the backend when it can (else the side's whole relation)."""
        d = self.delta(stage)
        if d is not None:
            return d
        backend = self.backend
        counts = backend.key_counts(self.relation(stage), keys, ALL_KEYS, self.versions) \
            if isinstance(backend, JoinCacheBackend) else None
        if counts is None:
            return backend.relation(self.relation(stage), self.versions)
        return counts.select([*keys, pl.col(COUNT).cast(pl.Int64).alias(MULT)])

    def _bootstrap(self, stage: Stage) -> pl.DataFrame:
        """A frontier stateful operator's output relation, from its whole input computed by the backend."""
        backend: CaptureBackend = self.backend
        op = stage.op
        child = self.relation(stage.inputs[0])
        if isinstance(op, ExternalOperator) and isinstance(backend, StoreReadingBackend) and self._may_defer(stage):
            op.reset()  # type: ignore[attr-defined]
            if backend.capture_external(child, op, self.versions):  # written by Spark, not through this process
                op.bind(op.store)
                return self._defer(stage)
        if isinstance(op, Aggregation):
            return op.bootstrap(backend.aggregate_input(child, op.layout, self.versions))
        assert isinstance(op, (TopKOp, GroupTopKOp))
        op.reset()
        return op.process(backend.relation(child, self.versions))

    def _capture_stacked(self, stage: Stage) -> pl.DataFrame | None:
        """Capture an external operator whose input reads other operators' results on the backend, in one go: the
        results of external operators below are read from their stores there, those in memory shipped, so they never
        go up through the operators in between (``spark/external_capture.py``). None where it cannot: the caller then
        pushes the results below up through the pass (their deltas, computed here, are kept for it)."""
        op = stage.op
        assert isinstance(op, ExternalOperator)
        if not self._may_defer(stage):
            return None
        found = self._backend_relation(stage.inputs[0])
        if found is None:
            return None
        rel, roots = found
        op.reset()  # type: ignore[attr-defined]
        if not self.backend.capture_external(rel, op, self.versions):
            return None
        op.bind(op.store)
        self._consumed(roots)
        return self._defer(stage)

    def _capture_anti_join(self, stage: Stage) -> pl.DataFrame | None:
        """Capture an external anti join on the backend from its two inputs (the results of external operators below
        read from their stores there), its result kept back (:meth:`_defer`); None where it cannot: the caller then
        brings both inputs whole into this process."""
        if not isinstance(self.backend, StoreReadingBackend) or not self._may_defer(stage):
            return None
        if isinstance(stage.op, AntiJoinOp) and stage.op.certain_right:  # only the engine computes its right flag
            return None
        sides: list[tuple[Relation, list[Stage]]] = []
        for side in stage.inputs:
            found = (self.relation(side), []) if side.stateless else self._backend_relation(side)
            if found is None:
                return None
            sides.append(found)
        op = stage.op
        op.reset()  # type: ignore[attr-defined]
        if not self.backend.capture_anti_join(sides[0][0], sides[1][0], op, self.versions):
            return None
        op.bind(op.store)  # type: ignore[attr-defined]
        self._consumed([*sides[0][1], *sides[1][1]])
        return self._defer(stage)

    def _may_defer(self, stage: Stage) -> bool:
        """Whether ``stage`` may be captured on the backend with its result kept back: it may go up after the pass,
        or an operator above is capturing on the backend and may read it from its store there."""
        return self._stacking > 0 or self._deferrable(stage)

    def _defer(self, stage: Stage) -> pl.DataFrame:
        """Keep back the result of ``stage``, captured on the backend: it goes up after the pass, read from its
        store chunk by chunk, unless an operator above reads it on the backend first. One that may not go up after
        the pass (:meth:`_deferrable`) and that no operator above reads goes up whole when its parent asks for it."""
        self.deferred.append(stage)
        if not self._deferrable(stage):
            self._speculative.add(stage.path)
        return stage.op.empty_delta()  # type: ignore[attr-defined]

    def _deferrable(self, stage: Stage) -> bool:
        """Whether ``stage``'s result may be captured on the backend and go up only after this pass: no join above
        it has another input that holds operator state, and no anti join above reads it as its subquery side. Such a
        join would read the result whole from the store when the other input's rows go up in this pass, and join them
        again when the result's own rows go up after it; such an anti join would start from an empty subquery (a NOT
        IN's gate open) and see the subquery's rows only after the pass, which moves the gate."""
        def clear(node: Stage) -> bool:  # every way from ``node`` down to ``stage`` passes no such join
            if node is stage:
                return True
            for i, child in enumerate(node.inputs):
                if not _holds(child, stage):
                    continue
                if isinstance(node.op, JoinOp) and any(j != i and not s.stateless for j, s in enumerate(node.inputs)):
                    return False
                if isinstance(node.op, AntiJoinOp) and i == 1:
                    return False
                if not clear(child):
                    return False
            return True

        return clear(self.pipeline.root)

    def _backend_relation(self, stage: Stage) -> tuple[Relation, list[Stage]] | None:
        """In a capture, ``stage``'s subtree as the backend computes it with the results of the external operators
        below read from their stores (``Relation.external``), and the operators whose results it reads; None when the
        backend cannot read one of them, or a result held in memory is not whole yet (an external operator below it
        sends its result up only after the pass)."""
        if not isinstance(self.backend, StoreReadingBackend):
            return None
        roots = list(dict.fromkeys(backend_roots(stage)))
        self._stacking += 1
        try:
            for r in roots:
                if r.path not in self._captured:
                    self._captured[r.path] = self.delta(r)
        finally:
            self._stacking -= 1
        if any(d is not stage and _holds(stage, d) and d not in roots for d in self.deferred):
            return None
        held = tuple((r.node, self.state_contents(r)) for r in roots if not is_external(r))
        external = tuple((r.node, r.op) for r in roots if is_external(r))
        rel = Relation(stage.node, self.pipeline.annotations, held, external)
        return (rel, roots) if self.backend.reads_external(rel) else None

    def _consumed(self, roots: list[Stage]) -> None:
        """The results of ``roots`` went into an operator above them whole: nothing of theirs goes up any more."""
        for r in roots:
            self._captured.pop(r.path, None)
            self._speculative.discard(r.path)
        self.deferred = [d for d in self.deferred if d not in roots]

    def _anti_join_inputs(self, left: Stage, right: Stage, keys: list[str],
                          certain_right: bool) -> tuple[pl.DataFrame, pl.DataFrame]:
        """In a capture, an anti join's inputs whole (its state starts from them): read by the backend with the
        results of external operators below from their stores where it can, else pushed up through the pass (always
        a right side whose sure rows the engine's conservative condition flags: ``certain_right``)."""
        dl = dr = None
        if holds_external(left) and (found := self._backend_relation(left)) is not None:
            dl = self.backend.relation(found[0], self.versions)
            self._consumed(found[1])
        if not certain_right and holds_external(right) and isinstance(self.backend, JoinCacheBackend) and \
                (found := self._backend_relation(right)) is not None:
            counts = self.backend.key_counts(found[0], keys, ALL_KEYS, self.versions)
            if counts is not None:
                dr = counts.select([*keys, pl.col(COUNT).cast(pl.Int64).alias(MULT)])
                self._consumed(found[1])
        if dl is None:
            dl = self._input_relation(left)
        if dr is None and certain_right:  # through this pass, whole: nothing below it is kept back for the backend
            stacking, self._stacking = self._stacking, 0
            try:
                dr = self._key_rows(right, keys)
            finally:
                self._stacking = stacking
        return dl, dr if dr is not None else self._key_rows(right, keys)

    def rows_for(self, stage: Stage, wanted: pl.DataFrame) -> pl.DataFrame | None:
        """``stage``'s current rows whose columns ``wanted.columns`` equal a row of ``wanted`` (no NULL, no float
        key), for a join above it to join a delta with in memory; None where the backend's own join is used: a capture,
        a pipeline without external state, a backend without key look-ups.

        Rows once read are kept for the pass (a stage's contents do not change once its parents read it). A join
        stage asked by its own join keys is read as both sides' rows for those keys, joined here: at Q21's EXISTS
        join the per-order summaries and the line items by the changed orders, which the joins below read already
        (the summaries from their stores' last replace, ``DeltaGroupStore._known``), where Spark computed the whole
        chain again with the summaries from their state tables."""
        if self.capture or self.inject is not None or not self.pipeline.external or \
                not isinstance(self.backend, JoinCacheBackend) or \
                any(t.is_float() for t in wanted.dtypes):
            return None
        wanted = wanted.drop_nulls().unique()
        return self._rows_for(stage, wanted) if wanted.height else None

    def _rows_for(self, stage: Stage, keys: pl.DataFrame) -> pl.DataFrame | None:
        wanted = _typed_as(keys, stage)
        if wanted is None:
            return None
        cols = tuple(wanted.columns)
        entry = self._keyed.get((stage.path, cols))
        missing = wanted
        if entry is not None:
            if entry[0].schema != wanted.schema:
                return None
            missing = wanted.join(entry[0], on=list(cols), how="anti")
        if missing.height:
            rows = self._read_rows(stage, missing)
            if rows is None:
                return None
            entry = (missing, rows) if entry is None else \
                (pl.concat([entry[0], missing]), pl.concat([entry[1], rows], how="diagonal_relaxed"))
            self._keyed[(stage.path, cols)] = entry
        assert entry is not None
        return entry[1].join(wanted, on=list(cols), how="semi")

    def _read_rows(self, stage: Stage, wanted: pl.DataFrame) -> pl.DataFrame | None:
        op, cols = stage.op, list(wanted.columns)
        if stage.from_state:
            rows = contents_for(stage, wanted)
            return rows if rows is not None else self.state_contents(stage).join(wanted, on=cols, how="semi")
        if isinstance(op, JoinOp) and not stage.stateless and (sides := _key_sides(op, cols)) is not None:
            left = self._rows_for(stage.inputs[0], wanted.rename(dict(zip(cols, sides[0]))))
            right = self._rows_for(stage.inputs[1], wanted.rename(dict(zip(cols, sides[1]))))
            if left is not None and right is not None:
                return op.join_frames(left, right)
        return self.backend.rows_with_keys(self.relation(stage), cols, wanted, 0, self.versions)

    def relation(self, stage: Stage) -> Relation:
        """``stage``'s subtree as the backend computes it, with the contents of its parts held in state: large
        results of external operators read from their stores by the backend where it can (not brought whole into
        this process: at SF10 a join side over Q21's per-order summaries read 15M groups here per pass), the others
        computed here."""
        if stage.path not in self._relations:
            rel = self._external_relation(stage)
            if rel is None:
                frames = tuple((s.node, self.state_contents(s)) for s in state_roots(stage))
                rel = Relation(stage.node, self.pipeline.annotations, frames)
            self._relations[stage.path] = rel
        return self._relations[stage.path]

    def _external_relation(self, stage: Stage) -> Relation | None:
        """``stage``'s subtree with the results of the external operators in it read by the backend from their
        stores (``Relation.external``); None when none is there, they are small enough to read here, or the backend
        cannot read one of them (``reads_external_side``)."""
        if not isinstance(self.backend, StoreReadingBackend) or not holds_external(stage):
            return None
        roots = list(dict.fromkeys(backend_roots(stage)))
        external = tuple((r.node, r.op) for r in roots if is_external(r))
        probe = Relation(stage.node, self.pipeline.annotations, (), external)
        if not self.backend.reads_external_side(probe):
            return None
        held = tuple((r.node, self.state_contents(r)) for r in roots if not is_external(r))
        return Relation(stage.node, self.pipeline.annotations, held, external)

    def state_contents(self, stage: Stage) -> pl.DataFrame:
        """The current annotated contents of a ``from_state`` stage, computed in memory."""
        assert stage.from_state
        if stage.path not in self._contents:
            op = stage.op
            if isinstance(op, (OutputStateOperator, AntiJoinOp)):
                out = op.output_relation()
            elif isinstance(op, JoinOp):
                left, right = stage.inputs
                out = op.join_frames(self.state_contents(left), self.state_contents(right))
            elif isinstance(op, UnionOp):
                out = op.combine([op.process(self.state_contents(s), i) for i, s in enumerate(stage.inputs)])
            else:
                assert isinstance(op, UnaryOperator)
                out = op.process(self.state_contents(stage.inputs[0]))
            self._contents[stage.path] = out
        return self._contents[stage.path]


def _typed_as(wanted: pl.DataFrame, stage: Stage) -> pl.DataFrame | None:
    """``wanted`` in the types of ``stage``'s columns: integers of another width cast (a value out of range matches
    no row), any other difference None (a cast could make unequal values equal)."""
    casts = {}
    for c, t in wanted.schema.items():
        target = polars_type(stage.node.field(c).dtype)
        if t != target:
            if not (t.is_integer() and target.is_integer()):
                return None
            casts[c] = target
    return wanted.cast(casts, strict=False).drop_nulls().unique() if casts else wanted  # type: ignore[arg-type]


def _key_sides(op: JoinOp, cols: list[str]) -> tuple[list[str], list[str]] | None:
    """The columns of each input of ``op`` that equal ``cols`` (join key columns of either input) in every row of
    its result; None if one of ``cols`` is not a join key."""
    left: list[str] = []
    right: list[str] = []
    for c in cols:
        i = op.left_keys.index(c) if c in op.left_keys else op.right_keys.index(c) if c in op.right_keys else -1
        if i < 0:
            return None
        left.append(op.left_keys[i])
        right.append(op.right_keys[i])
    return left, right


def _holds(stage: Stage, other: Stage) -> bool:
    """Whether ``other`` is ``stage`` or a stage below it."""
    return any(s is other for s in stage.walk())


__all__ = ["ALL_KEYS", "TreePass"]

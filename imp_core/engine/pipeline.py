"""The operator tree of one sketch's query, and the two passes that run through it: ``maintain_pass`` (the change
rows of one table) and ``capture`` (full maintenance).

See docs/ARCHITECTURE.md, "Passes and backends".
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from imp_core.engine.annotation import AnnotationLayout, consolidate
from imp_core.engine.backend import Backend, CaptureBackend, JoinBackend, JoinCacheBackend, Relation, Versions
from imp_core.engine.external import ExternalOperator, GroupStore, warm_stores
from imp_core.engine.join_sides import StageSide
from imp_core.engine.operators.aggregation import Aggregation
from imp_core.engine.operators.anti_join import AntiJoinOp
from imp_core.engine.operators.base import (
    BinaryOperator,
    Operator,
    OutputStateOperator,
    SketchDelta,
    StatefulOperator,
    UnaryOperator,
)
from imp_core.engine.operators.context import BuildContext, JoinCaching
from imp_core.engine.operators.group_topk import GroupTopKOp
from imp_core.engine.operators.join import JoinOp
from imp_core.engine.operators.merge import Merge
from imp_core.engine.operators.registry import build_external, build_operator, can_be_external
from imp_core.engine.operators.topk import TopKOp
from imp_core.engine.operators.union import UnionOp
from imp_core.engine.order_dependence import OrderDependence
from imp_core.engine.schema import COUNT, MULT
from imp_core.engine.stages import (
    Stage,
    backend_roots,
    holds_external,
    is_external,
    state_roots,
)
from imp_core.engine.state import Chunk, Fetch
from imp_core.errors import StateError
from imp_core.plan.nodes import Plan, Scan, explain
from imp_core.sketch.partition import PartitionSet

ALL_KEYS = 2**31 - 2  # no limit on the keys a backend counts (Spark's LIMIT takes a 32-bit count)


@dataclass
class PassStats:
    """What one pass did (for the run log and benchmarks)."""

    input_rows: int = 0
    join_calls: int = 0


def plan_fingerprint(plan: Plan, partitions: PartitionSet) -> str:
    text = explain(plan) + "\n" + json.dumps(partitions.to_json(), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def node_paths(plan: Plan, path: str = "r") -> Iterator[tuple[str, Plan]]:
    """Every node of ``plan`` with its path (``r``, ``r.0``, ``r.0.1``, ...), as the pipeline's stages have them."""
    yield path, plan
    for i, child in enumerate(plan.children):
        yield from node_paths(child, f"{path}.{i}")


def external_candidates(plan: Plan) -> frozenset[str]:
    """The paths of the nodes whose operator can keep its state outside the process."""
    return frozenset(path for path, node in node_paths(plan) if can_be_external(node))


class Pipeline:
    """Incremental operators for ``plan`` under ``partitions``, plus the merge μ at the root."""

    def __init__(self, plan: Plan, partitions: PartitionSet, *, topk_buffer: int = 0,
                 join_caching: JoinCaching | None = None, minmax_buffer: int = 0, topk_index: bool = True,
                 agg_index: bool = True, external: frozenset[str] = frozenset()) -> None:
        """``external``: the node paths of grouped aggregations (and DISTINCTs) whose state lives in a store
        outside the process (``engine/external.py``; bind the stores with :meth:`bind_stores`)."""
        self.plan = plan
        self.external = frozenset(external)
        self.partitions = partitions
        self.fingerprint = plan_fingerprint(plan, partitions)
        self.annotations = AnnotationLayout.of(plan, partitions)
        # which operators decide membership conservatively from order-dependent float sums (refuses unsound shapes)
        self.order_dependence = OrderDependence(plan)
        self._options = dict(topk_buffer=topk_buffer, minmax_buffer=minmax_buffer, join_caching=join_caching,
                             topk_index=topk_index, agg_index=agg_index)
        self.root = self._build(plan, "r")
        self.operators: dict[str, Operator] = {s.path: s.op for s in self.root.walk()}
        self.merge = Merge("merge@r", partitions.total_fragments, self.fingerprint)
        self.stats = PassStats()

    @classmethod
    def configured(cls, plan: Plan, partitions: PartitionSet, opts: Any,
                   external: frozenset[str] = frozenset()) -> Pipeline:
        """A pipeline with the optimizations switched on in ``opts`` (``imp_core.config.Optimizations``) and the
        operators at ``external`` keeping their state outside the process."""
        caching = JoinCaching(bloom=opts.bloom_filters,
                              small_rows=opts.small_side_rows if opts.small_side_in_memory else 0,
                              partner_rows=opts.partner_rows if opts.partner_index else 0,
                              keyed=opts.join_index)
        return cls(plan, partitions, topk_buffer=opts.topk_buffer, join_caching=caching,
                   minmax_buffer=opts.minmax_buffer, topk_index=opts.topk_index,
                   agg_index=opts.agg_index, external=external)

    def _build(self, node: Plan, path: str) -> Stage:
        inputs = tuple(self._build(child, f"{path}.{i}") for i, child in enumerate(node.children))
        ctx = BuildContext(path, self.annotations, self.order_dependence, self.fingerprint, **self._options)
        op = build_external(node, ctx) if path in self.external else build_operator(node, ctx)
        from_state = isinstance(op, (OutputStateOperator, AntiJoinOp)) or (not isinstance(node, Scan)
                                                                       and all(s.from_state for s in inputs))
        return Stage(path, node, op, inputs, frozenset(node.tables()), node.is_stateless(), from_state)

    def stage(self, node: Plan) -> Stage:
        """The stage of plan node ``node`` (matched by identity)."""
        found = next((s for s in self.root.walk() if s.node is node), None)
        if found is None:
            raise KeyError(f"{type(node).__name__} is not a node of this pipeline's plan")
        return found

    def stage_at(self, path: str) -> Stage:
        """The stage at node path ``path``."""
        found = next((s for s in self.root.walk() if s.path == path), None)
        if found is None:
            raise KeyError(f"no stage at {path}")
        return found

    def count_groups(self, path: str, backend: Any, versions: Versions) -> int | None:
        """About how many groups the aggregation (or DISTINCT) at ``path`` has at ``versions``, counted by the
        backend over its input (None where the input holds state of other operators or the backend cannot)."""
        stage = self.stage_at(path)
        if not stage.inputs[0].stateless or not hasattr(backend, "count_groups"):
            return None
        op = stage.op
        keys = op.layout.keys if isinstance(op, Aggregation) else ()
        return backend.count_groups(_Pass(self, backend, versions).relation(stage.inputs[0]), keys, versions)

    def op(self, node: Plan) -> Operator:
        return self.stage(node).op

    def external_operators(self) -> list[ExternalOperator]:
        """The operators whose state lives in a store outside the process, by operator id."""
        return sorted((op for op in self.operators.values() if isinstance(op, ExternalOperator)),
                      key=lambda o: o.op_id)  # type: ignore[attr-defined]

    def bind_stores(self, store_of: Callable[[ExternalOperator], GroupStore]) -> None:
        """Give every external operator its store (``store_of(operator)``)."""
        for op in self.external_operators():
            op.bind(store_of(op))

    def placed(self, external: frozenset[str], store_of: Callable[[ExternalOperator], GroupStore]) -> Pipeline:
        """The same operators and state with the operators at ``external`` keeping their state outside the process
        (new ones get ``store_of(operator)`` and their state written there) and every other in memory (state
        brought back from its store)."""
        if external == self.external:
            return self
        new = Pipeline(self.plan, self.partitions, external=external, **self._options)
        old_ops = {op.op_id: op for op in self.stateful()}
        for op in new.stateful():
            old = old_ops[op.op_id]
            if isinstance(op, ExternalOperator):
                if isinstance(old, ExternalOperator):
                    op.bind(old.store)
                    continue
                op.bind(store_of(op))
                op.set_state_frames(*old.state_frames())  # type: ignore[attr-defined]
            elif isinstance(old, ExternalOperator):
                meta, _ = old.state_frames()
                op.set_state_frames({k: v for k, v in meta.items() if k != "external"}, old.whole_frames())
            else:
                op.set_state_frames(*old.state_frames())
        return new

    def stateful(self) -> list[StatefulOperator]:
        """The operators with state, in a stable order, the merge μ last."""
        out = [op for op in self.operators.values() if isinstance(op, StatefulOperator)
               and (not isinstance(op, JoinOp) or op.keeps_caches)]
        return [*sorted(out, key=lambda o: o.op_id), self.merge]

    # -- state ---------------------------------------------------------------------------------------------------

    def state_blobs(self) -> dict[str, bytes]:
        """Every operator's state as a self-contained blob, by operator id."""
        return {op.op_id: op.state_to_bytes() for op in self.stateful()}

    def saved_states(self) -> dict[str, tuple[bytes, dict[str, Chunk]]]:
        """Every operator's state as the catalog stores it (blob and the chunks it names), by operator id."""
        return {op.op_id: op.saved_state() for op in self.stateful()}

    def load_state_blobs(self, blobs: dict[str, bytes], fetch: Fetch | None = None) -> None:
        """Load every operator's blob; ``fetch`` reads the chunks they name (the catalog's, when they came from it)."""
        for op in self.stateful():
            if op.op_id not in blobs:
                raise StateError(f"operator state for {op.op_id} is missing; recapture the sketch")
            op.load_state(blobs[op.op_id], fetch)

    def repartitioned(self, partitions: PartitionSet, mapping: np.ndarray) -> Pipeline:
        """The same operators under ``partitions``, holding this pipeline's state with every fragment id ``i``
        renamed ``mapping[i]`` (a split or merge of ranges, paper 7.4; ``mapping`` strictly increasing on the ids in
        use). The rows that change fragment are then moved by a pass of deletions under the old id and insertions
        under the new (``__refrag``).

        Raises:
            StateError: The mapping would merge ids in use, or leaves the new partitions.
        """
        if mapping.size != self.partitions.total_fragments:
            raise StateError(f"a repartition maps {mapping.size} fragment ids, the sketch has "
                             f"{self.partitions.total_fragments}")
        new = Pipeline(self.plan, partitions, external=self.external, **self._options)
        if mapping.size and (mapping.min() < 0 or mapping.max() >= partitions.total_fragments):
            raise StateError("a repartition maps fragment ids outside the new partitions")
        old_ops = {op.op_id: op for op in self.stateful()}
        new.bind_stores(lambda op: old_ops[op.op_id].store)  # type: ignore[attr-defined]
        for op in new.stateful():
            op.set_state_frames(*old_ops[op.op_id].relabeled_state(mapping, partitions.total_fragments))
        return new

    def reset(self) -> None:
        for op in self.stateful():
            op.reset()

    def state_size_bytes(self) -> int:
        return sum(op.state_size_bytes() for op in self.stateful())

    def sketch(self) -> set[int]:
        return self.merge.sketch()

    # -- passes --------------------------------------------------------------------------------------------------

    def maintain_pass(self, table: str, changes: pl.DataFrame, backend: JoinBackend | None, versions: Versions,
                      netting: bool = True) -> SketchDelta:
        """Push the change rows of ``table`` (plain columns + ``__mult``) through the tree; ``versions`` are the
        versions every table has reached *after* this pass (a query without joins needs no ``backend``)."""
        self.stats = PassStats(input_rows=changes.height)
        if changes.height == 0:
            return SketchDelta((), ())
        self._use_join_caches(True)
        warming = warm_stores(self.external_operators())
        try:
            run = _Pass(self, backend, versions, table=table, changes=changes, netting=netting)
            delta = run.delta(self.root)
        finally:
            if warming is not None:
                warming.join()
        return self.merge.process(delta if delta is not None else pl.DataFrame())

    def capture(self, backend: Backend, versions: Versions) -> SketchDelta:
        """Full maintenance: rebuild every operator's state and the sketch from the tables at ``versions``."""
        self.reset()
        self._use_join_caches(False)  # full maintenance is the plain capture query: no cache is built here
        self.stats = PassStats()
        if self.root.stateless:
            counts = backend.fragment_counts(Relation(self.plan, self.annotations), versions)
            return self.merge.apply_counts(np.asarray(counts, dtype=np.int64))
        run = _Pass(self, backend, versions, capture=True)
        delta = run.delta(self.root)
        out = self.merge.process(delta if delta is not None else pl.DataFrame())
        added = set(out.added)
        assert not run._speculative, f"results kept back and never read: {sorted(run._speculative)}"
        for stage in run.deferred:  # external state captured on Spark: its output goes up chunk by chunk
            op = stage.op
            assert isinstance(op, ExternalOperator)
            for chunk in op.output_chunks():
                d = _Pass(self, backend, versions, inject={stage.path: chunk}).delta(self.root)
                step = self.merge.process(d if d is not None else pl.DataFrame())
                added = (added | set(step.added)) - set(step.removed)
        return SketchDelta(tuple(sorted(added)), ())

    def warm_caches(self, backend: JoinBackend, versions: Versions) -> None:
        """Build every join's side caches at ``versions`` now (they are otherwise built on first use)."""
        run = _Pass(self, backend, versions)
        for stage in self.root.walk():
            if isinstance(stage.op, JoinOp):
                left, right = stage.inputs
                stage.op.build_caches(StageSide(run, stage, left), StageSide(run, stage, right))

    def relation_from_state(self, node: Plan) -> pl.DataFrame | None:
        """``node``'s current annotated contents computed from operator state alone, or None if it reads tables."""
        stage = self.stage(node)
        return _Pass(self, None, {}).state_contents(stage) if stage.from_state else None

    def as_relation(self, node: Plan) -> Relation:
        """``node``'s subtree as a backend computes it, with the current contents of its parts held in state (what a
        backend's ``relation`` or ``fragment_counts`` needs to recompute ``node`` at the tables' versions)."""
        return _Pass(self, None, {}).relation(self.stage(node))

    def _use_join_caches(self, on: bool) -> None:
        for op in self.operators.values():
            if isinstance(op, JoinOp):
                op.use_caches = on


class _Pass:
    """One pass up the tree. A capture (no ``table``) starts at the frontier stateful operators, whose inputs the
    backend computes whole; a maintenance pass starts at the scans of ``table``. Within a pass every stage is
    processed once, before its parent reads it, so contents computed from state are cached for the pass."""

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

    def delta(self, stage: Stage) -> pl.DataFrame | None:
        """The delta of ``stage``'s output, or None when nothing below it changed."""
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
        if self.capture and isinstance(op, AntiJoinOp):
            if isinstance(op, ExternalOperator) and (kept := self._capture_anti_join(stage)) is not None:
                return kept
            dl, dr = self._anti_join_inputs(left, right, op.right_keys)
        else:
            dl, dr = self.delta(left), self.delta(right)
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
            return any(p == stage.path or p.startswith(stage.path + ".") for p in self.inject)
        return not stage.stateless if self.capture else self.table in stage.tables

    def _union_delta(self, stage: Stage, op: UnionOp) -> pl.DataFrame | None:
        """The union of the inputs' deltas; a capture reads a stateless input whole from the backend (it has no
        delta of its own there)."""
        parts = []
        for i, s in enumerate(stage.inputs):
            d = self._input_relation(s) if self.capture else self.delta(s)
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
        if isinstance(op, ExternalOperator) and hasattr(backend, "capture_external") and self._may_defer(stage):
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
        op.reset()
        if not self.backend.capture_external(rel, op, self.versions):
            return None
        op.bind(op.store)
        self._consumed(roots)
        return self._defer(stage)

    def _capture_anti_join(self, stage: Stage) -> pl.DataFrame | None:
        """Capture an external anti join on the backend from its two inputs (the results of external operators below
        read from their stores there), its result kept back (:meth:`_defer`); None where it cannot: the caller then
        brings both inputs whole into this process."""
        if not hasattr(self.backend, "capture_anti_join") or not self._may_defer(stage):
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
        it has another input that holds operator state. Such a join would read the result whole from the store when
        the other input's rows go up in this pass, and join them again when the result's own rows go up after it."""
        node = self.pipeline.root
        while node is not stage:
            child = next(s for s in node.inputs if stage.path == s.path or stage.path.startswith(s.path + "."))
            if isinstance(node.op, JoinOp) and any(s is not child and not s.stateless for s in node.inputs):
                return False
            node = child
        return True

    def _backend_relation(self, stage: Stage) -> tuple[Relation, list[Stage]] | None:
        """In a capture, ``stage``'s subtree as the backend computes it with the results of the external operators
        below read from their stores (``Relation.external``), and the operators whose results it reads; None when the
        backend cannot read one of them, or a result held in memory is not whole yet (an external operator below it
        sends its result up only after the pass)."""
        if not hasattr(self.backend, "reads_external"):
            return None
        roots = list(backend_roots(stage))
        self._stacking += 1
        try:
            for r in roots:
                if r.path not in self._captured:
                    self._captured[r.path] = self.delta(r)
        finally:
            self._stacking -= 1
        if any(d.path.startswith(stage.path + ".") and d not in roots for d in self.deferred):
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

    def _anti_join_inputs(self, left: Stage, right: Stage, keys: list[str]) -> tuple[pl.DataFrame, pl.DataFrame]:
        """In a capture, an anti join's inputs whole (its state starts from them): read by the backend with the
        results of external operators below from their stores where it can, else pushed up through the pass."""
        dl = dr = None
        if holds_external(left) and (found := self._backend_relation(left)) is not None:
            dl = self.backend.relation(found[0], self.versions)
            self._consumed(found[1])
        if holds_external(right) and isinstance(self.backend, JoinCacheBackend) and \
                (found := self._backend_relation(right)) is not None:
            counts = self.backend.key_counts(found[0], keys, ALL_KEYS, self.versions)
            if counts is not None:
                dr = counts.select([*keys, pl.col(COUNT).cast(pl.Int64).alias(MULT)])
                self._consumed(found[1])
        return (dl if dl is not None else self._input_relation(left),
                dr if dr is not None else self._key_rows(right, keys))

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
        if not hasattr(self.backend, "reads_external_side") or not holds_external(stage):
            return None
        roots = list(backend_roots(stage))
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


__all__ = ["PassStats", "Pipeline", "SketchDelta", "Stage", "Versions", "external_candidates", "node_paths",
           "plan_fingerprint"]

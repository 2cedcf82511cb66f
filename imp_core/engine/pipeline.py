"""The operator tree of one sketch's query, and the two passes that run through it: ``maintain_pass`` (the change
rows of one table) and ``capture`` (full maintenance).

See docs/ARCHITECTURE.md, "Passes and backends".
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypedDict

import numpy as np
import polars as pl

from imp_core.engine.annotation import AnnotationLayout
from imp_core.engine.backend import Backend, GroupCountingBackend, JoinBackend, Relation, Versions
from imp_core.engine.external import ExternalOperator, GroupStore, warm_stores
from imp_core.engine.join_sides import StageSide
from imp_core.engine.operators.aggregation import Aggregation
from imp_core.engine.operators.anti_join import AntiJoinOp
from imp_core.engine.operators.base import (
    Operator,
    OutputStateOperator,
    SketchDelta,
    StatefulOperator,
)
from imp_core.engine.operators.context import BuildContext, JoinCaching
from imp_core.engine.operators.join import JoinOp
from imp_core.engine.operators.merge import Merge
from imp_core.engine.operators.registry import build_external, build_operator, can_be_external
from imp_core.engine.order_dependence import OrderDependence
from imp_core.engine.passes import TreePass
from imp_core.engine.stages import (
    Stage,
)
from imp_core.engine.state import Chunk, Fetch, Sink
from imp_core.errors import StateError
from imp_core.plan.nodes import Plan, Scan, explain, shared, shares_state
from imp_core.sketch.partition import PartitionSet


@dataclass
class PassStats:
    """What one pass did (for the run log and benchmarks)."""

    input_rows: int = 0
    join_calls: int = 0


def plan_fingerprint(plan: Plan, partitions: PartitionSet) -> str:
    """The identity of the operators ``plan`` builds under ``partitions``, saved state is tied to. A plan whose
    stateful subtrees have several places says so: their places share one stage and one state (state saved while each
    place had its own is recaptured)."""
    text = explain(plan) + "\n" + json.dumps(partitions.to_json(), sort_keys=True, default=str)
    if shares_state(plan):
        text += "\nshared stages"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def node_paths(plan: Plan, path: str = "r") -> Iterator[tuple[str, Plan]]:
    """Every node of ``plan`` with its path (``r``, ``r.0``, ``r.0.1``, ...), as the pipeline's stages have them."""
    yield path, plan
    for i, child in enumerate(plan.children):
        yield from node_paths(child, f"{path}.{i}")


def external_candidates(plan: Plan) -> frozenset[str]:
    """The paths of the nodes whose operator can keep its state outside the process."""
    return frozenset(path for path, node in node_paths(plan) if can_be_external(node))


class _Options(TypedDict):
    """The optimizations a pipeline hands to every operator it builds (and to the pipelines made from it)."""

    topk_buffer: int
    minmax_buffer: int
    join_caching: JoinCaching | None
    topk_index: bool
    agg_index: bool


class Pipeline:
    """Incremental operators for ``plan`` under ``partitions``, plus the merge μ at the root."""

    def __init__(self, plan: Plan, partitions: PartitionSet, *, topk_buffer: int = 0,
                 join_caching: JoinCaching | None = None, minmax_buffer: int = 0, topk_index: bool = True,
                 agg_index: bool = True, external: frozenset[str] = frozenset()) -> None:
        """``external``: the node paths of grouped aggregations (and DISTINCTs) whose state lives in a store
        outside the process (``engine/external.py``; bind the stores with :meth:`bind_stores`).

        Equal subtrees of ``plan`` are one stage (:func:`~imp_core.plan.nodes.shared`): a stage has the path of its
        first place (depth first) and the others name it (:meth:`stage_at`), so one operator keeps their state and a
        pass computes their delta once."""
        plan = shared(plan)
        self.plan = plan
        self._places: dict[int, str] = {}  # id(node) -> its stage's path (its first place)
        for path, node in node_paths(plan):
            self._places.setdefault(id(node), path)
        self._canonical = {path: self._places[id(node)] for path, node in node_paths(plan)}
        self.external = frozenset(self._canonical.get(p, p) for p in external)
        self.partitions = partitions
        self.fingerprint = plan_fingerprint(plan, partitions)
        self.annotations = AnnotationLayout.of(plan, partitions)
        # which operators decide membership conservatively from order-dependent float sums (refuses unsound shapes)
        self.order_dependence = OrderDependence(plan)
        self._options = _Options(topk_buffer=topk_buffer, minmax_buffer=minmax_buffer, join_caching=join_caching,
                                 topk_index=topk_index, agg_index=agg_index)
        self._built: dict[int, Stage] = {}
        self.root = self._build(plan, "r")
        self.operators: dict[str, Operator] = {s.path: s.op for s in self.stages()}
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
        if id(node) in self._built:  # a later place of a shared subtree
            return self._built[id(node)]
        inputs = tuple(self._build(child, f"{path}.{i}") for i, child in enumerate(node.children))
        ctx = BuildContext(path, self.annotations, self.order_dependence, self.fingerprint, **self._options)
        op = build_external(node, ctx) if path in self.external else build_operator(node, ctx)
        from_state = isinstance(op, (OutputStateOperator, AntiJoinOp)) or (not isinstance(node, Scan)
                                                                       and all(s.from_state for s in inputs))
        stage = Stage(path, node, op, inputs, frozenset(node.tables()), node.is_stateless(), from_state)
        self._built[id(node)] = stage
        return stage

    def stages(self) -> Iterator[Stage]:
        """Every stage once (a shared subtree's at its first place), depth first."""
        seen: set[int] = set()
        for s in self.root.walk():
            if id(s) not in seen:
                seen.add(id(s))
                yield s

    def node_paths(self) -> Iterator[tuple[str, Plan]]:
        """Every stage's path and plan node, once per stage (:func:`node_paths` lists a shared subtree's every
        place)."""
        return ((s.path, s.node) for s in self.stages())

    def stage(self, node: Plan) -> Stage:
        """The stage of plan node ``node`` (matched by identity, else by equality: a copy of the plan's node)."""
        found = self._built.get(id(node)) or next((s for s in self.stages() if s.node == node), None)
        if found is None:
            raise KeyError(f"{type(node).__name__} is not a node of this pipeline's plan")
        return found

    def stage_at(self, path: str) -> Stage:
        """The stage at node path ``path`` (any place of a shared subtree)."""
        path = self._canonical.get(path, path)
        found = next((s for s in self.stages() if s.path == path), None)
        if found is None:
            raise KeyError(f"no stage at {path}")
        return found

    def count_groups(self, path: str, backend: Any, versions: Versions) -> int | None:
        """About how many groups the aggregation (or DISTINCT) at ``path`` has at ``versions``, counted by the
        backend over its input (None where the input holds state of other operators or the backend cannot)."""
        stage = self.stage_at(path)
        if not stage.inputs[0].stateless or not isinstance(backend, GroupCountingBackend):
            return None
        op = stage.op
        keys = op.layout.keys if isinstance(op, Aggregation) else ()
        return backend.count_groups(TreePass(self, backend, versions).relation(stage.inputs[0]), keys, versions)

    def op(self, node: Plan) -> Operator:
        return self.stage(node).op

    def external_operators(self) -> list[ExternalOperator]:
        """The operators whose state lives in a store outside the process, by operator id."""
        return sorted((op for op in self.operators.values() if isinstance(op, ExternalOperator)),
                      key=lambda o: o.op_id)

    def bind_stores(self, store_of: Callable[[ExternalOperator], GroupStore]) -> None:
        """Give every external operator its store (``store_of(operator)``)."""
        for op in self.external_operators():
            op.bind(store_of(op))

    def placed(self, external: frozenset[str], store_of: Callable[[ExternalOperator], GroupStore]) -> Pipeline:
        """The same operators and state with the operators at ``external`` keeping their state outside the process
        (new ones get ``store_of(operator)`` and their state written there) and every other in memory (state
        brought back from its store).

        Raises:
            StateError: An aggregation whose MIN/MAX keeps a bounded buffer (``minmax_buffer=N``) would move: a store
                keeps every value, the buffer only the best N per group, so neither form is the other's (the service
                recaptures, placing it afresh).
        """
        if external == self.external:
            return self
        new = Pipeline(self.plan, self.partitions, external=external, **self._options)
        old_ops = {op.op_id: op for op in self.stateful()}
        for op in new.stateful():
            old = old_ops[op.op_id]
            if isinstance(op, ExternalOperator) != isinstance(old, ExternalOperator):
                _check_movable(old if isinstance(op, ExternalOperator) else op)
            if isinstance(op, ExternalOperator):
                if isinstance(old, ExternalOperator):
                    op.bind(old.store)
                    continue
                op.bind(store_of(op))
                meta, frames = old.state_frames()
                op.set_state_frames(meta, dict(frames))
            elif isinstance(old, ExternalOperator):
                meta, _ = old.state_frames()
                op.set_state_frames({k: v for k, v in meta.items() if k != "external"}, old.whole_frames())
            else:
                meta, frames = old.state_frames()
                op.set_state_frames(meta, dict(frames))
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

    def saved_states(self, sink: Sink | None = None) -> dict[str, tuple[bytes, dict[str, Chunk]]]:
        """Every operator's state as the catalog stores it (blob and the chunks it names), by operator id; large
        frames go to ``sink`` as parts, one at a time, when given (``imp_core.engine.state``)."""
        return {op.op_id: op.saved_state(sink) for op in self.stateful()}

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
            run = TreePass(self, backend, versions, table=table, changes=changes, netting=netting)
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
        run = TreePass(self, backend, versions, capture=True)
        delta = run.delta(self.root)
        out = self.merge.process(delta if delta is not None else pl.DataFrame())
        added = set(out.added)
        assert not run._speculative, f"results kept back and never read: {sorted(run._speculative)}"
        for stage in run.deferred:  # external state captured on Spark: its output goes up chunk by chunk
            op = stage.op
            assert isinstance(op, ExternalOperator)
            for chunk in op.output_chunks():
                d = TreePass(self, backend, versions, inject={stage.path: chunk}).delta(self.root)
                step = self.merge.process(d if d is not None else pl.DataFrame())
                added = (added | set(step.added)) - set(step.removed)
        return SketchDelta(tuple(sorted(added)), ())

    def warm_caches(self, backend: JoinBackend, versions: Versions) -> None:
        """Build every join's side caches at ``versions`` now (they are otherwise built on first use)."""
        run = TreePass(self, backend, versions)
        for stage in self.stages():
            if isinstance(stage.op, JoinOp):
                left, right = stage.inputs
                stage.op.build_caches(StageSide(run, stage, left), StageSide(run, stage, right))

    def relation_from_state(self, node: Plan) -> pl.DataFrame | None:
        """``node``'s current annotated contents computed from operator state alone, or None if it reads tables."""
        stage = self.stage(node)
        return TreePass(self, None, {}).state_contents(stage) if stage.from_state else None

    def as_relation(self, node: Plan) -> Relation:
        """``node``'s subtree as a backend computes it, with the current contents of its parts held in state (what a
        backend's ``relation`` or ``fragment_counts`` needs to recompute ``node`` at the tables' versions)."""
        return TreePass(self, None, {}).relation(self.stage(node))

    def _use_join_caches(self, on: bool) -> None:
        for op in self.operators.values():
            if isinstance(op, JoinOp):
                op.use_caches = on


def _check_movable(memory: StatefulOperator) -> None:
    """Refuse to move ``memory`` (the in-memory form of an operator that moves) between memory and a store when its
    MIN/MAX values are a bounded buffer: the buffer holds the best N values per group, a store every value.

    Raises:
        StateError: It is such an aggregation.
    """
    if not isinstance(memory, Aggregation) or not memory.minmax_buffer:
        return
    extremes = [name for name, a in memory.aggs if a.func in ("min", "max") and not a.distinct]
    if extremes:
        n = memory.minmax_buffer
        raise StateError(f"operator {memory.op_id}: its MIN/MAX state ({', '.join(extremes)}) keeps the best {n} "
                         f"values per group (minmax_buffer={n}) and cannot move between memory and Delta tables; "
                         f"recapture the sketch (imp sketch recapture), or set minmax_buffer=0")


__all__ = ["PassStats", "Pipeline", "SketchDelta", "Stage", "Versions", "external_candidates", "node_paths",
           "plan_fingerprint"]

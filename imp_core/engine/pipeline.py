"""An operator tree for one sketch's query, and the passes that run change batches through it.

``Pipeline`` builds one incremental operator per plan node (stable ids from the node's position), plus the merge
operator μ at the root. It runs two kinds of passes:

* ``maintain_pass(table, changes, versions)``: the change rows of one table between two versions go up the tree;
  subtrees that do not read the table produce no delta. Joins ask the ``Backend`` to join a delta with the other
  input's contents at ``versions`` (the versions already reached). Processing changed tables one after another this
  way is exact for any number of tables (``Δ(R⋈S) = ΔR⋈S + R'⋈ΔS``).
* ``capture(versions)``: full maintenance. The backend computes, for every *frontier* operator (a stateful operator
  whose input contains no stateful operator, or μ when the query has none), its input pre-aggregated at
  ``versions``; those operators bootstrap their state and their output flows up through the rest of the tree
  exactly like a maintenance pass. So the state a capture builds and the state maintenance reaches are made by the
  same operator code.

The backend does the heavy lifting over full tables (Spark in production, polars in tests); the pipeline and the
operators never do I/O.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import polars as pl

from imp_core.engine.annotation import MULT, SET, consolidate
from imp_core.engine.evaluate import polars_type
from imp_core.engine.operators.aggregation import Aggregation
from imp_core.engine.operators.base import Operator, StatefulOperator
from imp_core.engine.operators.join import JoinCaching, JoinOp, JoinSide
from imp_core.engine.operators.merge import Merge, SketchDelta
from imp_core.engine.operators.projection import Projection
from imp_core.engine.operators.selection import Selection
from imp_core.engine.operators.table_access import TableAccess
from imp_core.engine.operators.topk import TopKOp
from imp_core.engine.order_dependence import CERTAIN, OrderDependence, hi_name, lo_name
from imp_core.errors import StateError, UnsupportedError
from imp_core.plan.expr import AggCall, Col
from imp_core.plan.nodes import Aggregate, Distinct, Join, Plan, Project, Scan, Select, TopK, explain
from imp_core.sketch.partition import PartitionSet

Versions = dict[str, int]


class Backend(Protocol):
    """What the engine needs from the engine that holds the tables."""

    def join_side(self, node: Plan, pipeline: Pipeline, versions: Versions) -> JoinSide:
        """Access to ``node``'s current annotated contents at ``versions``."""
        ...

    def aggregate_input(self, node: Aggregate, op: Aggregation, pipeline: Pipeline,
                        versions: Versions) -> tuple[pl.DataFrame, pl.DataFrame, dict[int, pl.DataFrame]]:
        """Pre-aggregated input of a frontier aggregation: (partials, F_g pairs, MIN/MAX value counts)."""
        ...

    def relation(self, node: Plan, pipeline: Pipeline, versions: Versions) -> pl.DataFrame:
        """``node``'s full annotated result as an all-insert delta (for a frontier top-k)."""
        ...

    def fragment_counts(self, node: Plan, pipeline: Pipeline, versions: Versions) -> np.ndarray:
        """Per global fragment, the number of result rows of ``node`` whose annotation contains it."""
        ...

    def side_summary(self, node: Plan, keys: list[str], max_rows: int, pipeline: Pipeline,
                     versions: Versions) -> tuple[pl.DataFrame | None, pl.DataFrame | None]:
        """``node``'s annotated rows if at most ``max_rows``, else its join-key counts (key columns, ``__n``)."""
        ...

    def rows_with_keys(self, node: Plan, keys: list[str], values: pl.DataFrame, max_rows: int, pipeline: Pipeline,
                       versions: Versions) -> pl.DataFrame | None:
        """``node``'s annotated rows whose ``keys`` match a row of ``values``; None if more than ``max_rows`` (0: no
        limit)."""
        ...

    def key_counts(self, node: Plan, keys: list[str], max_keys: int, pipeline: Pipeline,
                   versions: Versions) -> pl.DataFrame | None:
        """``node``'s rows per join key (key columns, ``__n``); None if it has more than ``max_keys`` keys."""
        ...


@dataclass
class PassStats:
    """What one pass did (for the run log and benchmarks)."""

    input_rows: int = 0
    join_calls: int = 0


def plan_fingerprint(plan: Plan, partitions: PartitionSet) -> str:
    text = explain(plan) + "\n" + json.dumps(partitions.to_json(), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class Pipeline:
    """Incremental operators for ``plan`` under ``partitions``."""

    def __init__(self, plan: Plan, partitions: PartitionSet, *, topk_buffer: int = 0,
                 join_caching: JoinCaching | None = None, minmax_buffer: int = 0) -> None:
        self.plan = plan
        self.partitions = partitions
        self.fingerprint = plan_fingerprint(plan, partitions)
        self.ops: dict[int, Operator] = {}  # id(node) -> operator
        self.paths: dict[int, str] = {}
        self._frag_index = 0
        self.topk_buffer = topk_buffer
        self.join_caching = join_caching
        self.minmax_buffer = minmax_buffer
        # which operators decide membership conservatively from order-dependent float sums (refuses unsound shapes)
        self.order_dependence = OrderDependence(plan)
        self._build(plan, "r")
        self.merge = Merge("merge@r", partitions.total_fragments, self.fingerprint)
        self.stats = PassStats()

    @classmethod
    def configured(cls, plan: Plan, partitions: PartitionSet, opts: Any) -> Pipeline:
        """A pipeline with the optimizations switched on in ``opts`` (``imp_core.config.Optimizations``)."""
        caching = JoinCaching(bloom=opts.bloom_filters,
                              small_rows=opts.small_side_rows if opts.small_side_in_memory else 0,
                              partner_rows=opts.partner_rows if opts.partner_index else 0)
        return cls(plan, partitions, topk_buffer=opts.topk_buffer, join_caching=caching,
                   minmax_buffer=opts.minmax_buffer)

    # -- construction --------------------------------------------------------------------------------------------

    def _build(self, node: Plan, path: str) -> None:
        self.paths[id(node)] = path
        for i, child in enumerate(node.children):
            self._build(child, f"{path}.{i}")
        if isinstance(node, Scan):
            part = self.partitions.get(node.table)
            offset = self.partitions.offset(node.table) if part is not None else 0
            op: Operator = TableAccess(f"scan@{path}", node, part, offset, self._frag_index)
            if part is not None:
                self._frag_index += 1
        elif isinstance(node, Select):
            role = self.order_dependence.role(node)
            op = Selection(f"select@{path}", node.predicate, self.order_dependence.bounded_input(node),
                           role.conservative, role.flagged_input, role.flagged_output)
        elif isinstance(node, Project):
            role = self.order_dependence.role(node)
            op = Projection(f"project@{path}", node.items, self.order_dependence.bounded_input(node), role.carry,
                            role.flagged_input)
        elif isinstance(node, Join):
            op = JoinOp(f"join@{path}", node, self.join_caching, self.fingerprint)
        elif isinstance(node, Aggregate):
            key_types = {n: polars_type(e.dtype) for n, e in node.keys}
            op = Aggregation(f"aggregation@{path}", node.keys, node.aggs, key_types, self.fingerprint,
                             minmax_buffer=self.minmax_buffer, bounds=self.order_dependence.role(node).carry)
        elif isinstance(node, Distinct):
            keys = tuple((f.name, Col(f.name, f.dtype)) for f in node.child.schema)
            key_types = {f.name: polars_type(f.dtype) for f in node.child.schema}
            op = Aggregation(f"distinct@{path}", keys, (), key_types, self.fingerprint)
            op.kind = "distinct"
        elif isinstance(node, TopK):
            role = self.order_dependence.role(node)
            bounded = self.order_dependence.bounded_input(node)
            schema = {f.name: polars_type(f.dtype) for f in node.schema}
            for c in sorted(bounded):  # intervals and the certain flag the input carries stay with each row
                schema[lo_name(c)] = schema[hi_name(c)] = pl.Float64
            if role.flagged_input:
                schema[CERTAIN] = pl.Boolean
            op = TopKOp(f"topk@{path}", node.order, node.k, schema, self.fingerprint, buffer=self.topk_buffer,
                        bounded=bounded, conservative=role.conservative)
        else:
            raise UnsupportedError(f"plan node {type(node).__name__} has no incremental operator")
        self.ops[id(node)] = op

    def op(self, node: Plan) -> Operator:
        return self.ops[id(node)]

    def frag_column(self, scan: Scan) -> str | None:
        op = self.op(scan)
        assert isinstance(op, TableAccess)
        return op.frag_name if op.partition is not None else None

    def stateful(self) -> list[StatefulOperator]:
        out: list[StatefulOperator] = [op for op in self.ops.values() if isinstance(op, StatefulOperator)
                                       and (not isinstance(op, JoinOp) or op.stateful_now)]
        return [*sorted(out, key=lambda o: o.op_id), self.merge]

    def _use_join_caches(self, on: bool) -> None:
        for op in self.ops.values():
            if isinstance(op, JoinOp):
                op.use_caches = on

    # -- state ---------------------------------------------------------------------------------------------------

    def state_blobs(self) -> dict[str, bytes]:
        return {op.op_id: op.state_to_bytes() for op in self.stateful()}

    def load_state_blobs(self, blobs: dict[str, bytes]) -> None:
        for op in self.stateful():
            if op.op_id not in blobs:
                raise StateError(f"operator state for {op.op_id} is missing; recapture the sketch")
            op.load_state(blobs[op.op_id])

    def reset(self) -> None:
        for op in self.stateful():
            op.reset()

    def state_size_bytes(self) -> int:
        return sum(op.state_size_bytes() for op in self.stateful())

    def sketch(self) -> set[int]:
        return self.merge.sketch()

    # -- passes --------------------------------------------------------------------------------------------------

    def maintain_pass(self, table: str, changes: pl.DataFrame, backend: Backend, versions: Versions,
                      netting: bool = True) -> SketchDelta:
        """Push the change rows of ``table`` (plain columns + ``__mult``) through the tree; ``versions`` are the
        versions every table has reached *after* this pass."""
        self.stats = PassStats(input_rows=changes.height)
        if changes.height == 0:
            return SketchDelta((), ())

        def leaf(scan: Scan) -> pl.DataFrame | None:
            if scan.table != table:
                return None
            out = self.op(scan).process(changes)  # type: ignore[attr-defined]
            return consolidate(out) if netting else out

        self._use_join_caches(True)
        delta = self._delta(self.plan, leaf, lambda n: table in n.tables(), backend, versions, capture=False)
        return self.merge.process(delta if delta is not None else pl.DataFrame())

    def capture(self, backend: Backend, versions: Versions) -> SketchDelta:
        """Full maintenance: rebuild every operator's state and the sketch from the tables at ``versions``."""
        self.reset()
        self._use_join_caches(False)  # full maintenance is the plain capture query: no cache is built here
        self.stats = PassStats()
        if self.plan.is_stateless():
            counts = backend.fragment_counts(self.plan, self, versions)
            return self.merge.apply_counts(np.asarray(counts, dtype=np.int64))
        delta = self._delta(self.plan, lambda s: None, lambda n: not n.is_stateless(), backend, versions,
                            capture=True)
        return self.merge.process(delta if delta is not None else pl.DataFrame())

    def _delta(self, node: Plan, leaf, changed, backend: Backend, versions: Versions,  # noqa: ANN001
               capture: bool) -> pl.DataFrame | None:
        """The delta of ``node``'s output, or None when nothing below it changed."""
        if not changed(node):
            return None
        op = self.op(node)
        if isinstance(node, Scan):
            return leaf(node)
        if capture and isinstance(node, (Aggregate, Distinct, TopK)) and node.child.is_stateless():
            return self._bootstrap(node, backend, versions)
        if isinstance(node, Join):
            dl = self._delta(node.left, leaf, changed, backend, versions, capture)
            dr = self._delta(node.right, leaf, changed, backend, versions, capture)
            assert isinstance(op, JoinOp)
            self.stats.join_calls += int(dl is not None and dl.height > 0) + int(dr is not None and dr.height > 0)
            left_side = _LazySide(backend, node.left, self, versions)
            right_side = _LazySide(backend, node.right, self, versions)
            out = op.process(dl, dr, left_side, right_side)
            return out
        child = self._delta(node.children[0], leaf, changed, backend, versions, capture)
        if child is None:
            return None
        out = op.process(child)  # type: ignore[attr-defined]
        if capture and isinstance(op, (Aggregation, TopKOp)):
            # A capture hands Q(D) upward as an all-insert delta. From reset state that is what `process` returns,
            # except for an aggregation without GROUP BY: its one row exists even over an empty input.
            return op.current_output()
        return out

    def _bootstrap(self, node: Plan, backend: Backend, versions: Versions) -> pl.DataFrame:
        op = self.op(node)
        if isinstance(op, Aggregation):
            assert isinstance(node, (Aggregate, Distinct))
            agg_node = node if isinstance(node, Aggregate) else _distinct_as_aggregate(node)
            partial, fpairs, values = backend.aggregate_input(agg_node, op, self, versions)
            return op.bootstrap(partial, fpairs, values)
        assert isinstance(op, TopKOp) and isinstance(node, TopK)
        rows = backend.relation(node.child, self, versions)
        op.reset()
        return op.process(rows)

    def warm_caches(self, backend: Backend, versions: Versions) -> None:
        """Build every join's side caches at ``versions`` now (they are otherwise built on first use)."""
        for node in self.plan.walk():
            if isinstance(node, Join):
                op = self.op(node)
                assert isinstance(op, JoinOp)
                op.build_caches(_LazySide(backend, node.left, self, versions),
                                _LazySide(backend, node.right, self, versions))

    def parent_join(self, node: Plan) -> JoinOp:
        """The join operator that has ``node`` as an input."""
        for n in self.plan.walk():
            if isinstance(n, Join) and (n.left is node or n.right is node):
                op = self.op(n)
                assert isinstance(op, JoinOp)
                return op
        raise StateError("join side without a parent join")

    # -- current contents of stateful subtrees ---------------------------------------------------------------------

    def current(self, node: Plan) -> pl.DataFrame | None:
        """``node``'s current annotated output computed from operator state alone, or None if it reads tables."""
        op = self.op(node)
        if isinstance(op, (Aggregation, TopKOp)):
            return op.current_output()
        if isinstance(node, Scan):
            return None
        if isinstance(node, Join):
            left, right = self.current(node.left), self.current(node.right)
            if left is None or right is None:
                return None
            assert isinstance(op, JoinOp)
            return op.join_frames(left, right)
        child = self.current(node.children[0])
        if child is None:
            return None
        return op.process(child)  # type: ignore[attr-defined]


def _distinct_as_aggregate(node: Distinct) -> Aggregate:
    return Aggregate(node.child, tuple((f.name, Col(f.name, f.dtype)) for f in node.child.schema), ())


class _LazySide:
    """A JoinSide that asks the backend only when a delta actually needs joining."""

    def __init__(self, backend: Backend, node: Plan, pipeline: Pipeline, versions: Versions) -> None:
        self.backend, self.node, self.pipeline, self.versions = backend, node, pipeline, versions

    def join_delta(self, delta: pl.DataFrame, delta_is_left: bool) -> pl.DataFrame:
        current = self.pipeline.current(self.node)
        if current is not None:
            parent = self._parent_join()
            if delta_is_left:
                return parent.join_frames(delta, current)
            return parent.join_frames(current, delta)
        return self.backend.join_side(self.node, self.pipeline, self.versions).join_delta(delta, delta_is_left)

    def _parent_join(self) -> JoinOp:
        return self.pipeline.parent_join(self.node)

    def summary(self, keys: list[str], max_rows: int) -> tuple[pl.DataFrame | None, pl.DataFrame | None]:
        if self.pipeline.current(self.node) is not None:
            return None, None  # computed from operator state: already in memory
        return self.backend.side_summary(self.node, keys, max_rows, self.pipeline, self.versions)

    def rows_with_keys(self, keys: list[str], values: pl.DataFrame, max_rows: int) -> pl.DataFrame | None:
        if self.pipeline.current(self.node) is not None:
            return None  # computed from operator state: already in memory
        return self.backend.rows_with_keys(self.node, keys, values, max_rows, self.pipeline, self.versions)

    def key_counts(self, keys: list[str], max_keys: int) -> pl.DataFrame | None:
        if self.pipeline.current(self.node) is not None:
            return None  # computed from operator state: already in memory
        return self.backend.key_counts(self.node, keys, max_keys, self.pipeline, self.versions)


__all__ = ["Backend", "Pipeline", "PassStats", "SketchDelta", "Versions", "MULT", "SET", "AggCall"]

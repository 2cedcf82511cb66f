"""What the engine asks of the engine that holds the tables: capture inputs, joins of a delta with an input, and
(optionally) look-ups that build join caches.

A backend receives a plan subtree as a ``Relation`` (the node, how its scans are annotated, and the current contents
of its parts that follow from operator state) and the table versions to read; it never calls back into the
pipeline. See docs/ARCHITECTURE.md, "Passes and backends".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
import polars as pl

from imp_core.engine.annotation import AnnotationLayout
from imp_core.engine.operators.partials import PartialLayout, Partials
from imp_core.plan.nodes import Join, Plan

Versions = dict[str, int]


@dataclass(frozen=True)
class Relation:
    """A plan subtree as a backend computes it: ``node``, the annotation of the plan's scans, and ``from_state``:
    the subtrees below ``node`` whose current annotated contents follow from operator state alone, with those
    contents (the backend uses them instead of computing the subtrees; matched by identity)."""

    node: Plan
    annotations: AnnotationLayout
    from_state: tuple[tuple[Plan, pl.DataFrame], ...] = ()
    # subtrees whose contents are the result of an operator keeping its state outside the process (its operator: the
    # backend reads the result from the operator's store where it can, ``capture_external``)
    external: tuple[tuple[Plan, Any], ...] = ()

    def state_of(self, node: Plan) -> pl.DataFrame | None:
        """The contents of ``node`` if it is one of ``from_state``."""
        return next((frame for n, frame in self.from_state if n is node), None)

    def external_of(self, node: Plan) -> Any:
        """The operator whose store holds ``node``'s contents, if it is one of ``external``."""
        return next((op for n, op in self.external if n is node), None)


class CaptureBackend(Protocol):
    """Full relations at pinned versions, for a capture (full maintenance)."""

    def aggregate_input(self, child: Relation, layout: PartialLayout, versions: Versions) -> Partials:
        """The whole input of a frontier aggregation (``child``, which reads only tables), folded per group and
        fragment in the aggregation's ``layout``."""
        ...

    def relation(self, rel: Relation, versions: Versions) -> pl.DataFrame:
        """``rel``'s full annotated contents as an all-insert frame (the input of a frontier top-k)."""
        ...

    def fragment_counts(self, rel: Relation, versions: Versions) -> np.ndarray:
        """Per global fragment, the number of rows of ``rel`` whose annotation contains it (a query without
        stateful operators)."""
        ...


class JoinBackend(Protocol):
    """Joins of a delta with one input of a join at the versions a pass has reached."""

    def join_delta(self, join: Join, delta: pl.DataFrame, delta_is_left: bool, other: Relation,
                   versions: Versions) -> pl.DataFrame:
        """``delta ⋈ other`` (or ``other ⋈ delta``) under ``join``'s condition: the join's output columns
        (``imp_core.engine.schema.join_columns``) with ``__mult`` the product of both multiplicities."""
        ...


@runtime_checkable
class JoinCacheBackend(Protocol):
    """Optional: the look-ups that build join side caches (a backend without them gets no caches)."""

    def side_summary(self, side: Relation, keys: list[str], max_rows: int,
                     versions: Versions) -> tuple[pl.DataFrame | None, pl.DataFrame | None]:
        """``side``'s annotated rows if at most ``max_rows``, else its join-key counts (key columns, ``__n``)."""
        ...

    def rows_with_keys(self, side: Relation, keys: list[str], values: pl.DataFrame, max_rows: int,
                       versions: Versions) -> pl.DataFrame | None:
        """``side``'s annotated rows whose ``keys`` match a row of ``values``; None beyond ``max_rows`` (0: no
        limit)."""
        ...

    def key_counts(self, side: Relation, keys: list[str], max_keys: int, versions: Versions) -> pl.DataFrame | None:
        """``side``'s rows per join key (key columns, ``__n``); None beyond ``max_keys`` keys."""
        ...


@runtime_checkable
class StoreReadingBackend(Protocol):
    """Optional: a backend that reads the results of operators keeping their state in stores outside the process
    straight from those stores (``Relation.external``), and captures such operators' state into their stores. A
    backend without it gets those results as frames brought into the process."""

    def reads_external(self, rel: Relation) -> bool:
        """Whether the results of ``rel.external``'s operators can be computed here from their stores."""
        ...

    def reads_external_side(self, rel: Relation) -> bool:
        """Whether a join side's external results are better read here from their stores than brought into the
        process."""
        ...

    def capture_external(self, child: Relation, op: Any, versions: Versions) -> bool:
        """Capture an external operator's state from its whole input ``child`` into its store; False for the shapes
        it leaves to the caller (nothing written then)."""
        ...

    def capture_anti_join(self, left: Relation, right: Relation, op: Any, versions: Versions) -> bool:
        """Capture an external anti join's state from its two whole inputs into its store; False when it cannot."""
        ...


@runtime_checkable
class GroupCountingBackend(Protocol):
    """Optional: an estimate of a relation's distinct keys (the placement sizes a grouping by it)."""

    def count_groups(self, child: Relation, keys: tuple[tuple[str, Any], ...], versions: Versions) -> int:
        """About how many distinct ``keys`` (name, expression) ``child`` has."""
        ...


class Backend(CaptureBackend, JoinBackend, Protocol):
    """A backend a capture and any maintenance pass can use."""


__all__ = [
    "Backend",
    "CaptureBackend",
    "GroupCountingBackend",
    "JoinBackend",
    "JoinCacheBackend",
    "Relation",
    "StoreReadingBackend",
    "Versions",
]

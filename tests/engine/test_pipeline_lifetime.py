"""A pipeline and its operators are freed as soon as the last reference goes: no reference cycle keeps their state
(a join partner index holding a closure over its join kept every loaded TPC-H Q9 pipeline, ~1.4 GB, alive until
a full collection; a benchmark process grew to 19 GB and was killed)."""

from __future__ import annotations

import gc
import random
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from imp_core.config import Optimizations
from imp_core.engine.pipeline import Pipeline
from imp_core.plan.sql import parse_query
from imp_core.sketch.partition import Partition, PartitionSet
from tests.engine.test_join_caches import SQL as JOIN_SQL
from tests.engine.test_join_caches import CountingBackend, Store, pipelines

QUERIES = {
    "join": JOIN_SQL,
    "min, max, distinct": "SELECT g, MIN(v) AS lo, MAX(v) AS hi, COUNT(DISTINCT k) AS n FROM r GROUP BY g "
                          "HAVING MAX(v) > 2",
    "top-k": "SELECT g, v FROM r ORDER BY v DESC, g LIMIT 3",
    "anti-join": "SELECT r.g, COUNT(*) AS n FROM r WHERE NOT EXISTS (SELECT 1 FROM s WHERE s.k = r.k) GROUP BY r.g",
    "top-k per group": "SELECT g, v FROM (SELECT g, v, ROW_NUMBER() OVER (PARTITION BY g ORDER BY v DESC, k) AS rn "
                       "FROM r) t WHERE rn <= 2",
    "top-k of groups": "SELECT g, SUM(v) AS sv FROM r GROUP BY g ORDER BY sv DESC, g LIMIT 2",
    "outer join": "SELECT r.g, COUNT(s.w) AS n FROM r LEFT JOIN s ON r.k = s.k GROUP BY r.g",
    "union, distinct": "SELECT DISTINCT k FROM (SELECT k FROM r UNION ALL SELECT k FROM s) u",
    "except": "SELECT k FROM r EXCEPT SELECT k FROM s",
    "scalar subquery": "SELECT g, v FROM r WHERE v > (SELECT MAX(w) FROM s)",
    "rollup": "SELECT g, k, SUM(v) AS sv FROM r GROUP BY ROLLUP (g, k)",
}


@contextmanager
def collector_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def used(make: Callable[[], Pipeline], store: Store, backend: CountingBackend, rng: random.Random) -> list:
    """Weak references to a pipeline and its operators after a capture, passes on both tables and a reload."""
    p = make()
    versions = {"r": 0, "s": 0}
    p.capture(backend, versions)
    for table in ("r", "s", "r"):
        size = len(store.versions[table][-1])
        inserts = ([(rng.randint(0, 5), rng.randint(0, 14), rng.randint(0, 10))] if table == "r"
                   else [(rng.randint(0, 14), rng.randint(0, 4))])
        changes = store.change(table, rng.sample(range(size), min(2, size)), inserts)
        versions = {**versions, table: len(store.versions[table]) - 1}
        p.maintain_pass(table, changes, backend, dict(versions))
    p.load_state_blobs(p.state_blobs())
    p.maintain_pass("r", store.change("r", [0], []), backend, {**versions, "r": len(store.versions["r"]) - 1})
    assert p.sketch() is not None
    return [weakref.ref(p), *(weakref.ref(op) for op in p.operators.values()), weakref.ref(p.merge)]


@pytest.mark.parametrize("query", list(QUERIES))
def test_a_used_pipeline_is_freed_without_the_cycle_collector(query: str) -> None:
    rng = random.Random(7)
    store = Store([(rng.randint(0, 5), rng.randint(0, 9), rng.randint(0, 10)) for _ in range(40)],
                  [(rng.randint(0, 12), rng.randint(0, 4)) for _ in range(20)])
    schemas = {t: store.frame(t, 0).to_arrow().schema for t in ("r", "s")}
    plan = parse_query(QUERIES[query], schemas).plan
    parts = PartitionSet((Partition("r", "g", (0, 2, 4, 6), "int"), Partition("s", "w", (0, 2, 5), "int")))
    makers: dict[str, Callable[[], Pipeline]] = {"default": lambda: Pipeline.configured(plan, parts, Optimizations())}
    if query == "join":
        makers |= {name: (lambda name=name: pipelines(plan, parts)[name]) for name in pipelines(plan, parts)}
    for name, make in makers.items():
        backend = CountingBackend(store)
        with collector_off():
            refs = used(make, store, backend, rng)
            alive = [r() for r in refs if r() is not None]
            assert not alive, f"{query} ({name}): still referenced after use: {[type(o).__name__ for o in alive]}"

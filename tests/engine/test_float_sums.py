"""Float SUM/AVG under long insert/delete sequences: no drift from the exact value or from a recapture.

The data is adversarial for naive accumulation: values 1e16 and 1.0 inserted and deleted alternately, so a running
double sum loses every 1.0 added while a 1e16 is present (1e16 + 1.0 == 1e16). Batches are sometimes single rows
(exercising the compensation across batches, Neumaier's ``__c``) and sometimes many rows mixing both magnitudes,
with multiplicities above one (exercising the batch's own partial sum: products by Dekker's TwoProduct, then
Rump-Ogita-Oishi extraction). The expected values are exact rationals (``Fraction``).
"""

from __future__ import annotations

import math
import random
from fractions import Fraction

import polars as pl
import pyarrow as pa

from imp_core.engine.local import LocalBackend
from imp_core.engine.operators.aggregation import Aggregation
from imp_core.engine.pipeline import Pipeline
from imp_core.engine.schema import MULT
from imp_core.plan.expr import FLOAT, INT, AggCall, Col
from imp_core.plan.sql import parse_query
from imp_core.sketch.partition import Partition, PartitionSet

BIG, SMALL = 1e16, 1.0
GROUPS = 4


def changes(n_changes: int, seed: int) -> list[list[tuple[int, int, float, int]]]:
    """Batches of (id, group, x, multiplicity): alternately a 1e16 and a 1.0 inserted, then the 1e16 deleted."""
    rng = random.Random(seed)
    rows: dict[int, tuple[int, float]] = {}
    ops: list[tuple[int, int, float, int]] = []
    next_id = 0
    while len(ops) < n_changes:
        g = rng.randrange(GROUPS)
        big, small = next_id, next_id + 1
        next_id += 2
        ops += [(big, g, BIG, 1), (small, g, SMALL, 1), (big, g, BIG, -1)]
        rows[small] = (g, SMALL)
        if rng.random() < 0.2 and rows:  # now and then a 1.0 goes too
            victim = rng.choice(sorted(rows))
            vg, vx = rows.pop(victim)
            ops.append((victim, vg, vx, -1))
    ops = ops[:n_changes]
    batches, i = [], 0
    while i < len(ops):
        size = 1 if rng.random() < 0.4 else rng.randrange(2, 60)
        batches.append(ops[i:i + size])
        i += size
    return batches


def frame(batch: list[tuple[int, int, float, int]]) -> pl.DataFrame:
    return pl.DataFrame({"id": [b[0] for b in batch], "g": [b[1] for b in batch], "x": [b[2] for b in batch],
                         MULT: [b[3] for b in batch]}, schema={"id": pl.Int64, "g": pl.Int64, "x": pl.Float64,
                                                                MULT: pl.Int64})


def test_naive_accumulation_drifts_on_this_data() -> None:
    """The sequence is adversarial: a plain running double sum ends far from the exact one (so the tests below
    could fail)."""
    naive = [0.0] * GROUPS
    exact = [Fraction(0)] * GROUPS
    for batch in changes(10_000, seed=1):
        for _, g, x, m in batch:
            naive[g] += x * m
            exact[g] += Fraction(x) * m
    assert any(abs(Fraction(n) - e) >= 100 for n, e in zip(naive, exact))


def test_ten_thousand_changes_keep_sum_and_avg_exact() -> None:
    op = Aggregation("agg", (("g", Col("g", INT)),),
                     (("s", AggCall("sum", Col("x", FLOAT))), ("a", AggCall("avg", Col("x", FLOAT)))),
                     {"g": pl.Int64})
    exact = {g: Fraction(0) for g in range(GROUPS)}
    count = {g: 0 for g in range(GROUPS)}
    batches = changes(10_000, seed=2)
    assert sum(len(b) for b in batches) == 10_000
    for i, batch in enumerate(batches):
        d = frame(batch).with_columns(pl.lit(0, dtype=pl.UInt32).alias("__f0"))
        op.process(d)
        for _, g, x, m in batch:
            exact[g] += Fraction(x) * m
            count[g] += m
        if i % 10 and i != len(batches) - 1:
            continue
        out = {r["g"]: r for r in op.output_relation().iter_rows(named=True)}
        for g in range(GROUPS):
            if count[g] == 0:
                assert g not in out
                continue
            # the maintained SUM is the exact sum correctly rounded; AVG is that divided by the count
            assert out[g]["s"] == float(exact[g]), (i, g, out[g]["s"], exact[g])
            assert out[g]["a"] == float(exact[g]) / count[g]


def test_one_batch_mixing_magnitudes_and_multiplicities() -> None:
    """Within one batch: 1e16 and -1e16 from different rows cancel, small values survive, ``x * n`` is exact."""
    op = Aggregation("agg", (), (("s", AggCall("sum", Col("x", FLOAT))),), {})
    xs = [BIG, 0.1, -BIG, 3.3, 1e-5, BIG, 0.7, -BIG, 2.0 ** 60, -(2.0 ** 60), 1.0]
    ms = [7, 3, 7, -1, 5, -2, 11, -2, 1, 1, 1]
    exact = sum((Fraction(x) * m for x, m in zip(xs, ms)), Fraction(0))
    op.process(pl.DataFrame({"x": xs, MULT: ms, "__f0": pl.Series([0] * len(xs), dtype=pl.UInt32)}))
    got = op.output_relation().get_column("s")[0]
    assert got == float(exact)
    assert sum(x * m for x, m in zip(xs, ms)) != float(exact)  # naive summation is wrong here


def test_special_values_do_not_poison_the_sum() -> None:
    op = Aggregation("agg", (("g", Col("g", INT)),), (("s", AggCall("sum", Col("x", FLOAT))),), {"g": pl.Int64})
    op.process(pl.DataFrame({"g": [1, 1, 2, 2, 3, 3], "x": [math.inf, 1.0, 0.0, -0.0, 1e308, 1e308],
                             MULT: [1, 1, 1, 1, 1, 1], "__f0": pl.Series([0] * 6, dtype=pl.UInt32)}))
    out = {r["g"]: r["s"] for r in op.output_relation().iter_rows(named=True)}
    assert out == {1: math.inf, 2: 0.0, 3: math.inf}  # as SQL: inf stays inf, overflow is inf, zeros are zero
    op.process(pl.DataFrame({"g": [2], "x": [5e-324], MULT: [3], "__f0": pl.Series([0], dtype=pl.UInt32)}))
    assert {r["g"]: r["s"] for r in op.output_relation().iter_rows(named=True)}[2] == 3 * 5e-324


def test_having_decisions_match_recapture_and_exact_sums() -> None:
    """Through the whole pipeline: after every batch the sketch equals a recapture's and the exact answer's."""
    schema = pa.schema([("id", pa.int64()), ("g", pa.int64()), ("x", pa.float64())])
    query = parse_query("SELECT g, SUM(x) AS s, AVG(x) AS a FROM t GROUP BY g HAVING SUM(x) > 0.5", {"t": schema})
    # fragments on id: [0, 500), [500, 1000), ... so a group's sketch says which ids it holds
    parts = PartitionSet((Partition("t", "id", tuple(range(0, 4001, 500)), "int"),))
    versions: list[dict[int, tuple[int, float]]] = [{}]

    def read(table: str, version: int) -> pl.DataFrame:
        rows = versions[version]
        return pl.DataFrame({"id": list(rows), "g": [r[0] for r in rows.values()],
                             "x": [r[1] for r in rows.values()]}, schema={"id": pl.Int64, "g": pl.Int64,
                                                                          "x": pl.Float64})

    backend = LocalBackend(read)
    pipe = Pipeline(query.plan, parts)
    pipe.capture(backend, {"t": 0})
    for i, batch in enumerate(changes(2_000, seed=3)):
        rows = dict(versions[-1])
        for rid, g, x, m in batch:
            if m > 0:
                rows[rid] = (g, x)
            else:
                del rows[rid]
        versions.append(rows)
        pipe.maintain_pass("t", frame(batch), backend, {"t": len(versions) - 1})
        exact: dict[int, Fraction] = {}
        frags: dict[int, set[int]] = {}
        for rid, (g, x) in rows.items():
            exact[g] = exact.get(g, Fraction(0)) + Fraction(x)
            frags.setdefault(g, set()).add(rid // 500)
        expected = set().union(*[frags[g] for g in exact if exact[g] > Fraction(1, 2)])
        assert pipe.sketch() == expected, f"batch {i}"
        if i % 5 == 0:
            fresh = Pipeline(query.plan, parts)
            fresh.capture(backend, {"t": len(versions) - 1})
            assert fresh.sketch() == pipe.sketch()
            agg = next(op for op in pipe.stateful() if isinstance(op, Aggregation))
            again = next(op for op in fresh.stateful() if isinstance(op, Aggregation))
            mine = agg.output_relation().sort("g").drop("__sk")
            theirs = again.output_relation().sort("g").drop("__sk")
            assert mine.equals(theirs), f"batch {i}: maintained\n{mine}\nrecaptured\n{theirs}"

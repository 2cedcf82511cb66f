"""The anti join (NOT EXISTS / NOT IN) on hand-made deltas, then whole passes against a recomputation.

The rule (docs/ARCHITECTURE.md, "Operators"): a left row is in the result, with its own annotation and multiplicity,
while no right row has its key (NOT EXISTS: a NULL key matches nothing, so such a row stays); NOT IN keeps every left
row while the right side is empty, and otherwise only rows with a non-NULL key, none at all while some right key is
NULL. A right key appearing retracts the stored left rows of that key, disappearing brings them back.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import polars as pl
import pytest

from imp_core.engine.annotation import consolidate
from imp_core.engine.backend import Relation
from imp_core.engine.local import LocalBackend
from imp_core.engine.operators.anti_join import AntiJoinOp
from imp_core.engine.pipeline import Pipeline
from imp_core.engine.schema import MULT
from imp_core.errors import StateError
from imp_core.plan.expr import FLOAT, INT, AggCall, Binary, Col, Lit, conjoin
from imp_core.plan.nodes import Aggregate, AntiJoin, Field, Join, Plan, Project, Scan, Select
from imp_core.sketch.partition import Partition, PartitionSet

L = Scan("L", "L", (Field("k", INT), Field("v", INT)))
R = Scan("R", "R", (Field("k", INT), Field("w", INT)))
ON = Binary("=", Col("L.k", INT), Col("R.k", INT))
# L.v: [0, 5) -> fragment 0, [5, 10) -> 1; R.w: [0, 5) -> 2, [5, 10) -> 3 (never in an anti join's provenance)
PARTS = PartitionSet((Partition("L", "v", (0, 5, 10), "int"), Partition("R", "w", (0, 5, 10), "int")))
V = {"L": 0, "R": 0}


def anti(null_aware: bool = False) -> AntiJoin:
    return AntiJoin(L, R, ON, null_aware)


def left(k: list[int | None], v: list[int], mult: list[int] | None = None,
         frag: list[int] | None = None) -> pl.DataFrame:
    """An annotated left delta (fragment column ``__f0``: v's fragment unless given)."""
    mult = mult or [1] * len(k)
    frag = frag if frag is not None else [0 if x < 5 else 1 for x in v]
    return pl.DataFrame({"L.k": k, "L.v": v, MULT: mult, "__f0": frag},
                        schema={"L.k": pl.Int64, "L.v": pl.Int64, MULT: pl.Int64, "__f0": pl.UInt32})


def right(k: list[int | None], mult: list[int] | None = None) -> pl.DataFrame:
    mult = mult or [1] * len(k)
    return pl.DataFrame({"R.k": k, "R.w": [7] * len(k), MULT: mult, "__f1": [3] * len(k)},
                        schema={"R.k": pl.Int64, "R.w": pl.Int64, MULT: pl.Int64, "__f1": pl.UInt32})


def out_rows(df: pl.DataFrame) -> list[tuple]:
    """The netted output rows (k, v, mult, fragment), sorted."""
    return sorted(consolidate(df).rows(), key=repr)


def op_of(null_aware: bool = False) -> AntiJoinOp:
    return AntiJoinOp("anti_join@r", anti(null_aware))


# -- the rule on hand-made deltas (NOT EXISTS) ---------------------------------------------------------------------


def test_left_rows_pass_unless_a_right_row_has_their_key_and_keep_only_their_own_annotation() -> None:
    op = op_of()
    assert out_rows(op.process(None, right([1]))) == []  # no left rows stored yet
    out = op.process(left([1, 2], [3, 6]), None)
    assert out.columns == ["L.k", "L.v", MULT, "__f0"]  # left's columns: the right side adds no annotation
    assert out_rows(out) == [(2, 6, 1, 1)]
    # a delete of a passing row is emitted, of a matched row not
    assert out_rows(op.process(left([2, 1], [6, 3], [-1, -1]), None)) == [(2, 6, -1, 1)]
    assert op.output_relation().height == 0


def test_a_right_key_appearing_retracts_and_disappearing_restores_the_stored_rows_with_multiplicity() -> None:
    op = op_of()
    op.process(left([1, 1, 2], [3, 8, 4], [2, 1, 1]), None)
    # key 1 gets two right rows: its left rows (2 copies of (1, 3), one of (1, 8)) leave, with their fragments
    assert out_rows(op.process(None, right([1, 1]))) == [(1, 3, -2, 0), (1, 8, -1, 1)]
    assert out_rows(op.process(None, right([1], [-1]))) == []  # 2 -> 1 right rows: still matched
    assert out_rows(op.process(None, right([1], [-1]))) == [(1, 3, 2, 0), (1, 8, 1, 1)]  # 1 -> 0: back
    assert out_rows(op.output_relation()) == [(1, 3, 2, 0), (1, 8, 1, 1), (2, 4, 1, 0)]


def test_null_left_keys_match_nothing_and_null_right_keys_nothing_either() -> None:
    op = op_of()
    assert out_rows(op.process(left([None, 3], [1, 6]), right([None, 3]))) == [(None, 1, 1, 0)]
    assert out_rows(op.process(None, right([None], [-1]))) == []


def test_both_sides_in_one_batch_net_exactly() -> None:
    op = op_of()
    op.process(left([1], [2]), right([1]))
    # the matched row is deleted while its only right partner goes: it passes under R' but is gone from L'
    assert out_rows(op.process(left([1], [2], [-1]), right([1], [-1]))) == []
    # a new left row and a right row with its key in the same batch: never in the result
    assert out_rows(op.process(left([4], [9]), right([4]))) == []
    # a right row leaves while a left row of its key arrives: the new row passes
    assert out_rows(op.process(left([4], [1]), right([4], [-1]))) == [(4, 1, 1, 0), (4, 9, 1, 1)]


def test_two_key_pairs_and_float_keys_as_spark_matches_them() -> None:
    lt = Scan("A", "A", (Field("x", INT), Field("y", FLOAT)))
    rt = Scan("B", "B", (Field("x", INT), Field("y", FLOAT)))
    cond = conjoin([Binary("=", Col("A.x", INT), Col("B.x", INT)), Binary("=", Col("B.y", FLOAT), Col("A.y", FLOAT))])
    assert cond is not None
    op = AntiJoinOp("anti_join@r", AntiJoin(lt, rt, cond))
    nan = float("nan")
    a = pl.DataFrame({"A.x": [1, 1, 1, 2, None], "A.y": [nan, -0.0, 1.5, nan, 1.5], MULT: [1] * 5})
    b = pl.DataFrame({"B.x": [1, 1, 2], "B.y": [nan, 0.0, None], MULT: [1] * 3})
    out = op.process(a, b)
    # NaN = NaN and -0.0 = 0.0 (Spark's normalized keys); a NULL in any key pair matches nothing
    assert sorted((str(x), str(y)) for x, y in out.select("A.x", "A.y").rows()) == [
        ("1", "1.5"), ("2", "nan"), ("None", "1.5")]


def test_pending_left_rows_meet_a_right_delta_netted() -> None:
    op = op_of()
    for m in (1, -1, 1, 1):  # left deltas wait unnetted in the pending run
        op.process(left([1], [3], [m]), None)
    assert op.pending and out_rows(op.process(None, right([1]))) == [(1, 3, -2, 0)]
    assert out_rows(op.process(None, right([1], [-1]))) == [(1, 3, 2, 0)]
    assert out_rows(op.output_relation()) == [(1, 3, 2, 0)] and not op.pending


# -- NOT IN (null_aware) -------------------------------------------------------------------------------------------


def test_not_in_a_null_right_key_retracts_everything_until_it_goes() -> None:
    op = op_of(null_aware=True)
    assert out_rows(op.process(left([1, 2, None], [1, 6, 7]), right([1]))) == [(2, 6, 1, 1)]
    assert out_rows(op.process(None, right([None]))) == [(2, 6, -1, 1)]  # x NOT IN (1, NULL) is never true
    assert out_rows(op.process(left([5], [2]), None)) == []  # nor for a new row
    assert out_rows(op.process(None, right([None], [-1]))) == [(2, 6, 1, 1), (5, 2, 1, 0)]


def test_not_in_an_empty_right_side_keeps_every_row_even_a_null_key() -> None:
    op = op_of(null_aware=True)
    assert out_rows(op.process(left([1, None], [1, 6]), None)) == [(1, 1, 1, 0), (None, 6, 1, 1)]
    assert out_rows(op.process(None, right([3]))) == [(None, 6, -1, 1)]  # non-empty: NULL IN (...) is unknown
    assert out_rows(op.process(None, right([3], [-1]))) == [(None, 6, 1, 1)]  # empty again
    # a NULL right key and its removal in one batch from empty to empty: no change
    assert out_rows(op.process(None, right([None, None], [1, -1]))) == []
    assert out_rows(op.process(None, right([None, 1]))) == [(1, 1, -1, 0), (None, 6, -1, 1)]


# -- state -----------------------------------------------------------------------------------------------------------


def test_state_round_trips_and_a_foreign_blob_is_refused() -> None:
    op = op_of(null_aware=True)
    op.process(left([1, 2, None], [1, 6, 7], [1, 3, 1]), right([1, None]))
    other = op_of(null_aware=True)
    other.load_state(op.state_to_bytes())
    for name, df in op.canonical().items():
        assert df.equals(other.canonical()[name]), name
    step = (left([2], [6], [-1]), right([None], [-1]))
    assert out_rows(op.process(*step)) == out_rows(other.process(*step)) == [(2, 6, 2, 1)]
    with pytest.raises(StateError, match="NOT IN"):
        op_of(null_aware=False).load_state(op.state_to_bytes())


# -- whole passes: maintained == recomputed ----------------------------------------------------------------------


def expected(plan: AntiJoin, tables: dict[str, pl.DataFrame]) -> list[tuple]:
    """The anti join's result rows (k, v) with multiplicity, by the SQL rules, straight from the tables."""
    rights = tables["R"].get_column("k").to_list()
    present = {k for k in rights if k is not None}
    out: dict[tuple, int] = {}
    for k, v in tables["L"].rows():
        if plan.null_aware:
            keep = not rights or (k is not None and None not in rights and k not in present)
        else:
            keep = k is None or k not in present
        if keep:
            out[(k, v)] = out.get((k, v), 0) + 1
    return sorted(((k, v, n) for (k, v), n in out.items()), key=repr)


def relation_rows(df: pl.DataFrame) -> list[tuple]:
    netted = consolidate(df.select("L.k", "L.v", MULT)).group_by("L.k", "L.v").agg(pl.col(MULT).sum())
    return sorted(netted.filter(pl.col(MULT) != 0).rows(), key=repr)


def fragments(tables: dict[str, pl.DataFrame], plan: AntiJoin) -> set[int]:
    """The sketch the anti join's result needs: its left rows' fragments only."""
    return {0 if v < 5 else 1 for k, v, _ in expected(plan, tables)}


def table(k: list[int | None], x: list[int], name: str) -> pl.DataFrame:
    return pl.DataFrame({"k": k, name: x}, schema={"k": pl.Int64, name: pl.Int64})


def changes(rng: np.random.Generator, current: pl.DataFrame, name: str) -> pl.DataFrame:
    """A few inserts (keys 0..4 or NULL) and deletes of existing rows."""
    n = int(rng.integers(1, 4))
    keys = [None if rng.random() < 0.15 else int(x) for x in rng.integers(0, 5, n)]
    ins = table(keys, rng.integers(0, 10, n).tolist(), name).with_columns(pl.lit(1, dtype=pl.Int64).alias(MULT))
    dels = current.sample(min(int(rng.integers(0, 3)), current.height), seed=int(rng.integers(1 << 30)))
    return pl.concat([ins, dels.with_columns(pl.lit(-1, dtype=pl.Int64).alias(MULT))])


def apply(current: pl.DataFrame, change: pl.DataFrame) -> pl.DataFrame:
    out = current
    for *row, m in change.rows():
        if m > 0:
            out = pl.concat([out, pl.DataFrame([row] * m, schema=current.schema, orient="row")])
        else:
            same = pl.all_horizontal([pl.col(c).eq_missing(x) for c, x in zip(current.columns, row)])
            at = out.with_row_index().filter(same).get_column("index")[:(-m)]
            out = out.with_row_index().filter(~pl.col("index").is_in(at.implode())).drop("index")
    return out


def reader(tables: dict[str, pl.DataFrame]) -> Callable[[str, int], pl.DataFrame]:
    return lambda name, version: tables[name]


def assert_like_a_recapture(pipe: Pipeline, build: Callable[[], Pipeline], backend: LocalBackend) -> None:
    fresh = build()
    fresh.capture(backend, V)
    assert pipe.sketch() == fresh.sketch()
    captured = {op.op_id: op.canonical() for op in fresh.stateful()}
    for op in pipe.stateful():
        for name, df in op.canonical().items():
            assert df.equals(captured[op.op_id][name]), (op.op_id, name)


@pytest.mark.parametrize("null_aware", [False, True])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_rounds_on_both_sides_equal_a_recomputation(null_aware: bool, seed: int) -> None:
    rng = np.random.default_rng(seed)
    plan = anti(null_aware)
    tables = {"L": table([1, None, 2], [3, 6, 8], "v"), "R": table([2], [1], "w")}
    pipe = Pipeline(plan, PARTS)
    pipe.capture(LocalBackend(reader(tables)), V)
    for step in range(16):
        name = str(rng.choice(["L", "R"]))
        change = changes(rng, tables[name], "v" if name == "L" else "w")
        tables[name] = apply(tables[name], change)
        backend = LocalBackend(reader(tables))
        pipe.maintain_pass(name, change, backend, V)
        if step == 5:  # saved and loaded state carries on like the live one
            blobs = pipe.state_blobs()
            pipe = Pipeline(plan, PARTS)
            pipe.load_state_blobs(blobs)
        assert pipe.sketch() == fragments(tables, plan)
        if step % 4 == 3:  # reading the state nets the pending left rows: in between, right deltas meet them unnetted
            state = pipe.relation_from_state(plan)
            assert state is not None and relation_rows(state) == expected(plan, tables)
            assert relation_rows(backend.relation(Relation(plan, pipe.annotations), V)) == expected(plan, tables)
            assert_like_a_recapture(pipe, lambda: Pipeline(plan, PARTS), backend)


def _having(plan: Plan) -> Plan:
    """``SELECT k, COUNT(*) AS n FROM plan GROUP BY k HAVING COUNT(*) > 1``."""
    agg = Aggregate(plan, (("k", Col("L.k", INT)),), (("n", AggCall("count", None)),))
    return Select(agg, Binary(">", Col("n", INT), Lit.of(1)))


def _joined(plan: Plan) -> Plan:
    """The anti join's rows joined with R again on w (a join reading the anti join's contents from state)."""
    r2 = Project(Scan("R", "R2", (Field("k", INT), Field("w", INT))), (("w2", Col("R2.w", INT)),))
    return Join(plan, r2, Binary("=", Col("L.v", INT), Col("w2", INT)))


def _over_aggregate() -> Plan:
    """NOT EXISTS with an aggregation on the left: its rows carry fragment sets."""
    agg = Aggregate(L, (("g", Col("L.k", INT)),), (("s", AggCall("sum", Col("L.v", INT))),))
    return AntiJoin(agg, R, Binary("=", Col("g", INT), Col("R.k", INT)))


SHAPES: dict[str, Callable[[], Plan]] = {
    "having_over_not_exists": lambda: _having(anti()),
    "join_above_not_in": lambda: _joined(anti(null_aware=True)),
    "not_exists_over_an_aggregation": _over_aggregate,
    "not_exists_with_a_filtered_subquery": lambda: AntiJoin(L, Select(R, Binary(">", Col("R.w", INT), Lit.of(3))),
                                                            ON),
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_query_shapes_with_an_anti_join_equal_a_recapture(shape: str) -> None:
    plan = SHAPES[shape]()
    rng = np.random.default_rng(11)
    tables = {"L": table([1, 1, None, 2, 3], [3, 6, 8, 1, 9], "v"), "R": table([2, 3], [1, 6], "w")}
    pipe = Pipeline(plan, PARTS)
    pipe.capture(LocalBackend(reader(tables)), V)
    for _ in range(10):
        name = str(rng.choice(["L", "R"]))
        change = changes(rng, tables[name], "v" if name == "L" else "w")
        tables[name] = apply(tables[name], change)
        backend = LocalBackend(reader(tables))
        pipe.maintain_pass(name, change, backend, V)
        assert_like_a_recapture(pipe, lambda: Pipeline(plan, PARTS), backend)


class _RowsOnly:
    """A backend without the key-count look-ups (no ``JoinCacheBackend``): a capture reads the subquery whole."""

    def __init__(self, inner: LocalBackend) -> None:
        self.inner = inner
        self.relation, self.aggregate_input = inner.relation, inner.aggregate_input
        self.fragment_counts, self.join_delta = inner.fragment_counts, inner.join_delta


class _Counting(LocalBackend):
    """Records the key-count look-ups."""

    calls: list[list[str]] = []

    def key_counts(self, side: Relation, keys: list[str], max_keys: int, versions: dict[str, int]) -> pl.DataFrame:
        self.calls.append(keys)
        out = super().key_counts(side, keys, max_keys, versions)
        assert out is not None
        return out


@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_capture_reads_the_subquery_as_key_counts_or_whole_alike(shape: str) -> None:
    plan = SHAPES[shape]()
    tables = {"L": table([1, 1, None, 2, 3], [3, 6, 8, 1, 9], "v"), "R": table([2, 2, None, 3], [1, 1, 6, 6], "w")}
    counted, whole = Pipeline(plan, PARTS), Pipeline(plan, PARTS)
    backend = _Counting(reader(tables))
    backend.calls = []
    counted.capture(backend, V)
    whole.capture(_RowsOnly(LocalBackend(reader(tables))), V)  # type: ignore[arg-type]
    assert backend.calls == [["R.k"]]  # the subquery side came as one row per key
    assert counted.sketch() == whole.sketch()
    for a, b in zip(counted.stateful(), whole.stateful()):
        for name, df in a.canonical().items():
            assert df.equals(b.canonical()[name]), (a.op_id, name)

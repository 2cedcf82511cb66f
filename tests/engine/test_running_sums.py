"""Which aggregations watch their wide decimal sums (``imp_core.engine.running_sums``): a use Spark's order-dependent
NULL cannot make the sketch miss a fragment leaves the aggregation alone; any other use guards it, and a guarded
aggregation refuses a group whose Σ|x| leaves 38 digits, leaving its state as it was."""

from __future__ import annotations

from decimal import Decimal

import polars as pl
import pyarrow as pa
import pytest

from imp_core.engine.operators.aggregation import Aggregation
from imp_core.engine.operators.aggregation_external import ExternalAggregation
from imp_core.engine.running_sums import guarded_sums
from imp_core.engine.schema import MULT
from imp_core.errors import OrderDependentValueError
from imp_core.plan.expr import INT, AggCall, Col
from imp_core.plan.nodes import Aggregate
from imp_core.plan.sql import parse_query

SCHEMA = {
    "t": pa.schema([("g", pa.int64()), ("m", pa.decimal128(38, 0)), ("d", pa.decimal128(10, 2)), ("k", pa.int64())]),
    "u": pa.schema([("k2", pa.int64()), ("n", pa.decimal128(38, 2))]),
}
BIG = Decimal(6 * 10**37)


def guarded(sql: str) -> set[str]:
    """The guarded sums of the query's aggregations, by name."""
    plan = parse_query(sql, SCHEMA).plan
    out = guarded_sums(plan)
    assert set(out) <= {id(n) for n in plan.walk() if isinstance(n, Aggregate)}
    return set().union(*out.values())


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT g, SUM(m) AS s FROM t GROUP BY g",  # the value only reaches the answer
        "SELECT g, SUM(m) AS s FROM t GROUP BY g HAVING SUM(m) > 0",  # a comparison is not TRUE on NULL
        "SELECT g, AVG(m) AS a FROM t GROUP BY g HAVING NOT (SUM(m) * 2 BETWEEN -5 AND 5) OR SUM(m) IN (1, 2)",
        "SELECT g FROM t GROUP BY g HAVING ABS(SUM(m)) > 10 AND COUNT(*) > 1",
        "SELECT q.g FROM (SELECT g, SUM(m) AS s FROM t GROUP BY g HAVING SUM(m) > 0) AS q JOIN t ON q.g = t.k",
        "SELECT g, COALESCE(SUM(m), 0) AS s FROM t GROUP BY g",  # a value of the answer, however it is computed
        "SELECT g, SUM(d) AS s FROM t GROUP BY g ORDER BY s DESC LIMIT 3",  # DECIMAL(10, 2): never leaves 38 digits
        "SELECT g, COUNT(m) AS c FROM t GROUP BY g ORDER BY c DESC LIMIT 3",
    ],
)
def test_uses_that_keep_at_least_sparks_rows_guard_nothing(sql: str) -> None:
    assert guarded(sql) == set()


@pytest.mark.parametrize(
    "sql, names",
    [
        ("SELECT g, SUM(m) AS s FROM t GROUP BY g ORDER BY s DESC LIMIT 3", {"s"}),
        ("SELECT g FROM t GROUP BY g HAVING SUM(m) > 0 ORDER BY g LIMIT 3", {"__agg0"}),  # extra rows reach a LIMIT
        ("SELECT g FROM t GROUP BY g HAVING SUM(m) IS NULL", {"__agg0"}),
        ("SELECT g FROM t GROUP BY g HAVING COALESCE(SUM(m), 0) = 0", {"__agg0"}),
        ("SELECT s, COUNT(*) AS c FROM (SELECT g, SUM(m) AS s FROM t GROUP BY g) AS q GROUP BY s", {"s"}),
        ("SELECT COUNT(*) AS c FROM (SELECT g FROM t GROUP BY g HAVING SUM(m) > 0) AS q", {"__agg0"}),
        (
            "SELECT t.g FROM t WHERE t.k NOT IN (SELECT q.g FROM (SELECT g, SUM(n) AS s FROM t JOIN u ON t.k = u.k2 "
            "GROUP BY g HAVING SUM(n) > 0) AS q)",
            {"s"},
        ),
        ("SELECT DISTINCT s FROM (SELECT g, AVG(m) AS s FROM t GROUP BY g) AS q", {"s"}),
    ],
)
def test_other_uses_guard_the_sum(sql: str, names: set[str]) -> None:
    assert guarded(sql) == names  # a HAVING's own aggregate is named __agg0


def _ranked(guard: bool, keyed: bool, scale: int = 0, distinct: bool = False) -> Aggregation:
    """SUM(m) (or SUM(DISTINCT m)) of a DECIMAL(38, ``scale``) per g, guarded or not."""
    t = pa.decimal128(38, scale)
    aggs = (("s", AggCall("sum", Col("m", t), t, distinct=distinct)),)
    return Aggregation(
        "aggregation@r",
        (("g", Col("g", INT)),),
        aggs,
        {"g": pl.Int64()},
        keyed=keyed,
        guarded={"s"} if guard else frozenset(),
    )


def _batch(values: list[Decimal], mult: int, scale: int = 0) -> pl.DataFrame:
    return pl.DataFrame(
        {"g": [1] * len(values), "m": pl.Series(values, dtype=pl.Decimal(38, scale)), MULT: [mult] * len(values)}
    )


@pytest.mark.parametrize("keyed", [True, False])
def test_a_guarded_sum_refuses_a_group_whose_absolute_sum_leaves_38_digits(keyed: bool) -> None:
    op = _ranked(True, keyed)
    op.process(_batch([BIG, Decimal(-5)], 1))
    before = op.canonical()
    with pytest.raises(OrderDependentValueError, match=r"SUM\(m\).*10\^38"):
        op.process(_batch([-BIG], 1))  # sum 5, but Σ|x| 1.2e38: Spark may give NULL
    after = op.canonical()
    assert before.keys() == after.keys() and all(before[k].equals(after[k]) for k in before)
    assert op.output_relation().get_column("s").to_list() == [Decimal(6 * 10**37 - 5)]  # the state as before the batch
    op.process(_batch([Decimal(-5)], -1))  # back in range
    assert op.output_relation().get_column("s").to_list() == [BIG]


@pytest.mark.parametrize("keyed", [True, False])
def test_an_unguarded_sum_reports_the_exact_sum(keyed: bool) -> None:
    op = _ranked(False, keyed)
    op.process(_batch([BIG, -BIG, Decimal(3)], 1))
    assert op.output_relation().get_column("s").to_list() == [Decimal(3)]


def test_guarded_state_is_not_read_as_unguarded_state() -> None:
    meta, frames = _ranked(False, True).state_frames()
    with pytest.raises(Exception, match="different aggregation; recapture"):
        _ranked(True, True).set_state_frames(meta, frames)


def test_a_distinct_sum_used_beyond_a_comparison_is_guarded() -> None:
    assert guarded("SELECT g, SUM(DISTINCT m) AS s FROM t GROUP BY g ORDER BY s DESC LIMIT 3") == {"s"}
    assert guarded("SELECT g FROM t GROUP BY g HAVING SUM(DISTINCT m) > 0") == set()


def _distinct(guard: bool, keyed: bool, scale: int = 0) -> Aggregation:
    return _ranked(guard, keyed, scale, distinct=True)


@pytest.mark.parametrize("keyed", [True, False])
def test_a_guarded_distinct_sum_refuses_values_whose_absolute_sum_leaves_38_digits(keyed: bool) -> None:
    op = _distinct(True, keyed)
    op.process(_batch([BIG, Decimal(-5)], 1))
    with pytest.raises(OrderDependentValueError, match=r"SUM\(DISTINCT m\).*10\^38"):
        op.process(_batch([-BIG], 1))  # distinct sum -5, but Σ|x| 1.2e38: Spark may give NULL


@pytest.mark.parametrize("keyed", [True, False])
def test_an_unguarded_distinct_sum_is_exact_or_null_beyond_38_digits(keyed: bool) -> None:
    op = _distinct(False, keyed)
    op.process(_batch([BIG, -BIG, Decimal(3)], 1))
    assert op.output_relation().get_column("s").to_list() == [Decimal(3)]
    op.process(_batch([BIG, -BIG], -1))
    op.process(_batch([BIG, Decimal(6 * 10**37 + 1)], 1))  # 1.2e38 + 4: beyond 38 digits, Spark's NULL
    assert op.output_relation().get_column("s").to_list() == [None]


@pytest.mark.parametrize("keyed", [True, False])
def test_a_distinct_sum_with_a_scale_leaves_38_digits_at_10_to_the_38_units(keyed: bool) -> None:
    """DECIMAL(38, 10): 9e27 + 8e27 is 1.7e38 units, NULL in Spark (polars' 128-bit sum would keep 39 digits)."""
    op = _distinct(False, keyed, scale=10)
    op.process(_batch([Decimal(9 * 10**27), Decimal(8 * 10**27)], 1, scale=10))
    assert op.output_relation().get_column("s").to_list() == [None]
    op.process(_batch([Decimal(9 * 10**27)], -1, scale=10))
    assert op.output_relation().get_column("s").to_list() == [Decimal(8 * 10**27)]


def test_a_guarded_distinct_sum_kept_in_delta_tables_is_guarded_too() -> None:
    op = _distinct(True, keyed=False)
    external = ExternalAggregation(op.op_id, op.keys, op.aggs, op.key_types, guarded={"s"})
    assert external.guarded == op.guarded == [0]
    assert all(m.guard for m in external.multisets.values())  # type: ignore[union-attr]


@pytest.mark.parametrize("keyed", [True, False])
def test_a_distinct_sum_of_38_nines_fits(keyed: bool) -> None:
    """99...9 (38 digits) fits DECIMAL(38, 0): Spark returns it, not NULL (28-digit rounding made it 10^38)."""
    nines = Decimal("9" * 38)
    op = _distinct(False, keyed)
    op.process(_batch([Decimal("9" * 37 + "8"), Decimal(1)], 1))
    assert op.output_relation().get_column("s").to_list() == [nines]

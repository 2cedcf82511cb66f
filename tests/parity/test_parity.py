"""The two expression compilers against Spark: the parity table, its coverage, and random values.

``cases.py`` holds the table (expression, input row, Spark's value); each batch runs as one Spark job through Spark
SQL (which checks the table and the IR's types), the Spark compiler and the polars evaluator. A coverage test fails
when a function, operator, EXTRACT field or expression class has no case. A randomized (derandomized: fixed seed)
test compares the engine with Spark on a few thousand values for the kernels whose rules are arithmetic (HALF_UP
rounding through decimal text, decimal arithmetic near precision limits, casts).
"""

from __future__ import annotations

import datetime as dt
import random
from typing import TYPE_CHECKING

import pyarrow as pa
import pytest

from imp_core.plan.expr import (
    ARITH_OPS,
    BOOL_OPS,
    CMP_OPS,
    EXPR_NODES,
    EXTRACT_FIELDS,
    FUNCTIONS,
    AggCall,
    Between,
    Binary,
    Cast,
    Extract,
    Func,
    InList,
    Like,
    Unary,
)
from tests.parity.cases import ALL, BATCHES
from tests.parity.harness import COLUMNS, SCHEMA, C, D, engine_frame, run_batch, same

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Expression classes the table does not need: aggregates are evaluated by the aggregation operator (tests/engine).
NOT_SCALAR = {AggCall}


@pytest.mark.parametrize("batch", sorted(BATCHES))
def test_parity(spark: SparkSession, batch: str) -> None:
    problems = [f"{o.case.expr} on {o.case.row}: " + "; ".join(o.problems)
                for o in run_batch(spark, BATCHES[batch]) if o.problems]
    assert not problems, "\n".join(problems)


def test_every_function_operator_and_class_has_a_case() -> None:
    nodes: set[type] = set()
    funcs: set[str] = set()
    fields: set[str] = set()
    ops: set[str] = set()
    forms: set[str] = set()
    casts: set[tuple[str, str]] = set()
    for case in ALL:
        for e in case.ir().walk():
            nodes.add(type(e))
            if isinstance(e, Func):
                funcs.add(e.name)
            elif isinstance(e, Extract):
                fields.add(e.field_)
            elif isinstance(e, (Binary, Unary)):
                ops.add(e.op)
            elif isinstance(e, Like):
                forms.add(("NOT " if e.negated else "") + ("ILIKE" if e.case_insensitive else "LIKE"))
            elif isinstance(e, (InList, Between)):
                forms.add(("NOT " if e.negated else "") + type(e).__name__)
            if isinstance(e, Cast):
                casts.add((_kind(e.arg.dtype), _kind(e.to)))
    assert set(EXPR_NODES) - NOT_SCALAR - nodes == set(), "expression classes without a parity case"
    assert set(FUNCTIONS) - funcs == set(), "functions without a parity case"
    assert set(EXTRACT_FIELDS) - fields == set(), "EXTRACT fields without a parity case"
    assert set(ARITH_OPS + CMP_OPS + BOOL_OPS + ("neg", "not")) - ops == set(), "operators without a parity case"
    assert {"LIKE", "NOT LIKE", "ILIKE", "NOT ILIKE", "InList", "NOT InList", "Between", "NOT Between"} - forms == set()
    targets = {"int", "float", "decimal", "string", "bool", "date", "timestamp"}
    for src in targets - {"timestamp"}:
        missing = {dst for dst in targets if (src, dst) not in casts and src != dst
                   and not {src, dst} <= {"date", "bool"} and not (src == "date" and dst in ("int", "float",
                                                                                              "decimal"))
                   and not (src in ("int", "float", "decimal", "bool") and dst in ("date", "timestamp"))}
        assert not missing, f"CAST from {src} to {sorted(missing)} has no parity case"


def _kind(t: pa.DataType) -> str:
    if pa.types.is_integer(t):
        return "int"
    if pa.types.is_floating(t):
        return "float"
    if pa.types.is_decimal(t):
        return "decimal"
    if pa.types.is_boolean(t):
        return "bool"
    if pa.types.is_date(t):
        return "date"
    if pa.types.is_timestamp(t):
        return "timestamp"
    return "string"


def test_the_table_is_consistent() -> None:
    """Every case parses, names only known columns, and its expected value has a Python type the harness compares."""
    for case in ALL:
        assert set(case.row) <= set(COLUMNS), case
        case.ir()
    assert len({(c.expr, tuple(sorted(c.row.items(), key=lambda kv: kv[0])), c.sql) for c in ALL}) > 0.95 * len(ALL)


# -- random values -------------------------------------------------------------------------------------------------

RANDOM_EXPRESSIONS = [
    "round(d1, 2)", "round(d1)", "round(d1, -2)", "round(d1, 5)", "round(f1, 3)", "round(m1, 1)", "round(l1, -3)",
    "CAST(d1 AS DECIMAL(20,6))", "CAST(d1 AS DECIMAL(12,2))", "CAST(f1 AS DECIMAL(10,4))", "CAST(m1 AS FLOAT)",
    "CAST(x1 AS DOUBLE)", "CAST(x1 AS FLOAT)", "CAST(y1 AS DOUBLE)", "CAST(e1 AS DECIMAL(10,2))",
    "CAST(d1 AS INT)", "CAST(d1 AS SMALLINT)", "CAST(s1 AS DOUBLE)", "CAST(s1 AS FLOAT)", "CAST(s1 AS DECIMAL(20,6))",
    "CAST(s1 AS BIGINT)", "m1 / m2", "x1 / m1", "m1 * e1", "e1 / e2", "x1 + y1", "x1 - x2", "x1 % m1", "y1 * y1",
    "x1 * x2", "y1 / e1", "m1 + 7", "e1 % 3", "l1 * l2", "i1 + i2", "f1 * f2", "f1 + l1", "d1 % d2", "floor(d1)",
    "ceil(m1)", "substring(s1, i2, t1)", "greatest(d1, d2)", "d1 < d2", "m1 = d1",
]


def _random_rows(n: int, seed: int = 14) -> pa.Table:
    rnd = random.Random(seed)

    def dec(digits: int, scale: int) -> D:
        return D(rnd.randrange(-(10**digits) + 1, 10**digits)).scaleb(-scale)

    def double() -> float:
        kind = rnd.random()
        if kind < 0.4:
            return round(rnd.uniform(-1000, 1000), rnd.choice([1, 2, 3, 4, 7]))  # decimal-looking: HALF_UP ties
        if kind < 0.7:
            return rnd.uniform(-1, 1) * 10 ** rnd.randrange(-12, 20)
        return rnd.choice([0.0, -0.0, 0.5, -2.5, 1e16, 2.0**53 + 2, float("nan"), float("inf"), 5e-324, 1.5e300])

    rows: dict[str, list] = {name: [] for name in COLUMNS}
    for _ in range(n):
        d = double()
        row = {
            "d1": d, "d2": double(), "f1": double(), "f2": double(),
            "l1": rnd.choice([rnd.randrange(-10**6, 10**6), rnd.randrange(-2**63, 2**63)]),
            "l2": rnd.randrange(-2**40, 2**40), "i1": rnd.randrange(-2**31, 2**31),
            "i2": rnd.randrange(-8, 9), "h1": rnd.randrange(-2**15, 2**15), "t1": rnd.randrange(-5, 10),
            "m1": dec(rnd.choice([3, 6, 10]), 2), "m2": dec(rnd.choice([1, 4, 10]), 2),
            "e1": dec(rnd.choice([4, 12, 20]), 8), "e2": dec(rnd.choice([2, 9, 20]), 8),
            "x1": dec(rnd.choice([5, 20, 36, 38]), 2), "x2": dec(rnd.choice([3, 18, 38]), 2),
            "y1": dec(rnd.choice([10, 25, 38]), 8),
            "s1": rnd.choice([repr(d), f"{d:.6e}", f" {rnd.randrange(-999, 999)}.{rnd.randrange(0, 99999)} ",
                              str(rnd.randrange(-2**63, 2**63)), "héllo wörld\t", f"{d}f"]),
            "s2": None, "dt1": dt.date(2024, 1, 1), "dt2": None, "ts1": None, "ts2": None, "tz1": None,
            "b1": rnd.random() < 0.5, "b2": None,
        }
        for name, value in row.items():
            rows[name].append(value)
    rows["f1"] = [float(pa.scalar(v, pa.float32()).as_py()) if v is not None else None for v in rows["f1"]]
    return pa.table(rows, schema=SCHEMA)


def test_random_values_agree_with_spark(spark: SparkSession) -> None:
    from pyspark.sql import functions as F

    from imp_core.engine.evaluate import compile_expr

    table = _random_rows(1500)
    irs = [C(e, {}, None).ir() for e in RANDOM_EXPRESSIONS]
    truth = spark.createDataFrame(table).select(*[F.expr(e).alias(f"q{i}") for i, e in enumerate(RANDOM_EXPRESSIONS)])
    expected = truth.toArrow()
    frame = engine_frame(table)
    engine = frame.select(*[compile_expr(e).alias(f"q{i}") for i, e in enumerate(irs)])
    problems = []
    for i, expr in enumerate(RANDOM_EXPRESSIONS):
        want, got = expected.column(f"q{i}").to_pylist(), engine[f"q{i}"].to_list()
        bad = [(j, want[j], got[j]) for j in range(len(want)) if not same(got[j], want[j])]
        if bad:
            j, w, g = bad[0]
            row = {k: table.column(k)[j].as_py() for k in ("d1", "d2", "f1", "m1", "m2", "e1", "x1", "y1", "s1")}
            problems.append(f"{expr}: {len(bad)} rows differ, e.g. Spark {w!r}, engine {g!r} on {row}")
    assert not problems, "\n".join(problems)


def test_the_table_has_the_awkward_inputs() -> None:
    """Each class of awkward value reaches the expressions as an input somewhere in the table."""
    import math

    inputs = [(name, value) for case in ALL for name, value in case.row.items() if value is not None]
    floats = [v for n, v in inputs if isinstance(v, float)]
    classes = {
        "NULL": any(v is None for case in ALL for v in case.row.values()) or any(not c.row for c in ALL),
        "NaN": any(math.isnan(v) for v in floats),
        "+inf": INF_ in floats, "-inf": -INF_ in floats,
        "-0.0": any(v == 0 and math.copysign(1, v) < 0 for v in floats),
        "FLOAT": any(n.startswith("f") for n, _ in inputs),
        "int64 limits": any(isinstance(v, int) and abs(v) >= 2**63 - 1 for _, v in inputs),
        "int32 limits": any(n.startswith("i") and abs(v) >= 2**31 - 1 for n, v in inputs),
        "DECIMAL scale 2": any(n.startswith("m") for n, _ in inputs),
        "DECIMAL scale 8": any(n.startswith(("e", "y")) for n, _ in inputs),
        "DECIMAL(38)": any(n.startswith(("x", "y")) for n, _ in inputs),
        "microseconds": any(isinstance(v, dt.datetime) and v.microsecond not in (0,) for _, v in inputs),
        "month end": any(isinstance(v, dt.date) and (v + dt.timedelta(days=1)).day == 1 for _, v in inputs),
        "leap day": any(isinstance(v, dt.date) and (v.month, v.day) == (2, 29) for _, v in inputs),
        "tab": any(isinstance(v, str) and "\t" in v for _, v in inputs),
        "newline": any(isinstance(v, str) and "\n" in v for _, v in inputs),
        "non-ASCII": any(isinstance(v, str) and not v.isascii() for _, v in inputs),
        "BOOLEAN": any(isinstance(v, bool) for _, v in inputs),
    }
    assert [k for k, present in classes.items() if not present] == []


INF_ = float("inf")


def test_a_compiler_without_a_visitor_fails_at_import() -> None:
    from imp_core.engine.evaluate import PolarsCompiler
    from imp_core.plan.expr import require_visitors
    from imp_core.spark.compile import SparkExpressionCompiler

    class Partial(PolarsCompiler):
        visit_Like = None  # type: ignore[assignment]

    with pytest.raises(ImportError, match="visit_Like"):
        require_visitors(Partial, "test")

    class NoRound(SparkExpressionCompiler):
        func_round = None  # type: ignore[assignment]

    with pytest.raises(ImportError, match="func_round"):
        require_visitors(NoRound, "test")
    for compiler in (PolarsCompiler, SparkExpressionCompiler):
        require_visitors(compiler, "test")  # complete

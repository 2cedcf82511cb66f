"""Running parity cases through Spark SQL, the Spark compiler and the polars evaluator.

A case is an expression in Spark SQL over the columns of ``COLUMNS``, one input row (the columns it names; the
others are NULL) and the value Spark gives. ``run_batch`` evaluates a batch of cases with one Spark job: one
DataFrame with a row per case, every case's expression selected at once three ways (Spark SQL text, the IR through
``imp_core.spark.compile``, the IR through ``imp_core.engine.evaluate`` on the same rows in polars), and each case
reads its own row. The Spark SQL text checks the table itself (the expected values are Spark's) and the IR's result
type (Spark's type of the text must be the IR's type).
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
from dataclasses import dataclass, field
from typing import Any

import polars as pl
import pyarrow as pa

from imp_core.errors import UnsupportedError
from imp_core.plan.expr import Expr
from imp_core.plan.sql import parse_query

D = decimal.Decimal
NAN = float("nan")
INF = float("inf")

COLUMNS: dict[str, pa.DataType] = {
    "d1": pa.float64(), "d2": pa.float64(), "f1": pa.float32(), "f2": pa.float32(),
    "l1": pa.int64(), "l2": pa.int64(), "i1": pa.int32(), "i2": pa.int32(), "h1": pa.int16(), "t1": pa.int8(),
    "m1": pa.decimal128(10, 2), "m2": pa.decimal128(10, 2), "e1": pa.decimal128(20, 8), "e2": pa.decimal128(20, 8),
    "x1": pa.decimal128(38, 2), "x2": pa.decimal128(38, 2), "y1": pa.decimal128(38, 8),
    "s1": pa.string(), "s2": pa.string(), "dt1": pa.date32(), "dt2": pa.date32(),
    "ts1": pa.timestamp("us"), "ts2": pa.timestamp("us"), "tz1": pa.timestamp("us", tz="UTC"),
    "b1": pa.bool_(), "b2": pa.bool_(),
}
SCHEMA = pa.schema(list(COLUMNS.items()))


class Refused:
    """Marker: the engine refuses the expression in sketched queries (UnsupportedError at compile time)."""


REFUSED = Refused()


@dataclass(frozen=True)
class C:
    """One parity case: ``expr`` over ``row`` gives ``expected`` on Spark (non-ANSI, UTC)."""

    expr: str
    row: dict[str, Any]
    expected: Any
    engine: Any = None  # REFUSED when the engine refuses the expression; else it must give ``expected``
    sql: str | None = None  # Spark SQL text when the IR's meaning is written differently in Spark
    why: str = ""
    id: str = field(default="", compare=False)

    def ir(self) -> Expr:
        query = parse_query(f"SELECT {self.expr} AS v FROM t", {"t": SCHEMA})
        return query.plan.items[0][1]  # type: ignore[attr-defined]


def same(actual: Any, expected: Any) -> bool:
    """Equal values, with NaN equal to NaN and -0.0 distinct from 0.0 (the sign matters at bounds)."""
    if expected is None or actual is None:
        return actual is None and expected is None
    if isinstance(expected, float):
        if not isinstance(actual, float):
            return False
        if math.isnan(expected):
            return math.isnan(actual)
        return actual == expected and math.copysign(1, actual) == math.copysign(1, expected)
    if isinstance(expected, D):
        return isinstance(actual, D) and actual == expected
    if isinstance(expected, dt.datetime):
        if isinstance(actual, dt.datetime) and actual.tzinfo is not None:
            actual = actual.astimezone(dt.UTC).replace(tzinfo=None)
        return actual == expected
    return type(actual) is type(expected) and actual == expected


def input_table(cases: list[C]) -> pa.Table:
    rows = {name: [c.row.get(name) for c in cases] for name in COLUMNS}
    unknown = {k for c in cases for k in c.row} - set(COLUMNS)
    assert not unknown, f"unknown input columns {unknown}"
    return pa.table(rows, schema=SCHEMA)


def engine_frame(table: pa.Table) -> pl.DataFrame:
    """The rows as the engine holds them: the plan's column names, the engine's storage types."""
    from imp_core.engine.evaluate import polars_type

    frame = pl.from_arrow(table).rename({n: f"t.{n}" for n in COLUMNS})
    return frame.cast({f"t.{n}": polars_type(t) for n, t in COLUMNS.items()})  # type: ignore[arg-type]


@dataclass
class Outcome:
    case: C
    spark_sql: Any = None
    spark_sql_type: str = ""
    spark: Any = None
    engine: Any = None
    ir_type: str = ""
    problems: list[str] = field(default_factory=list)


def run_batch(spark: Any, cases: list[C]) -> list[Outcome]:
    """Evaluate ``cases`` three ways (one Spark job for the SQL text and the compiled IR together)."""
    from pyspark.sql import functions as F

    from imp_core.engine.evaluate import compile_expr as polars_expr
    from imp_core.spark.compile import compile_expr as spark_expr
    from imp_core.spark.types import arrow_to_spark

    table = input_table(cases)
    irs = [c.ir() for c in cases]
    df = spark.createDataFrame(table)
    df = df.select("*", *[F.col(n).alias(f"t.{n}") for n in COLUMNS])  # the plan's names for the compiled IR
    sql_cols = [F.expr(c.sql or c.expr).alias(f"q{i}") for i, c in enumerate(cases)]
    ir_cols = [spark_expr(e).alias(f"c{i}") for i, e in enumerate(irs)]
    out = df.select(*sql_cols, *ir_cols)
    result = out.toArrow()
    sql_types = {f.name: f.dataType.simpleString() for f in out.schema.fields}

    frame = engine_frame(table)
    engine_values: dict[int, Any] = {}
    for i, e in enumerate(irs):
        try:
            engine_values[i] = frame.with_columns(polars_expr(e).alias("__v"))["__v"]  # a Series
        except UnsupportedError as err:
            engine_values[i] = err

    outcomes = []
    for i, (c, e) in enumerate(zip(cases, irs)):
        o = Outcome(c, ir_type=arrow_to_spark(e.dtype).simpleString())
        o.spark_sql = result.column(f"q{i}")[i].as_py()
        o.spark_sql_type = sql_types[f"q{i}"]
        o.spark = result.column(f"c{i}")[i].as_py()
        values = engine_values[i]
        o.engine = values if isinstance(values, UnsupportedError) else values.slice(i, 1).to_list()[0]
        o.problems = disagreements(o)
        outcomes.append(o)
    return outcomes


def disagreements(o: Outcome) -> list[str]:
    """Where the three evaluations of a case disagree with its expected value (or the engine with its refusal)."""
    c = o.case
    found = []
    if not same(o.spark_sql, c.expected):
        found.append(f"Spark SQL gives {o.spark_sql!r}, the table says {c.expected!r}")
    if o.spark_sql_type != o.ir_type and c.sql is None:
        found.append(f"Spark types it {o.spark_sql_type}, the IR {o.ir_type}")
    if not same(o.spark, c.expected):
        found.append(f"the Spark compiler gives {o.spark!r}")
    if c.engine is REFUSED:
        if not isinstance(o.engine, UnsupportedError):
            found.append(f"the engine should refuse it, gives {o.engine!r}")
    elif isinstance(o.engine, UnsupportedError):
        found.append(f"the engine refuses it: {o.engine}")
    elif not same(o.engine, c.expected):
        found.append(f"the engine gives {o.engine!r}")
    return found

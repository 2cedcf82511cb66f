"""Generators of the property tests: random databases, SQL queries, partitions and change batches.

Everything here is a hypothesis strategy or plain data; the oracle tests that use it are ``test_properties.py``
(in-memory engine, DuckDB and a recapture as oracles) and ``test_spark_oracle.py`` (real Delta tables, the real
service, Spark as the oracle).

**The database.** Tables ``r``, ``s``, ``u`` hold tame values (small ints, dyadic floats, DECIMAL(10, 2), ASCII
strings, a short date range) that every oracle evaluates the same way. Tables ``x`` and ``y`` hold the awkward
values Spark must be followed on:

* ``x.i``: integers at the int64 limits (sums and arithmetic overflow and wrap, as in Spark's non-ANSI mode);
* ``x.f``: doubles with NaN, +inf, -inf, -0.0 (dyadic otherwise, so their sums are exact in any order);
* ``x.h``: FLOAT (32-bit) values such as ``0.1f`` (exactly summable in double at these magnitudes);
* ``x.q``: DECIMAL(18, 8) (scale 8: exact sums, Spark's DECIMAL(22, 12) AVG);
* ``x.z``: non-dyadic doubles (0.1, 1/3, ±1e16, ...): their sums depend on the order of additions;
* ``y.ts``: microsecond timestamps around partition bounds; ``y.dd``: dates at month ends and leap days;
  ``y.w``: strings with tabs, newlines and non-ASCII letters; ``y.b``: booleans.

Change batches insert, delete and update rows, duplicate them, delete whole groups, empty and refill tables, and
insert extreme rows that a later batch deletes again (``spike`` / ``unspike``); initial tables hold up to 60 rows.

**Which oracle judges what.** DuckDB agrees with Spark on NaN (one value, above every number, in comparisons,
ordering, grouping, joins, MIN/MAX) and on -0.0 = 0.0, so ``x.f`` is judged by DuckDB, with the grammar keeping
FLOOR/CEIL/ROUND/CAST/GREATEST/LEAST away from NaN and ±inf. AVG over a DECIMAL column is rendered for DuckDB with
Spark's exact HALF_UP rule (DuckDB's own AVG is a double). DuckDB cannot be the oracle for the other awkward
classes: it raises on int64 overflow where Spark wraps (``x.i``), compares FLOAT with a decimal literal in single
precision where Spark widens to double (``x.h``), adds non-dyadic doubles in its own order (``x.z`` summed, marked
per query), and differs from Spark on UPPER('ß') and on what TRIM removes (``y.w``). A case that reads such a column
(``Case.duck`` is False) is checked against a recapture (maintained state and sketch equal a fresh capture) and the
engine's invariants only; the Spark oracle (``test_spark_oracle.py``) runs those classes against Spark itself.

**Runs.** Examples per test: each test's own count in the full suite, a quarter of it under the hypothesis profile
``unit`` (``make unit``: ``--hypothesis-profile=unit``), or ``IMP_HYPOTHESIS_EXAMPLES`` for every test. Cases come
from a fixed seed
(``IMP_HYPOTHESIS_SEED``, default 14), so CI is reproducible; another seed explores other cases, and
``IMP_HYPOTHESIS_SEED=random`` draws fresh ones on every run, e.g.::

    IMP_HYPOTHESIS_SEED=random IMP_HYPOTHESIS_EXAMPLES=500 .venv/bin/python -m pytest tests/engine/test_properties.py

A failure prints the minimal case and how to reproduce it.
"""

from __future__ import annotations

import bisect
import datetime as dt
import math
import os
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
from hypothesis import HealthCheck, event, seed, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from imp_core.engine.schema import MULT
from imp_core.sketch.partition import Partition, PartitionSet

EXAMPLES = int(os.environ.get("IMP_HYPOTHESIS_EXAMPLES", "0")) or None
SEED = os.environ.get("IMP_HYPOTHESIS_SEED", "14")
# the share of each property test's examples a hypothesis profile runs (tests/conftest.py registers the profiles)
PROFILE_SHARE = {"unit": 0.25}


def examples(default_examples: int) -> int:
    """How many examples a property test runs under the loaded hypothesis profile."""
    share = PROFILE_SHARE.get(settings.get_current_profile_name(), 1.0)
    return EXAMPLES or max(1, round(default_examples * share))


def property_test(default_examples: int) -> Callable[[Any], Any]:
    """Settings and seed of a property test (apply above ``@given``)."""
    def wrap(test: Any) -> Any:
        test = settings(max_examples=examples(default_examples), deadline=None, derandomize=False, database=None,
                        print_blob=True, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                                HealthCheck.filter_too_much])(test)
        return test if SEED == "random" else seed(int(SEED))(test)
    return wrap


# --- the database -------------------------------------------------------------------------------------------------

D0 = dt.date(2024, 1, 1)
INTS = list(range(-3, 7))
NONNEG_INTS = list(range(7))
FLOATS = [i / 4 for i in range(-12, 25)]
NONNEG_FLOATS = [i / 4 for i in range(21)]
DECIMALS = [Decimal(i) / 4 for i in range(-8, 17)]
STRINGS = ["", "a", "ab", "abc", "b", "ba", "B", " a", "a b"]
DATES = [D0 + dt.timedelta(days=i) for i in range(-3, 10)]
NAN, INF = float("nan"), float("inf")
I64 = 2 ** 63
BIG_INTS = [-I64, -I64 + 1, -(2 ** 62), -1, 0, 1, 3, 2 ** 62, I64 - 2, I64 - 1]
SPECIAL_FLOATS = [NAN, INF, -INF, -0.0, 0.0, 0.5, -1.25, 2.0, 3.75]
FLOAT32S = [float(np.float32(v)) for v in (0.1, 0.2, 0.3, 1 / 3, -0.7, 2.5, 100.1)]
NON_DYADIC = [0.1, 0.2, 0.3, 1 / 3, 2 / 3, -0.7, 1e16, -1e16, 1e-3, 123.456]
DECIMALS8 = [Decimal(v) for v in ("0.12345678", "-1.00000001", "12345678.87654321", "0.00000001", "-0.00000005",
                                  "99.99999999", "0E-8", "3.33333333")]
T0 = dt.datetime(2024, 1, 1)
TIMESTAMPS = [T0 + dt.timedelta(microseconds=us) for us in (-1, 0, 1, 999, 1000, 1001)] + [
    dt.datetime(2024, 2, 29, 23, 59, 59, 999999), dt.datetime(2024, 3, 1), dt.datetime(1970, 1, 1),
    dt.datetime(1969, 12, 31, 23, 59, 59, 999999)]
EDGE_DATES = [dt.date(2024, 1, 31), dt.date(2024, 2, 28), dt.date(2024, 2, 29), dt.date(2024, 3, 1),
              dt.date(2023, 2, 28), dt.date(2023, 3, 1), dt.date(2024, 4, 30), dt.date(2024, 12, 31),
              dt.date(2025, 1, 1)]
ODD_STRINGS = ["a\tb", "a\nb", "é", "ß", "Ä", "日本", " a ", "a", "", "\t"]


@dataclass(frozen=True)
class Column:
    """A generated column: its expression kind, values, types, and what may be done with it.

    ``kind``: int | float | dec | str | date | ts | bool; ``part``: partition kind (None: not partitioned here);
    ``duck``: DuckDB evaluates every generated expression over it as Spark does; ``exact``: its sums are the same in
    any order; ``special``: holds NaN or ±inf (kept away from FLOOR/CEIL/ROUND/CAST/GREATEST/LEAST).
    """

    name: str
    kind: str
    domain: tuple[Any, ...]
    arrow: pa.DataType
    part: str | None
    duck: bool = True
    exact: bool = True
    special: bool = False
    scale: int | None = None  # of a DECIMAL column

    @property
    def polars(self) -> pl.DataType:
        return pl.from_arrow(pa.table({"c": pa.array([], self.arrow)})).schema["c"]  # type: ignore[union-attr]


def _c(name: str, kind: str, domain: Sequence[Any], arrow: pa.DataType, part: str | None = None, **kw: Any) -> Column:
    return Column(name, kind, tuple(domain), arrow, part, **kw)


TABLES: dict[str, tuple[Column, ...]] = {
    # Some columns are never negative so that the safety check (which may rely on signs, e.g. HAVING SUM(b) > c)
    # declares partitions safe often enough for the DuckDB comparison to bite.
    "r": (_c("a", "int", INTS, pa.int64(), "int"), _c("b", "int", NONNEG_INTS, pa.int64(), "int"),
          _c("x", "float", FLOATS, pa.float64(), "float"), _c("n", "str", STRINGS, pa.string(), "string"),
          _c("d", "date", DATES, pa.date32(), "date")),
    "s": (_c("c", "int", INTS, pa.int64(), "int"), _c("e", "int", NONNEG_INTS, pa.int64(), "int"),
          _c("y", "float", NONNEG_FLOATS, pa.float64(), "float"), _c("t", "str", STRINGS, pa.string(), "string")),
    "u": (_c("k", "int", NONNEG_INTS, pa.int64(), "int"), _c("w", "float", FLOATS, pa.float64(), "float"),
          _c("v", "date", DATES, pa.date32(), "date"),
          _c("m", "dec", DECIMALS, pa.decimal128(10, 2), "decimal", scale=2)),
    "x": (_c("k", "int", NONNEG_INTS, pa.int64(), "int"),
          _c("i", "int", BIG_INTS, pa.int64(), "int", duck=False),
          _c("f", "float", SPECIAL_FLOATS, pa.float64(), None, special=True),
          _c("h", "float", FLOAT32S, pa.float32(), None, duck=False),
          _c("q", "dec", DECIMALS8, pa.decimal128(18, 8), "decimal", scale=8),
          _c("z", "float", NON_DYADIC, pa.float64(), "float", exact=False)),
    "y": (_c("k", "int", NONNEG_INTS, pa.int64(), "int"), _c("ts", "ts", TIMESTAMPS, pa.timestamp("us"), "timestamp"),
          _c("dd", "date", EDGE_DATES, pa.date32(), "date"), _c("w", "str", ODD_STRINGS, pa.string(), "string",
                                                                duck=False),
          _c("b", "bool", (True, False), pa.bool_(), None)),
}
SCHEMAS = {t: pa.schema([(c.name, c.arrow) for c in cols]) for t, cols in TABLES.items()}
EXTREME = ("x", "y")  # tables whose values DuckDB cannot always judge (see the module docstring)

Row = tuple[Any, ...]


def column(table: str, name: str) -> Column:
    return next(c for c in TABLES[table] if c.name == name)


def rows_strategy(table: str, max_size: int) -> st.SearchStrategy[list[Row]]:
    return st.lists(row_strategy(table), max_size=max_size)


def row_strategy(table: str) -> st.SearchStrategy[Row]:
    return st.tuples(*[st.sampled_from([*c.domain, None]) for c in TABLES[table]])


def frame(table: str, rows: Sequence[Row], mult: Sequence[int] | None = None) -> pl.DataFrame:
    schema = {c.name: c.polars for c in TABLES[table]}
    data = {c: [r[i] for r in rows] for i, c in enumerate(schema)}
    if mult is not None:
        schema[MULT] = pl.Int64
        data[MULT] = list(mult)
    return pl.DataFrame(data, schema=schema)


# --- generated SQL expressions ------------------------------------------------------------------------------------

NUM = ("int", "float", "dec")


@dataclass(frozen=True)
class X:
    """A generated SQL expression: ``fmt`` with ``{i}`` standing for child ``i``.

    ``kind`` is int | float | dec | str | date | ts | bool; ``exact`` is False when the value may not be a dyadic
    number (it must then not be summed: the sum would depend on the order of additions); ``agg`` marks an aggregate
    call, rendered as a window function (``OVER (...)``) for the brute-force provenance; ``special`` marks values
    that may be NaN or ±inf; ``duck_fmt`` is how DuckDB must be told the same thing (``{w}`` stands for the window
    clause of each aggregate in it).
    """

    fmt: str
    kids: tuple[X, ...] = ()
    kind: str = "int"
    exact: bool = True
    agg: bool = False
    column: bool = False
    special: bool = False
    duck_fmt: str | None = None

    def sql(self, window: str | None = None, duck: bool = False) -> str:
        kids = [k.sql(window, duck) for k in self.kids]
        if duck and self.duck_fmt is not None:
            return self.duck_fmt.format(*kids, w=f" OVER ({window})" if window is not None else "")
        text = self.fmt.format(*kids)
        if self.agg and window is not None:
            text = f"{text} OVER ({window})"
        return text


def col(ref: str, kind: str, exact: bool = True, special: bool = False) -> X:
    return X(ref, (), kind, exact, column=True, special=special)


def _special(*xs: X) -> bool:
    return any(x.special for x in xs)


def has_column(x: X) -> bool:
    return x.column or any(has_column(k) for k in x.kids)


def _lit_num(draw: st.DrawFn) -> X:
    choice = draw(st.sampled_from(["int", "int", "dec", "float"]))
    if choice == "int":
        v = draw(st.integers(-2, 5))
        return X(f"({v})" if v < 0 else str(v), (), "int")
    v = draw(st.sampled_from([0.25, 0.5, 1.5, 2.75, -0.5]))
    text = f"({v})" if v < 0 else str(v)
    return X(f"CAST({text} AS DOUBLE)", (), "float") if choice == "float" else X(text, (), "dec")


def _num_result(a: str, b: str) -> str:
    if "float" in (a, b):
        return "float"
    if "dec" in (a, b):
        return "dec"
    return "int"


def _exact(kind: str, *xs: X) -> bool:
    """Whether an expression of ``kind`` over ``xs`` adds up the same in any order: a decimal turned into a double
    (0.12345678) is not dyadic."""
    return all(x.exact for x in xs) and not (kind == "float" and any(x.kind == "dec" for x in xs))


def _pick(draw: st.DrawFn, options: list[str]) -> str:
    return draw(st.sampled_from(options))


# a grammar: one branch per production, picked by a drawn name (hence the noqa)
def gen_num(draw: st.DrawFn, cols: Sequence[X], depth: int, exact: bool = False) -> X:  # noqa: C901
    """A numeric expression; with ``exact`` only dyadic-valued operations (fit for SUM/AVG)."""
    atoms = [c for c in cols if c.kind in NUM and (c.exact or not exact)]
    strs = [c for c in cols if c.kind == "str"]
    dates = [c for c in cols if c.kind == "date"]
    opts = ["lit"] + ["col"] * (4 if atoms else 0)
    if depth > 0:
        opts += ["arith", "arith", "arith", "div", "mod", "neg", "abs", "case", "coalesce", "greatest", "cast"]
        opts += ["length"] if strs else []
        opts += ["extract", "datediff"] if dates else []
        opts += ["floor", "round"] if any(c.kind == "float" and not c.special for c in atoms) else []
        opts += ["extract"] if any(c.kind == "ts" for c in cols) else []
    what = _pick(draw, opts)
    sub = lambda: gen_num(draw, cols, depth - 1, exact)
    if what == "lit":
        return _lit_num(draw)
    if what == "col":
        return draw(st.sampled_from(atoms))
    if what == "arith":
        a, b = sub(), sub()
        op = _pick(draw, ["+", "-", "*"])
        kind = _num_result(a.kind, b.kind)
        return X(f"({{0}} {op} {{1}})", (a, b), kind, _exact(kind, a, b), special=_special(a, b))
    if what == "div":
        a = sub()
        if draw(st.booleans()):  # by a non-zero power of two keeps dyadic values dyadic
            d = _pick(draw, ["2", "4", "CAST(0.5 AS DOUBLE)", "(-2)"])
            return X(f"({{0}} / {d})", (a,), "float", _exact("float", a), special=a.special)
        if exact:
            return a
        b = sub()
        return X("({0} / NULLIF({1}, 0))", (a, b), "float", False, special=_special(a, b))
    if what == "mod":
        a = sub()
        if draw(st.booleans()):
            d = _pick(draw, ["2", "3", "(-3)"])
            return X(f"({{0}} % {d})", (a,), _num_result(a.kind, "int"), a.exact, special=a.special)
        b = sub()
        kind = _num_result(a.kind, b.kind)
        return X("({0} % NULLIF({1}, 0))", (a, b), kind, _exact(kind, a, b), special=_special(a, b))
    if what == "neg":
        a = sub()
        return X("(-({0}))", (a,), a.kind, a.exact, special=a.special)
    if what == "abs":
        a = sub()
        return X("ABS({0})", (a,), a.kind, a.exact, special=a.special)
    if what == "case":
        p, a, b = gen_pred(draw, cols, depth - 1), sub(), sub()
        kind = _num_result(a.kind, b.kind)
        return X("CASE WHEN {0} THEN {1} ELSE {2} END", (p, a, b), kind, _exact(kind, a, b), special=_special(a, b))
    if what == "coalesce":
        a, b = sub(), _lit_num(draw)
        kind = _num_result(a.kind, b.kind)
        return X("COALESCE({0}, {1})", (a, b), kind, _exact(kind, a, b), special=a.special)
    if what == "greatest":
        a, b = sub(), sub()
        if _special(a, b):  # NaN in GREATEST/LEAST: DuckDB and Spark agree, the engine is checked by the parity suite
            kind = _num_result(a.kind, b.kind)
            return X("({0} + {1})", (a, b), kind, _exact(kind, a, b), special=True)
        f = _pick(draw, ["GREATEST", "LEAST"])
        kind = _num_result(a.kind, b.kind)
        return X(f + "({0}, {1})", (a, b), kind, _exact(kind, a, b))
    if what == "cast":
        ints = [c for c in atoms if c.kind == "int"]
        a = draw(st.sampled_from(ints)) if ints else X("1")
        return X("CAST({0} AS DOUBLE)", (a,), "float", True)
    if what == "length":
        return X("LENGTH({0})", (gen_str(draw, cols, depth - 1),), "int")
    if what == "extract":
        stamps = [c for c in cols if c.kind == "ts"]
        if stamps and (not dates or draw(st.booleans())):
            part = _pick(draw, ["YEAR", "MONTH", "DAY", "HOUR", "MINUTE"])
            return X(f"EXTRACT({part} FROM {{0}})", (draw(st.sampled_from(stamps)),), "int")
        part = _pick(draw, ["YEAR", "MONTH", "DAY"])
        return X(f"EXTRACT({part} FROM {{0}})", (gen_date(draw, cols, depth - 1, pure=True),), "int")
    if what == "datediff":
        return X("DATEDIFF({0}, {1})", (gen_date(draw, cols, 0, pure=True), gen_date(draw, cols, 0, pure=True)), "int",
                 duck_fmt="({0} - {1})")  # DuckDB: date - date is the days between them
    floats = [c for c in atoms if c.kind == "float" and not c.special]
    a = draw(st.sampled_from(floats))
    if what == "floor":
        return X(_pick(draw, ["FLOOR", "CEIL"]) + "({0})", (a,), "int")
    if exact or draw(st.booleans()):
        return X("ROUND({0})", (a,), "float")
    return X("ROUND({0}, 1)", (a,), "float", False)


# a grammar: one branch per production, picked by a drawn name (hence the noqa)
def gen_str(draw: st.DrawFn, cols: Sequence[X], depth: int) -> X:  # noqa: C901
    atoms = [c for c in cols if c.kind == "str"]
    opts = ["lit"] + ["col"] * (4 if atoms else 0)
    if depth > 0:
        opts += ["upper", "trim", "substr", "pipe", "replace", "coalesce", "case", "cast"]
    what = _pick(draw, opts)
    sub = lambda: gen_str(draw, cols, depth - 1)
    if what == "lit":
        return X("'" + draw(st.sampled_from(["a", "ab", "b", "", "B"])) + "'", (), "str")
    if what == "col":
        return draw(st.sampled_from(atoms))
    if what == "upper":
        return X(_pick(draw, ["UPPER", "LOWER"]) + "({0})", (sub(),), "str")
    if what == "trim":
        return X("TRIM({0})", (sub(),), "str")
    if what == "substr":
        start, length = draw(st.integers(1, 2)), draw(st.integers(1, 2))
        return X(f"SUBSTRING({{0}}, {start}, {length})", (sub(),), "str")
    if what == "pipe":
        return X("({0} || {1})", (sub(), sub()), "str")
    if what == "replace":
        return X("REPLACE({0}, 'a', 'z')", (sub(),), "str")
    if what == "coalesce":
        return X("COALESCE({0}, 'n')", (sub(),), "str")
    if what == "case":
        return X("CASE WHEN {0} THEN {1} ELSE {2} END", (gen_pred(draw, cols, depth - 1), sub(), sub()), "str")
    other = [c for c in cols if c.kind in ("int", "date")]
    if not other:
        return sub()
    return X("CAST({0} AS STRING)", (draw(st.sampled_from(other)),), "str")


def _date_lit(draw: st.DrawFn) -> X:
    return X(f"DATE '{draw(st.sampled_from(DATES)).isoformat()}'", (), "date")


def gen_date(draw: st.DrawFn, cols: Sequence[X], depth: int, pure: bool = False) -> X:
    """A date expression; ``pure`` excludes ``+ INTERVAL`` (a timestamp in DuckDB)."""
    atoms = [c for c in cols if c.kind == "date"]
    opts = ["lit"] + ["col"] * (4 if atoms else 0)
    if depth > 0:
        opts += ["plus", "coalesce", "case"] + ([] if pure else ["interval"])
    what = _pick(draw, opts)
    sub = lambda: gen_date(draw, cols, depth - 1, pure=True)
    if what == "lit":
        return _date_lit(draw)
    if what == "col":
        return draw(st.sampled_from(atoms))
    if what == "plus":
        n = draw(st.integers(0, 3))
        return X(f"({{0}} {_pick(draw, ['+', '-'])} {n})", (sub(),), "date")
    if what == "coalesce":
        return X("COALESCE({0}, {1})", (sub(), _date_lit(draw)), "date")
    if what == "case":
        return X("CASE WHEN {0} THEN {1} ELSE {2} END", (gen_pred(draw, cols, depth - 1), sub(), sub()), "date")
    unit = _pick(draw, ["DAY", "MONTH"])
    return X(f"({{0}} {_pick(draw, ['+', '-'])} INTERVAL '1' {unit})", (sub(),), "date")


def gen_value(draw: st.DrawFn, cols: Sequence[X], depth: int, kind: str | None = None) -> X:
    kinds = sorted({c.kind for c in cols if c.kind != "bool"} | {"int"})
    kind = kind or draw(st.sampled_from(kinds))
    if kind in NUM:
        return gen_num(draw, cols, depth)
    if kind == "str":
        return gen_str(draw, cols, depth)
    if kind == "ts":
        return gen_ts(draw, cols)
    return gen_date(draw, cols, depth, pure=True)


def gen_ts(draw: st.DrawFn, cols: Sequence[X]) -> X:
    """A timestamp: a column or a microsecond literal (near the domain's values, i.e. near partition bounds)."""
    atoms = [c for c in cols if c.kind == "ts"]
    if atoms and draw(st.integers(0, 2)):
        return draw(st.sampled_from(atoms))
    return X(f"TIMESTAMP '{draw(st.sampled_from(TIMESTAMPS)).isoformat(sep=' ')}'", (), "ts")


# a grammar: one branch per production, picked by a drawn name (hence the noqa)
def gen_pred(draw: st.DrawFn, cols: Sequence[X], depth: int) -> X:  # noqa: C901
    """A boolean condition (SQL three-valued logic) over ``cols``."""
    opts = ["cmp", "cmp", "cmp", "isnull", "in", "between"]
    if any(c.kind == "str" for c in cols):
        opts += ["like"]
    if any(c.kind == "date" for c in cols):
        opts += ["datecmp"]
    if any(c.kind == "bool" for c in cols):
        opts += ["bool"]
    if depth > 0:
        opts += ["and", "or", "not"]
    what = _pick(draw, opts)
    if what == "bool":
        b = draw(st.sampled_from([c for c in cols if c.kind == "bool"]))
        return X(_pick(draw, ["{0}", "(NOT {0})", "({0} = TRUE)", "({0} IS NULL)", "({0} <> FALSE)"]), (b,), "bool")
    if what in ("and", "or"):
        a, b = gen_pred(draw, cols, depth - 1), gen_pred(draw, cols, depth - 1)
        return X(f"({{0}} {what.upper()} {{1}})", (a, b), "bool")
    if what == "not":
        return X("(NOT {0})", (gen_pred(draw, cols, depth - 1),), "bool")
    if what == "isnull":
        a = gen_value(draw, cols, min(depth, 1))
        return X("({0} IS " + ("NOT " if draw(st.booleans()) else "") + "NULL)", (a,), "bool")
    if what == "like":
        a = gen_str(draw, cols, min(depth, 1))
        pattern = draw(st.sampled_from(["a%", "%b", "_", "%a%", "a_", "%", "B%"]))
        op = _pick(draw, ["LIKE", "NOT LIKE", "ILIKE"])
        return X(f"({{0}} {op} '{pattern}')", (a,), "bool")
    if what == "datecmp":
        a = gen_date(draw, cols, 1)
        if draw(st.integers(0, 2)) == 0:  # DuckDB makes date + INTERVAL a timestamp: only ever compared
            a = X(f"({{0}} {_pick(draw, ['+', '-'])} INTERVAL '1' {_pick(draw, ['DAY', 'MONTH'])})", (a,), "date")
        op = _pick(draw, ["<", "<=", ">", ">=", "=", "<>"])
        return X(f"({{0}} {op} {{1}})", (a, _date_lit(draw)), "bool")
    kinds = sorted({c.kind for c in cols if c.kind != "bool"} | {"int"})
    kind = draw(st.sampled_from(kinds))
    a = gen_value(draw, cols, min(depth, 2), kind)
    if what == "cmp":
        b = gen_value(draw, cols, min(depth, 1), kind)
        op = _pick(draw, ["<", "<=", ">", ">=", "=", "<>"])
        return X(f"({{0}} {op} {{1}})", (a, b), "bool")
    if what == "in":
        items = [gen_value(draw, [], 0, kind) for _ in range(draw(st.integers(1, 3)))]
        if draw(st.integers(0, 4)) == 0:
            items.append(X("NULL", (), kind))
        neg = "NOT " if draw(st.booleans()) else ""
        return X(f"({{0}} {neg}IN (" + ", ".join(f"{{{i + 1}}}" for i in range(len(items))) + "))",
                 (a, *items), "bool")
    lo, hi = gen_value(draw, [], 0, kind), gen_value(draw, [], 0, kind)
    neg = "NOT " if draw(st.integers(0, 3)) == 0 else ""
    return X(f"({{0}} {neg}BETWEEN {{1}} AND {{2}})", (a, lo, hi), "bool")


# --- generated queries --------------------------------------------------------------------------------------------


@dataclass
class Source:
    """A FROM item: a table under an alias, or a subquery block."""

    alias: str
    table: str | None = None
    sub: Block | None = None

    def columns(self) -> list[X]:
        if self.table is not None:
            return [col(f"{self.alias}.{c.name}", c.kind, c.exact, c.special) for c in TABLES[self.table]]
        assert self.sub is not None
        return [col(f"{self.alias}.c{i}", x.kind, x.exact, x.special) for i, x in enumerate(self.sub.items)]

    def sql(self, duck: bool = False) -> str:
        if self.table is not None:
            return f"{self.table} AS {self.alias}"
        assert self.sub is not None
        return f"({self.sub.sql(duck)}) AS {self.alias}"


@dataclass
class Block:
    """One SELECT block. Output columns are named c0, c1, ...; ``order`` holds (item, descending, nulls first)."""

    items: list[X]
    sources: list[Source]
    conditions: list[X | None]  # for sources[1:]: the condition linking it (None: cross product)
    comma: bool  # conditions in WHERE (comma join) rather than JOIN ... ON
    where: X | None = None
    keys: list[X] | None = None  # GROUP BY; [] = aggregation without GROUP BY; None = no aggregation
    having: X | None = None
    distinct: bool = False
    order: list[tuple[int, bool, bool]] = field(default_factory=list)
    limit: int | None = None
    ordinal_order: bool = False
    hidden: tuple[X, bool, bool] | None = None  # a first ORDER BY key that is not in the select list
    duck: bool = True  # False: the block sums order-dependent values DuckDB adds in its own order
    subquery_scans: list[tuple[str, str]] = field(default_factory=list)  # (alias, table) read by WHERE subqueries

    @property
    def aggregated(self) -> bool:
        return self.keys is not None

    def from_sql(self, duck: bool = False) -> str:
        if self.comma:
            return ", ".join(s.sql(duck) for s in self.sources)
        out = self.sources[0].sql(duck)
        for s, cond in zip(self.sources[1:], self.conditions):
            out += f" JOIN {s.sql(duck)} ON {cond.sql(duck=duck)}" if cond is not None else \
                f" CROSS JOIN {s.sql(duck)}"
        return out

    def where_parts(self) -> list[X]:
        parts = [c for c in self.conditions if c is not None] if self.comma else []
        return parts + ([self.where] if self.where is not None else [])

    def where_sql(self, duck: bool = False) -> str:
        parts = self.where_parts()
        return (" WHERE " + " AND ".join(p.sql(duck=duck) for p in parts)) if parts else ""

    def group_sql(self, duck: bool = False) -> str:
        out = ""
        if self.keys:
            out += " GROUP BY " + ", ".join(k.sql(duck=duck) for k in self.keys)
        if self.having is not None:
            out += f" HAVING {self.having.sql(duck=duck)}"
        return out

    def order_sql(self, exprs: bool = False, duck: bool = False) -> str:
        keys = []
        if self.hidden is not None:
            x, desc, nulls_first = self.hidden
            keys.append(f"{x.sql(duck=duck)} {'DESC' if desc else 'ASC'} NULLS {'FIRST' if nulls_first else 'LAST'}")
        for i, desc, nulls_first in self.order:
            ref = self.items[i].sql(duck=duck) if exprs else (str(i + 1) if self.ordinal_order else f"c{i}")
            keys.append(f"{ref} {'DESC' if desc else 'ASC'} NULLS {'FIRST' if nulls_first else 'LAST'}")
        return ", ".join(keys)

    def sql(self, duck: bool = False) -> str:
        """The query as SQL; with ``duck``, the same query as DuckDB must be told it (Spark's decimal AVG)."""
        items = ", ".join(f"{x.sql(duck=duck)} AS c{i}" for i, x in enumerate(self.items))
        out = (f"SELECT {'DISTINCT ' if self.distinct else ''}{items} FROM {self.from_sql(duck)}"
               f"{self.where_sql(duck)}")
        out += self.group_sql(duck)
        if self.limit is not None:
            out += f" ORDER BY {self.order_sql(duck=duck)} LIMIT {self.limit}"
        return out

    def all_duck(self) -> bool:
        return self.duck and all(s.sub.all_duck() for s in self.sources if s.sub is not None)

    def scans(self) -> list[tuple[str, str]]:
        """(alias, table) of every table this block and its subqueries read."""
        out = []
        for s in self.sources:
            out += [(s.alias, s.table)] if s.table is not None else s.sub.scans()  # type: ignore[union-attr]
        return out + self.subquery_scans

    def tables(self) -> list[str]:
        out = []
        for s in self.sources:
            out += [s.table] if s.table is not None else s.sub.tables()  # type: ignore[union-attr]
        return out + [t for _, t in self.subquery_scans]

    def has_subquery(self) -> bool:
        return any(s.sub is not None for s in self.sources) or bool(self.subquery_scans)

    def total_order(self) -> bool:
        return {i for i, _, _ in self.order} == set(range(len(self.items)))

    def order_columns(self) -> list[int] | None:
        """Output columns whose values LIMIT determines (all of them for a total order), None if it is not known."""
        if self.total_order():
            return list(range(len(self.items)))
        return None if self.hidden is not None else [i for i, _, _ in self.order]


class _Names:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.n}"


@st.composite
def blocks(draw: st.DrawFn, shape: str = "any", depth: int = 0, names: _Names | None = None,
           max_tables: int = 3) -> Block:
    """A random SELECT block. ``shape``: spj | agg | topk | nested | any."""
    names = names or _Names()
    if shape == "any":
        shape = draw(st.sampled_from(["spj", "agg", "topk", "nested"]))
    # FROM items
    n_sources = draw(st.integers(1, min(3, max_tables)))
    sources: list[Source] = []
    budget = max_tables
    for i in range(n_sources):
        chance = 1 if shape == "nested" else 4  # nested: often several subqueries (stateful inputs on both sides)
        want_sub = (shape == "nested" and i == 0) or (depth < 1 and draw(st.integers(0, chance)) == 0)
        if want_sub and depth < 2 and budget >= 1:
            sub_max = max(1, budget - (n_sources - 1 - i))
            sub = draw(blocks(draw(st.sampled_from(["spj", "agg", "topk"])), depth + 1, names, sub_max))
            sources.append(Source(names("q"), sub=sub))
            budget -= len(sub.tables())
        else:
            table = draw(st.sampled_from(sorted(TABLES)))
            sources.append(Source(names(table), table=table))
            budget -= 1
        if budget <= 0:
            break
    cols = [c for s in sources for c in s.columns()]
    conditions: list[X | None] = []
    for i in range(1, len(sources)):
        seen = [c for s in sources[:i] for c in s.columns()]
        here = sources[i].columns()
        conditions.append(draw(join_condition(seen, here, allow_cross=len(sources) == 2)))
        if i == 2 and draw(st.integers(0, 3)) == 0:  # a condition over all three FROM items
            nums = [[c for c in src.columns() if c.kind in NUM] for src in sources[:3]]
            if all(nums):
                a, b, c = (draw(st.sampled_from(n)) for n in nums)
                link = X("(({0} + {1}) = {2})", (a, b, c), "bool")
                conditions[-1] = link if conditions[-1] is None else X("({0} AND {1})", (conditions[-1], link), "bool")
    comma = draw(st.booleans())
    where = gen_pred(draw, cols, 2) if draw(st.integers(0, 3)) > 0 else None
    block = Block([], sources, conditions, comma, where)
    _add_where_subquery(draw, block, cols, names, depth == 0 and budget >= 1)
    if shape in ("agg",) or (shape in ("topk", "nested") and draw(st.booleans())):
        _aggregation(draw, block, cols, nested=depth > 0)
    else:
        # a top-k in a subquery with one or two columns: copies of a row from several fragments meet at its cut
        n_items = draw(st.integers(1, 2 if shape == "topk" and depth > 0 else 4))
        block.items = [draw(st.sampled_from(cols)) if draw(st.booleans()) else gen_value(draw, cols, 2)
                       for _ in range(n_items)]
        block.distinct = draw(st.integers(0, 3)) == 0
    if shape == "topk" or (shape == "nested" and depth == 0 and draw(st.booleans())):
        _topk(draw, block, total=depth > 0, cols=cols)
    return block


SUBQUERY_KINDS = ("int", "str", "date")  # key kinds compared with a subquery's column (equal types on both sides)


def where_subquery(outer: list[X], alias: str) -> st.SearchStrategy[tuple[X, tuple[str, str]] | None]:
    """A WHERE conjunct with a subquery over one table: correlated EXISTS / NOT EXISTS (an equality between an outer
    and an inner column, and a condition on the inner table), or IN / NOT IN over one of its columns."""
    @st.composite
    def gen(draw: st.DrawFn) -> tuple[X, tuple[str, str]] | None:
        table = draw(st.sampled_from(sorted(t for t in TABLES if t not in EXTREME)))
        inner = [col(f"{alias}.{c.name}", c.kind, c.exact, c.special) for c in TABLES[table]]
        pairs = [(o, i) for o in outer for i in inner
                 if o.kind == i.kind and o.kind in SUBQUERY_KINDS and not o.special]
        if not pairs:
            return None
        o, i = draw(st.sampled_from(pairs))
        cond = gen_pred(draw, inner, 1)
        what = draw(st.sampled_from(["exists", "in", "not exists", "not in"]))
        if what in ("exists", "not exists"):
            fmt = f"({'NOT ' if what == 'not exists' else ''}EXISTS (SELECT * FROM {table} AS {alias} " \
                  f"WHERE ({{1}} = {{0}}) AND {{2}}))"
        else:
            fmt = f"({{0}} {'NOT ' if what == 'not in' else ''}IN (SELECT {{1}} FROM {table} AS {alias} WHERE {{2}}))"
        return X(fmt, (o, i, cond), "bool"), (alias, table)
    return gen()


def _add_where_subquery(draw: st.DrawFn, block: Block, cols: list[X], names: _Names, allowed: bool) -> None:
    """One time in four (when ``allowed``: an outer block with a table to spare), a WHERE conjunct with a subquery
    (its table counts among the block's tables)."""
    if not allowed or draw(st.integers(0, 3)) != 0:
        return
    found = draw(where_subquery(cols, names("w")))
    if found is not None:
        pred, scan = found
        block.where = pred if block.where is None else X("({0} AND {1})", (block.where, pred), "bool")
        block.subquery_scans.append(scan)


def join_condition(left: list[X], right: list[X], allow_cross: bool) -> st.SearchStrategy[X | None]:
    @st.composite
    def gen(draw: st.DrawFn) -> X | None:
        pairs = [(a, b) for a in left for b in right
                 if a.kind == b.kind or (a.kind in NUM and b.kind in NUM)]
        what = draw(st.sampled_from(["equi", "equi", "equi", "theta", "both"] + (["cross"] if allow_cross else [])))
        if what == "cross" or not pairs:
            return None
        a, b = draw(st.sampled_from(pairs))
        if draw(st.booleans()):
            a, b = b, a
        equi = X("({0} = {1})", (a, b), "bool")
        if what == "equi":
            return equi
        if a.kind in NUM and b.kind in NUM:
            theta = X(_pick(draw, ["({0} < {1})", "(ABS({0} - {1}) <= 1)", "({0} + 1 >= {1})"]), (a, b), "bool")
        else:
            theta = X("({0} <= {1})", (a, b), "bool")
        if what == "theta":
            return theta
        other = draw(st.sampled_from(pairs))
        more = X("({0} <> {1})", other, "bool") if draw(st.booleans()) else gen_pred(draw, left + right, 1)
        return X("({0} AND {1})", (equi, more), "bool")
    return gen()


_DECIMAL_COLUMNS = [c for cols in TABLES.values() for c in cols if c.kind == "dec"]


def _duck_decimal_avg(scale: int) -> str:
    """Spark's AVG of a DECIMAL(p, scale) column for DuckDB: the exact sum over the count, HALF_UP at scale + 4."""
    unscaled = f"SUM(CAST(CAST({{0}} AS DECIMAL(38, {scale})) * {10 ** scale} AS HUGEINT)){{w}}"
    n = "COUNT({0}){w}"
    step = f"CAST('{Decimal(1).scaleb(-(scale + 4))}' AS DECIMAL(18, {scale + 4}))"
    return (f"(CASE WHEN {n} = 0 THEN NULL ELSE CAST(sign({unscaled}) * ((2 * abs({unscaled}) * 10000 + {n}) "
            f"// (2 * {n})) AS DECIMAL(38, 0)) * {step} END)")


def _agg_call(draw: st.DrawFn, block: Block, cols: list[X]) -> X:
    """One aggregate call of a generated aggregation (marks ``block`` when only a recapture can judge it)."""
    func = draw(st.sampled_from(["SUM", "COUNT", "COUNT(*)", "AVG", "MIN", "MAX", "COUNT(DISTINCT)"]))
    if func == "COUNT(*)":
        return X("COUNT(*)", (), "int", True, agg=True)
    if func == "COUNT(DISTINCT)":  # DuckDB's DISTINCT, like Spark's, sees -0.0 = 0.0 and one NaN
        return X("COUNT(DISTINCT {0})", (gen_value(draw, cols, 1),), "int", True, agg=True)
    if func not in ("SUM", "AVG"):
        arg = gen_value(draw, cols, 1)
        return X(func + "({0})", (arg,), "int" if func == "COUNT" else arg.kind, arg.exact, agg=True,
                 special=arg.special and func != "COUNT")
    if draw(st.integers(0, 5)) == 0 and any(not c.exact for c in cols):
        # an order-dependent sum: DuckDB adds in its own order, so this block is judged by a recapture
        arg = draw(st.sampled_from([c for c in cols if not c.exact]))
        block.duck = False
    else:
        arg = gen_num(draw, cols, 1, exact=True)
        if not arg.exact:  # a decimal mixed into a double: order-dependent after all, judged by a recapture
            block.duck = False
    decimal_column = [c for c in _DECIMAL_COLUMNS if arg.column and arg.fmt.endswith("." + c.name)]
    if func == "AVG" and arg.kind == "dec" and not decimal_column:
        func = "SUM"  # AVG of a decimal expression: its scale (Spark's rules) is not rendered for DuckDB
    if func == "AVG" and arg.kind == "dec":
        return X("AVG({0})", (arg,), "dec", True, agg=True,
                 duck_fmt=_duck_decimal_avg(decimal_column[0].scale))  # type: ignore[arg-type]
    kind = "float" if func == "AVG" else arg.kind
    return X(func + "({0})", (arg,), kind, func == "SUM" and arg.exact, agg=True, special=arg.special)


def _aggregation(draw: st.DrawFn, block: Block, cols: list[X], nested: bool = False) -> None:
    # in a subquery, an aggregation without GROUP BY (one row even over no input) often feeds a join or top-k
    n_keys = draw(st.sampled_from([0, 0, 1, 1, 2] if nested else [0, 1, 1, 1, 2, 2]))
    keys: list[X] = []
    for _ in range(n_keys):
        key = draw(st.sampled_from(cols)) if draw(st.integers(0, 3)) else gen_value(draw, cols, 1)
        # a constant key adds nothing, and an integer constant would be read as a select-list position
        if has_column(key) and key.sql() not in [k.sql() for k in keys]:
            keys.append(key)
    aggs = [_agg_call(draw, block, cols) for _ in range(draw(st.integers(1, 3)))]
    atoms = keys + aggs
    items = [k for k in keys if draw(st.booleans())] + [a for a in aggs if draw(st.integers(0, 4))]
    if draw(st.integers(0, 3)) == 0:
        plain_keys = [k for k in keys if k.column]
        items.append(gen_num(draw, plain_keys + aggs, 1))
    if not items:
        items = [aggs[0]]
    block.items = items
    block.keys = keys
    if draw(st.integers(0, 2)):
        block.having = gen_pred(draw, atoms, 1)
    block.distinct = draw(st.integers(0, 9)) == 0


def _topk(draw: st.DrawFn, block: Block, total: bool, cols: list[X]) -> None:
    n = len(block.items)
    idx = draw(st.permutations(range(n)))
    if not block.distinct and draw(st.integers(0, 3)) == 0:
        # ORDER BY an expression outside the select list (a hidden column below the top-k, projected away above
        # it), then every output column, so that LIMIT's result is still determined
        atoms = cols if not block.aggregated else [k for k in block.keys or [] if k.column] + \
            [x for x in block.items if x.agg]
        hidden = gen_value(draw, atoms, 1)
        if has_column(hidden):  # a constant key would be a select-list position
            block.hidden = (hidden, draw(st.booleans()), draw(st.booleans()))
            total = True
    if not total:
        idx = idx[:draw(st.integers(1, n))] if draw(st.integers(0, 2)) else idx
    block.order = [(i, draw(st.booleans()), draw(st.booleans())) for i in idx]
    block.limit = draw(st.sampled_from([0, 1, 1, 2, 3, 5]))
    block.ordinal_order = draw(st.integers(0, 3)) == 0


# --- partitions ---------------------------------------------------------------------------------------------------


def partitions_strategy(tables: list[str]) -> st.SearchStrategy[PartitionSet]:
    @st.composite
    def gen(draw: st.DrawFn) -> PartitionSet:
        chosen = draw(st.lists(st.sampled_from(sorted(set(tables))), min_size=1, max_size=3, unique=True))
        parts = []
        for t in chosen:
            c = draw(st.sampled_from([c for c in TABLES[t] if c.part is not None]))
            extra = {"int": [-10, 100], "float": [-0.1, 1.3, 2.6, 100.0], "string": ["aa", "zz", "A"],
                     "date": [D0 + dt.timedelta(days=40)], "decimal": [Decimal("0.1"), Decimal("99.99")],
                     "timestamp": [T0 + dt.timedelta(days=1)]}[c.part]
            bounds = draw(st.lists(st.sampled_from(sorted(set(c.domain) | set(extra))), min_size=2, max_size=5,
                                   unique=True))
            parts.append(Partition(t, c.name, tuple(sorted(bounds)), c.part))
        return PartitionSet(tuple(parts))
    return gen()


def fragment_of(part: Partition, value: Any) -> int:
    """Local fragment of a value, computed independently of the engine (NULL belongs to fragment 0)."""
    if value is None:
        return 0
    return bisect.bisect_right(list(part.bounds[1:-1]), value)


# --- change batches -----------------------------------------------------------------------------------------------


def _extremes(c: Column) -> list[Any]:
    """A column's most awkward values: its smallest and largest, NaN, ±inf, -0.0."""
    values = [v for v in c.domain if not (isinstance(v, float) and math.isnan(v))]
    out = [min(values), max(values)] if values else []
    if c.special:
        out += [v for v in c.domain if isinstance(v, float) and (math.isnan(v) or math.isinf(v) or
                                                                 (v == 0 and math.copysign(1, v) < 0))]
    return out


def extreme_row_strategy(table: str) -> st.SearchStrategy[Row]:
    return st.tuples(*[st.sampled_from([*_extremes(c), None]) for c in TABLES[table]])


def op_strategy(tables: list[str]) -> st.SearchStrategy[tuple]:
    table = st.sampled_from(sorted(set(tables)))
    idx = st.integers(0, 10_000)

    @st.composite
    def gen(draw: st.DrawFn) -> tuple:
        t = draw(table)
        kind = draw(st.sampled_from(["insert", "insert", "delete", "delete", "update", "update", "group", "dup",
                                     "empty", "refill", "spike", "unspike"]))
        if kind == "insert":
            return ("insert", t, draw(rows_strategy(t, 8)))
        if kind == "spike":  # rows of the domain's extremes, deleted again by a later "unspike"
            return ("spike", t, draw(st.lists(extreme_row_strategy(t), min_size=1, max_size=3)))
        if kind == "unspike":
            return ("unspike", t)
        if kind == "delete":
            return ("delete", t, draw(st.lists(idx, min_size=1, max_size=5)))
        if kind == "update":
            return ("update", t, draw(st.lists(st.tuples(idx, st.integers(0, len(TABLES[t]) - 1),
                                                         row_strategy(t)), min_size=1, max_size=4)))
        if kind == "group":
            return ("group", t, draw(st.integers(0, len(TABLES[t]) - 1)), draw(idx))
        if kind == "dup":
            return ("dup", t, draw(idx), draw(st.integers(1, 3)))
        if kind == "empty":
            return ("empty", t)
        return ("refill", t, draw(rows_strategy(t, 15)))
    return gen()


# --- change operations on a table's rows: each changes ``rows`` in place and returns the change rows -------------


def _insert(rows: list[Row], op: tuple) -> list[tuple[Row, int]]:
    rows += op[2]
    return [(r, 1) for r in op[2]]


def _unspike(rows: list[Row], spiked: list[Row]) -> list[tuple[Row, int]]:
    """Deletes the same row objects a spike inserted (NaN equals itself only by identity)."""
    out = []
    for r in spiked:
        hit = next((i for i, x in enumerate(rows) if x is r), None)
        if hit is not None:
            out.append((rows.pop(hit), -1))
    return out


def _delete(rows: list[Row], op: tuple) -> list[tuple[Row, int]]:
    out = []
    for i in op[2]:
        if rows:
            out.append((rows.pop(i % len(rows)), -1))
    return out


def _update(rows: list[Row], op: tuple) -> list[tuple[Row, int]]:
    out: list[tuple[Row, int]] = []
    for i, c, new in op[2]:
        if rows:
            old = rows.pop(i % len(rows))
            updated = old[:c] + (new[c],) + old[c + 1:]  # change one column, like an UPDATE
            rows.append(updated)
            out += [(old, -1), (updated, 1)]
    return out


def _delete_group(rows: list[Row], op: tuple) -> list[tuple[Row, int]]:
    if not rows:
        return []
    c, value = op[2], rows[op[3] % len(rows)][op[2]]
    gone = [r for r in rows if r[c] == value]
    rows[:] = [r for r in rows if r[c] != value]
    return [(r, -1) for r in gone]


def _duplicate(rows: list[Row], op: tuple) -> list[tuple[Row, int]]:
    if not rows:
        return []
    r = rows[op[2] % len(rows)]
    rows += [r] * op[3]
    return [(r, 1)] * op[3]


def _empty(rows: list[Row], op: tuple) -> list[tuple[Row, int]]:
    out = [(r, -1) for r in rows]
    rows.clear()
    return out


def _refill(rows: list[Row], op: tuple) -> list[tuple[Row, int]]:
    out = [(r, -1) for r in rows] + [(r, 1) for r in op[2]]
    rows[:] = op[2]
    return out


_CHANGES: dict[str, Callable[[list[Row], tuple], list[tuple[Row, int]]]] = {
    "insert": _insert, "spike": _insert, "delete": _delete, "update": _update, "group": _delete_group,
    "dup": _duplicate, "empty": _empty, "refill": _refill,
}


def _net(rows_mult: list[tuple[Row, int]]) -> list[tuple[Row, int]]:
    """Identical change rows merged into one with their summed multiplicity (zero sums dropped)."""
    merged: Counter[Row] = Counter()
    for r, m in rows_mult:
        merged[r] += m
    return [(r, m) for r, m in merged.items() if m != 0]


class Store:
    """Table versions in memory; applies change operations and returns the change rows they made."""

    def __init__(self, initial: dict[str, list[Row]]) -> None:
        self.versions: dict[str, list[list[Row]]] = {t: [list(rows)] for t, rows in initial.items()}
        self._frames: dict[tuple[str, int], pl.DataFrame] = {}
        self._spikes: dict[str, list[Row]] = {}

    def rows(self, table: str, version: int | None = None) -> list[Row]:
        v = self.versions[table]
        return v[-1 if version is None else version]

    def latest(self) -> dict[str, int]:
        return {t: len(v) - 1 for t, v in self.versions.items()}

    def read(self, table: str, version: int) -> pl.DataFrame:
        key = (table, version)
        if key not in self._frames:
            self._frames[key] = frame(table, self.versions[table][version])
        return self._frames[key]

    def apply(self, ops: Sequence[tuple], merge_duplicates: bool) -> dict[str, pl.DataFrame]:
        """Apply one batch; every changed table gets one new version. Returns the change rows per table."""
        current = {t: list(v[-1]) for t, v in self.versions.items()}
        changes: dict[str, list[tuple[Row, int]]] = {}
        for op in ops:
            kind, t = op[0], op[1]
            out = changes.setdefault(t, [])
            if kind == "spike":
                self._spikes[t] = list(op[2])
            if kind == "unspike":
                out += _unspike(current[t], self._spikes.pop(t, []))
            else:
                out += _CHANGES[kind](current[t], op)
        result = {}
        for t, rows_mult in changes.items():
            self.versions[t].append(current[t])
            if merge_duplicates:  # a CDF may deliver n identical rows or one row with multiplicity n
                rows_mult = _net(rows_mult)
            result[t] = frame(t, [r for r, _ in rows_mult], [m for _, m in rows_mult])
        return result



class Case:
    """One generated example (a plain class so that hypothesis prints the short ``repr`` below).

    ``duck``: whether DuckDB can judge it (see the module docstring); ``duck_sql`` is the query as DuckDB must be
    told it.
    """

    def __init__(self, block: Block | None, sql: str, initial: dict[str, list[Row]], parts: PartitionSet,
                 batches: list[list[tuple]], merge_duplicates: bool, netting: bool, reload_state: list[bool],
                 duck: bool | None = None) -> None:
        self.block, self.sql, self.initial, self.parts = block, sql, initial, parts
        self.batches, self.merge_duplicates, self.netting, self.reload_state = (batches, merge_duplicates, netting,
                                                                              reload_state)
        self.duck = duck_judges(block) if duck is None and block is not None else bool(duck if duck is not None
                                                                                        else True)
        self.duck_sql = block.sql(duck=True) if block is not None else sql

    def __repr__(self) -> str:  # what hypothesis prints for a failing example
        lines = ["", f"SQL: {self.sql}", f"partitions: {self.parts.to_json()}",
                 f"netting={self.netting} merge_duplicates={self.merge_duplicates} reload={self.reload_state} "
                 f"duckdb_judges={self.duck}"]
        lines += [f"table {t}: {rows}" for t, rows in self.initial.items()]
        lines += [f"batch {i}: {b}" for i, b in enumerate(self.batches)]
        return "\n".join(lines)


def duck_judges(block: Block) -> bool:
    """Whether DuckDB evaluates ``block`` exactly as Spark does: no order-dependent sum, no column DuckDB reads
    differently (see the module docstring)."""
    if not block.all_duck():
        return False
    sql = block.sql()
    for alias, table in block.scans():
        for c in TABLES[table]:
            if not c.duck and re.search(rf"\b{re.escape(alias)}\.{re.escape(c.name)}\b", sql):
                return False
    return True


@st.composite
def cases(draw: st.DrawFn, shape: str = "any") -> Case:
    block = draw(blocks(shape))
    tables = sorted(set(block.tables()))
    many = len(block.tables()) >= 3
    initial = {t: draw(rows_strategy(t, 12 if many else 60)) for t in tables}
    parts = draw(partitions_strategy(tables))
    batches = draw(st.lists(st.lists(op_strategy(tables), min_size=1, max_size=3), min_size=1, max_size=5))
    return Case(block, block.sql(), initial, parts, batches, draw(st.booleans()), draw(st.booleans()),
                draw(st.lists(st.booleans(), min_size=len(batches), max_size=len(batches))))


def note(text: str) -> None:
    """Count a hypothesis event (shown with --hypothesis-show-statistics); a no-op outside generated cases."""
    try:
        event(text)
    except InvalidArgument:
        pass

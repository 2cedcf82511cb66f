"""The conservative selection decided in NumPy (``imp_core.engine.interval_select``) keeps and flags exactly the rows
the polars expressions of ``IntervalCompiler.may`` keep and flag: NULL ends, NaN (above every number, equal to
itself), infinities, unknown intervals ``[-inf, NaN]``, every comparison in both orders, under AND, OR and NOT."""

from __future__ import annotations

import math
import random
from decimal import Decimal

import polars as pl
import pytest

from imp_core.engine.operators.selection import Selection
from imp_core.engine.schema import CERTAIN, MULT, hi_name, lo_name
from imp_core.plan.expr import FLOAT, INT, Binary, Col, Expr, Lit, Unary

ENDS = [None, math.nan, -math.inf, math.inf, -1.0, 0.0, 1.5, 1600.0, 1600.5]
OPS = ["<", "<=", ">", ">=", "=", "<>"]


def _frame(rng: random.Random, rows: int) -> pl.DataFrame:
    cols: dict[str, list] = {"g": list(range(rows)), MULT: [rng.choice([-1, 1]) for _ in range(rows)]}
    for name in ("v", "w"):
        los, his = [], []
        for _ in range(rows):
            lo, hi = rng.choice(ENDS), rng.choice(ENDS)
            if rng.random() < 0.5 and lo is not None and hi is not None and not (lo <= hi):
                lo, hi = hi, lo  # mostly ordered intervals, some not (NaN, a swapped pair)
            if rng.random() < 0.1:
                lo, hi = -math.inf, math.nan  # unknown
            los.append(lo)
            his.append(hi)
        cols[name] = [lo if lo is not None and rng.random() < 0.5 else hi for lo, hi in zip(los, his)]
        cols[lo_name(name)], cols[hi_name(name)] = los, his
    cols[CERTAIN] = [rng.random() < 0.5 for _ in range(rows)]
    return pl.DataFrame(cols, schema={"g": pl.Int64, MULT: pl.Int64, "v": pl.Float64, lo_name("v"): pl.Float64,
                                      hi_name("v"): pl.Float64, "w": pl.Float64, lo_name("w"): pl.Float64,
                                      hi_name("w"): pl.Float64, CERTAIN: pl.Boolean})


def _predicate(rng: random.Random, depth: int) -> Expr:
    if depth and rng.random() < 0.5:
        kind = rng.choice(["and", "or", "not"])
        if kind == "not":
            return Unary("not", _predicate(rng, depth - 1))
        return Binary(kind, _predicate(rng, depth - 1), _predicate(rng, depth - 1))
    side = Col(rng.choice(["v", "w"]), FLOAT)
    other = rng.choice([Lit(rng.choice([0, 1600, -3]), INT), Lit(rng.choice([1.5, 1600.5, -0.0, math.inf]), FLOAT),
                        Col(rng.choice(["v", "w"]), FLOAT)])
    left, right = (side, other) if rng.random() < 0.5 else (other, side)
    return Binary(rng.choice(OPS), left, right)


@pytest.mark.parametrize("flags", [(False, False), (False, True), (True, True)])
def test_numpy_decision_equals_the_expressions(flags: tuple[bool, bool]) -> None:
    rng = random.Random(sum(flags) * 7 + 1)
    used = 0
    for _ in range(150):
        p = _predicate(rng, 2)
        sel = Selection("select@1", p, {"v", "w"}, conservative=True, flagged_input=flags[0],
                        flagged_output=flags[1])
        assert sel._numpy is not None, str(p)  # every predicate here has the NumPy shape
        frame = _frame(rng, rng.randrange(1, 60))
        got = sel.process(frame)
        sel._numpy = None
        want = sel.process(frame)
        assert got.columns == want.columns, str(p)
        assert got.equals(want, null_equal=True), str(p)
        used += got.height
    assert used  # some rows pass


def test_other_shapes_keep_the_expressions() -> None:
    unbounded = Binary("<", Col("g", INT), Lit(3, INT))
    assert Selection("s", unbounded, {"v"}, conservative=True)._numpy is None  # no interval in it
    assert Selection("s", Binary("<", Col("v", FLOAT), Lit(None, INT)), {"v"}, conservative=True)._numpy is None
    mixed = Binary("and", Binary("<", Col("v", FLOAT), Lit(1.5, FLOAT)), unbounded)
    assert Selection("s", mixed, {"v"}, conservative=True)._numpy is None  # a part without an interval
    rounded = Binary("<", Col("v", FLOAT), Lit(Decimal("1.5"), FLOAT))
    assert Selection("s", rounded, {"v"}, conservative=True)._numpy is None  # a DECIMAL constant: polars casts it

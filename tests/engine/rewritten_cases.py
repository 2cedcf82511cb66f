"""Random cases for the SQL the front end rewrites into the paper's operators (docs/SQL.md): set operations over two
generated blocks (UNION ALL, UNION, INTERSECT, EXCEPT) and outer joins of two tables (LEFT, RIGHT, FULL), with the
tables, partitions and change batches drawn as for every other case (``generators.cases``); and rankings filtered by a
constant (top-k per group) over a generated block; and generated aggregations grouped by ROLLUP, CUBE or GROUPING
SETS."""

from __future__ import annotations

from hypothesis import strategies as st

from tests.engine.generators import (
    EXTREME,
    SUBQUERY_KINDS,
    TABLES,
    Block,
    Case,
    blocks,
    col,
    duck_judges,
    gen_pred,
    op_strategy,
    partitions_strategy,
    rows_strategy,
)

SET_OPERATIONS = ("UNION ALL", "UNION", "INTERSECT", "EXCEPT")


def _case(draw: st.DrawFn, sql: str, duck_sql: str, tables: list[str], duck: bool) -> Case:
    tables = sorted(set(tables))
    initial = {t: draw(rows_strategy(t, 30)) for t in tables}
    parts = draw(partitions_strategy(tables))
    batches = draw(st.lists(st.lists(op_strategy(tables), min_size=1, max_size=3), min_size=1, max_size=4))
    case = Case(None, sql, initial, parts, batches, draw(st.booleans()), draw(st.booleans()),
                draw(st.lists(st.booleans(), min_size=len(batches), max_size=len(batches))), duck=duck)
    case.duck_sql = duck_sql
    return case


@st.composite
def set_operation_cases(draw: st.DrawFn) -> Case:
    """``A op B``: two select-project-join blocks, B's select list redrawn to A's kinds from B's own columns."""
    a: Block = draw(blocks("spj", max_tables=2))
    b: Block = draw(blocks("spj", max_tables=2))
    cols_b = [c for s in b.sources for c in s.columns()]
    items = []
    for x in a.items:
        same = [c for c in cols_b if c.kind == x.kind and c.special == x.special]
        items.append(draw(st.sampled_from(same)) if same else x)
    if any(x in a.items and x not in cols_b for x in items):
        b = a  # B has no column of some kind A selects: a self-operation
    else:
        b.items = items
    op = draw(st.sampled_from(SET_OPERATIONS))
    return _case(draw, f"{a.sql()} {op} {b.sql()}", f"{a.sql(duck=True)} {op} {b.sql(duck=True)}",
                 a.tables() + b.tables(), duck_judges(a) and duck_judges(b))


@st.composite
def outer_join_cases(draw: st.DrawFn) -> Case:
    """``SELECT ... FROM t1 AS a1 {LEFT|RIGHT|FULL} JOIN t2 AS b1 ON a1.x = b1.y [AND p(padded side)] [WHERE q]``,
    or counts per preserved key over it (TPC-H Q13's shape)."""
    plain = sorted(t for t in TABLES if t not in EXTREME)  # tables DuckDB reads as Spark does
    ta, tb = draw(st.sampled_from(plain)), draw(st.sampled_from(plain))
    keys = [(i, j) for i, ca in enumerate(TABLES[ta]) for j, cb in enumerate(TABLES[tb])
            if ca.kind in SUBQUERY_KINDS and ca.arrow == cb.arrow and ca.kind == cb.kind]
    if not keys:  # no key of one type: join the table with itself
        tb = ta
        keys = [(i, i) for i, c in enumerate(TABLES[ta]) if c.kind in SUBQUERY_KINDS]
    left = [col(f"a1.{c.name}", c.kind, c.exact, c.special) for c in TABLES[ta]]
    right = [col(f"b1.{c.name}", c.kind, c.exact, c.special) for c in TABLES[tb]]
    i, j = draw(st.sampled_from(keys))
    x, y = left[i], right[j]
    side = draw(st.sampled_from(["LEFT", "RIGHT", "FULL"]))
    on = f"{x.sql()} = {y.sql()}"
    padded = {"LEFT": right, "RIGHT": left}.get(side)
    if padded is not None and draw(st.booleans()):
        on += f" AND {gen_pred(draw, padded, 1).sql()}"
    source = f"{ta} AS a1 {side} JOIN {tb} AS b1 ON {on}"
    where = f" WHERE {gen_pred(draw, left + right, 1).sql()}" if draw(st.integers(0, 2)) == 0 else ""
    if draw(st.booleans()):
        keep = draw(st.lists(st.sampled_from(left + right), min_size=1, max_size=3, unique_by=lambda c: c.fmt))
        sql = f"SELECT {', '.join(f'{c.sql()} AS c{i}' for i, c in enumerate(keep))} FROM {source}{where}"
    else:
        counted = draw(st.sampled_from(right if side == "LEFT" else left))
        key = x if side != "RIGHT" else y
        sql = (f"SELECT {key.sql()} AS c0, COUNT({counted.sql()}) AS c1 FROM {source}{where} "
               f"GROUP BY {key.sql()}")
    return _case(draw, sql, sql, [ta, tb], True)


RANKINGS = ("ROW_NUMBER", "RANK", "DENSE_RANK")


@st.composite
def ranking_cases(draw: st.DrawFn) -> Case:
    """``SELECT * FROM (SELECT q.*, FN() OVER ([PARTITION BY q.cP] ORDER BY q.cO [DESC], ...) AS rk FROM (A) q) r
    WHERE rk <= k [AND rk > 1]``, or counts per rank over it: a ranking of a random block (top-k per group).
    ROW_NUMBER orders by every column (ties are then copies of one row), so its numbering is Spark's and DuckDB's."""
    a: Block = draw(blocks(draw(st.sampled_from(["spj", "agg"])), max_tables=2))
    names = [f"q.c{i}" for i in range(len(a.items))]
    exact = [n for n, x in zip(names, a.items) if x.kind != "float"]  # floats rank -0.0 and NaN per engine
    fn = draw(st.sampled_from(RANKINGS if len(exact) == len(names) else RANKINGS[1:]))
    part = draw(st.lists(st.sampled_from(exact), max_size=1)) if exact else []
    by = draw(st.permutations(names)) if fn == "ROW_NUMBER" else draw(st.lists(st.sampled_from(names), min_size=1,
                                                                               max_size=2, unique=True))
    order = ", ".join(f"{c}{draw(st.sampled_from(['', ' DESC']))}" for c in by)
    over = (f"PARTITION BY {', '.join(part)} " if part else "") + f"ORDER BY {order}"
    k = draw(st.integers(0, 3))
    inner = "SELECT q.*, {fn}() OVER ({over}) AS rk FROM ({a}) AS q"
    where = f"r.rk <= {k}" + (" AND r.rk > 1" if draw(st.integers(0, 3)) == 0 else "")
    outer = draw(st.sampled_from(["SELECT * FROM ({inner}) AS r WHERE {where}",
                                  "SELECT r.rk, COUNT(*) AS n FROM ({inner}) AS r WHERE {where} GROUP BY r.rk"]))

    def text(duck: bool) -> str:
        return outer.format(inner=inner.format(fn=fn, over=over, a=a.sql(duck=duck)), where=where)

    return _case(draw, text(False), text(True), a.tables(), duck_judges(a))


@st.composite
def grouping_set_cases(draw: st.DrawFn) -> Case:
    """A generated aggregation grouped by ``ROLLUP(keys)``, ``CUBE(keys)`` or ``GROUPING SETS (...)`` of its keys.
    DuckDB is told ``HAVING ... AND COUNT(*) > 0``: over no rows Spark outputs no row for any set, DuckDB one for the
    empty set."""
    a: Block = draw(blocks("agg", max_tables=2).filter(lambda b: bool(b.keys)))
    keys = a.keys or []  # (an ORDER BY ... LIMIT of the block is left out)
    kind = draw(st.sampled_from(["ROLLUP", "CUBE", "SETS"]))
    if kind == "SETS":
        sets = draw(st.lists(st.lists(st.integers(0, len(keys) - 1), unique=True, max_size=len(keys)), min_size=1,
                             max_size=3))

    def text(duck: bool) -> str:
        ks = [k.sql(duck=duck) for k in keys]
        grouping = f"{kind}({', '.join(ks)})" if kind != "SETS" else \
            "GROUPING SETS (" + ", ".join("(" + ", ".join(ks[i] for i in sorted(x)) + ")" for x in sets) + ")"
        items = ", ".join(f"{x.sql(duck=duck)} AS c{i}" for i, x in enumerate(a.items))
        having = [a.having.sql(duck=duck)] if a.having is not None else []
        if duck:
            having.append("COUNT(*) > 0")
        return (f"SELECT {'DISTINCT ' if a.distinct else ''}{items} FROM {a.from_sql(duck)}{a.where_sql(duck)} "
                f"GROUP BY {grouping}" + (f" HAVING {' AND '.join(having)}" if having else ""))

    return _case(draw, text(False), text(True), a.tables(), duck_judges(a))


__all__ = ["grouping_set_cases", "outer_join_cases", "ranking_cases", "set_operation_cases"]

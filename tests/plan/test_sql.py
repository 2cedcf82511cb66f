"""Tests of the SQL front-end (``imp_core.plan.sql``) and query templates (``imp_core.plan.template``).

Most cases live in fixture files, ``tests/plan/fixtures/*.sql``, one case per block (sqlglot's fixture style):

* blocks are separated by blank lines; a block without SQL (only ``--`` comment lines) is a comment;
* a block starts with optional ``-- title`` comment lines (the first one names the test), then the SQL;
* ``-- dialect: postgres`` (optional, anywhere before the expectation) parses the SQL in that dialect;
* ``-- output: a, b`` (optional, before the expectation) checks ``Query.output_names``;
* then exactly one expectation:
  ``-- expect:`` followed by the lines of ``explain(plan)``, verbatim, up to the end of the block; or
  ``-- error: ErrorClass: fragment``, the class of the error raised and a fragment of its message (one line;
  the message must contain the fragment).

All tables the fixtures use are defined in ``TABLES`` below. Nothing here needs Spark or Postgres.
"""

from __future__ import annotations

import datetime as dt
import decimal
import re
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
import sqlglot

from imp_core import errors
from imp_core.errors import PlanError, UnsupportedError
from imp_core.plan.expr import Binary, Col, Lit, conjuncts
from imp_core.plan.nodes import Aggregate, Join, Project, Scan, Select, TopK, explain
from imp_core.plan.sql import Query, parse_query, parse_statement
from imp_core.plan.template import template_key

FIXTURES = Path(__file__).parent / "fixtures"

I, F, S, D, TS, B = pa.int64(), pa.float64(), pa.string(), pa.date32(), pa.timestamp("us"), pa.bool_()  # noqa: E741
MONEY = pa.decimal128(15, 2)


def _ints(*names: str) -> pa.Schema:
    return pa.schema([(n, I) for n in names])


# The tables of the paper's running example, its Appendix A (synthetic, crimes), TPC-H, and a few for edge cases.
TABLES: dict[str, pa.Schema] = {
    "sales": pa.schema([("id", I), ("brand", S), ("price", I), ("numSold", I)]),
    **{t: _ints(*"abcdefghij") for t in ("r500", "t1gb50g", "t1gb1000g", "t1gb5000g", "t1gb500000g", "t1gbjoin",
                                         "edb1", "R")},
    **{t: pa.schema([("ttid", I), ("info", S)]) for t in ("tjoinhelp", "tjoinhelppercent1", "tjoinhelppercent5",
                                                          "tjoinhelppercent10")},
    "crimes": pa.schema([("id", I), ("beat", I), ("year", I), ("district", I), ("community_area", I), ("ward", I),
                         ("primary_type", S)]),
    "customer": pa.schema([("c_custkey", I), ("c_name", S), ("c_address", S), ("c_nationkey", I), ("c_phone", S),
                           ("c_acctbal", MONEY), ("c_mktsegment", S), ("c_comment", S)]),
    "orders": pa.schema([("o_orderkey", I), ("o_custkey", I), ("o_orderstatus", S), ("o_totalprice", MONEY),
                         ("o_orderdate", D), ("o_orderpriority", S), ("o_clerk", S), ("o_shippriority", I),
                         ("o_comment", S)]),
    "lineitem": pa.schema([("l_orderkey", I), ("l_partkey", I), ("l_suppkey", I), ("l_linenumber", I),
                           ("l_quantity", MONEY), ("l_extendedprice", MONEY), ("l_discount", MONEY), ("l_tax", MONEY),
                           ("l_returnflag", S), ("l_linestatus", S), ("l_shipdate", D), ("l_commitdate", D),
                           ("l_receiptdate", D), ("l_shipinstruct", S), ("l_shipmode", S), ("l_comment", S)]),
    "nation": pa.schema([("n_nationkey", I), ("n_name", S), ("n_regionkey", I), ("n_comment", S)]),
    "region": pa.schema([("r_regionkey", I), ("r_name", S), ("r_comment", S)]),
    "supplier": pa.schema([("s_suppkey", I), ("s_name", S), ("s_address", S), ("s_nationkey", I), ("s_phone", S),
                           ("s_acctbal", MONEY), ("s_comment", S)]),
    "events": pa.schema([("id", I), ("ts", TS), ("day", D), ("name", S), ("score", F), ("ok", B),
                         ("amount", pa.decimal128(10, 2))]),
    "Mixed": pa.schema([("ID", I), ("CamelCase", S)]),
}


@dataclass(frozen=True)
class Case:
    file: str
    line: int
    title: str
    sql: str
    dialect: str
    output: tuple[str, ...] | None
    expect: str | None
    error: tuple[str, str] | None

    @property
    def id(self) -> str:
        return f"{self.file}:{self.line}:{self.title}"


def load_cases(path: Path) -> list[Case]:
    """Read one fixture file (format in the module docstring)."""
    cases: list[Case] = []
    block: list[tuple[int, str]] = []
    lines = path.read_text().splitlines()
    for number, line in enumerate(lines + [""], start=1):
        if line.strip():
            block.append((number, line))
            continue
        if block:
            case = _parse_block(path.name, block)
            if case is not None:
                cases.append(case)
            block = []
    return cases


def _parse_block(file: str, block: list[tuple[int, str]]) -> Case | None:
    titles: list[str] = []
    sql: list[str] = []
    plan: list[str] | None = None
    dialect, output, error = "spark", None, None
    for _, line in block:
        stripped = line.strip()
        if plan is not None:
            plan.append(line)
        elif stripped.startswith("-- expect:"):
            plan = []
        elif stripped.startswith("-- error:"):
            cls, _, fragment = stripped.removeprefix("-- error:").strip().partition(":")
            error = (cls.strip(), fragment.strip())
        elif stripped.startswith("-- dialect:"):
            dialect = stripped.removeprefix("-- dialect:").strip()
        elif stripped.startswith("-- output:"):
            output = tuple(n.strip() for n in stripped.removeprefix("-- output:").split(","))
        elif stripped.startswith("--") and not sql:
            titles.append(stripped.removeprefix("--").strip())
        else:
            sql.append(line)
    if not sql:
        return None  # a comment block
    start = block[0][0]
    if (plan is None) == (error is None):
        raise AssertionError(f"{file}:{start}: a case needs exactly one of `-- expect:` and `-- error:`")
    title = titles[0] if titles else " ".join(" ".join(sql).split())[:40]
    return Case(file, start, title, "\n".join(sql), dialect, output, "\n".join(plan) if plan is not None else None,
                error)


CASES = [c for path in sorted(FIXTURES.glob("*.sql")) for c in load_cases(path)]


def test_fixture_files_are_found() -> None:
    assert len(CASES) > 100
    assert {c.file for c in CASES} >= {"paper.sql", "tpch.sql", "expressions.sql", "structure.sql",
                                        "rejected.sql", "names.sql"}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_fixture(case: Case) -> None:
    if case.error is not None:
        cls_name, fragment = case.error
        cls = getattr(errors, cls_name)
        with pytest.raises(PlanError) as info:
            parse_query(case.sql, TABLES, dialect=case.dialect)
        assert type(info.value) is cls, f"expected {cls_name}, got {type(info.value).__name__}: {info.value}"
        message = str(info.value)
        assert fragment in message, message
        assert "\n" not in message  # one line, for the CLI
        place = re.search(r"at line (\d+), column (\d+)", message)
        if place is not None:  # the position the message names is also in the error's fields
            assert (info.value.line, info.value.column) == (int(place[1]), int(place[2])), message
        return
    query = parse_query(case.sql, TABLES, dialect=case.dialect)
    assert explain(query.plan) == case.expect
    assert query.plan.names == query.output_names
    assert query.sql == case.sql
    if case.output is not None:
        assert query.output_names == case.output


# --- properties every plan must have --------------------------------------------------------------------------

PLANS = [c for c in CASES if c.expect is not None]


def _sides(join: Join) -> tuple[set[str], set[str]]:
    return set(join.left.names), set(join.right.names)


@pytest.mark.parametrize("case", PLANS, ids=lambda c: c.id)
def test_predicates_are_pushed_down(case: Case) -> None:
    """No conjunct above a join could have been a join condition or a filter below it."""
    plan = parse_query(case.sql, TABLES, dialect=case.dialect).plan
    for node in plan.walk():
        if isinstance(node, Select) and isinstance(node.child, Join):
            for c in conjuncts(node.predicate):
                assert not c.columns(), f"{c} should be below the join"
        if isinstance(node, Join):
            left, right = _sides(node)
            for c in conjuncts(node.condition):
                cols = c.columns()
                assert cols & left and cols & right, f"{c} in {explain(node)} should be pushed into one side"
        if isinstance(node, Select) and isinstance(node.child, Scan):
            assert node.predicate.columns() <= set(node.child.names)


@pytest.mark.parametrize("case", PLANS, ids=lambda c: c.id)
def test_from_items_expose_alias_dot_column(case: Case) -> None:
    plan = parse_query(case.sql, TABLES, dialect=case.dialect).plan
    for node in plan.walk():
        if isinstance(node, Scan):
            assert node.names == tuple(f"{node.alias}.{f.name}" for f in TABLES[node.table])
        if isinstance(node, Join):
            for side in (node.left, node.right):
                assert all("." in n for n in side.names), side.names
        if isinstance(node, TopK):
            assert all(isinstance(k.expr, Col) for k in node.order)


# --- API details ----------------------------------------------------------------------------------------------


def test_query_is_a_frozen_value() -> None:
    q = parse_query("SELECT brand FROM sales", TABLES)
    assert isinstance(q, Query)
    with pytest.raises(AttributeError):
        q.sql = "x"  # type: ignore[misc]
    assert q == parse_query("SELECT brand FROM sales", TABLES)


def test_stored_spelling_is_kept_and_identifiers_fold() -> None:
    q = parse_query("SELECT numsold, m.camelcase, SALES.ID FROM SALES, mixed m WHERE sales.ID = M.id AND NUMSOLD > 1",
                    TABLES)
    assert q.output_names == ("numSold", "CamelCase", "id")
    assert q.plan.tables() == {"sales", "Mixed"}
    join = next(n for n in q.plan.walk() if isinstance(n, Join))
    assert join.condition == Binary("=", Col("sales.id", I), Col("m.ID", I))


def test_literal_types() -> None:
    q = parse_query("SELECT price FROM sales WHERE price * 0.05 > 1 AND price < 1e3 AND brand = 'x' AND NOT FALSE",
                    TABLES)
    selects = [n for n in q.plan.walk() if isinstance(n, Select)]
    assert explain(selects[0]).startswith("Select (NOT FALSE)\n  Select")  # the constant conjunct is on top
    lits = [e for e in selects[1].predicate.walk() if isinstance(e, Lit)]
    assert [type(x.value) for x in lits] == [decimal.Decimal, int, float, str]
    assert lits[0].value == decimal.Decimal("0.05") and lits[0].dtype == pa.decimal128(2, 2)  # Spark's literal type
    assert lits[1].dtype == pa.int32()  # an integer constant that fits is an INT, as in Spark


def test_date_literals_are_constants() -> None:
    q = parse_query("SELECT o_orderkey FROM orders WHERE o_orderdate >= DATE '1994-01-01' "
                    "AND o_orderdate < DATE '1994-01-01' + INTERVAL '3' MONTH AND o_orderdate <> '1994-02-01'",
                    TABLES)
    select = next(n for n in q.plan.walk() if isinstance(n, Select))
    values = [c.right.value for c in conjuncts(select.predicate) if isinstance(c, Binary)]
    assert values == [dt.date(1994, 1, 1), dt.date(1994, 4, 1), dt.date(1994, 2, 1)]


def test_parse_error_is_one_line_plan_error() -> None:
    with pytest.raises(PlanError) as info:
        parse_query("SELECT brand\nFROM sales\nWHERE (price > 3", TABLES)
    assert type(info.value) is PlanError
    assert "cannot parse" in str(info.value) and "line 3" in str(info.value)
    assert "\n" not in str(info.value) and "\x1b" not in str(info.value)


def test_errors_carry_line_column_and_snippet_as_fields() -> None:
    with pytest.raises(PlanError) as info:
        parse_query("SELECT brand\nFROM sales\nWHERE upper(brand) = 'X' AND price > 'abc' + 1", TABLES)
    assert (info.value.line, info.value.column, info.value.snippet) == (3, 38, "'abc' + 1")
    with pytest.raises(UnsupportedError) as unsupported:
        parse_query("SELECT brand FROM sales s\n  LEFT JOIN tjoinhelp t ON s.id < t.ttid", TABLES)
    assert (unsupported.value.line, unsupported.value.column) == (2, 3)
    with pytest.raises(PlanError) as syntax:
        parse_query("SELECT brand\nFROM sales\nWHERE (price > 3", TABLES)
    assert (syntax.value.line, syntax.value.column) == (3, 16)
    with pytest.raises(PlanError) as nowhere:
        parse_query("SELECT brand FROM sales", TABLES, dialect="klingon")
    assert (nowhere.value.line, nowhere.value.column, nowhere.value.snippet) == (None, None, None)


def test_unknown_dialect() -> None:
    with pytest.raises(PlanError, match="unknown SQL dialect"):
        parse_query("SELECT brand FROM sales", TABLES, dialect="klingon")


def test_errors_wrap_their_cause_and_keep_position() -> None:
    with pytest.raises(PlanError) as info:
        parse_query("SELECT brand\n  FROM sales\n WHERE price > 'x' + 1", TABLES)
    assert "line 3" in str(info.value)


def test_aggregate_outputs_and_having_shape() -> None:
    q = parse_query("SELECT brand, SUM(price * numSold) AS rev FROM sales GROUP BY brand "
                    "HAVING SUM(price * numSold) > 5000", TABLES)
    project = q.plan
    assert isinstance(project, Project)
    having = project.child
    assert isinstance(having, Select)
    agg = having.child
    assert isinstance(agg, Aggregate)
    assert agg.names == ("brand", "rev")
    assert having.predicate == Binary(">", Col("rev", agg.schema[1].dtype), Lit.of(5000))


def test_a_parsed_statement_is_used_and_left_unchanged() -> None:
    sql = "SELECT Brand, SUM(price) AS s FROM sales WHERE price > 3 AND \"brand\" = 'x' GROUP BY brand"
    statement = parse_statement(sql)
    before = statement.sql(dialect="spark")
    assert parse_query(sql, TABLES, statement=statement) == parse_query(sql, TABLES)
    assert template_key(sql, statement=statement) == template_key(sql)
    assert statement.sql(dialect="spark") == before  # template_key normalized a copy
    # the statement is what is translated: a different tree under the same text gives its plan
    other = parse_statement("SELECT price FROM sales")
    assert parse_query(sql, TABLES, statement=other).output_names == ("price",)

# --- output names agree with a real engine --------------------------------------------------------------------

NAME_QUERIES = [
    "SELECT brand, SUM(price * numSold) AS rev FROM sales GROUP BY brand HAVING SUM(price * numSold) > 5000",
    "SELECT s.brand, s.price AS p, numSold FROM sales s WHERE s.price > 3",
    "SELECT a, avg(b) AS ab FROM (SELECT a AS a, b AS b, c AS c FROM t1gb50g WHERE b < 10) tt "
    "JOIN tjoinhelp ON (a = ttid) GROUP BY a HAVING avg(c) < 10",
    "SELECT c_custkey, c_name, sum(l_extendedprice * (1 - l_discount)) AS revenue, c_acctbal, n_name "
    "FROM customer, orders, lineitem, nation WHERE c_custkey = o_custkey AND l_orderkey = o_orderkey "
    "AND c_nationkey = n_nationkey GROUP BY c_custkey, c_name, c_acctbal, n_name ORDER BY revenue LIMIT 20",
    "SELECT * FROM nation n, region r WHERE n.n_regionkey = r.r_regionkey",
]


@pytest.mark.parametrize("sql", NAME_QUERIES)
def test_output_names_match_duckdb(sql: str) -> None:
    query = parse_query(sql, TABLES)
    con = duckdb.connect()
    try:
        for name in query.plan.tables():
            con.register(name, TABLES[name].empty_table())
        result = con.execute(sqlglot.transpile(sql, read="spark", write="duckdb")[0])
        assert tuple(d[0] for d in result.description) == query.output_names
    finally:
        con.close()


def test_sort_keys_keep_only_non_default_null_order() -> None:
    def keys(sql: str, dialect: str = "spark") -> list[tuple[bool, bool | None]]:
        plan = parse_query(sql, TABLES, dialect=dialect).plan
        topk = next(n for n in plan.walk() if isinstance(n, TopK))
        return [(k.descending, k.nulls_first) for k in topk.order]

    # Spark's default (NULLs are the smallest values) is left implicit
    assert keys("SELECT brand, price FROM sales ORDER BY brand, price DESC LIMIT 1") == [(False, None), (True, None)]
    assert keys("SELECT brand, price FROM sales ORDER BY brand NULLS LAST, price DESC NULLS FIRST LIMIT 1") == \
        [(False, False), (True, True)]
    # Postgres sorts NULLs as the largest values: the plan spells that out
    assert keys("SELECT brand, price FROM sales ORDER BY brand, price DESC LIMIT 1", "postgres") == \
        [(False, False), (True, True)]


def test_unknown_table_lists_registered_tables_and_ctes() -> None:
    with pytest.raises(PlanError) as info:
        parse_query("WITH c AS (SELECT brand FROM sales) SELECT * FROM c, nope", {"sales": TABLES["sales"]})
    assert "unknown table nope" in str(info.value)
    assert "registered tables: sales; CTEs in scope: c" in str(info.value)


def test_unknown_column_lists_available_columns() -> None:
    with pytest.raises(PlanError) as info:
        parse_query("SELECT brnd FROM sales s", TABLES)
    assert "column brnd does not exist in sales AS s" in str(info.value)
    assert "available: s.id, s.brand, s.price, s.numSold" in str(info.value)


def test_plan_errors_from_the_ir_get_a_position() -> None:
    with pytest.raises(PlanError) as info:
        parse_query("SELECT brand\nFROM sales\nWHERE upper(brand) = 'X' AND price > 'abc' + 1", TABLES)
    assert "line 3, column 38" in str(info.value) and "'abc' + 1" in str(info.value)


def test_a_cte_body_is_planned_once_per_reference_without_leaking_later_ctes() -> None:
    # `b` may use `a`, but `a` must not see `b` (no recursion), and inside `a` the name `sales` is the table
    with pytest.raises(PlanError, match="unknown table b"):
        parse_query("WITH a AS (SELECT * FROM b), b AS (SELECT brand FROM sales) SELECT * FROM a", TABLES)

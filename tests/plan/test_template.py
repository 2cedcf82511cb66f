"""Template keys (imp_core.plan.template): which constants a key replaces, their values, and the key's dialect."""

from __future__ import annotations

import datetime as dt
import decimal

import pytest

from imp_core.errors import PlanError, UnsupportedError
from imp_core.plan.template import template_key


def test_template_key_replaces_where_and_having_constants() -> None:
    a = ("SELECT a, avg(b) AS ab FROM (SELECT a AS a, b AS b, c AS c FROM t1gb50g WHERE b < 10) tt "
         "JOIN tjoinhelp ON (a = ttid) GROUP BY a HAVING avg(c) < 10")
    b = ("select A, AVG(b) as ab\nfrom (select a as a, b as b, c as c from T1GB50G where b < 1000) tt "
         "join tjoinhelp on (a = ttid) group by a having avg(c) < -5.5")
    key_a, consts_a = template_key(a)
    key_b, consts_b = template_key(b)
    assert key_a == key_b
    assert key_a == ("SELECT a, AVG(b) AS ab FROM (SELECT a AS a, b AS b, c AS c FROM t1gb50g WHERE b < ?) AS tt "
                     "JOIN tjoinhelp ON (a = ttid) GROUP BY a HAVING AVG(c) < ?")
    assert consts_a == (10, 10)
    assert consts_b == (1000, decimal.Decimal("-5.5"))


def test_template_key_keeps_select_on_and_limit_constants() -> None:
    key, consts = template_key("SELECT price * 2 AS p FROM sales s JOIN tjoinhelp t ON s.id = t.ttid + 1 "
                               "WHERE brand = 'x' ORDER BY p LIMIT 10")
    assert key == ("SELECT price * 2 AS p FROM sales AS s JOIN tjoinhelp AS t ON s.id = t.ttid + 1 "
                   "WHERE brand = ? ORDER BY p LIMIT 10")
    assert consts == ("x",)
    other, _ = template_key("SELECT price * 3 AS p FROM sales s JOIN tjoinhelp t ON s.id = t.ttid + 1 "
                            "WHERE brand = 'y' ORDER BY p LIMIT 10")
    assert other != key
    limit, _ = template_key("SELECT price * 2 AS p FROM sales s JOIN tjoinhelp t ON s.id = t.ttid + 1 "
                            "WHERE brand = 'x' ORDER BY p LIMIT 20")
    assert limit != key


def test_template_key_typed_constants() -> None:
    key, consts = template_key("SELECT o_orderkey FROM orders WHERE o_orderdate >= DATE '1994-01-01' "
                               "AND o_orderdate < DATE '1994-01-01' + INTERVAL '3' MONTH "
                               "AND o_totalprice BETWEEN 0.05 AND 1e3 AND o_orderstatus IN ('F', 'O') "
                               "AND o_shippriority > -1")
    assert key == ("SELECT o_orderkey FROM orders WHERE o_orderdate >= ? AND o_orderdate < ? + INTERVAL (?) MONTH "
                   "AND o_totalprice BETWEEN ? AND ? AND o_orderstatus IN (?, ?) AND o_shippriority > ?")
    assert consts == (dt.date(1994, 1, 1), dt.date(1994, 1, 1), 3, decimal.Decimal("0.05"), 1000.0, "F", "O", -1)


def test_template_key_placeholder_is_a_question_mark_in_every_dialect() -> None:
    key, consts = template_key('SELECT "brand" FROM Sales WHERE price > 3', dialect="postgres")
    assert key == "SELECT brand FROM sales WHERE price > ?"
    assert consts == (3,)


def test_template_key_of_paper_queries_differ_by_shape() -> None:
    one, _ = template_key("SELECT a, avg(b) AS ab FROM r500 GROUP BY a HAVING avg(c) < 1000")
    two, _ = template_key("SELECT a, avg(b) AS ab FROM r500 GROUP BY a HAVING avg(c) < 1000 and avg(d) < 1200")
    assert one != two


def test_template_key_errors() -> None:
    with pytest.raises(PlanError, match="cannot parse"):
        template_key("SELECT FROM WHERE")
    with pytest.raises(UnsupportedError, match="only SELECT"):
        template_key("DELETE FROM sales WHERE price > 3")

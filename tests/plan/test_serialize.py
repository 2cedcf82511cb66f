"""The plan IR as JSON (``imp_core/plan/serialize.py``): every fixture query's plan survives the catalog's JSON."""

from __future__ import annotations

import json

import pytest

from imp_core.errors import PlanError
from imp_core.plan.expr import Binary, Col
from imp_core.plan.nodes import AntiJoin
from imp_core.plan.serialize import FORMAT, FORMAT_VERSION, plan_from_json, plan_to_json
from imp_core.plan.sql import parse_query
from tests.plan.test_sql import CASES, TABLES

PLANNED = [c for c in CASES if c.error is None]


@pytest.mark.parametrize("case", PLANNED, ids=lambda c: c.id)
def test_every_fixture_plan_round_trips_through_json(case) -> None:  # noqa: ANN001
    plan = parse_query(case.sql, TABLES, dialect=case.dialect).plan
    back = plan_from_json(json.loads(json.dumps(plan_to_json(plan))))
    assert back == plan and repr(back) == repr(plan)


def test_float_constants_keep_their_bits() -> None:
    plan = parse_query("SELECT id FROM sales WHERE price > 1e-1 AND price < 1.7976931348623157e308", TABLES).plan
    text = json.dumps(plan_to_json(plan))
    assert '{"float": "0.1"}' in text and '{"float": "1.7976931348623157e+308"}' in text
    assert plan_from_json(json.loads(text)) == plan


@pytest.mark.parametrize("doc, message", [
    ({"format": "other"}, "not an imp plan document"),
    ({"format": FORMAT, "version": FORMAT_VERSION + 1, "plan": None}, "format version"),
    ({"format": FORMAT, "version": FORMAT_VERSION, "plan": {"@": "Teleport"}}, "'Teleport' this imp does not know"),
    ({"format": FORMAT, "version": FORMAT_VERSION, "plan": {"float": "x"}}, "unreadable float"),
    ({"format": FORMAT, "version": FORMAT_VERSION, "plan": {"@": "Scan", "nope": 1}}, "does not fit this imp"),
    ({"format": FORMAT, "version": FORMAT_VERSION, "plan": 3}, "not a plan node"),
])
def test_a_bad_document_is_a_plan_error(doc: dict, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        plan_from_json(doc)


def test_distinct_is_stored_only_where_it_is_set() -> None:
    plain = parse_query("SELECT brand, count(price) AS n FROM sales GROUP BY brand", TABLES).plan
    distinct = parse_query("SELECT brand, count(DISTINCT price) AS n FROM sales GROUP BY brand", TABLES).plan
    assert plain != distinct
    assert '"distinct"' not in json.dumps(plan_to_json(plain))  # documents of plans without DISTINCT as before
    text = json.dumps(plan_to_json(distinct))
    assert '"distinct": true' in text
    assert plan_from_json(json.loads(text)) == distinct


def test_an_anti_join_round_trips_with_its_null_semantics() -> None:
    outer = parse_query("SELECT id, price FROM sales", TABLES).plan
    inner = parse_query("SELECT numSold AS n FROM sales", TABLES).plan
    cond = Binary("=", Col("price", outer.field("price").dtype), Col("n", inner.field("n").dtype))
    for null_aware in (False, True):
        plan = AntiJoin(outer, inner, cond, null_aware)
        back = plan_from_json(json.loads(json.dumps(plan_to_json(plan))))
        assert back == plan and back.null_aware is null_aware and back.schema == outer.schema

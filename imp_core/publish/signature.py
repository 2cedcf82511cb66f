"""A query's plan signature, computed by imp's Spark extension (``imp.spark.ImpSketches.signature``, the same
encoder its optimizer rule matches with), and the constraint under which each literal slot may take another value.

The constraints come from the reuse rules (:mod:`imp_core.plan.reuse`), not from a second copy of them: Spark names
each literal's place in the SQL text, so a slot's literal is replaced there by a larger and by a smaller value,
and the reuse check decides whether the captured sketch serves the changed query. A slot the check lets grow is
``>=`` its value, one it lets shrink ``<=``; every other slot (a string, one whose place is unknown, one the check
refuses both ways) must equal its captured value.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import sqlglot

from imp_core.errors import ImpError
from imp_core.plan.columns import narrowed
from imp_core.plan.nodes import Plan
from imp_core.plan.reuse import can_reuse
from imp_core.plan.sql import parse_query
from imp_core.sources import storage
from imp_core.spark.connector import RESULT_SEMANTICS
from imp_core.spark.extension import API_CLASS

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

_EPOCH = dt.date(1970, 1, 1)
_EPOCH_TS = dt.datetime(1970, 1, 1)
_INTEGERS = ("tinyint", "smallint", "int", "bigint")


def spark_text(sql: str, dialect: str) -> str:
    """The query as Spark SQL (the text itself for Spark's dialect, so positions are the user's)."""
    return sql if dialect == "spark" else sqlglot.transpile(sql, read=dialect, write="spark")[0]


def api(spark: SparkSession) -> Any:
    """The extension's API object (``imp.spark.ImpSketches``) through the JVM gateway."""
    jvm = spark._jvm  # noqa: SLF001 - PySpark's Py4J gateway
    for part in API_CLASS.split("."):
        jvm = getattr(jvm, part)
    return jvm


def raw_signature(spark: SparkSession, sql: str, tables: Mapping[str, str]) -> dict[str, Any]:
    """The extension's signature of ``sql`` (Spark SQL) with each table name read as the Delta table at its path."""
    uris = {name: storage.spark_uri(path) for name, path in tables.items()}
    return json.loads(api(spark).signature(spark._jsparkSession, sql, uris, dict(RESULT_SEMANTICS)))  # noqa: SLF001 - Py4J


def plan_signature(spark: SparkSession, sql: str, dialect: str, tables: Mapping[str, str],
                   schemas: Mapping[str, pa.Schema], keep: Mapping[str, set[str]]) -> dict[str, Any]:
    """What the catalog records with a sketch: ``{"hash", "tree", "slots": [{slot, type, value, op}]}`` (``hash``
    None and ``unmatchable`` set when the plan holds something the extension never matches).

    Args:
        spark: A session that loads the extension (imp's own).
        sql, dialect: The sketch's query.
        tables: Table name -> path of every table the query reads.
        schemas: The tables' schemas (for the reuse check's plans).
        keep: Partitioned columns per table (the reuse check compares plans narrowed to them, as sketch use does).
    """
    text = spark_text(sql, dialect)
    raw = raw_signature(spark, text, tables)
    if raw.get("unmatchable"):
        return {"hash": None, "unmatchable": raw["unmatchable"], "tree": None, "slots": []}
    captured = narrowed(parse_query(text, dict(schemas), "spark").plan, keep)
    slots = [{"slot": s["slot"], "type": s["type"], "value": s.get("value"),
              "op": _op(text, s, captured, schemas, keep)} for s in raw["slots"]]
    return {"hash": raw["hash"], "tree": raw["tree"], "slots": slots}


def _op(text: str, slot: Mapping[str, Any], captured: Plan, schemas: Mapping[str, pa.Schema],
        keep: Mapping[str, set[str]]) -> str:
    start, stop = slot.get("start"), slot.get("stop")
    if start is None or stop is None or slot.get("value") is None:
        return "="
    changed = _perturbed(text[start:stop + 1], slot["type"], slot["value"])
    if changed is None:
        return "="
    for op, literal in zip((">=", "<="), changed):
        other = text[:start] + literal + text[stop + 1:]
        try:
            ok, _ = can_reuse(captured, narrowed(parse_query(other, dict(schemas), "spark").plan, keep))
        except ImpError:
            ok = False
        if ok:
            return op
    return "="


def _perturbed(literal: str, kind: str, value: str) -> tuple[str, str] | None:
    """The literal's text one step larger and one step smaller, when it is a number, date or timestamp literal holding
    ``value`` (None otherwise: that slot must keep its value)."""
    text = literal.strip()
    try:
        if kind in _INTEGERS:
            if int(text) != int(value):
                return None
            return str(int(text) + 1), str(int(text) - 1)
        if kind.startswith("decimal"):
            number = decimal.Decimal(text)
            if number != decimal.Decimal(value):
                return None
            step = decimal.Decimal(1).scaleb(number.as_tuple().exponent)  # type: ignore[arg-type]
            return format(number + step, "f"), format(number - step, "f")
        if kind == "date":
            body = text.split(None, 1)
            if len(body) != 2 or body[0].upper() != "DATE":
                return None
            day = dt.date.fromisoformat(body[1].strip().strip("'\""))
            if (day - _EPOCH).days != int(value):
                return None
            return f"DATE '{day + dt.timedelta(days=1)}'", f"DATE '{day - dt.timedelta(days=1)}'"
        if kind in ("timestamp", "timestamp_ntz"):
            return _perturbed_timestamp(text, value)
    except (ValueError, ArithmeticError, OverflowError):
        return None
    return None


def _perturbed_timestamp(text: str, value: str) -> tuple[str, str] | None:
    """A ``TIMESTAMP '...'`` literal one second later and earlier, when it holds ``value`` (microseconds since the
    epoch, in the sketches' UTC session zone; a literal with its own offset is left alone)."""
    body = text.split(None, 1)
    if len(body) != 2 or body[0].upper() not in ("TIMESTAMP", "TIMESTAMP_NTZ"):
        return None
    moment = dt.datetime.fromisoformat(body[1].strip().strip("'\""))
    if moment.tzinfo is not None:
        return None
    if (moment - _EPOCH_TS) // dt.timedelta(microseconds=1) != int(value):
        return None
    step = dt.timedelta(seconds=1)
    return (f"{body[0]} '{(moment + step).isoformat(sep=' ')}'", f"{body[0]} '{(moment - step).isoformat(sep=' ')}'")


__all__ = ["api", "plan_signature", "raw_signature", "spark_text"]

"""The plan IR as JSON: what the catalog stores with a sketch, so that loading it does not parse its SQL again.

Every plan node and expression class is written as ``{"@": class name, field: value, ...}`` with its constructor's
fields (a field marked ``omit_default`` only when it differs from its default, so that adding such a field leaves
the documents of plans without it as they were); reading calls the constructor, so a stored plan is validated and
typed again exactly as a parsed one. See
docs/ARCHITECTURE.md, "State and versions".
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import decimal
import re
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from imp_core.errors import PlanError
from imp_core.plan.expr import EXPR_NODES
from imp_core.plan.nodes import PLAN_NODES, Field, Plan, SortKey

FORMAT = "imp-plan"
FORMAT_VERSION = 1

# the classes a document may name: every plan node (``nodes.PLAN_NODES``) and expression (``EXPR_NODES``) class
_CLASSES: dict[str, type] = {c.__name__: c for c in (*PLAN_NODES, *EXPR_NODES, Field, SortKey)}
_DERIVED = frozenset({"schema"})  # plan fields the constructor computes from the others

_SIMPLE_TYPES = {str(t): t for t in (pa.null(), pa.bool_(), pa.int8(), pa.int16(), pa.int32(), pa.int64(),
                                     pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64(), pa.float16(), pa.float32(),
                                     pa.float64(), pa.string(), pa.large_string(), pa.binary(), pa.large_binary(),
                                     pa.date32(), pa.date64(), pa.month_day_nano_interval())}
_DECIMAL = re.compile(r"decimal(128|256)\((\d+), (-?\d+)\)")
_TIMESTAMP = re.compile(r"timestamp\[(s|ms|us|ns)(?:, tz=(.+))?\]")


def plan_to_json(plan: Plan) -> dict[str, Any]:
    """``plan`` as a JSON-able document (:func:`plan_from_json` reads it back equal, types included)."""
    return {"format": FORMAT, "version": FORMAT_VERSION, "plan": _encode(plan)}


def plan_from_json(doc: Any) -> Plan:
    """The plan :func:`plan_to_json` wrote, built (and so validated) by the node constructors.

    Raises:
        PlanError: ``doc`` is not a stored plan of this format version, names a class this imp does not have, or
            does not make a valid plan (the caller then parses the sketch's SQL instead).
    """
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise PlanError("the stored plan is not an imp plan document")
    if doc.get("version") != FORMAT_VERSION:
        raise PlanError(f"the stored plan has format version {doc.get('version')}; this imp reads version "
                        f"{FORMAT_VERSION}")
    plan = _decode(doc.get("plan"))
    if not isinstance(plan, Plan):
        raise PlanError(f"the stored plan's root is a {type(plan).__name__}, not a plan node")
    return plan


_SCALARS: tuple[tuple[type, str, Callable[[Any], str]], ...] = (
    (float, "float", repr),  # exact, and NaN, ±inf and -0.0 survive
    (decimal.Decimal, "decimal", str),
    (dt.datetime, "timestamp", dt.datetime.isoformat),  # before date: a datetime is a date
    (dt.date, "date", dt.date.isoformat),
)
"""Values stored as ``{tag: text}``: their class, tag and how they are written."""


def _encode(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    for kind, tag, write in _SCALARS:
        if isinstance(value, kind):
            return {tag: write(value)}
    if isinstance(value, pa.DataType):
        return _type_to_json(value)
    if isinstance(value, tuple):
        return [_encode(v) for v in value]
    name = type(value).__name__
    if _CLASSES.get(name) is type(value) and dataclasses.is_dataclass(value):
        out: dict[str, Any] = {"@": name}
        for f in dataclasses.fields(value):
            if f.init and f.name not in _DERIVED and not (f.metadata.get("omit_default") and
                                                           getattr(value, f.name) == f.default):
                out[f.name] = _encode(getattr(value, f.name))
        return out
    raise PlanError(f"cannot store a {name} in a plan")  # pragma: no cover - the IR holds only the values above


def _decode(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, list):
        return tuple(_decode(v) for v in value)
    if not isinstance(value, dict):
        raise PlanError(f"the stored plan holds an unexpected {type(value).__name__}")
    if "@" in value:
        return _decode_node(value)
    read = _READ.get(next(iter(value))) if len(value) == 1 else None
    if read is None:
        raise PlanError(f"the stored plan holds an unknown value {value!r}")
    [(tag, text)] = value.items()
    try:
        return read(text)
    except (ValueError, TypeError, KeyError, decimal.InvalidOperation, pa.ArrowInvalid) as e:
        raise PlanError(f"the stored plan holds an unreadable {tag} {text!r}") from e


def _decode_node(value: dict[str, Any]) -> Any:
    cls = _CLASSES.get(value["@"])
    if cls is None:
        raise PlanError(f"the stored plan has a node {value['@']!r} this imp does not know")
    try:
        return cls(**{k: _decode(v) for k, v in value.items() if k != "@"})
    except TypeError as e:
        raise PlanError(f"the stored plan's {value['@']} does not fit this imp: {e}") from e


def _type_to_json(t: pa.DataType) -> dict[str, str]:
    text = str(t)
    if text in _SIMPLE_TYPES or _DECIMAL.fullmatch(text) or _TIMESTAMP.fullmatch(text):
        return {"type": text}
    schema = pa.schema([pa.field("t", t)])  # any other Arrow type (a table column's struct, say), exactly
    return {"arrow_type": base64.b64encode(schema.serialize().to_pybytes()).decode()}


def _arrow_type(encoded: str) -> pa.DataType:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(encoded))).field("t").type


def _named_type(text: str) -> pa.DataType:
    if text in _SIMPLE_TYPES:
        return _SIMPLE_TYPES[text]
    if m := _DECIMAL.fullmatch(text):
        make = pa.decimal128 if m[1] == "128" else pa.decimal256
        return make(int(m[2]), int(m[3]))
    if m := _TIMESTAMP.fullmatch(text):
        return pa.timestamp(m[1], tz=m[2])
    raise ValueError(text)


_READ: dict[str, Callable[[str], Any]] = {
    "float": float, "decimal": decimal.Decimal, "timestamp": dt.datetime.fromisoformat,
    "date": dt.date.fromisoformat, "type": _named_type, "arrow_type": _arrow_type,
}
"""How each tag of a ``{tag: text}`` value is read back."""


__all__ = ["FORMAT", "FORMAT_VERSION", "PLAN_NODES", "plan_from_json", "plan_to_json"]

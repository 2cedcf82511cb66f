"""Scalar and aggregate expressions of the plan IR, typed with Spark's rules.

``types`` holds the typing rules on Arrow types, ``operators`` the expression base class, columns, constants and
operators, ``calls`` functions, EXTRACT and aggregates, ``rewrite`` rewrites of expressions, ``visitors`` the node
list every compiler must cover. See docs/ARCHITECTURE.md, "The plan IR".
"""

from imp_core.plan.expr.calls import EXTRACT_FIELDS, FUNCTIONS, AggCall, Extract, Func
from imp_core.plan.expr.operators import (
    Between,
    Binary,
    Case,
    Cast,
    Col,
    Expr,
    InList,
    Interval,
    IsNull,
    Like,
    Lit,
    Unary,
    arithmetic_types,
    comparison_type,
    literal_decimal,
    numeric_result,
)
from imp_core.plan.expr.rewrite import conjoin, conjuncts, rebuild, rename_columns, substitute
from imp_core.plan.expr.types import (
    AGG_FUNCS,
    ARITH_OPS,
    BOOL,
    BOOL_OPS,
    CMP_OPS,
    DATE,
    FLOAT,
    FLOAT32,
    INT,
    INT8,
    INT16,
    INT32,
    INTERVAL_UNITS,
    MAX_PRECISION,
    MIN_ADJUSTED_SCALE,
    NULL,
    SECOND_WITH_FRACTION,
    STRING,
    TIMESTAMP,
    as_decimal,
    cast_error,
    common_type,
    decimal_literal_type,
    decimal_result,
    decimal_type,
    int_literal_type,
    is_integral,
    is_numeric,
    is_string,
    is_temporal,
    kind_of_type,
    wider_decimal,
    wider_integral,
)
from imp_core.plan.expr.visitors import EXPR_NODES, require_visitors

__all__ = [
    "AGG_FUNCS", "ARITH_OPS", "BOOL", "BOOL_OPS", "CMP_OPS", "DATE", "EXPR_NODES", "EXTRACT_FIELDS", "FLOAT",
    "FLOAT32", "FUNCTIONS", "INT", "INT8", "INT16", "INT32", "INTERVAL_UNITS", "MAX_PRECISION", "MIN_ADJUSTED_SCALE",
    "NULL", "SECOND_WITH_FRACTION", "STRING", "TIMESTAMP", "AggCall", "Between", "Binary", "Case", "Cast", "Col",
    "Expr", "Extract", "Func", "InList", "Interval", "IsNull", "Like", "Lit", "Unary", "arithmetic_types",
    "as_decimal", "cast_error", "common_type", "comparison_type", "conjoin", "conjuncts", "decimal_literal_type",
    "decimal_result", "decimal_type", "int_literal_type", "is_integral", "is_numeric", "is_string", "is_temporal",
    "kind_of_type", "literal_decimal", "numeric_result", "rebuild", "rename_columns", "require_visitors",
    "substitute", "wider_decimal", "wider_integral",
]

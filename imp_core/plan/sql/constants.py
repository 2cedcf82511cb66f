"""The SQL front-end's tables: sqlglot node and type names -> IR functions, operators and types, clause names.

See docs/ARCHITECTURE.md, "The plan IR".
"""

from __future__ import annotations

from sqlglot import exp

from imp_core.plan.expr import FLOAT, FLOAT32, INT, INT8, INT16, INT32

# SQL type names -> IR types, with Spark's widths (INT is 32-bit, FLOAT/REAL 32-bit, DOUBLE 64-bit)
NUMBER_TYPES = {exp.DataType.Type.TINYINT: INT8, exp.DataType.Type.SMALLINT: INT16, exp.DataType.Type.INT: INT32,
                exp.DataType.Type.MEDIUMINT: INT32, exp.DataType.Type.BIGINT: INT,
                exp.DataType.Type.FLOAT: FLOAT32, exp.DataType.Type.DOUBLE: FLOAT}
STRING_TYPES = {exp.DataType.Type.TEXT, exp.DataType.Type.VARCHAR, exp.DataType.Type.CHAR,
                exp.DataType.Type.NVARCHAR, exp.DataType.Type.NCHAR}
TIMESTAMP_TYPES = {exp.DataType.Type.TIMESTAMP, exp.DataType.Type.TIMESTAMPTZ, exp.DataType.Type.TIMESTAMPLTZ,
                   exp.DataType.Type.TIMESTAMPNTZ, exp.DataType.Type.DATETIME}
# Dialects whose DECIMAL without precision means DECIMAL(10, 0) (Spark's default); elsewhere it is unconstrained.
SPARK_LIKE = {"spark", "spark2", "databricks", "hive"}

INTERVAL_UNITS = {"day": "day", "days": "day", "week": "week", "weeks": "week", "month": "month",
                  "months": "month", "year": "year", "years": "year", "hour": "hour", "hours": "hour",
                  "minute": "minute", "minutes": "minute", "second": "second", "seconds": "second"}

# EXTRACT(SECOND FROM ts) keeps the microseconds (a DECIMAL(8, 6) in Spark); the SECOND(ts) function does not
EXTRACT_FIELDS = {"year": "year", "years": "year", "yr": "year", "quarter": "quarter", "qtr": "quarter",
                  "month": "month", "months": "month", "mon": "month", "week": "week", "weeks": "week",
                  "weekofyear": "week", "day": "day", "days": "day", "dayofmonth": "day", "dayofweek": "dayofweek",
                  "dow": "dayofweek", "dayofyear": "dayofyear", "doy": "dayofyear", "hour": "hour",
                  "hours": "hour", "minute": "minute", "minutes": "minute", "second": "second_with_fraction",
                  "seconds": "second_with_fraction"}
EXTRACT_FUNCS: dict[type[exp.Expression], str] = {
    exp.Year: "year", exp.Quarter: "quarter", exp.Month: "month", exp.Day: "day", exp.DayOfMonth: "day",
    exp.WeekOfYear: "week", exp.DayOfWeek: "dayofweek", exp.DayOfYear: "dayofyear", exp.Hour: "hour",
    exp.Minute: "minute", exp.Second: "second",
}

# sqlglot function node -> (our function name, its argument keys in order; "*" is the `expressions` list)
FUNCS: dict[type[exp.Expression], tuple[str, tuple[str, ...]]] = {
    exp.Upper: ("upper", ("this",)),
    exp.Lower: ("lower", ("this",)),
    exp.Length: ("length", ("this",)),
    exp.Substring: ("substring", ("this", "start", "length")),
    exp.Coalesce: ("coalesce", ("this", "*")),
    exp.Abs: ("abs", ("this",)),
    exp.Round: ("round", ("this", "decimals")),
    exp.Floor: ("floor", ("this",)),
    exp.Ceil: ("ceil", ("this",)),
    exp.Greatest: ("greatest", ("this", "*")),
    exp.Least: ("least", ("this", "*")),
    exp.Nullif: ("nullif", ("this", "expression")),
    exp.Replace: ("replace", ("this", "expression", "replacement")),
    exp.Sqrt: ("sqrt", ("this",)),
    exp.Ln: ("ln", ("this",)),
    exp.Exp: ("exp", ("this",)),
    exp.Pow: ("power", ("this", "expression")),
    exp.Sign: ("sign", ("this",)),
}
# Flags sqlglot records while parsing that do not change the meaning of these functions for us.
IGNORED_FUNC_ARGS = {"safe", "ignore_nulls", "is_nvl", "is_null", "big_int", "zero_start"}
# Spellings that reach us as anonymous functions.
FUNC_ALIASES = {"ceiling": "ceil", "substr": "substring", "pow": "power", "signum": "sign",
                "char_length": "length", "character_length": "length"}

AGGS: dict[type[exp.Expression], str] = {exp.Sum: "sum", exp.Count: "count", exp.Avg: "avg", exp.Min: "min",
                                          exp.Max: "max"}

CMP: dict[type[exp.Expression], str] = {exp.EQ: "=", exp.NEQ: "<>", exp.LT: "<", exp.LTE: "<=", exp.GT: ">",
                                         exp.GTE: ">="}
ARITH: dict[type[exp.Expression], str] = {exp.Add: "+", exp.Sub: "-", exp.Mul: "*", exp.Div: "/", exp.Mod: "%"}

SELECT_CLAUSES = {"with_", "expressions", "hint", "distinct", "from_", "joins", "where", "group", "having",
                  "order", "limit", "offset"}
CLAUSE_NAMES = {"qualify": "QUALIFY", "laterals": "LATERAL VIEW", "windows": "a WINDOW clause",
                "distribute": "DISTRIBUTE BY", "sort": "SORT BY", "cluster": "CLUSTER BY", "sample": "TABLESAMPLE",
                "pivots": "PIVOT", "locks": "FOR UPDATE / FOR SHARE", "into": "SELECT INTO",
                "connect": "CONNECT BY", "prewhere": "PREWHERE", "match": "MATCH_RECOGNIZE"}
TABLE_ARG_NAMES = {"version": "time travel (VERSION AS OF / TIMESTAMP AS OF)",
                   "system_time": "time travel (FOR SYSTEM_TIME)", "sample": "TABLESAMPLE", "pivots": "PIVOT",
                   "laterals": "LATERAL VIEW", "partition": "a PARTITION clause on a table",
                   "changes": "a CHANGES clause on a table"}
# Names for expression nodes that have no function name, for "... is not supported" messages.
NODE_NAMES: dict[type[exp.Expression], str] = {
    exp.NullSafeEQ: "null-safe equality (<=> / IS NOT DISTINCT FROM)",
    exp.NullSafeNEQ: "null-safe inequality (IS DISTINCT FROM)", exp.IntDiv: "integer division (DIV)",
    exp.Bracket: "an array or map subscript", exp.Dot: "struct field access", exp.Xor: "XOR",
    exp.BitwiseAnd: "bitwise AND (&)", exp.BitwiseOr: "bitwise OR (|)", exp.BitwiseXor: "bitwise XOR (^)",
    exp.BitwiseNot: "bitwise NOT (~)", exp.Any: "ANY (...)", exp.All: "ALL (...)", exp.Tuple: "a row value (tuple)",
    exp.Lambda: "a lambda function", exp.Array: "an array constructor", exp.Struct: "a struct constructor",
}

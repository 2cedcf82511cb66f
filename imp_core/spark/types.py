"""Arrow <-> Spark type mapping for the types the platform supports."""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa
from pyspark.sql import types as T

from imp_core.errors import UnsupportedError

# Arrow types whose Spark type takes no parameter, tried in order (the sized integers and float32 before the rest)
_PLAIN_TYPES: tuple[tuple[Callable[[pa.DataType], bool], type[T.DataType]], ...] = (
    (pa.types.is_int8, T.ByteType),
    (pa.types.is_int16, T.ShortType),
    (pa.types.is_int32, T.IntegerType),
    (pa.types.is_integer, T.LongType),
    (pa.types.is_float32, T.FloatType),
    (pa.types.is_floating, T.DoubleType),
    (lambda t: pa.types.is_string(t) or pa.types.is_large_string(t) or t == pa.string_view(), T.StringType),
    (pa.types.is_boolean, T.BooleanType),
    (pa.types.is_date, T.DateType),
    (lambda t: pa.types.is_binary(t) or pa.types.is_large_binary(t), T.BinaryType),
    (pa.types.is_null, T.NullType),
)


def arrow_to_spark(t: pa.DataType) -> T.DataType:
    if pa.types.is_decimal(t):
        return T.DecimalType(t.precision, t.scale)
    if pa.types.is_timestamp(t):
        return T.TimestampType() if t.tz else T.TimestampNTZType()
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return T.ArrayType(arrow_to_spark(t.value_type))
    for matches, spark_type in _PLAIN_TYPES:
        if matches(t):
            return spark_type()
    raise UnsupportedError(f"columns of Arrow type {t} are not supported")


def arrow_schema_to_spark(schema: pa.Schema) -> T.StructType:
    return T.StructType([T.StructField(f.name, arrow_to_spark(f.type), True) for f in schema])


def spark_type_name(t: pa.DataType) -> str:
    """Spark SQL type name for CAST."""
    return arrow_to_spark(t).simpleString()

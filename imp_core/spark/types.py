"""Arrow <-> Spark type mapping for the types the platform supports."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql import types as T

from imp_core.errors import UnsupportedError


def arrow_to_spark(t: pa.DataType) -> T.DataType:
    if pa.types.is_int8(t):
        return T.ByteType()
    if pa.types.is_int16(t):
        return T.ShortType()
    if pa.types.is_int32(t):
        return T.IntegerType()
    if pa.types.is_integer(t):
        return T.LongType()
    if pa.types.is_float32(t):
        return T.FloatType()
    if pa.types.is_floating(t):
        return T.DoubleType()
    if pa.types.is_decimal(t):
        return T.DecimalType(t.precision, t.scale)
    if pa.types.is_string(t) or pa.types.is_large_string(t) or t == pa.string_view():
        return T.StringType()
    if pa.types.is_boolean(t):
        return T.BooleanType()
    if pa.types.is_date(t):
        return T.DateType()
    if pa.types.is_timestamp(t):
        return T.TimestampType() if t.tz else T.TimestampNTZType()
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return T.BinaryType()
    if pa.types.is_null(t):
        return T.NullType()
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return T.ArrayType(arrow_to_spark(t.value_type))
    raise UnsupportedError(f"columns of Arrow type {t} are not supported")


def arrow_schema_to_spark(schema: pa.Schema) -> T.StructType:
    return T.StructType([T.StructField(f.name, arrow_to_spark(f.type), True) for f in schema])


def spark_type_name(t: pa.DataType) -> str:
    """Spark SQL type name for CAST."""
    return arrow_to_spark(t).simpleString()

"""The Kafka sink's shape: check a DataFrame's columns, normalise them, and name their Arrow types."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from aioprod.spark.plan import Plan
from aioprod.spark.reports import DataFrameSchemaError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame
    from pyspark.sql.types import DataType, StructType


def check_schema(schema: StructType, topic: str | None) -> dict[str, DataType]:
    """The sink columns present, after checking each against the Kafka sink's types."""
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        ByteType,
        IntegerType,
        LongType,
        ShortType,
        StringType,
        StructType,
    )

    fields = {f.name: f.dataType for f in schema.fields}
    found: dict[str, DataType] = {}

    def expect(name: str, ok: bool, expected: str) -> None:
        if not ok:
            raise DataFrameSchemaError(f"column {name!r} has type {fields[name].simpleString()}; expected {expected}")
        found[name] = fields[name]

    if "value" not in fields:
        lower = {n.lower(): n for n in fields}
        hint = f" (found {lower['value']!r}; names are case-sensitive)" if "value" in lower else ""
        raise DataFrameSchemaError(f"the DataFrame has no 'value' column; expected binary or string{hint}")
    expect("value", isinstance(fields["value"], (BinaryType, StringType)), "binary or string")
    if "key" in fields:
        expect("key", isinstance(fields["key"], (BinaryType, StringType)), "binary or string")
    if topic is None:  # topic= wins: a topic column is then not read, whatever its type (as Spark's sink)
        if "topic" not in fields:
            raise DataFrameSchemaError("the DataFrame has no 'topic' column and no topic= argument was given")
        expect("topic", isinstance(fields["topic"], StringType), "string")
    if "partition" in fields:
        expect(
            "partition",
            isinstance(fields["partition"], (IntegerType, ShortType, ByteType, LongType)),
            "int",
        )
    if "headers" in fields:
        dtype = fields["headers"]
        ok = False
        if isinstance(dtype, ArrayType) and isinstance(dtype.elementType, StructType):
            inner = {f.name: f.dataType for f in dtype.elementType.fields}
            ok = (
                set(inner) == {"key", "value"}
                and isinstance(inner["key"], StringType)
                and isinstance(inner["value"], (BinaryType, StringType))
            )
        expect("headers", ok, "array<struct<key:string,value:binary>>")
    return found


def prepare(df: DataFrame, plan: Plan, columns: Mapping[str, DataType]) -> DataFrame:
    """Select only the sink's columns, in the plan's order, normalised to binary/string/int."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType, LongType

    selected = [F.col("value").cast("binary").alias("value")]
    if plan.has_key:
        selected.append(F.col("key").cast("binary").alias("key"))
    if plan.has_topic:
        selected.append(F.col("topic"))
    if plan.has_partition:
        # As a long: a long column cast to int wrapped silently (4294967297 went to partition 1
        # when Spark's ANSI mode is off); kept whole, a partition that does not exist is a row error.
        dtype = columns["partition"]
        selected.append(F.col("partition") if isinstance(dtype, LongType) else F.col("partition").cast("long"))
    if plan.has_headers:
        element = columns["headers"].elementType  # type: ignore[attr-defined]
        value_type = {f.name: f.dataType for f in element.fields}["value"]
        in_order = [f.name for f in element.fields] == ["key", "value"]
        if not in_order or not isinstance(value_type, BinaryType):
            # Rebuilt by name: the transports read a header's key and value by position.
            selected.append(
                F.transform(
                    "headers",
                    lambda h: F.struct(h["key"].alias("key"), h["value"].cast("binary").alias("value")),
                ).alias("headers")
            )
        else:
            selected.append(F.col("headers"))
    return df.select(*selected)


def arrow_schema(plan: Plan, large: bool) -> pa.Schema:
    """The Arrow schema Spark uses for the prepared columns (``large``: useLargeVarTypes)."""
    import pyarrow as pa

    binary = pa.large_binary() if large else pa.binary()
    string = pa.large_string() if large else pa.string()
    fields = [pa.field("value", binary)]
    if plan.has_key:
        fields.append(pa.field("key", binary))
    if plan.has_topic:
        fields.append(pa.field("topic", string))
    if plan.has_partition:
        fields.append(pa.field("partition", pa.int64()))
    if plan.has_headers:
        element = pa.struct([pa.field("key", string), pa.field("value", binary)])
        fields.append(pa.field("headers", pa.large_list(element) if large else pa.list_(element)))
    return pa.schema(fields)

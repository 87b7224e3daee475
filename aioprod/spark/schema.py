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


def check_schema(schema: StructType, topic: str | None, *, case_sensitive: bool = False) -> dict[str, DataType]:
    """The sink columns present, after checking each against the Kafka sink's types.

    ``case_sensitive``: ``spark.sql.caseSensitive``, by which Spark finds a column's name twice.
    """
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

    sink = ("value", "key", "partition", "headers") + (("topic",) if topic is None else ())
    for name in sink:
        # A join or a repeated alias: only the last one's type was checked, then Spark's select
        # failed with AMBIGUOUS_REFERENCE.
        same = [f.name for f in schema.fields if (f.name if case_sensitive else f.name.lower()) == name]
        if len(same) > 1:
            how = " (Spark ignores case unless spark.sql.caseSensitive is true)" if len(set(same)) > 1 else ""
            raise DataFrameSchemaError(
                f"the DataFrame has {len(same)} columns named {name!r}: {', '.join(map(repr, same))}{how};"
                " drop or rename all but one"
            )
    fields = {f.name: f.dataType for f in schema.fields}
    lower = {n.lower(): n for n in fields}
    found: dict[str, DataType] = {}

    def expect(name: str, ok: bool, expected: str) -> None:
        if not ok:
            raise DataFrameSchemaError(f"column {name!r} has type {fields[name].simpleString()}; expected {expected}")
        found[name] = fields[name]

    if "value" not in fields:
        hint = f" (found {lower['value']!r}; names are case-sensitive)" if "value" in lower else ""
        raise DataFrameSchemaError(f"the DataFrame has no 'value' column; expected binary or string{hint}")
    expect("value", isinstance(fields["value"], (BinaryType, StringType)), "binary or string")
    if not case_sensitive:
        # Spark finds F.col("key") in a column "Key": left unread, the rows went out keyless.
        for name in sink:
            if name not in fields and name in lower:
                raise DataFrameSchemaError(
                    f"the DataFrame has a column {lower[name]!r}, not {name!r}: the sink's column names are "
                    "case-sensitive; rename it or drop it"
                )
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
                sorted(f.name for f in dtype.elementType.fields) == ["key", "value"]  # each once
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


def arrow_schema(plan: Plan) -> pa.Schema:
    """The prepared columns' Arrow types with 32-bit offsets; :func:`as_sent` widens what Spark sent wider."""
    import pyarrow as pa

    fields = [pa.field("value", pa.binary())]
    if plan.has_key:
        fields.append(pa.field("key", pa.binary()))
    if plan.has_topic:
        fields.append(pa.field("topic", pa.string()))
    if plan.has_partition:
        fields.append(pa.field("partition", pa.int64()))
    if plan.has_headers:
        element = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
        fields.append(pa.field("headers", pa.list_(element)))
    return pa.schema(fields)


def as_sent(schema: pa.Schema, batch: pa.RecordBatch) -> pa.Schema:
    """``schema`` with each string, binary and list as wide as the offsets ``batch`` holds.

    Spark's record-batch messages carry no schema, and reading 32-bit offsets as 64-bit ones (or
    the reverse) puts values on other rows without any error: ``useLargeVarTypes`` widens
    Spark's strings and binaries but not its lists. So the width is not guessed from settings;
    it is read from each offsets buffer's size, in ``batch`` decoded with ``schema``'s narrow types
    (which never reads past what was sent). Raises ``ValueError`` for a size that fits neither.
    """
    import pyarrow as pa

    def widen(name: str, dtype: pa.DataType, array: pa.Array) -> pa.DataType:
        if pa.types.is_struct(dtype):
            children = [widen(f"{name}.{f.name}", f.type, array.field(i)) for i, f in enumerate(dtype)]
            return pa.struct([f.with_type(t) for f, t in zip(dtype, children, strict=True)])
        variable = {pa.binary(): pa.large_binary(), pa.string(): pa.large_string()}
        if dtype in variable or pa.types.is_list(dtype):
            wide = _offsets_are_64_bit(name, array)
            if pa.types.is_list(dtype):
                element = widen(f"{name}[]", dtype.value_type, array.values)
                return pa.large_list(element) if wide else pa.list_(element)
            return variable[dtype] if wide else dtype
        return dtype

    return pa.schema(
        [f.with_type(widen(f.name, f.type, column)) for f, column in zip(schema, batch.columns, strict=True)]
    )


def _offsets_are_64_bit(name: str, array: pa.Array) -> bool:
    offsets = array.buffers()[1]
    size = 0 if offsets is None else offsets.size
    n = len(array) + 1
    if len(array) == 0 or 4 * n <= size < 8 * n:
        return False
    if size >= 8 * n:
        return True
    raise ValueError(f"column {name!r}: an offsets buffer of {size} bytes for {len(array)} values")

"""Reading a query's state back: ``ls.read.state(checkpointLocation, operatorId, batchId)``.

Returns a DataFrame with columns ``key`` (struct), ``value`` (struct) and
``partition_id``, like Spark's state data source. The rows are read by Spark tasks,
one per state partition, from the state files alone.
"""

from __future__ import annotations

import json
from functools import partial as bind
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from lockgate.checkpoint import CommitLog
from lockgate.checkpoint.fs import resolve_filesystem
from lockgate.errors import CheckpointError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def _arrow_field_to_spark(field: pa.Field) -> Any:
    from pyspark.sql.pandas.types import from_arrow_type
    from pyspark.sql.types import StructField

    return StructField(field.name, from_arrow_type(field.type), True)


def _read_partition(conf: Any, version: int, out_schema: pa.Schema, batches: Any) -> Any:
    from lockgate.state.store import read_state_table

    for batch in batches:
        for pid in batch.column(0).to_pylist():
            table = read_state_table(conf, int(pid), version)
            key_names = [f.name for f in conf.key_schema]
            value_names = [f.name for f in conf.value_schema]
            key = pa.StructArray.from_arrays(
                [table.column(n).combine_chunks() for n in key_names], names=key_names
            ) if key_names else pa.array([{}] * table.num_rows)
            value = pa.StructArray.from_arrays(
                [table.column(n).combine_chunks() for n in value_names], names=value_names
            ) if value_names else pa.nulls(table.num_rows, out_schema.field("value").type)
            parts = pa.array([int(pid)] * table.num_rows, type=pa.int32())
            yield pa.RecordBatch.from_arrays([key, value, parts], schema=out_schema)


def read_state(
    spark: SparkSession, checkpoint_location: str, operator_id: int = 0, batch_id: int | None = None
) -> DataFrame:
    from pyspark.sql.types import IntegerType, StructField, StructType

    from lockgate.state.store import StateStoreConf

    fs, root = resolve_filesystem(checkpoint_location)
    schema_path = fs.join(root, "state", str(operator_id), "_metadata", "schema")
    try:
        meta = json.loads(fs.read_bytes(schema_path).decode("utf-8"))
    except FileNotFoundError:
        raise CheckpointError(
            f"No state for operator {operator_id} in checkpoint {checkpoint_location} "
            f"({schema_path} does not exist). Is this the checkpoint of a stateful query?",
            path=schema_path,
        ) from None
    if batch_id is None:
        latest = CommitLog(fs, fs.join(root, "commits")).get_latest_batch_id()
        if latest is None:
            raise CheckpointError(
                f"Checkpoint {checkpoint_location} has no committed batch yet.", path=root
            )
        batch_id = latest
    key_schema = pa.schema([pa.field(n, _parse_arrow_type(t)) for n, t in meta["keySchema"]])
    value_schema = pa.schema([pa.field(n, _parse_arrow_type(t)) for n, t in meta["valueSchema"]])
    num_partitions = int(meta["numPartitions"])
    conf = StateStoreConf(
        root=fs.join(root, "state"),
        operator_id=operator_id,
        num_partitions=num_partitions,
        key_schema=key_schema,
        value_schema=value_schema,
    )
    key_type = StructType([_arrow_field_to_spark(f) for f in key_schema])
    value_type = StructType([_arrow_field_to_spark(f) for f in value_schema])
    out = StructType(
        [
            StructField("key", key_type, True),
            StructField("value", value_type, True),
            StructField("partition_id", IntegerType(), True),
        ]
    )
    from lockgate.plan.aggregate import schema_to_arrow

    tz = str(spark.conf.get("spark.sql.session.timeZone", "UTC"))
    out_arrow = schema_to_arrow(out, tz)
    ids = spark.range(0, num_partitions, 1, num_partitions).selectExpr("cast(id as int) as id")
    return ids.mapInArrow(bind(_read_partition, conf, batch_id + 1, out_arrow), out)


def _parse_arrow_type(text: str) -> pa.DataType:
    simple = {
        "int8": pa.int8(), "int16": pa.int16(), "int32": pa.int32(), "int64": pa.int64(),
        "float": pa.float32(), "double": pa.float64(), "bool": pa.bool_(), "string": pa.string(),
        "large_string": pa.large_string(), "binary": pa.binary(), "date32[day]": pa.date32(),
    }
    if text in simple:
        return simple[text]
    if text.startswith("timestamp["):
        inner = text[len("timestamp[") : -1]
        unit, _, tz = inner.partition(",")
        tz = tz.strip().removeprefix("tz=") or None
        return pa.timestamp(unit.strip(), tz=tz)
    if text.startswith("decimal128("):
        p, s = text[len("decimal128(") : -1].split(",")
        return pa.decimal128(int(p), int(s))
    if text.startswith("list<") and text.endswith(">"):
        inner = text[len("list<") : -1]
        _, _, item = inner.partition(": ")
        return pa.list_(_parse_arrow_type(item.strip()))
    raise CheckpointError(f"Unsupported state column type {text!r} in the state schema file.")

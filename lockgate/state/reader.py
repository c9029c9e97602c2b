"""Reading a query's state back: ``ls.read.state(checkpointLocation, operatorId, batchId)``.

Returns a DataFrame with columns ``key`` (struct), ``value`` (struct) and
``partition_id``, like Spark's state data source. The rows are read by Spark tasks,
one per state partition, from the state files alone.

A ``transformWithState`` operator keeps one store per state variable (and one for its
timers): ``stateVarName`` picks the variable, ``readRegisteredTimers`` the timers, and
``flattenCollectionTypes`` (default true) shows a list or map state one element a row,
with the columns Spark's reader gives each kind.

``readChangeFeed`` gives the changes each batch made instead (each batch's delta file),
and ``snapshotStartBatchId`` with ``snapshotPartitionId`` reads one partition from the
snapshot after batch ``snapshotStartBatchId`` and the deltas after it, as Spark's
options of these names.
"""

from __future__ import annotations

import itertools
from functools import partial as bind
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from lockgate.checkpoint import CommitLog
from lockgate.checkpoint.fs import resolve_filesystem
from lockgate.errors import CheckpointError, NotSupportedYetError, StateDataSourceError
from lockgate.jvm import cast_columns
from lockgate.state.arrow_types import schema_to_arrow, spark_field_names
from lockgate.state.schema import (
    SESSION_WINDOW_NAME,
    STREAM_JOIN_NAME,
    TIMERS_STORE,
    TRANSFORM_WITH_STATE_NAMES,
    TTL_COLUMN,
    TTL_LIST_COLUMN,
    read_schema_file,
    stored_schema,
    variable_store_keys,
)
from lockgate.state.store import (
    StateStoreConf,
    read_changes,
    read_state_table,
    read_state_table_from_snapshot,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def arrow_field_to_spark(field: pa.Field) -> Any:
    from pyspark.sql.pandas.types import from_arrow_type
    from pyspark.sql.types import StructField

    return StructField(field.name, from_arrow_type(field.type), True)


def _explode_sessions(table: pa.Table, key_names: list[str], list_names: list[str]) -> pa.Table:
    """One row per session: the keys repeated, each list column flattened."""
    import pyarrow.compute as pc

    parents = pc.list_parent_indices(table.column(list_names[0]).combine_chunks())
    columns = {n: table.column(n).combine_chunks().take(parents) for n in key_names}
    for n in list_names:
        columns[n] = pc.list_flatten(table.column(n).combine_chunks())
    return pa.table(columns)


def _field_types(schema: pa.Schema, struct: str) -> dict[str, pa.DataType]:
    fields = schema.field(struct).type
    return {fields.field(i).name: fields.field(i).type for i in range(fields.num_fields)}


def _key_value(
    table: pa.Table,
    conf: Any,
    out_schema: pa.Schema,
    sessions: bool,
    columns: tuple[list[str], list[str]] | None,
    key_groups: list[int | None] | None,
) -> tuple[pa.Array, pa.Array]:
    """The ``key`` and ``value`` structs of a state table's rows, as Spark's reader shows
    them (``out_schema``'s key and value); ``columns``: the table's key and value
    columns, when not all of the store's."""
    key_names, value_names = columns or ([f.name for f in conf.key_schema], [f.name for f in conf.value_schema])
    if sessions:
        # Session windows keep a list of sessions per key; show one row per
        # session keyed by (keys, session start), as Spark's state reader does.
        table = _explode_sessions(table, key_names, value_names)
        key_names, value_names = key_names + value_names[:1], value_names[1:]
        types = {**_field_types(out_schema, "key"), **_field_types(out_schema, "value")}
        table = pa.table({n: table.column(n).cast(types[n]) for n in table.column_names})
    out_key, out_value = out_schema.field("key").type, out_schema.field("value").type
    key_columns = [table.column(n).combine_chunks() for n in key_names]
    if key_groups is not None:
        key_columns = _nest(key_columns, key_groups, out_key)
    key = pa.StructArray.from_arrays(
        key_columns,
        names=[out_key.field(i).name for i in range(out_key.num_fields)],
    ) if key_names else pa.array([{}] * table.num_rows)
    value = pa.StructArray.from_arrays(
        [
            pa.nulls(table.num_rows) if pa.types.is_null(out_value.field(i).type) else table.column(n).combine_chunks()
            for i, n in enumerate(value_names)
        ],
        names=[out_value.field(i).name for i in range(out_value.num_fields)],
    ) if value_names else pa.nulls(table.num_rows, out_value)
    return key, value


def _read_partition(
    conf: Any,
    version: int,
    out_schema: pa.Schema,
    batches: Any,
    sessions: bool = False,
    columns: tuple[list[str], list[str]] | None = None,
    key_groups: list[int | None] | None = None,
    snapshot: int | None = None,
) -> Any:
    for batch in batches:
        for pid in batch.column(0).to_pylist():
            table = _state_table(conf, int(pid), version, snapshot)
            key, value = _key_value(table, conf, out_schema, sessions, columns, key_groups)
            parts = pa.array([int(pid)] * len(value), type=pa.int32())  # sessions: a row each
            yield pa.RecordBatch.from_arrays([key, value, parts], schema=out_schema)


def _state_table(conf: Any, pid: int, version: int, snapshot: int | None) -> pa.Table:
    """One partition's state at ``version``, from snapshot version ``snapshot`` on when
    given (``snapshotStartBatchId``)."""
    if snapshot is None:
        return read_state_table(conf, pid, version)
    return read_state_table_from_snapshot(conf, pid, snapshot, version)


def _read_partition_changes(
    conf: Any,
    first_batch: int,
    last_batch: int,
    out_schema: pa.Schema,
    key_value: Any,
    batches: Any,
) -> Any:
    """The change feed of the partitions a task is given: each batch's delta file, a row
    per key it put (``update``) or removed (``delete``, value null); ``key_value(table)``
    gives the rows' ``key`` and ``value`` columns. Batches at or before the store's first
    version (a variable added on a restart) changed nothing."""
    import pyarrow.compute as pc

    for batch in batches:
        for pid in batch.column(0).to_pylist():
            for batch_id in range(max(first_batch, conf.first_version), last_batch + 1):
                table, removed = read_changes(conf, int(pid), batch_id + 1)
                key, value = key_value(table)
                value = pc.if_else(removed, pa.nulls(table.num_rows, value.type), value)
                yield pa.RecordBatch.from_arrays(
                    [
                        pa.array([batch_id] * table.num_rows, type=pa.int64()),
                        pc.if_else(removed, "delete", "update").cast(pa.string()),
                        key,
                        value,
                        pa.array([int(pid)] * table.num_rows, type=pa.int32()),
                    ],
                    schema=out_schema,
                )


def read_state(
    spark: SparkSession,
    checkpoint_location: str,
    operator_id: int = 0,
    batch_id: int | None = None,
    join_side: str | None = None,
    state_var_name: str | None = None,
    read_registered_timers: Any = False,
    flatten_collection_types: Any = True,
    read_change_feed: Any = False,
    change_start_batch_id: int | None = None,
    change_end_batch_id: int | None = None,
    snapshot_start_batch_id: int | None = None,
    snapshot_partition_id: int | None = None,
) -> DataFrame:
    from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

    # Spark's StateSourceOptions: the booleans parsed, the name trimmed, checked in its order
    timers = _boolean_option("readRegisteredTimers", read_registered_timers)
    flatten = _boolean_option("flattenCollectionTypes", flatten_collection_types)
    var_name = None if state_var_name is None else str(state_var_name).strip()
    if timers and var_name is not None:
        raise StateDataSourceError(
            "STDS_CONFLICT_OPTIONS", {"options": "['readRegisteredTimers', 'stateVarName']"}
        )
    changes = _boolean_option("readChangeFeed", read_change_feed)
    snapshot_options = (snapshot_start_batch_id, snapshot_partition_id)
    _check_change_feed_options(
        changes, join_side, batch_id, change_start_batch_id, change_end_batch_id, snapshot_options
    )

    fs, root = resolve_filesystem(checkpoint_location)
    schema_path = fs.join(root, "state", str(operator_id), "_metadata", "schema")
    meta = read_schema_file(fs, schema_path, operator_id)
    if meta is None:
        raise CheckpointError(
            f"No state for operator {operator_id} in checkpoint {checkpoint_location} "
            f"({schema_path} does not exist). Is this the checkpoint of a stateful query?",
            path=schema_path,
        )
    if batch_id is None:
        latest = CommitLog(fs, fs.join(root, "commits")).get_latest_batch_id()
        if latest is None:
            raise CheckpointError(
                f"Checkpoint {checkpoint_location} has no committed batch yet.", path=root
            )
        batch_id = latest if not changes or change_end_batch_id is None else change_end_batch_id
    snapshot = None if changes else _check_snapshot_options(batch_id, *snapshot_options)
    change_range = None
    if changes:
        assert change_start_batch_id is not None
        end = batch_id if change_end_batch_id is None else change_end_batch_id
        if end < change_start_batch_id:
            raise StateDataSourceError(
                "STDS_INVALID_OPTION_VALUE.WITH_MESSAGE",
                {
                    "optionName": "changeEndBatchId",
                    "message": "changeEndBatchId cannot be smaller than changeStartBatchId. Please "
                    "check the input to changeEndBatchId, or if you are using its default value, "
                    f"make sure that changeStartBatchId is less than {end}.",
                },
            )
        change_range = (int(change_start_batch_id), int(end))
        if meta.get("operatorName") in (SESSION_WINDOW_NAME, STREAM_JOIN_NAME):
            raise NotSupportedYetError(
                f"readChangeFeed of a {meta.get('operatorName')} operator's state",
                "lockgate reads the change feed of aggregations, deduplications, limits, "
                "applyInPandasWithState and transformWithState's value states; read this "
                "operator's state at a batch with batchId.",
            )
    key_schema, value_schema = _stored_schema(meta, "key"), _stored_schema(meta, "value")
    num_partitions = int(meta["numPartitions"])
    operator_name = meta.get("operatorName")
    if operator_name in TRANSFORM_WITH_STATE_NAMES:
        return _read_transform_with_state(
            spark, fs, root, meta, operator_id, batch_id, var_name, timers, flatten, change_range, snapshot
        )
    if var_name is not None or timers:
        raise StateDataSourceError(
            "STDS_INVALID_OPTION_VALUE.WITH_MESSAGE",
            {
                "optionName": "stateVarName",
                "message": "Providing state variable names is only supported with the "
                f"transformWithState operator. Found operator={operator_name}. Please remove "
                "this option and re-run the query.",
            },
        )
    store_name = None
    if meta.get("operatorName") == STREAM_JOIN_NAME:
        if join_side not in ("left", "right"):
            raise ValueError(
                f"Stateful operator {operator_id} is a stream-stream join, which keeps the state "
                f"of each side apart: pass joinSide='left' or joinSide='right' (got {join_side!r})."
            )
        store_name = join_side
        key_schema, value_schema = _side_schema(key_schema, join_side), _side_schema(value_schema, join_side)
    elif join_side is not None:
        raise ValueError(
            f"joinSide={join_side!r} applies to stream-stream joins only; stateful operator "
            f"{operator_id} is {meta.get('operatorName')!r}."
        )
    conf = StateStoreConf(
        root=fs.join(root, "state"),
        operator_id=operator_id,
        num_partitions=num_partitions,
        key_schema=key_schema,
        value_schema=value_schema,
        store_name=store_name,
        timestamps_as_micros=store_name is not None,
    )
    key_fields, value_fields = list(key_schema), list(value_schema)
    columns = None
    if store_name is not None:
        # the row as it was buffered, without the index (the last key column: the row's
        # place among its key's) and lockgate's own columns, keyed by its join keys named
        # as Spark's state reader names them (field0, field1, ...)
        key_fields = key_fields[:-1]
        value_fields = [f for f in value_fields if f.name != "matched" and not f.name.startswith("derived_")]
        columns = ([f.name for f in key_fields], [f.name for f in value_fields])
        key_fields = [f.with_name(f"field{i}") for i, f in enumerate(key_fields)]
    sessions = meta.get("operatorName") == SESSION_WINDOW_NAME
    if sessions:
        elements = [pa.field(f.name, f.type.value_type) for f in value_fields]
        key_fields, value_fields = key_fields + elements[:1], elements[1:]
    if operator_name == "dedupe":
        # Spark's deduplication stores no value: its reader shows a null __dummy__
        value_fields = [pa.field("__dummy__", pa.null())]
    shown = meta.get("valueNames")
    if not shown or store_name is not None or sessions or len(shown) != len(value_fields):
        shown = None
    key_groups = None
    nesting = meta.get("keyNesting")
    if nesting and store_name is None and not sessions:
        key_groups = [None if parts is None else len(parts) for _, parts in nesting]
        if sum(g or 1 for g in key_groups) != len(key_fields):
            key_groups = None  # not the layout this file's key columns have: show them flat
    if key_groups is not None:
        # the grouping keys as Spark's reader shows them (key.window.start, key.k)
        nested, rest = [], iter(key_fields)
        for (name, parts), group in zip(nesting, key_groups):
            if group is None:
                nested.append(next(rest).with_name(str(name)))
            else:
                children = [next(rest).with_name(str(p)) for p in parts]
                nested.append(pa.field(str(name), pa.struct(children)))
        key_fields = nested
    key_type = StructType([arrow_field_to_spark(f) for f in key_fields])
    value_type = StructType([arrow_field_to_spark(f) for f in value_fields])
    out = StructType(
        [
            StructField("key", key_type, True),
            StructField("value", value_type, True),
            StructField("partition_id", IntegerType(), True),
        ]
    )
    if change_range is not None:
        out = StructType(
            [StructField("batch_id", LongType(), True), StructField("change_type", StringType(), True), *out.fields]
        )
    tz = str(spark.conf.get("spark.sql.session.timeZone", "UTC"))
    out_arrow = schema_to_arrow(out, tz)
    ids = _partition_ids(spark, conf, snapshot)
    if change_range is not None:
        key_value = bind(
            _key_value, conf=conf, out_schema=out_arrow, sessions=False, columns=None, key_groups=key_groups
        )
        read = bind(_read_partition_changes, conf, *change_range, out_arrow, key_value)
    else:
        read = bind(
            _read_partition, conf, batch_id + 1, out_arrow, sessions=sessions,
            columns=columns, key_groups=key_groups, snapshot=None if snapshot is None else snapshot[0],
        )
    result = ids.mapInArrow(read, out)
    if shown is not None:
        # An aggregation's buffers as Spark's reader names them (count, sum, sum, ...).
        # The names may repeat, which Arrow's Java reader cannot take: the rows come
        # with the stored (unique) names and a struct cast renames them.
        renamed = StructType(
            [StructField(str(n), f.dataType, f.nullable) for n, f in zip(shown, value_type.fields)]
        )
        result = result.select(
            *[result[c] if c != "value" else result["value"].cast(renamed).alias("value") for c in result.columns]
        )
    return cast_columns(result, spark_field_names(result.schema))


def _check_change_feed_options(
    changes: bool, join_side: Any, batch_id: Any, start: Any, end: Any, snapshot_options: tuple[Any, Any]
) -> None:
    """Spark's checks of the change feed's options, in its order and with its errors."""
    if not changes:
        for name, value in (("changeStartBatchId", start), ("changeEndBatchId", end)):
            if value is not None:
                raise StateDataSourceError(
                    "STDS_INVALID_OPTION_VALUE.WITH_MESSAGE",
                    {"optionName": name, "message": "Only specify this option when readChangeFeed is set to true."},
                )
        return
    if join_side is not None:
        raise StateDataSourceError("STDS_CONFLICT_OPTIONS", {"options": "['joinSide', 'readChangeFeed']"})
    if batch_id is not None:
        raise StateDataSourceError("STDS_CONFLICT_OPTIONS", {"options": "['batchId', 'readChangeFeed']"})
    for name, value in zip(("snapshotStartBatchId", "snapshotPartitionId"), snapshot_options):
        if value is not None:
            raise StateDataSourceError("STDS_CONFLICT_OPTIONS", {"options": f"['{name}', 'readChangeFeed']"})
    if start is None:
        raise StateDataSourceError("STDS_REQUIRED_OPTION_UNSPECIFIED", {"optionName": "changeStartBatchId"})
    if int(start) < 0:
        raise StateDataSourceError("STDS_INVALID_OPTION_VALUE.IS_NEGATIVE", {"optionName": "changeStartBatchId"})


def _check_snapshot_options(batch_id: int, start: Any, partition: Any) -> tuple[int, int] | None:
    """Spark's checks of ``snapshotStartBatchId`` and ``snapshotPartitionId`` (without
    ``readChangeFeed``), in its order and with its errors; the snapshot's state version
    (the batch id plus one) and the partition, or None when not given."""
    if start is not None and int(start) < 0:
        raise StateDataSourceError("STDS_INVALID_OPTION_VALUE.IS_NEGATIVE", {"optionName": "snapshotStartBatchId"})
    if start is not None and int(start) > batch_id:
        raise StateDataSourceError(
            "STDS_INVALID_OPTION_VALUE.WITH_MESSAGE",
            {"optionName": "snapshotStartBatchId", "message": f"value should be less than or equal to {batch_id}"},
        )
    if partition is not None and int(partition) < 0:
        raise StateDataSourceError("STDS_INVALID_OPTION_VALUE.IS_NEGATIVE", {"optionName": "snapshotPartitionId"})
    # both at once, as each partition may have its snapshots at other batches
    if partition is not None and start is None:
        raise StateDataSourceError("STDS_REQUIRED_OPTION_UNSPECIFIED", {"optionName": "snapshotStartBatchId"})
    if start is not None and partition is None:
        raise StateDataSourceError("STDS_REQUIRED_OPTION_UNSPECIFIED", {"optionName": "snapshotPartitionId"})
    return None if start is None else (int(start) + 1, int(partition))


def _partition_ids(spark: SparkSession, conf: StateStoreConf, snapshot: tuple[int, int] | None) -> DataFrame:
    """The state partitions to read, one Spark task each: all, or the one
    ``snapshotPartitionId`` names (Spark's error when the operator has no such
    partition)."""
    first, last = 0, conf.num_partitions
    if snapshot is not None:
        first = snapshot[1]
        last = first + 1
        if first >= conf.num_partitions:
            raise StateDataSourceError(
                "CANNOT_LOAD_STATE_STORE.SNAPSHOT_PARTITION_ID_NOT_FOUND",
                {"snapshotPartitionId": str(first), "operatorId": str(conf.operator_id), "checkpointLocation": conf.root},
            )
    return spark.range(first, last, 1, last - first).selectExpr("cast(id as int) as id")


def _nest(columns: list[Any], groups: list[int | None], key_type: pa.StructType) -> list[Any]:
    """The flat key columns grouped into the key's fields: a group of n columns becomes
    one struct column of the key type's field at that place."""
    out, position = [], 0
    for i, group in enumerate(groups):
        if group is None:
            out.append(columns[position])
            position += 1
        else:
            field_type = key_type.field(i).type
            names = [field_type.field(j).name for j in range(field_type.num_fields)]
            out.append(pa.StructArray.from_arrays(columns[position : position + group], names=names))
            position += group
    return out


def _side_schema(schema: pa.Schema, side: str) -> pa.Schema:
    """One side's columns of a stream-stream join's schema (stored as ``left.<name>``
    and ``right.<name>``)."""
    prefix = f"{side}."
    return pa.schema([f.with_name(f.name[len(prefix) :]) for f in schema if f.name.startswith(prefix)])


def _stored_schema(meta: dict[str, Any], which: str) -> pa.Schema:
    return stored_schema(meta, which)


def _boolean_option(name: str, value: Any) -> bool:
    """Spark's ``toBoolean`` of an option value (``True``/``False`` or the strings)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "false"):
        return text == "true"
    raise StateDataSourceError(
        "STDS_INVALID_OPTION_VALUE.WITH_MESSAGE",
        {"optionName": name, "message": "Boolean value is expected"},
    )


def _variable_kind(value_type: pa.DataType) -> tuple[str, bool]:
    """The kind of a transformWithState state variable from its store's value columns
    (the layout of ``StateVariable.value_type``), and whether it has a TTL: a
    ``ListState`` keeps one column ``values`` of a list of structs, a ``MapState`` columns
    ``keys`` and ``values`` of lists of structs; anything else is a ``ValueState``'s own
    columns (a value state cannot hold a list of structs: nested structs are refused).
    With TTL the expirations follow, in ``$ttlExpirationMs`` (value) or
    ``$ttlExpirationsMs`` (each element's)."""

    def struct_list(t: pa.DataType) -> bool:
        return (pa.types.is_list(t) or pa.types.is_large_list(t)) and pa.types.is_struct(t.value_type)

    names = [value_type.field(i).name for i in range(value_type.num_fields)]
    ttl = bool(names) and names[-1] in (TTL_COLUMN, TTL_LIST_COLUMN)
    user = names[:-1] if ttl else names
    if user == ["values"] and struct_list(value_type.field(0).type):
        return "list", ttl
    if user == ["keys", "values"] and all(struct_list(value_type.field(i).type) for i in range(2)):
        return "map", ttl
    return "value", ttl


def _read_transform_with_state(
    spark: SparkSession,
    fs: Any,
    root: str,
    meta: dict[str, Any],
    operator_id: int,
    batch_id: int,
    var_name: str | None,
    timers: bool,
    flatten: bool,
    change_range: tuple[int, int] | None = None,
    snapshot: tuple[int, int] | None = None,
) -> DataFrame:
    """One state variable (or the timers) of a transformWithState operator, in the shape
    of Spark's state data source for its kind (Spark's ``SchemaUtil.getSourceSchema``);
    with ``change_range``, the changes each batch of the range made to a value state."""
    from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

    if var_name is None and not timers:
        raise StateDataSourceError("STDS_REQUIRED_OPTION_UNSPECIFIED", {"optionName": "stateVarName"})
    key_schema, value_schema = _stored_schema(meta, "key"), _stored_schema(meta, "value")
    variables = {f.name: f.type for f in value_schema}
    store = TIMERS_STORE if timers else var_name
    if store is None or store not in variables or (not timers and store.startswith("$")):
        raise StateDataSourceError(
            "STDS_INVALID_OPTION_VALUE.WITH_MESSAGE",
            {
                "optionName": "stateVarName",
                "message": f"State variable {var_name} is not defined for the transformWithState operator.",
            },
        )
    if timers and meta.get("timeMode") == "none":
        raise StateDataSourceError(
            "STDS_INVALID_OPTION_VALUE.WITH_MESSAGE",
            {"optionName": "readRegisteredTimers", "message": "Registered timers are not available in TimeMode=None."},
        )
    stored = variables[store]
    kind, ttl = ("timers", False) if timers else _variable_kind(stored)
    if change_range is not None and kind != "value":
        # Spark's change feed of a list shows each append apart from a put, and of a map
        # each entry updated, even to the same value; lockgate's deltas keep the whole
        # list or map a batch left, which tells neither. Spark's own reader fails on the
        # timers' change feed.
        what = "registered timers" if timers else f"{kind} state {var_name!r}"
        raise NotSupportedYetError(
            f"readChangeFeed of a transformWithState operator's {what}",
            "lockgate reads the change feed of value states; read this state at each batch "
            "with batchId instead.",
        )
    key_type = StructType([arrow_field_to_spark(f) for f in key_schema])

    def spark_type(t: pa.DataType) -> Any:
        return arrow_field_to_spark(pa.field("x", t)).dataType

    def with_ttl(t: Any) -> Any:
        # Spark keeps a value with TTL as struct<value, ttlExpirationMs> and shows it so
        if not ttl:
            return t
        return StructType(
            [StructField("value", t, True), StructField("ttlExpirationMs", LongType(), True)]
        )

    if kind == "value":
        user = pa.struct([stored.field(i) for i in range(stored.num_fields - int(ttl))])
        columns = [StructField("value", with_ttl(spark_type(user)), True)]
    elif kind == "list":
        from pyspark.sql.types import ArrayType

        element = with_ttl(spark_type(stored.field(0).type.value_type))
        columns = (
            [StructField("list_element", element, True)]
            if flatten
            else [StructField("list_value", ArrayType(element, True), True)]
        )
    elif kind == "map":
        from pyspark.sql.types import MapType

        user_key = spark_type(stored.field(0).type.value_type)
        user_value = with_ttl(spark_type(stored.field(1).type.value_type))
        columns = (
            [StructField("user_map_key", user_key, True), StructField("user_map_value", user_value, True)]
            if flatten
            else [StructField("map_value", MapType(user_key, user_value, True), True)]
        )
    else:
        columns = [StructField("expiration_timestamp_ms", LongType(), True)]
    out = StructType(
        [StructField("key", key_type, True), *columns, StructField("partition_id", IntegerType(), True)]
    )
    if change_range is not None:
        out = StructType(
            [StructField("batch_id", LongType(), True), StructField("change_type", StringType(), True), *out.fields]
        )
    conf = StateStoreConf(
        root=fs.join(root, "state"),
        operator_id=operator_id,
        num_partitions=int(meta["numPartitions"]),
        key_schema=variable_store_keys(key_schema),
        value_schema=pa.schema([stored.field(i) for i in range(stored.num_fields)]),
        store_name=store,
        values_by_name=meta.get("encodingFormat") == "avro" and not timers,
        # a variable added on a restart: its store holds nothing up to this version
        first_version=int((meta.get("stateVariablesSince") or {}).get(store) or 0),
        signed_zero_keys=True,  # keyed by the key's bytes, as the operator keeps them
    )
    tz = str(spark.conf.get("spark.sql.session.timeZone", "UTC"))
    out_arrow = schema_to_arrow(out, tz)
    ids = _partition_ids(spark, conf, snapshot)
    if change_range is not None:
        read = bind(
            _read_partition_changes, conf, *change_range, out_arrow,
            bind(_variable_key_value, conf, out_arrow, ttl),
        )
    else:
        read = bind(
            _read_variable_partition, conf, batch_id + 1, out_arrow, kind, ttl, flatten,
            snapshot=None if snapshot is None else snapshot[0],
        )
    result = ids.mapInArrow(read, out)
    return cast_columns(result, spark_field_names(result.schema))


def _with_ttl(value: pa.Array, expiration: pa.Array | None) -> pa.Array:
    """A value as Spark's reader shows one with TTL: struct<value, ttlExpirationMs>."""
    if expiration is None:
        return value
    return pa.StructArray.from_arrays([value, expiration], names=["value", "ttlExpirationMs"])


def _value_state(conf: Any, stored: list[pa.Array], num_rows: int, expirations: pa.Array | None) -> pa.Array:
    """A value state's ``value`` column from its store's value columns."""
    value_names = conf.value_schema.names[: len(stored)]
    user = (
        pa.StructArray.from_arrays(stored, names=value_names)
        if value_names
        else pa.nulls(num_rows, pa.struct([]))
    )
    return _with_ttl(user, expirations)


def _grouping_key(keys: list[pa.Array], out_key: pa.StructType, num_rows: int) -> pa.Array:
    """The ``key`` column: the grouping keys under their own names."""
    if not keys:
        return pa.array([{}] * num_rows, type=out_key)
    return pa.StructArray.from_arrays(keys, names=[f.name for f in out_key]).cast(out_key)


def _variable_key_value(conf: Any, out_schema: pa.Schema, ttl: bool, table: pa.Table) -> tuple[pa.Array, pa.Array]:
    """A value state's ``key`` and ``value`` columns of a table of its store's rows."""
    key_names = [f.name for f in conf.key_schema]
    stored = [table.column(c).combine_chunks() for c in conf.value_schema.names]
    expirations = stored.pop() if ttl else None
    value = _value_state(conf, stored, table.num_rows, expirations).cast(out_schema.field("value").type)
    keys = [table.column(c).combine_chunks() for c in key_names]
    return _grouping_key(keys, out_schema.field("key").type, table.num_rows), value


def _read_variable_partition(
    conf: Any,
    version: int,
    out_schema: pa.Schema,
    kind: str,
    ttl: bool,
    flatten: bool,
    batches: Any,
    snapshot: int | None = None,
) -> Any:
    import pyarrow.compute as pc

    key_names = [f.name for f in conf.key_schema]
    out_key = out_schema.field("key").type
    for batch in batches:
        for pid in batch.column(0).to_pylist():
            table = _state_table(conf, int(pid), version, snapshot)
            keys = [table.column(n).combine_chunks() for n in key_names]
            columns: list[pa.Array] = []
            stored = [table.column(n).combine_chunks() for n in conf.value_schema.names]
            expirations = stored.pop() if ttl else None
            if kind == "value":
                columns = [_value_state(conf, stored, table.num_rows, expirations)]
            elif flatten or kind == "timers":
                # one row per element, the key repeated
                parents = pc.list_parent_indices(stored[0])
                keys = [k.take(parents) for k in keys]
                flat = [pc.list_flatten(a) for a in stored]
                each_ttl = None if expirations is None else pc.list_flatten(expirations)
                columns = [*flat[:-1], _with_ttl(flat[-1], each_ttl)] if kind != "timers" else flat
            else:
                lengths = pc.fill_null(pc.list_value_length(stored[0]), 0).to_numpy(zero_copy_only=False)
                offsets = pa.array([0, *itertools.accumulate(int(n) for n in lengths)], type=pa.int32())
                each_ttl = None if expirations is None else pc.list_flatten(expirations)
                values = _with_ttl(pc.list_flatten(stored[-1]), each_ttl)
                if kind == "list":
                    columns = [pa.ListArray.from_arrays(offsets, values)]
                else:
                    columns = [pa.MapArray.from_arrays(offsets, pc.list_flatten(stored[0]), values)]
            columns = [c.cast(out_schema.field(i + 1).type) for i, c in enumerate(columns)]
            num_rows = len(keys[0]) if keys else (len(columns[0]) if columns else 0)
            key = _grouping_key(keys, out_key, num_rows)
            parts = pa.array([int(pid)] * num_rows, type=pa.int32())
            yield pa.RecordBatch.from_arrays([key, *columns, parts], schema=out_schema)


_TIME_MODE_NAMES = {"none": "NoTime", "processingTime": "ProcessingTime", "eventTime": "EventTime"}
_TIMER_STATE_NAMES = {"processingTime": "$procTimers_keyToTimestamp", "eventTime": "$eventTimers_keyToTimestamp"}
_VARIABLE_TYPES = {"value": "ValueState", "list": "ListState", "map": "MapState"}


def _transform_with_state_properties(meta: dict[str, Any]) -> str:
    """Spark's ``TransformWithStateOperatorProperties`` (the ``operatorPropertiesJson``
    of its ``OperatorStateMetadataV2``) from lockgate's state schema file: the time mode,
    the output mode, and each state variable (the timers as Spark's ``TimerState``)."""
    import json

    time_mode = str(meta.get("timeMode") or "none")
    variables = []
    timers = _TIMER_STATE_NAMES.get(time_mode)
    if timers is not None:
        variables.append({"stateName": timers, "stateVariableType": "TimerState", "ttlEnabled": False})
    value_schema = _stored_schema(meta, "value")
    for f in value_schema:
        if f.name == TIMERS_STORE:
            continue
        kind, ttl = _variable_kind(f.type)
        variables.append({"stateName": f.name, "stateVariableType": _VARIABLE_TYPES[kind], "ttlEnabled": ttl})
    # declared and then deleted in init(): no store, but Spark lists them too
    for name, kind, ttl in meta.get("stateVariablesDeletedInInit") or []:
        variables.append({"stateName": name, "stateVariableType": _VARIABLE_TYPES[kind], "ttlEnabled": bool(ttl)})
    properties: dict[str, Any] = {"timeMode": _TIME_MODE_NAMES.get(time_mode, time_mode)}
    if meta.get("outputMode"):
        properties["outputMode"] = str(meta["outputMode"]).capitalize()
    properties["stateVariables"] = variables
    return json.dumps(properties, separators=(",", ":"))


def read_state_metadata(spark: SparkSession, checkpoint_location: str) -> DataFrame:
    """Spark's ``state-metadata`` source over a lockgate checkpoint. Spark's own source
    reads the operator metadata files lockgate writes in its format (operators, stores,
    partitions, batch range); what it cannot know is a transformWithState's
    ``operatorProperties`` (Spark keeps them in a V2 metadata file, with schema files
    lockgate does not write), so that column is filled from lockgate's state schema
    file: Spark's JSON of the time mode, output mode and state variables."""
    from pyspark.sql import functions as F

    fs, root = resolve_filesystem(checkpoint_location)
    state_dir = fs.join(root, "state")
    properties = {}
    for name in fs.list_names(state_dir) if fs.exists(state_dir) else []:
        if not name.isdigit():
            continue
        meta = read_schema_file(fs, fs.join(state_dir, name, "_metadata", "schema"), int(name))
        if meta is not None and meta.get("operatorName") in TRANSFORM_WITH_STATE_NAMES:
            properties[int(name)] = _transform_with_state_properties(meta)
    table = spark.read.format("state-metadata").load(checkpoint_location)
    if not properties:
        return table
    filled = F.col("operatorProperties")
    for op, text in sorted(properties.items()):
        filled = F.when(F.col("operatorId") == op, F.lit(text)).otherwise(filled)
    return table.withColumn("operatorProperties", filled)

"""``<checkpoint>/state/<operatorId>/_metadata/schema``: what each stateful operator stores.

Written by the driver on an operator's first batch; on restart a query whose operator
kind or partition count differ, or whose key or value schema is incompatible by Spark's
rules (``spark.sql.streaming.stateStore.stateSchemaCheck``: names are not compared,
types are), is refused before any state is touched, with an error naming the operator
and the difference. transformWithState's value columns are its state variables, compared
by name as Spark compares column families: one added or removed is accepted and the file
rewritten (:attr:`OperatorStateSchema.variables_since`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from lockgate.checkpoint.checksum import ChecksumMismatchError, read_checked, write_checked
from lockgate.checkpoint.fs import CheckpointFileSystem
from lockgate.errors import CheckpointError
from lockgate.state.arrow_types import (
    field_from_json,
    field_to_json,
    parse_arrow_type,
    spark_names,
    unique_arrow_names,
)
from lockgate.state.operator_metadata import OperatorMetadata, write_operator_metadata

FORMAT_VERSION = 1


def _fields(schema: pa.Schema) -> list[list[str]]:
    return [[f.name, str(f.type)] for f in schema]


TRANSFORM_WITH_STATE_NAME = "transformWithStateInPandasExec"
"""The operator name of ``transformWithStateInPandas`` (Spark's, in progress and the
state schema file)."""
TRANSFORM_WITH_STATE_ROW_NAME = "transformWithStateInPySparkExec"
"""... and of the Row-based ``transformWithState`` (pyspark 4.3's)."""
TRANSFORM_WITH_STATE_NAMES = frozenset({TRANSFORM_WITH_STATE_NAME, TRANSFORM_WITH_STATE_ROW_NAME})
STREAM_JOIN_NAME = "symmetricHashJoin"
"""Spark's ``shortName`` of StreamingSymmetricHashJoinExec (progress, state schema)."""
SESSION_WINDOW_NAME = "sessionWindowStateStoreSaveExec"
"""Spark's ``shortName`` of SessionWindowStateStoreSaveExec (progress, state schema)."""
TIMERS_STORE = "$timers"
"""transformWithState's store of registered timers (``$``: Spark's prefix of reserved
column families; ``lockgate/plan/transform_with_state.py`` keeps them there)."""
TTL_COLUMN = "$ttlExpirationMs"
"""A transformWithState ``ValueState`` with TTL: the value's expiration (epoch ms) after
its columns."""
TTL_LIST_COLUMN = "$ttlExpirationsMs"
"""A ``ListState`` or ``MapState`` with TTL: each element's (map entry's) expiration."""


def variable_store_keys(key_schema: pa.Schema) -> pa.Schema:
    """The key columns of a transformWithState variable's store: the grouping keys under
    reserved names, so that a grouping key may share its name with a field of the
    variable's value (Spark keeps key and value apart; one flat table cannot). Files
    written before under the grouping keys' own names read the same: key columns are
    matched by position."""
    return pa.schema([f.with_name(f"$key{i}") for i, f in enumerate(key_schema)])


@dataclass(frozen=True)
class OperatorStateSchema:
    operator_id: int
    operator_name: str
    key_schema: pa.Schema
    value_schema: pa.Schema
    num_partitions: int
    metadata_partitions: int | None = None
    """The partition count Spark's operator metadata records (``_metadata/metadata``):
    the query's state partitions, also for operators lockgate keeps in one partition
    (``limit``, an aggregation without keys); None: ``num_partitions``."""
    key_nesting: tuple[tuple[str, tuple[str, ...] | None], ...] | None = None
    """How the flat key columns nest into the query's grouping keys, as Spark's state
    reader shows the key: per grouping key its name and, for a struct key (a window),
    its fields, which take that many flat columns in order. None: the flat columns."""
    value_names: tuple[str, ...] | None = None
    """The value fields' names as Spark's state reader shows them (an aggregation's
    buffers: ``count``, ``sum``, ``sum``, ``count``, ...; they may repeat), which
    ``ls.read.state`` uses; None: the value columns' own names."""
    variables_since: dict[str, int] | None = None
    """transformWithState: each value column is a state variable (Spark's column
    families), compared by name; a variable added on a restart is accepted (it starts
    empty after the version given here), a removed one dropped, as Spark's
    ``StateSchemaCompatibilityChecker`` does per column family. None: other operators."""
    variables_removed: dict[str, list[int]] | None = None
    """transformWithState: a variable no longer declared, ``[since, last]``: the version
    its store starts after and the last version it holds (read back if declared again)."""
    variables_gaps: dict[str, list[int]] | None = None
    """transformWithState: a variable declared again, ``[last, version]``: the versions
    in between it was not declared (``StateStoreConf.gap``)."""
    time_mode: str | None = None
    """transformWithState: its ``timeMode`` (``none``, ``processingTime``,
    ``eventTime``), for the state reader (Spark's operator properties keep it)."""
    evolution_threshold: int | None = None
    """transformWithState with ``spark.sql.streaming.stateStore.encodingFormat=avro``:
    a state variable's value schema may evolve by Avro's rules (:func:`avro_evolvable`)
    at most this many times (``...stateStore.valueStateSchemaEvolutionThreshold``), its
    files read by name (``StateStoreConf.values_by_name``). None: Spark's default
    ``unsaferow`` encoding, where a value schema may not change."""
    variables_evolutions: dict[str, int] | None = None
    """How many times each state variable's value schema has evolved (avro)."""
    output_mode: str | None = None
    """transformWithState: its ``outputMode`` (``append``, ``update``), for Spark's
    ``state-metadata`` source's ``operatorProperties`` (:func:`read_state_metadata`)."""
    variables_deleted_in_init: tuple[tuple[str, str, bool], ...] | None = None
    """transformWithState: the variables ``init`` declares and then deletes
    (``deleteIfExists``), as ``(name, kind, ttl)``; they have no store, but Spark's
    ``operatorProperties`` list them with the others."""

    def to_json(self) -> str:
        extra: dict[str, Any] = {}
        if self.variables_since is not None:
            extra["stateVariablesSince"] = self.variables_since
        if self.variables_removed:
            extra["stateVariablesRemoved"] = self.variables_removed
        if self.variables_gaps:
            extra["stateVariablesGaps"] = self.variables_gaps
        if self.time_mode is not None:
            extra["timeMode"] = self.time_mode
        if self.output_mode is not None:
            extra["outputMode"] = self.output_mode
        if self.variables_deleted_in_init:
            extra["stateVariablesDeletedInInit"] = [list(v) for v in self.variables_deleted_in_init]
        if self.evolution_threshold is not None:
            extra["encodingFormat"] = "avro"
        if self.variables_evolutions:
            extra["stateVariablesEvolutions"] = self.variables_evolutions
        if self.key_nesting is not None:
            extra["keyNesting"] = [[name, None if parts is None else list(parts)] for name, parts in self.key_nesting]
        if self.value_names is not None:
            extra["valueNames"] = list(self.value_names)
        return json.dumps(
            {
                **extra,
                "formatVersion": FORMAT_VERSION,
                "operatorId": self.operator_id,
                "operatorName": self.operator_name,
                "numPartitions": self.num_partitions,
                "keySchema": _fields(_spark_named(self.key_schema)),
                "valueSchema": _fields(_spark_named(self.value_schema)),
                "keyFields": [field_to_json(f) for f in _spark_named(self.key_schema)],
                "valueFields": [field_to_json(f) for f in _spark_named(self.value_schema)],
            },
            indent=1,
        )


def read_schema_file(fs: CheckpointFileSystem, path: str, operator_id: int) -> dict | None:  # type: ignore[type-arg]
    """The parsed state schema file of one operator, verified; None when it is missing."""
    fix = (
        f"The state of stateful operator {operator_id} cannot be checked against the query. "
        "Restore the file (and its .crc) from a backup, or start the query with a new "
        "checkpoint location."
    )
    try:
        raw = read_checked(fs, path)
    except FileNotFoundError:
        return None
    except ChecksumMismatchError as exc:
        raise ChecksumMismatchError(f"{exc} {fix}", path=path) from exc
    except OSError as exc:
        raise CheckpointError(f"Cannot read state schema file {path}: {exc}. {fix}", path=path) from exc
    try:
        stored = json.loads(raw.decode("utf-8"))
    except ValueError as exc:  # UnicodeDecodeError is a ValueError
        raise CheckpointError(f"State schema file {path} is corrupt: {exc}. {fix}", path=path) from exc
    if not isinstance(stored, dict):
        raise CheckpointError(
            f"State schema file {path} is corrupt: it holds a JSON {type(stored).__name__}, not "
            f"an object. {fix}",
            path=path,
        )
    if stored.get("formatVersion") != FORMAT_VERSION:
        raise CheckpointError(
            f"State schema file {path} has format version {stored.get('formatVersion')!r}; "
            f"this lockgate reads version {FORMAT_VERSION}: the file was written by another "
            f"lockgate version, or damaged. {fix}",
            path=path,
        )
    # a file that parses as JSON but not as a schema file (edited, or another tool's)
    # fails here naming the file, not later with a TypeError of whoever reads it
    problem = None
    for name, kind, label in (("operatorName", str, "a string"), ("numPartitions", int, "an integer"), ("operatorId", int, "an integer")):
        value = stored.get(name)
        if not isinstance(value, kind) or isinstance(value, bool):
            problem = f"{name} is {value!r}, expected {label}"
            break
    if problem is None:
        try:
            for which in ("key", "value"):
                stored_schema(stored, which)
        except (CheckpointError, TypeError, KeyError, ValueError, AttributeError, IndexError) as exc:
            problem = f"{type(exc).__name__}: {exc}"
    if problem is not None:
        raise CheckpointError(f"State schema file {path} is corrupt: {problem}. {fix}", path=path)
    return stored


def _same_names_hint(old: pa.Schema, new: pa.Schema) -> str:
    """Where only the types of same-named fields differ, the likely cause besides a
    changed query: an earlier lockgate kept those buffers in other types (avg of a short
    decimal, for one, is now kept as Spark's optimizer computes it, as a double; and
    approx_count_distinct's distinct values are now its HyperLogLog++ registers)."""
    renamed = [
        n.removesuffix("_distinctValues") + "_registers" if n.endswith("_distinctValues") else n
        for n in old.names
    ]
    if old.names != new.names and renamed != new.names:
        return ""
    return (
        " The fields are the same, with other types: if the query did not change, an "
        "earlier lockgate version wrote this state with those types; run the query on that "
        "version until its state is no longer needed, or start it with a new checkpoint "
        "location."
    )


def check_or_write(
    fs: CheckpointFileSystem, state_root: str, schema: OperatorStateSchema, *, check_schemas: bool = True
) -> None:
    """Write the operator's schema file on its first batch; on a restart refuse a query
    whose operator or partition count changed, and (unless ``check_schemas`` is off:
    ``spark.sql.streaming.stateStore.stateSchemaCheck=false``) whose key or value
    schema is incompatible by Spark's rules. The file keeps the first run's schema.

    Then (every run, as Spark) the operator's metadata file in Spark's format, which
    Spark's ``state-metadata`` source and state tools read
    (:mod:`lockgate.state.operator_metadata`)."""
    _check_or_write_schema(fs, state_root, schema, check_schemas=check_schemas)
    write_operator_metadata(
        fs, state_root, OperatorMetadata(
            schema.operator_id, schema.operator_name, schema.metadata_partitions or schema.num_partitions
        )
    )


def _check_or_write_schema(
    fs: CheckpointFileSystem, state_root: str, schema: OperatorStateSchema, *, check_schemas: bool
) -> None:
    path = fs.join(state_root, str(schema.operator_id), "_metadata", "schema")
    stored = read_schema_file(fs, path, schema.operator_id)
    if stored is None:
        write_checked(fs, path, schema.to_json().encode("utf-8"), overwrite=True)
        return
    op = f"stateful operator {schema.operator_id} ({schema.operator_name})"
    differences = []
    renamed = (stored.get("operatorName"), schema.operator_name) == (TRANSFORM_WITH_STATE_NAME, TRANSFORM_WITH_STATE_ROW_NAME)
    # (lockgate named the Row-based transformWithState as the pandas one before)
    if stored.get("operatorName") != schema.operator_name and not renamed:
        differences.append(
            f"the operator was {stored.get('operatorName')!r} and is now {schema.operator_name!r}"
        )
    if stored.get("numPartitions") != schema.num_partitions:
        differences.append(
            f"the state has {stored.get('numPartitions')} partitions and the query now "
            f"uses {schema.num_partitions}"
        )
    if differences:
        raise CheckpointError(
            f"The query's {op} is incompatible with the state in the checkpoint: "
            + "; ".join(differences)
            + ". Restore the original query or start it with a new checkpoint location.",
            path=path,
        )
    # Spark's StateSchemaCompatibilityChecker: names are not compared, types are (at
    # any depth), and a column the state holds as non-nullable may not become nullable.
    pairs = [
        ("key", stored_schema(stored, "key"), schema.key_schema, ""),
        ("value", stored_schema(stored, "value"), schema.value_schema, ""),
    ]
    if schema.variables_since is not None:  # per state variable, by name
        old_values = stored_schema(stored, "value")
        old_names = set(old_values.names)
        pairs[1:] = [
            ("value", pa.schema([old_values.field(f.name)]), pa.schema([f]), f" (state variable {f.name!r})")
            for f in schema.value_schema
            if f.name in old_names
        ]
    evolutions = dict(stored.get("stateVariablesEvolutions") or {})
    if schema.variables_since is not None and schema.evolution_threshold is not None:
        # avro: each variable's value schema may evolve (Spark's Avro schema resolution)
        old_values = stored_schema(stored, "value")
        pairs[1:] = []
        for f in schema.value_schema:
            if f.name not in old_values.names or not check_schemas:
                continue
            old = old_values.field(f.name)
            if schemas_compatible(pa.schema([old]), pa.schema([f])) and old.type.equals(f.type):
                continue
            if not avro_evolvable(old.type, f.type):
                raise CheckpointError(
                    "[STATE_STORE_INVALID_VALUE_SCHEMA_EVOLUTION] Schema evolution is not "
                    f"possible new_value_schema={spark_type_string(f.type)} and old_value_schema="
                    f"{spark_type_string(old.type)}. Avro's schema resolution allows adding "
                    "and removing nullable fields, reordering fields, and widening a type "
                    "(int to long, float or double; long to float or double; float to double; "
                    "string to binary and back). (The query's "
                    f"{op} (state variable {f.name!r}), state schema file {path}.) Keep the "
                    "field's type, give the variable a new name, or start the query with a "
                    "new checkpoint location.",
                    path=path,
                )
            evolutions[f.name] = int(evolutions.get(f.name, 0)) + 1
            if evolutions[f.name] > schema.evolution_threshold:
                raise CheckpointError(
                    "[STATE_STORE_VALUE_SCHEMA_EVOLUTION_THRESHOLD_EXCEEDED] The number of "
                    f"state schema evolutions {evolutions[f.name]} exceeds the maximum number "
                    f"of state schema evolutions, {schema.evolution_threshold}, allowed for "
                    f"this column family. Offending column family: {f.name}. Please set "
                    "'spark.sql.streaming.stateStore.valueStateSchemaEvolutionThreshold' to a "
                    "higher number, or revert the state schema modification.",
                    path=path,
                )
        schema = dataclasses.replace(schema, variables_evolutions=evolutions or None)
    for which, old_schema, new_schema, variable in pairs if check_schemas else []:
        error_class = f"STATE_STORE_{which.upper()}_SCHEMA_NOT_COMPATIBLE"
        if not schemas_compatible(old_schema, new_schema):
            raise CheckpointError(
                f"[{error_class}] Provided {which} schema does not match existing state "
                f"{which} schema. Please check number and type of fields. Existing "
                f"{which}_schema={_fields(_spark_named(old_schema))} and new {which}_schema="
                f"{_fields(_spark_named(new_schema))}. If you want to force running the query without "
                "schema validation, please set spark.sql.streaming.stateStore.stateSchemaCheck "
                "to false. However, please note that running the query with incompatible "
                f"schema could cause non-deterministic behavior. (The query's {op}{variable}, "
                f"state schema file {path}.{_same_names_hint(old_schema, new_schema)})",
                path=path,
            )
    if schema.variables_since is not None and (
        renamed
        or not stored_schema(stored, "value").equals(schema.value_schema)
        or stored.get("stateVariablesSince") != schema.variables_since
        or stored.get("stateVariablesRemoved") != (schema.variables_removed or None)
        or stored.get("stateVariablesGaps") != (schema.variables_gaps or None)
        or stored.get("timeMode") != schema.time_mode
        or stored.get("outputMode") != schema.output_mode
        or stored.get("stateVariablesDeletedInInit")
        != ([list(v) for v in schema.variables_deleted_in_init] if schema.variables_deleted_in_init else None)
        or stored.get("stateVariablesEvolutions") != schema.variables_evolutions
        or stored.get("encodingFormat") != ("avro" if schema.evolution_threshold is not None else None)
    ):
        # variables added, removed or evolved: the file now describes the query's (Spark
        # writes a new schema file then)
        write_checked(fs, path, schema.to_json().encode("utf-8"), overwrite=True)


_AVRO_WIDENINGS = {
    "int8": ("int16", "int32", "int64", "float", "double"),
    "int16": ("int32", "int64", "float", "double"),
    "int32": ("int64", "float", "double"),
    "int64": ("float", "double"),
    "float": ("double",),
    "string": ("binary",),
    "binary": ("string",),
}


def avro_evolvable(old: pa.DataType, new: pa.DataType) -> bool:
    """Whether state written as ``old`` reads as ``new`` by Avro's schema resolution,
    which Spark applies to state encoded as Avro: struct fields matched by name (one
    added reads as null, one removed is skipped), lists and maps element-wise, and a
    type widened as Avro promotes it (Spark's bytes and shorts are Avro ints)."""
    if pa.types.is_struct(old) and pa.types.is_struct(new):
        before = {old.field(i).name: old.field(i).type for i in range(old.num_fields)}
        return all(
            avro_evolvable(before[f.name], f.type) if f.name in before else f.nullable for f in new
        )
    if pa.types.is_map(old) and pa.types.is_map(new):
        return avro_evolvable(old.key_type, new.key_type) and avro_evolvable(old.item_type, new.item_type)
    if pa.types.is_list(old) and pa.types.is_list(new):
        return avro_evolvable(old.value_type, new.value_type)
    if _types_compatible(old, new):
        return True
    return str(new) in _AVRO_WIDENINGS.get(str(old), ())


def spark_type_string(t: pa.DataType) -> str:
    """An Arrow type of state as Spark's Scala ``DataType.toString`` renders it
    (``StructType(StructField(id,IntegerType,true))``), for Spark's error messages."""
    if pa.types.is_struct(t):
        fields = ",".join(
            f"StructField({t.field(i).name},{spark_type_string(t.field(i).type)},{str(t.field(i).nullable).lower()})"
            for i in range(t.num_fields)
        )
        return f"StructType({fields})"
    if pa.types.is_map(t):
        return f"MapType({spark_type_string(t.key_type)},{spark_type_string(t.item_type)},{str(t.item_field.nullable).lower()})"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return f"ArrayType({spark_type_string(t.value_type)},{str(t.value_field.nullable).lower()})"
    if pa.types.is_decimal(t):
        return f"DecimalType({t.precision},{t.scale})"
    if pa.types.is_timestamp(t):
        return "TimestampType" if t.tz is not None else "TimestampNTZType"
    names = {
        "int8": "ByteType", "int16": "ShortType", "int32": "IntegerType", "int64": "LongType",
        "float": "FloatType", "double": "DoubleType", "string": "StringType", "large_string": "StringType",
        "binary": "BinaryType", "large_binary": "BinaryType", "bool": "BooleanType", "date32[day]": "DateType",
        "null": "NullType",
    }
    return names.get(str(t), str(t))


def stored_schema(meta: dict, which: str) -> pa.Schema:  # type: ignore[type-arg]
    """The key or value schema of a state schema file: from its tree form, or from the
    type renderings of files written before it had one; a struct with duplicated field
    names as the state files hold it (:func:`_spark_named`)."""
    if f"{which}Fields" in meta:
        fields = [field_from_json(f) for f in meta[f"{which}Fields"]]
    else:
        fields = [pa.field(n, parse_arrow_type(t)) for n, t in meta.get(f"{which}Schema", [])]
    return pa.schema([f.with_type(unique_arrow_names(f.type)) for f in fields])


def _spark_named(schema: pa.Schema) -> pa.Schema:
    """``schema`` with the nested field names Spark gives its columns: a struct with
    duplicated field names is held under unique names
    (:func:`~lockgate.state.arrow_types.unique_field_names`), and the schema file shows
    it as Spark's own state schema does; :func:`stored_schema` reads it back."""
    return pa.schema([f.with_type(spark_names(f.type)) for f in schema])


def schemas_compatible(stored: pa.Schema, new: pa.Schema) -> bool:
    """Spark's ``DataType.equalsIgnoreNameAndCompatibleNullability(new, stored)``: the
    same number of columns, pairwise the same types ignoring field names at any depth
    (and time zones: state holds UTC), and nullable only where the state is."""
    if len(stored) != len(new):
        return False
    return all(
        (s.nullable or not n.nullable) and _types_compatible(s.type, n.type) for s, n in zip(stored, new)
    )


def _types_compatible(stored: pa.DataType, new: pa.DataType) -> bool:
    if pa.types.is_struct(stored) and pa.types.is_struct(new):
        return stored.num_fields == new.num_fields and all(
            (stored.field(i).nullable or not new.field(i).nullable)
            and _types_compatible(stored.field(i).type, new.field(i).type)
            for i in range(stored.num_fields)
        )
    if pa.types.is_map(stored) and pa.types.is_map(new):
        return (
            _types_compatible(stored.key_type, new.key_type)
            and (stored.item_field.nullable or not new.item_field.nullable)
            and _types_compatible(stored.item_type, new.item_type)
        )
    lists = (pa.types.is_list, pa.types.is_large_list, pa.types.is_fixed_size_list)
    for is_list in lists:
        if is_list(stored) and is_list(new):
            if pa.types.is_fixed_size_list(stored) and stored.list_size != new.list_size:
                return False
            return (stored.value_field.nullable or not new.value_field.nullable) and _types_compatible(
                stored.value_type, new.value_type
            )
    if pa.types.is_timestamp(stored) and pa.types.is_timestamp(new):
        return stored.unit == new.unit and (stored.tz is None) == (new.tz is None)
    return stored.equals(new)


def check_operator_count(fs: CheckpointFileSystem, state_root: str, count: int) -> None:
    existing = sorted(int(n) for n in fs.list_names(state_root) if n.isdigit())
    extra = [n for n in existing if n >= count]
    if extra:
        raise CheckpointError(
            f"The checkpoint has state for stateful operators {existing} but the query now has "
            f"{count}: the number of stateful operators changed. Restore the original query or "
            "start it with a new checkpoint location.",
            path=state_root,
        )

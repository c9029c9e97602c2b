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

import json
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from lockgate.checkpoint.checksum import ChecksumMismatchError, read_checked, write_checked
from lockgate.checkpoint.fs import CheckpointFileSystem
from lockgate.errors import CheckpointError
from lockgate.state.arrow_types import field_from_json, field_to_json, parse_arrow_type
from lockgate.state.operator_metadata import OperatorMetadata, write_operator_metadata

FORMAT_VERSION = 1


def _fields(schema: pa.Schema) -> list[list[str]]:
    return [[f.name, str(f.type)] for f in schema]


TRANSFORM_WITH_STATE_NAME = "transformWithStateInPandasExec"
"""The operator name of ``transformWithState(InPandas)`` (Spark's, in progress and the
state schema file)."""
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
                "keySchema": _fields(self.key_schema),
                "valueSchema": _fields(self.value_schema),
                "keyFields": [field_to_json(f) for f in self.key_schema],
                "valueFields": [field_to_json(f) for f in self.value_schema],
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
    return stored


def _same_names_hint(old: pa.Schema, new: pa.Schema) -> str:
    """Where only the types of same-named fields differ, the likely cause besides a
    changed query: an earlier lockgate kept those buffers in other types (avg of a short
    decimal, for one, is now kept as Spark's optimizer computes it, as a double)."""
    if old.names != new.names:
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
    if stored.get("formatVersion") != FORMAT_VERSION:
        raise CheckpointError(
            f"State schema file {path} has format version {stored.get('formatVersion')!r}; "
            f"this lockgate reads version {FORMAT_VERSION}.",
            path=path,
        )
    op = f"stateful operator {schema.operator_id} ({schema.operator_name})"
    differences = []
    if stored.get("operatorName") != schema.operator_name:
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
    for which, old_schema, new_schema, variable in pairs if check_schemas else []:
        error_class = f"STATE_STORE_{which.upper()}_SCHEMA_NOT_COMPATIBLE"
        if not schemas_compatible(old_schema, new_schema):
            raise CheckpointError(
                f"[{error_class}] Provided {which} schema does not match existing state "
                f"{which} schema. Please check number and type of fields. Existing "
                f"{which}_schema={_fields(old_schema)} and new {which}_schema="
                f"{_fields(new_schema)}. If you want to force running the query without "
                "schema validation, please set spark.sql.streaming.stateStore.stateSchemaCheck "
                "to false. However, please note that running the query with incompatible "
                f"schema could cause non-deterministic behavior. (The query's {op}{variable}, "
                f"state schema file {path}.{_same_names_hint(old_schema, new_schema)})",
                path=path,
            )
    if schema.variables_since is not None and (
        stored_schema(stored, "value").names != schema.value_schema.names
        or stored.get("stateVariablesSince") != schema.variables_since
        or stored.get("stateVariablesRemoved") != (schema.variables_removed or None)
        or stored.get("stateVariablesGaps") != (schema.variables_gaps or None)
        or stored.get("timeMode") != schema.time_mode
    ):
        # variables added or removed: the file now describes the query's (Spark writes a
        # new schema file then)
        write_checked(fs, path, schema.to_json().encode("utf-8"), overwrite=True)


def stored_schema(meta: dict, which: str) -> pa.Schema:  # type: ignore[type-arg]
    """The key or value schema of a state schema file: from its tree form, or from the
    type renderings of files written before it had one."""
    if f"{which}Fields" in meta:
        return pa.schema([field_from_json(f) for f in meta[f"{which}Fields"]])
    return pa.schema([pa.field(n, parse_arrow_type(t)) for n, t in meta.get(f"{which}Schema", [])])


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

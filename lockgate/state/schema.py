"""``<checkpoint>/state/<operatorId>/_metadata/schema``: what each stateful operator stores.

Written by the driver on an operator's first batch; on restart a query whose operator
kind, key schema, value schema or partition count differ is refused before any state
is touched, with an error naming the operator and the difference.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pyarrow as pa

from lockgate.checkpoint.checksum import ChecksumMismatchError, read_checked, write_checked
from lockgate.checkpoint.fs import CheckpointFileSystem
from lockgate.errors import CheckpointError
from lockgate.state.arrow_types import field_to_json, without_time_zones

FORMAT_VERSION = 1


def _fields(schema: pa.Schema) -> list[list[str]]:
    return [[f.name, str(f.type)] for f in schema]


@dataclass(frozen=True)
class OperatorStateSchema:
    operator_id: int
    operator_name: str
    key_schema: pa.Schema
    value_schema: pa.Schema
    num_partitions: int

    def to_json(self) -> str:
        return json.dumps(
            {
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


def _strip_tz(fields: list[list[str]]) -> list[list[str]]:
    return [[n, without_time_zones(t)] for n, t in fields]


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
        if not isinstance(stored, dict):
            raise ValueError(f"expected a JSON object, got {type(stored).__name__}")
    except ValueError as exc:  # UnicodeDecodeError is a ValueError
        raise CheckpointError(f"State schema file {path} is corrupt: {exc}. {fix}", path=path) from exc
    return stored


def check_or_write(fs: CheckpointFileSystem, state_root: str, schema: OperatorStateSchema) -> None:
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
    new_key, new_value = _fields(schema.key_schema), _fields(schema.value_schema)
    if _strip_tz(stored.get("keySchema", [])) != _strip_tz(new_key):
        differences.append(f"key schema was {stored.get('keySchema')} and is now {new_key}")
    if _strip_tz(stored.get("valueSchema", [])) != _strip_tz(new_value):
        differences.append(f"value schema was {stored.get('valueSchema')} and is now {new_value}")
    if differences:
        raise CheckpointError(
            f"The query's {op} is incompatible with the state in the checkpoint: "
            + "; ".join(differences)
            + ". Restore the original query or start it with a new checkpoint location.",
            path=path,
        )


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

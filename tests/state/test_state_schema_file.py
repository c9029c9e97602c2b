"""The state schema file's column types: written as trees, read back exactly; older
files, which have only Arrow's renderings, read back from those."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from lockgate.errors import CheckpointError
from lockgate.state.arrow_types import (
    field_from_json,
    field_to_json,
    parse_arrow_type,
    without_time_zones,
)
from lockgate.state.schema import OperatorStateSchema

TYPES = [
    pa.int64(),
    pa.float64(),
    pa.bool_(),
    pa.string(),
    pa.binary(),
    pa.date32(),
    pa.decimal128(38, 18),
    pa.timestamp("us", tz="UTC"),
    pa.timestamp("us"),
    pa.list_(pa.field("item", pa.int32(), False)),  # collect_set's buffer
    pa.list_(pa.field("element", pa.string())),
    pa.large_list(pa.int8()),
    pa.list_(pa.float64(), 3),
    pa.struct([pa.field("start", pa.timestamp("us", tz="Europe/Paris")), pa.field("end", pa.int64(), False)]),
    pa.map_(pa.string(), pa.list_(pa.struct([pa.field("a", pa.decimal128(10, 2))]))),
    pa.map_(pa.string(), pa.int32(), keys_sorted=True),
    pa.list_(pa.map_(pa.int32(), pa.field("v", pa.string(), False))),
]


@pytest.mark.parametrize("t", TYPES, ids=str)
def test_column_types_read_back_exactly(t):
    field = pa.field("c", t, False)
    stored = json.loads(json.dumps(field_to_json(field)))
    back = field_from_json(stored)
    assert back.equals(field, check_metadata=True)
    assert str(back.type) == str(t)  # field names of lists and maps too


@pytest.mark.parametrize("t", TYPES, ids=str)
def test_renderings_of_older_files_read_back(t):
    assert str(parse_arrow_type(str(t))) == str(t)


def test_schema_file_holds_both_forms():
    schema = OperatorStateSchema(
        0, "stateStoreSave", pa.schema([pa.field("k", pa.string())]), pa.schema([pa.field("s", TYPES[9])]), 2
    )
    data = json.loads(schema.to_json())
    assert data["valueSchema"] == [["s", "list<item: int32 not null>"]]
    assert data["valueFields"] == [
        {"name": "s", "nullable": True, "type": {"list": {"name": "item", "nullable": False, "type": "int32"}}}
    ]


def test_time_zones_left_out_at_every_depth():
    rendering = "struct<start: timestamp[us, tz=Europe/Paris], end: timestamp[us, tz=UTC]>"
    assert without_time_zones(rendering) == "struct<start: timestamp[us], end: timestamp[us]>"


def test_unknown_type_names_the_type():
    with pytest.raises(CheckpointError, match="'int33'"):
        parse_arrow_type("int33")


def test_restart_in_another_time_zone_keeps_a_struct_key(tmp_path):
    """A window key (struct of timestamps) renders with the session time zone; a restart
    under another zone reads the same UTC values and is not refused."""
    from lockgate.checkpoint.fs import resolve_filesystem
    from lockgate.state.schema import check_or_write

    def schema(tz: str, key_type: pa.DataType | None = None) -> OperatorStateSchema:
        window = pa.struct([pa.field("start", pa.timestamp("us", tz=tz)), pa.field("end", pa.timestamp("us", tz=tz))])
        keys = pa.schema([pa.field("window", key_type or window)])
        return OperatorStateSchema(0, "stateStoreSave", keys, pa.schema([pa.field("n", pa.int64())]), 2)

    fs, root = resolve_filesystem(str(tmp_path))
    check_or_write(fs, root, schema("UTC"))
    check_or_write(fs, root, schema("America/New_York"))
    with pytest.raises(CheckpointError, match="STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE"):
        check_or_write(fs, root, schema("UTC", pa.struct([pa.field("start", pa.int64())])))

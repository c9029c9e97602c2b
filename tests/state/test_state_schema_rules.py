"""The restart check of a stateful operator's state schema follows Spark's
StateSchemaCompatibilityChecker: column names are not compared (a renamed grouping
column of the same type is accepted), types are, at any depth; a non-nullable state
column may not become nullable; ``spark.sql.streaming.stateStore.stateSchemaCheck=false``
turns the key and value checks off. One case per rule here; the renamed-column case
is also run end to end against native Spark in tests/state/test_state_schema_restart.py."""

from __future__ import annotations

import pyarrow as pa
import pytest

from lockgate.checkpoint.fs import LocalFileSystem
from lockgate.errors import CheckpointError
from lockgate.state.schema import OperatorStateSchema, check_or_write

FS = LocalFileSystem()
WINDOW = pa.struct([pa.field("start", pa.timestamp("us", tz="UTC")), pa.field("end", pa.timestamp("us", tz="UTC"))])


def _schema(keys: list[pa.Field], values: list[pa.Field]) -> OperatorStateSchema:
    return OperatorStateSchema(0, "stateStoreSave", pa.schema(keys), pa.schema(values), 2)


FIRST = _schema(
    [pa.field("window", WINDOW), pa.field("k", pa.string())],
    [pa.field("n", pa.int64(), False), pa.field("xs", pa.list_(pa.field("item", pa.int32(), False)))],
)

# (rule, new schema, error class or None when Spark accepts it)
CASES = [
    ("renamed key column", _schema([pa.field("window", WINDOW), pa.field("key2", pa.string())], list(FIRST.value_schema)), None),
    ("renamed value column", _schema(list(FIRST.key_schema), [pa.field("count", pa.int64(), False), FIRST.value_schema.field(1)]), None),
    (
        "renamed nested struct field",
        _schema(
            [pa.field("w", pa.struct([pa.field("s", pa.timestamp("us", tz="UTC")), pa.field("e", pa.timestamp("us", tz="UTC"))])), FIRST.key_schema.field(1)],
            list(FIRST.value_schema),
        ),
        None,
    ),
    ("non-nullable becomes nullable", _schema(list(FIRST.key_schema), [pa.field("n", pa.int64(), True), FIRST.value_schema.field(1)]), "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE"),
    (
        "nested non-nullable becomes nullable",
        _schema(list(FIRST.key_schema), [FIRST.value_schema.field(0), pa.field("xs", pa.list_(pa.int32()))]),
        "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE",
    ),
    ("key type changed", _schema([pa.field("window", WINDOW), pa.field("k", pa.int64())], list(FIRST.value_schema)), "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE"),
    ("value type changed", _schema(list(FIRST.key_schema), [pa.field("n", pa.int32(), False), FIRST.value_schema.field(1)]), "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE"),
    ("key column added", _schema([*FIRST.key_schema, pa.field("k2", pa.string())], list(FIRST.value_schema)), "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE"),
    ("value column dropped", _schema(list(FIRST.key_schema), [FIRST.value_schema.field(0)]), "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE"),
    ("key columns swapped", _schema([FIRST.key_schema.field(1), FIRST.key_schema.field(0)], list(FIRST.value_schema)), "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE"),
    (
        "other session time zone",
        _schema([pa.field("window", pa.struct([pa.field("start", pa.timestamp("us", tz="Asia/Tokyo")), pa.field("end", pa.timestamp("us", tz="Asia/Tokyo"))])), FIRST.key_schema.field(1)], list(FIRST.value_schema)),
        None,
    ),
]


@pytest.mark.parametrize(("rule", "new", "error"), CASES, ids=[c[0] for c in CASES])
def test_sparks_compatibility_rules(tmp_path, rule, new, error):
    root = str(tmp_path / "state")
    check_or_write(FS, root, FIRST)
    if error is None:
        check_or_write(FS, root, new)
        check_or_write(FS, root, FIRST)  # the file keeps the first run's schema
    else:
        with pytest.raises(CheckpointError, match=rf"\[{error}\].*stateSchemaCheck to false") as info:
            check_or_write(FS, root, new)
        assert "stateful operator 0" in str(info.value) and "_metadata/schema" in str(info.value)
        # same names, other types: a lockgate version's buffers may be the cause
        hinted = "an earlier lockgate version wrote this state" in str(info.value)
        assert hinted == (new.key_schema.names == FIRST.key_schema.names and new.value_schema.names == FIRST.value_schema.names)
        check_or_write(FS, root, new, check_schemas=False)  # stateSchemaCheck=false


def test_operator_and_partition_changes_are_refused_even_without_the_schema_check(tmp_path):
    root = str(tmp_path / "state")
    check_or_write(FS, root, FIRST)
    other = OperatorStateSchema(0, "dedupe", FIRST.key_schema, FIRST.value_schema, 2)
    with pytest.raises(CheckpointError, match="the operator was 'stateStoreSave'"):
        check_or_write(FS, root, other, check_schemas=False)
    more = OperatorStateSchema(0, "stateStoreSave", FIRST.key_schema, FIRST.value_schema, 4)
    with pytest.raises(CheckpointError, match="2 partitions"):
        check_or_write(FS, root, more, check_schemas=False)

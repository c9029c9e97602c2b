"""Arrow types of state columns, written to and read from the state schema file.

Each column is stored twice in ``state/<operatorId>/_metadata/schema``: as the type's
Arrow rendering (``keySchema``/``valueSchema``, compared on restart and easy to read)
and as a tree (``keyFields``/``valueFields``) that names every nested field and its
nullability, which the state reader turns back into the exact type. The rendering
alone cannot always be read back (a nested field name may itself hold ``": "``);
files written before the trees existed are read from it by :func:`parse_arrow_type`.
"""

from __future__ import annotations

import re
from typing import Any

import pyarrow as pa

from lockgate.errors import CheckpointError

_TZ = re.compile(r"timestamp\[(\w+), tz=[^\]]*\]")


def without_time_zones(rendering: str) -> str:
    """``rendering`` with every timestamp's zone left out: state values are UTC
    microseconds, and Arrow renders them with the session time zone."""
    return _TZ.sub(r"timestamp[\1]", rendering)


# -- the tree form ----------------------------------------------------------------------
def field_to_json(field: pa.Field) -> dict[str, Any]:
    return {"name": field.name, "nullable": field.nullable, "type": type_to_json(field.type)}


def type_to_json(t: pa.DataType) -> Any:
    if pa.types.is_struct(t):
        return {"struct": [field_to_json(t.field(i)) for i in range(t.num_fields)]}
    if pa.types.is_map(t):
        return {"map": [field_to_json(t.key_field), field_to_json(t.item_field)], "keysSorted": t.keys_sorted}
    if pa.types.is_fixed_size_list(t):
        return {"fixed_size_list": field_to_json(t.value_field), "size": t.list_size}
    if pa.types.is_large_list(t):
        return {"large_list": field_to_json(t.value_field)}
    if pa.types.is_list(t):
        return {"list": field_to_json(t.value_field)}
    rendering = str(t)
    if "<" in rendering:
        raise CheckpointError(f"State column type {rendering!r} cannot be stored in the state schema file.")
    return rendering


def field_from_json(data: dict[str, Any]) -> pa.Field:
    return pa.field(data["name"], type_from_json(data["type"]), bool(data["nullable"]))


def type_from_json(data: Any) -> pa.DataType:
    if isinstance(data, str):
        return _flat_type(data)
    if "struct" in data:
        return pa.struct([field_from_json(f) for f in data["struct"]])
    if "map" in data:
        key, item = (field_from_json(f) for f in data["map"])
        return pa.map_(key, item, keys_sorted=bool(data.get("keysSorted", False)))
    if "fixed_size_list" in data:
        return pa.list_(field_from_json(data["fixed_size_list"]), int(data["size"]))
    if "large_list" in data:
        return pa.large_list(field_from_json(data["large_list"]))
    if "list" in data:
        return pa.list_(field_from_json(data["list"]))
    raise CheckpointError(f"Unknown state column type {data!r} in the state schema file.")


# -- the rendering ----------------------------------------------------------------------
def parse_arrow_type(text: str) -> pa.DataType:
    """The Arrow type whose ``str()`` is ``text`` (for state schema files that have no
    tree form). Nested field names are taken up to their first ``": "``."""
    text = text.strip()
    nested = re.fullmatch(r"(\w+)<(.*)>(?:\[(\d+)\])?", text, re.DOTALL)
    if nested is None or nested.group(1) == "dictionary":
        return _flat_type(text)
    kind, inner, size = nested.groups()
    if kind == "struct":
        return pa.struct([_parse_field(part) for part in _split_top_level(inner)])
    if kind == "map":
        parts = _split_top_level(inner)
        keys_sorted = parts[-1] == "keys_sorted"
        key, item = parts[:2]
        item_name = re.search(r" \('([^']*)'\)$", item)
        if item_name:
            item = item[: item_name.start()]
        item_field = _parse_field(f"{item_name.group(1) if item_name else 'value'}: {item}")
        return pa.map_(pa.field("key", parse_arrow_type(key), False), item_field, keys_sorted=keys_sorted)
    if kind in ("list", "large_list", "fixed_size_list"):
        item = _parse_field(inner)
        if kind == "large_list":
            return pa.large_list(item)
        return pa.list_(item, int(size)) if size else pa.list_(item)
    raise CheckpointError(f"Unsupported state column type {text!r} in the state schema file.")


def _parse_field(text: str) -> pa.Field:
    name, sep, rest = text.partition(": ")
    if not sep:
        raise CheckpointError(f"Unsupported state column field {text!r} in the state schema file.")
    nullable = not rest.endswith(" not null")
    return pa.field(name, parse_arrow_type(rest.removesuffix(" not null")), nullable)


def _split_top_level(text: str) -> list[str]:
    """``text`` split at the ``", "`` that are outside any brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "<[(":
            depth += 1
        elif ch in ">])":
            depth -= 1
        elif depth == 0 and text.startswith(", ", i):
            parts.append(text[start:i])
            start = i + 2
    parts.append(text[start:])
    return parts


def _flat_type(text: str) -> pa.DataType:
    timestamp = re.fullmatch(r"timestamp\[(\w+)(?:, tz=(.*))?\]", text)
    if timestamp:
        return pa.timestamp(timestamp.group(1), tz=timestamp.group(2))
    decimal = re.fullmatch(r"decimal(128|256)\((\d+), ?(\d+)\)", text)
    if decimal:
        make = pa.decimal128 if decimal.group(1) == "128" else pa.decimal256
        return make(int(decimal.group(2)), int(decimal.group(3)))
    fixed = re.fullmatch(r"fixed_size_binary\[(\d+)\]", text)
    if fixed:
        return pa.binary(int(fixed.group(1)))
    try:
        return pa.type_for_alias(text)
    except (ValueError, KeyError):
        raise CheckpointError(f"Unsupported state column type {text!r} in the state schema file.") from None


# -- from Spark's types -------------------------------------------------------------------
def spark_type_to_arrow(data_type: Any, timezone: str) -> pa.DataType:
    """The Arrow type PySpark gives a Spark SQL ``data_type`` (timestamps in ``timezone``),
    its nested fields under :func:`unique_field_names`."""
    from pyspark.sql.pandas.types import to_arrow_type

    data_type = unique_field_names(data_type)
    try:
        return to_arrow_type(data_type, timezone=timezone)
    except TypeError:  # older signature
        return to_arrow_type(data_type)


def schema_to_arrow(schema: Any, timezone: str) -> pa.Schema:
    """The Arrow schema of a Spark ``StructType``, every field nullable (state columns)."""
    return pa.schema([pa.field(f.name, spark_type_to_arrow(f.dataType, timezone), True) for f in schema.fields])


# -- structs with duplicated field names ----------------------------------------------------
# Spark allows a struct two fields of one name (``struct(col, col)``, two aliases ``x``,
# a struct of a join's columns), Arrow does not: Spark refuses to send such a struct to
# Python (DUPLICATED_FIELD_NAME_IN_ARROW_STRUCT) and pyarrow cannot turn it into Python
# values. Between the JVM and a state step such a struct's repeated names carry a
# numbered suffix, one both sides derive from the Spark type; Spark casts them on the
# way in and back on the way out (structs cast by position), and the state schema file
# shows the names Spark gave them (:func:`spark_names`).
_DUPLICATE = "#lockgate"
_DUPLICATE_SUFFIX = re.compile(re.escape(_DUPLICATE) + r"\d+$")


def unique_field_names(data_type: Any) -> Any:
    """``data_type`` (a Spark SQL type) with the repeated names of every struct at any
    depth made unique: the second ``ts`` of ``struct<ts, ts>`` becomes ``ts#lockgate1``.
    The same object when no struct repeats a name; the top level of a schema (a
    DataFrame's columns) is kept as it is."""
    from pyspark.sql.types import ArrayType, MapType, StructField, StructType

    if isinstance(data_type, ArrayType):
        element = unique_field_names(data_type.elementType)
        if element is data_type.elementType:
            return data_type
        return ArrayType(element, data_type.containsNull)
    if isinstance(data_type, MapType):
        key, value = unique_field_names(data_type.keyType), unique_field_names(data_type.valueType)
        if key is data_type.keyType and value is data_type.valueType:
            return data_type
        return MapType(key, value, data_type.valueContainsNull)
    if not isinstance(data_type, StructType):
        return data_type
    types = [unique_field_names(f.dataType) for f in data_type.fields]
    names = _unique(data_type.names)
    if names == data_type.names and all(t is f.dataType for t, f in zip(types, data_type.fields)):
        return data_type
    return StructType(
        [StructField(n, t, f.nullable, f.metadata) for n, t, f in zip(names, types, data_type.fields)]
    )


def unique_column_types(schema: Any) -> Any:
    """A DataFrame's schema with :func:`unique_field_names` in each column's type (the
    column names stay: Arrow allows a batch two columns of one name)."""
    from pyspark.sql.types import StructField, StructType

    fields = [StructField(f.name, unique_field_names(f.dataType), f.nullable, f.metadata) for f in schema.fields]
    if all(f.dataType is g.dataType for f, g in zip(fields, schema.fields)):
        return schema
    return StructType(fields)


def _unique(names: list[str]) -> list[str]:
    if len(set(names)) == len(names):
        return names
    taken = set(names)
    seen: set[str] = set()
    result = []
    for name in names:
        unique, n = name, 0
        while unique in seen or (unique != name and unique in taken):
            n += 1
            unique = f"{name}{_DUPLICATE}{n}"
        seen.add(unique)
        result.append(unique)
    return result


def unique_arrow_names(t: pa.DataType) -> pa.DataType:
    """:func:`unique_field_names` of an Arrow type: the type :func:`spark_type_to_arrow`
    gives the Spark type that ``t`` is the Arrow type of (a state schema file's type,
    written under Spark's names, read back as the state files hold it)."""
    if pa.types.is_struct(t):
        fields = [t.field(i) for i in range(t.num_fields)]
        names = _unique([f.name for f in fields])
        return pa.struct([pa.field(n, unique_arrow_names(f.type), f.nullable, f.metadata) for n, f in zip(names, fields)])
    if pa.types.is_map(t):
        key, item = t.key_field, t.item_field
        return pa.map_(
            key.with_type(unique_arrow_names(key.type)), item.with_type(unique_arrow_names(item.type)), keys_sorted=t.keys_sorted
        )
    if pa.types.is_fixed_size_list(t):
        return pa.list_(t.value_field.with_type(unique_arrow_names(t.value_type)), t.list_size)
    if pa.types.is_large_list(t):
        return pa.large_list(t.value_field.with_type(unique_arrow_names(t.value_type)))
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(unique_arrow_names(t.value_type)))
    return t


def spark_field_names(data_type: Any) -> Any:
    """``data_type`` (a Spark SQL type of :func:`unique_field_names`) with the names
    Spark gives its fields at any depth, the suffixes taken off again."""
    from pyspark.sql.types import ArrayType, MapType, StructField, StructType

    if isinstance(data_type, ArrayType):
        return ArrayType(spark_field_names(data_type.elementType), data_type.containsNull)
    if isinstance(data_type, MapType):
        return MapType(
            spark_field_names(data_type.keyType), spark_field_names(data_type.valueType), data_type.valueContainsNull
        )
    if not isinstance(data_type, StructType):
        return data_type
    return StructType(
        [
            StructField(_DUPLICATE_SUFFIX.sub("", f.name), spark_field_names(f.dataType), f.nullable, f.metadata)
            for f in data_type.fields
        ]
    )


def spark_names(t: pa.DataType) -> pa.DataType:
    """``t`` (an Arrow type of :func:`spark_type_to_arrow`) with the names Spark gives
    its nested fields, the suffixes :func:`unique_field_names` added taken off again."""
    if pa.types.is_struct(t):
        return pa.struct([spark_names_field(t.field(i)) for i in range(t.num_fields)])
    if pa.types.is_map(t):
        return pa.map_(spark_names_field(t.key_field), spark_names_field(t.item_field), keys_sorted=t.keys_sorted)
    if pa.types.is_fixed_size_list(t):
        return pa.list_(spark_names_field(t.value_field), t.list_size)
    if pa.types.is_large_list(t):
        return pa.large_list(spark_names_field(t.value_field))
    if pa.types.is_list(t):
        return pa.list_(spark_names_field(t.value_field))
    return t


def spark_names_field(field: pa.Field) -> pa.Field:
    """``field`` under the name Spark gives it, its type under :func:`spark_names`."""
    name = _DUPLICATE_SUFFIX.sub("", field.name)
    return pa.field(name, spark_names(field.type), field.nullable, field.metadata)

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
    """The Arrow type PySpark gives a Spark SQL ``data_type`` (timestamps in ``timezone``)."""
    from pyspark.sql.pandas.types import to_arrow_type

    try:
        return to_arrow_type(data_type, timezone=timezone)
    except TypeError:  # older signature
        return to_arrow_type(data_type)


def schema_to_arrow(schema: Any, timezone: str) -> pa.Schema:
    """The Arrow schema of a Spark ``StructType``, every field nullable (state columns)."""
    return pa.schema([pa.field(f.name, spark_type_to_arrow(f.dataType, timezone), True) for f in schema.fields])

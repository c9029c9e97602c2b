"""Spark's session catalog as the API reads it: whether a temporary view of a name
exists (``ls.sql``'s views share Spark's namespace), and what a catalog table is
(``readStream.table``: the file source over a table stored as files)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyspark.sql.types import StructType

from lockgate.errors import AnalysisError, NotSupportedYetError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

FILE_TABLE_FORMATS = ("parquet", "orc", "json", "csv", "text")
"""The providers of the catalog tables lockgate streams: those its file source reads."""


def has_temp_view(spark: SparkSession, key: str) -> bool:
    """Whether Spark's catalog has the temporary view ``key`` (``name``, or
    ``database.name`` for a global one, in lower case)."""
    catalog = spark._jsparkSession.sessionState().catalog()
    parts = key.split(".")
    if len(parts) == 2:
        return bool(catalog.getGlobalTempView(parts[1]).isDefined())
    return bool(catalog.getTempView(parts[0]).isDefined())


@dataclass(frozen=True)
class FileTable:
    """A catalog table stored as files, as its file source streams it."""

    provider: str
    location: str
    schema: StructType
    """The table's schema, partition columns last."""
    options: dict[str, str]
    """The table's storage options, but its path."""


def file_table(spark: SparkSession, table_name: str) -> FileTable:
    """The catalog table ``table_name`` as Spark resolves it (Spark's
    ``TABLE_OR_VIEW_NOT_FOUND`` for a missing one); Spark's error for a temporary view,
    and a clear one for a table that is not stored as files."""
    node = spark.read.table(table_name)._jdf.queryExecution().analyzed()
    while node.getClass().getSimpleName() == "SubqueryAlias":
        node = node.child()
    kind = node.getClass().getSimpleName()
    if kind == "View" and node.isTempView():
        raise AnalysisError(
            f"{table_name} is not a temp view of streaming logical plan, please use batch "
            "API such as `DataFrameReader.table` to read it."
        )
    table = node.catalogTable() if kind == "LogicalRelation" else None
    provider = (
        str(table.get().provider().get()).lower()
        if table is not None and table.isDefined() and table.get().provider().isDefined()
        else None
    )
    if table is None or provider not in FILE_TABLE_FORMATS:
        what = f"a {provider} table" if provider else ("a view" if kind == "View" else f"a table read as {kind}")
        raise NotSupportedYetError(
            f"readStream.table({table_name!r}) of {what}",
            f"lockgate streams catalog tables stored as files ({', '.join(FILE_TABLE_FORMATS)}); "
            "read other sources with their own format.",
        )
    catalog_table = table.get()
    storage = catalog_table.storage().properties()
    options = {}
    keys = storage.keySet().iterator()
    while keys.hasNext():
        key = str(keys.next())
        if key.lower() != "path":
            options[key] = str(storage.apply(key))
    return FileTable(
        provider=provider,
        location=str(catalog_table.location().toString()),
        schema=StructType.fromJson(json.loads(str(catalog_table.schema().json()))),
        options=options,
    )

"""``toTable(name)``: a streaming write into a catalog table, through the file sink."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lockgate.errors import AnalysisError, NotSupportedYetError
from lockgate.sinks import lookup_sink

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType


_FILE_FORMATS = ("parquet", "json", "csv", "orc", "text")


def prepare_table(
    spark: SparkSession,
    name: str,
    schema: StructType,
    fmt: str | None,
    partition_by: tuple[str, ...],
    cluster_by: tuple[str, ...] = (),
) -> tuple[str, str]:
    """Create the table if missing; return its file format and location.

    A table of a format lockgate cannot write (``iceberg``, ``delta``...) is refused
    before anything is created.
    """
    fmt = (fmt or "parquet").lower()
    if not spark.catalog.tableExists(name):
        if fmt not in _FILE_FORMATS:
            lookup_sink(fmt)  # "Failed to find data source" for a format nobody registered
            raise NotSupportedYetError(
                f"toTable({name!r}) in format {fmt!r}",
                f"lockgate writes tables stored as files ({', '.join(_FILE_FORMATS)}).",
            )
        writer = spark.createDataFrame([], schema).write.format(fmt)
        if partition_by:
            writer = writer.partitionBy(*partition_by)
        if cluster_by:
            writer = writer.clusterBy(*cluster_by)
        writer.saveAsTable(name)
    rows = spark.sql(f"DESCRIBE TABLE EXTENDED {name}").collect()
    info = {str(r[0]).strip(): str(r[1]).strip() for r in rows if r[0]}
    provider = info.get("Provider", fmt).lower()
    location = info.get("Location")
    if not location:
        raise AnalysisError(f"Table {name} has no location; lockgate can write only file-based tables.")
    if provider not in _FILE_FORMATS:
        raise AnalysisError(
            f"Table {name} uses provider {provider!r}; lockgate's toTable writes parquet, json, "
            "csv, orc or text tables."
        )
    return provider, location

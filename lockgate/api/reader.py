"""``DataStreamReader``: ``ls.readStream``, as ``pyspark.sql.streaming.DataStreamReader``."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from pyspark.sql.types import StructType

from lockgate.api.dataframe import StreamingDataFrame
from lockgate.errors import AnalysisError
from lockgate.options import Options, to_option_string
from lockgate.plan.catalog import file_table
from lockgate.plan.nodes import StreamingRelation, source_evolution_enabled
from lockgate.sources import SourceProvider, lookup_source

if TYPE_CHECKING:
    from lockgate.api.session import StreamingSession


def check_source_evolution(spark: Any, source_name: str | None) -> None:
    """Spark refuses a named source unless source evolution is on. With it on, a query
    keys the offsets log (v2) and ``sources/`` by source name, and every source must be
    named (checked when the query's sources are set up, ``MicroBatchExecution``)."""
    if source_name is not None and not source_evolution_enabled(spark):
        raise AnalysisError.spark(
            "STREAMING_QUERY_EVOLUTION_ERROR.SOURCE_NAMING_NOT_SUPPORTED", {"name": source_name}
        )


class DataStreamReader:
    """Describes a streaming source; ``load()`` gives the streaming DataFrame."""

    def __init__(self, session: StreamingSession) -> None:
        self._session = session
        self._format: str | SourceProvider = "parquet"
        self._format_set = False
        self._options: dict[str, str] = {}
        self._schema: StructType | None = None
        self._source_name: str | None = None

    def format(self, source: str | SourceProvider) -> DataStreamReader:
        self._format = source
        self._format_set = True
        return self

    def name(self, source_name: str) -> DataStreamReader:
        """Name the source, as PySpark 4.2+ does for source evolution (PySpark's checks)."""
        from pyspark.errors import PySparkTypeError, PySparkValueError

        if not isinstance(source_name, str):
            raise PySparkTypeError(
                errorClass="NOT_EXPECTED_TYPE",
                messageParameters={
                    "arg_name": "source_name",
                    "expected_type": "str",
                    "arg_type": type(source_name).__name__,
                },
            )
        if not re.fullmatch(r"[a-zA-Z0-9_]+", source_name):
            raise PySparkValueError(
                errorClass="INVALID_STREAMING_SOURCE_NAME",
                messageParameters={"source_name": source_name},
            )
        self._source_name = source_name
        return self

    def schema(self, schema: StructType | str) -> DataStreamReader:
        if isinstance(schema, str):
            schema = self._session.spark.createDataFrame([], schema).schema
        if not isinstance(schema, StructType):
            raise TypeError(f"schema should be StructType or string, got {type(schema).__name__}")
        self._schema = schema
        return self

    def option(self, key: str, value: Any) -> DataStreamReader:
        self._options[key] = to_option_string(value)
        return self

    def options(self, **options: Any) -> DataStreamReader:
        for key, value in options.items():
            if value is not None:
                self.option(key, value)
        return self

    def load(
        self,
        path: str | None = None,
        format: str | None = None,
        schema: StructType | str | None = None,
        **options: Any,
    ) -> StreamingDataFrame:
        if self._source_name is not None:
            check_source_evolution(self._session.spark, self._source_name)
        if format is not None:
            self.format(format)
        if schema is not None:
            self.schema(schema)
        self.options(**options)
        if path is not None:
            if not isinstance(path, str) or not path.strip():
                raise ValueError("If the path is provided for stream, it needs to be a non-empty string.")
            self._options["path"] = path
        if isinstance(self._format, SourceProvider):
            provider = self._format
            name = provider.name or type(provider).__name__
        else:
            if not self._format_set and "path" not in self._options:
                self._format = self._session.spark.conf.get(
                    "spark.sql.sources.default", "parquet"
                ) or "parquet"
            name = self._format
            provider = lookup_source(name, self._session.spark)
        opts = Options(self._options, owner=f"{name} source option")
        schema_out = provider.sourceSchema(self._session.spark, opts, self._schema)
        if self._source_name is None and source_evolution_enabled(self._session.spark):
            # Spark refuses an unnamed source already here (and again when a query starts)
            raise AnalysisError.spark(
                "STREAMING_QUERY_EVOLUTION_ERROR.UNNAMED_STREAMING_SOURCES_WITH_ENFORCEMENT",
                {"sourceInfo": f"Leaf position 0 - {name}"},
            )
        relation = StreamingRelation(
            provider=provider,
            source_name=name,
            options=tuple(self._options.items()),
            schema=schema_out,
            user_schema=self._schema,
            user_name=self._source_name,
        )
        return StreamingDataFrame._from_plan(self._session, relation)

    def _file(self, fmt: str, path: str, schema: Any, options: dict[str, Any]) -> StreamingDataFrame:
        if not isinstance(path, str):
            raise TypeError(f"path can be only a single string, got {type(path).__name__}")
        return self.load(path=path, format=fmt, schema=schema, **options)

    def json(self, path: str, schema: StructType | str | None = None, **options: Any) -> StreamingDataFrame:
        return self._file("json", path, schema, options)

    def csv(self, path: str, schema: StructType | str | None = None, **options: Any) -> StreamingDataFrame:
        return self._file("csv", path, schema, options)

    def parquet(self, path: str, **options: Any) -> StreamingDataFrame:
        return self._file("parquet", path, options.pop("schema", None), options)

    def orc(self, path: str, **options: Any) -> StreamingDataFrame:
        return self._file("orc", path, options.pop("schema", None), options)

    def text(self, path: str, wholetext: bool = False, lineSep: str | None = None, **options: Any) -> StreamingDataFrame:
        # PySpark's text() sets wholetext always (False by default), overriding an
        # earlier option("wholetext", "true"), as native streaming then reads lines.
        options["wholetext"] = wholetext
        if lineSep is not None:
            options["lineSep"] = lineSep
        return self._file("text", path, None, options)

    def table(self, tableName: str) -> StreamingDataFrame:
        """A catalog table stored as files, streamed as Spark streams it: the file source
        over the table's location, in its format, with its schema (partition columns
        last) and storage options; options set on this reader take precedence."""
        if not isinstance(tableName, str) or not tableName.strip():
            raise ValueError("tableName should be a non-empty string")
        table = file_table(self._session.spark, tableName)
        for key, value in table.options.items():
            self._options.setdefault(key, value)
        return self.load(path=table.location, format=table.provider, schema=table.schema)

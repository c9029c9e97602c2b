"""``DataStreamWriter``: ``sdf.writeStream``, as ``pyspark.sql.streaming.DataStreamWriter``."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lockgate.api import read as _read  # noqa: F401 - a batch session's reader (assembly.BATCH_READER)
from lockgate.clock import Clock
from lockgate.errors import NotSupportedYetError, OptionError
from lockgate.execution.assembly import QuerySpec, check_cluster_by, create_query
from lockgate.execution.triggers import (
    DEFAULT_TRIGGER,
    AvailableNowTrigger,
    ContinuousTrigger,
    OnceTrigger,
    ProcessingTimeTrigger,
    Trigger,
)
from lockgate.options import to_option_string
from lockgate.sinks.base import OUTPUT_MODES
from lockgate.sinks.foreach import writer_functions
from lockgate.sinks.table import prepare_table

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from lockgate.api.dataframe import StreamingDataFrame
    from lockgate.api.query import StreamingQuery

class DataStreamWriter:
    """Describes where and how a streaming query writes; ``start()`` runs it."""

    def __init__(self, df: StreamingDataFrame) -> None:
        self._df = df
        self._spark = df._session.spark
        self._format: str | None = None
        self._output_mode = "append"
        self._options: dict[str, str] = {}
        self._query_name: str | None = None
        self._trigger: Trigger = DEFAULT_TRIGGER
        self._partition_by: tuple[str, ...] = ()
        self._cluster_by: tuple[str, ...] = ()
        self._foreach_batch: Callable[[DataFrame, int], Any] | None = None
        self._foreach_writer: Any = None
        self._clock: Clock | None = None

    # -- builder -----------------------------------------------------------------------
    def outputMode(self, outputMode: str) -> DataStreamWriter:
        if not isinstance(outputMode, str) or outputMode.strip().lower() not in OUTPUT_MODES:
            raise OptionError(
                f"Unknown output mode {outputMode}. Accepted output modes are 'append', "
                "'complete', 'update'",
                option="outputMode",
            )
        self._output_mode = outputMode.strip().lower()
        return self

    def format(self, source: str) -> DataStreamWriter:
        self._format = source
        return self

    def option(self, key: str, value: Any) -> DataStreamWriter:
        self._options[key] = to_option_string(value)
        return self

    def options(self, **options: Any) -> DataStreamWriter:
        for key, value in options.items():
            if value is not None:
                self.option(key, value)
        return self

    def partitionBy(self, *cols: str | list[str]) -> DataStreamWriter:
        flat: list[str] = []
        for col in cols:
            flat.extend(col if isinstance(col, (list, tuple)) else [col])
        self._partition_by = tuple(flat)
        return self

    def clusterBy(self, *cols: str | list[str]) -> DataStreamWriter:
        """As PySpark's: a file sink writes as without it; ``toTable`` creates the table
        clustered by ``cols`` (its clustering columns, as Spark records them)."""
        if len(cols) == 1 and isinstance(cols[0], (list, tuple)):
            cols = tuple(cols[0])
        self._cluster_by = tuple(str(c) for c in cols)
        return self

    def queryName(self, queryName: str) -> DataStreamWriter:
        if not isinstance(queryName, str) or not queryName.strip():
            from pyspark.errors import PySparkValueError

            raise PySparkValueError(
                errorClass="VALUE_NOT_NON_EMPTY_STR",
                messageParameters={"arg_name": "queryName", "arg_value": str(queryName)},
            )
        self._query_name = queryName
        return self

    def trigger(
        self,
        *,
        processingTime: str | None = None,
        once: bool | None = None,
        continuous: str | None = None,
        availableNow: bool | None = None,
        realTime: str | None = None,
    ) -> DataStreamWriter:
        """As PySpark's: its errors (``ONLY_ALLOW_SINGLE_TRIGGER``, ``VALUE_NOT_ALLOWED``,
        ``VALUE_NOT_NON_EMPTY_STR``), and intervals parsed by Spark's own ``Trigger``."""
        from pyspark.errors import PySparkValueError

        given = [x for x in (processingTime, once, continuous, availableNow, realTime) if x is not None]
        if len(given) != 1:
            raise PySparkValueError(errorClass="ONLY_ALLOW_SINGLE_TRIGGER", messageParameters={})
        if processingTime is not None:
            self._trigger = ProcessingTimeTrigger.parse(processingTime)
        elif once is not None:
            if once is not True:
                raise PySparkValueError(
                    errorClass="VALUE_NOT_ALLOWED",
                    messageParameters={"arg_name": "once", "allowed_values": "[True]"},
                )
            self._trigger = OnceTrigger()
        elif availableNow is not None:
            if availableNow is not True:
                raise PySparkValueError(
                    errorClass="VALUE_NOT_ALLOWED",
                    messageParameters={"arg_name": "availableNow", "allowed_values": "[True]"},
                )
            self._trigger = AvailableNowTrigger()
        elif continuous is not None:
            self._trigger = ContinuousTrigger.parse(continuous)
        else:
            raise NotSupportedYetError(
                "trigger(realTime=...)",
                "lockgate runs micro-batch (processingTime, once, availableNow) and continuous "
                "triggers.",
            )
        return self

    def foreachBatch(self, func: Callable[[DataFrame, int], Any]) -> DataStreamWriter:
        if not callable(func):
            raise TypeError(f"foreachBatch takes a function (DataFrame, batch_id), got {func!r}")
        self._format = "foreachBatch"
        self._foreach_batch = func
        return self

    def foreach(self, f: Any) -> DataStreamWriter:
        writer_functions(f)
        self._format = "foreach"
        self._foreach_writer = f
        return self

    def withClock(self, clock: Clock) -> DataStreamWriter:
        """lockgate extension: run the query on ``clock`` (e.g. a :class:`ManualClock`)."""
        self._clock = clock
        return self

    # -- starting ----------------------------------------------------------------------
    def start(
        self,
        path: str | None = None,
        format: str | None = None,
        outputMode: str | None = None,
        partitionBy: str | list[str] | None = None,
        queryName: str | None = None,
        **options: Any,
    ) -> StreamingQuery:
        if format is not None:
            self.format(format)
        if outputMode is not None:
            self.outputMode(outputMode)
        if partitionBy is not None:
            self.partitionBy(partitionBy)
        if queryName is not None:
            self.queryName(queryName)
        self.options(**options)
        if path is not None:
            self._options["path"] = path
        return self._start()

    def toTable(
        self,
        tableName: str,
        format: str | None = None,
        outputMode: str | None = None,
        partitionBy: str | list[str] | None = None,
        queryName: str | None = None,
        **options: Any,
    ) -> StreamingQuery:
        if format is not None:
            self.format(format)
        if outputMode is not None:
            self.outputMode(outputMode)
        if partitionBy is not None:
            self.partitionBy(partitionBy)
        if queryName is not None:
            self.queryName(queryName)
        self.options(**options)
        self._check_cluster_by()
        fmt, location = prepare_table(
            self._spark, tableName, self._df.schema, self._format, self._partition_by,
            self._cluster_by,
        )
        self._format = fmt
        self._options["path"] = location
        return self._start()

    def _start(self) -> StreamingQuery:
        from lockgate.plan.nodes import check_sources_named, source_relations

        check_sources_named(self._spark, source_relations(self._df._plan))
        streams = self._df._session.streams
        spec = QuerySpec(
            spark=self._spark,
            plan=self._df._plan,
            template=self._df._template,
            format=self._format,
            options=dict(self._options),
            output_mode=self._output_mode,
            trigger=self._trigger,
            query_name=self._query_name,
            partition_by=self._partition_by,
            cluster_by=self._cluster_by,
            clock=self._clock,
            foreach_batch=self._foreach_batch,
            foreach_writer=self._foreach_writer,
        )
        execution = create_query(spec, streams, streams._check_name_available)
        return streams._start_query(execution)

    def _check_cluster_by(self) -> None:
        check_cluster_by(self._cluster_by, self._partition_by, self._df.columns)

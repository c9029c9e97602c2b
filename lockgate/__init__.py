"""lockgate: Spark Structured Streaming's stream execution engine, in Python, on PySpark.

>>> import lockgate                                             # doctest: +SKIP
>>> ls = lockgate.session(spark)                                # doctest: +SKIP
>>> q = (ls.readStream.format("rate").load()                    # doctest: +SKIP
...        .writeStream.format("console").start())
"""

from lockgate.api.dataframe import StreamingDataFrame
from lockgate.api.listener import (
    QueryIdleEvent,
    QueryProgressEvent,
    QueryStartedEvent,
    QueryTerminatedEvent,
    StreamingQueryListener,
)
from lockgate.api.manager import StreamingQueryManager
from lockgate.api.query import StreamingQuery
from lockgate.api.reader import DataStreamReader
from lockgate.api.session import StreamingSession, session, spark_conf
from lockgate.api.writer import DataStreamWriter
from lockgate.clock import SystemClock
from lockgate.errors import (
    AnalysisError,
    CheckpointError,
    LockgateError,
    NotSupportedYetError,
    OptionError,
    StreamingQueryException,
)
from lockgate.sinks import Sink, SinkProvider, register_sink
from lockgate.sinks.kafka_jvm import jars
from lockgate.sources import ReadLimit, Source, SourceProvider, register_source
from lockgate.testing import ManualClock, MemoryStream

__version__ = "0.1.0"

__all__ = [
    "AnalysisError",
    "CheckpointError",
    "DataStreamReader",
    "DataStreamWriter",
    "LockgateError",
    "ManualClock",
    "MemoryStream",
    "NotSupportedYetError",
    "OptionError",
    "QueryIdleEvent",
    "QueryProgressEvent",
    "QueryStartedEvent",
    "QueryTerminatedEvent",
    "ReadLimit",
    "Sink",
    "SinkProvider",
    "Source",
    "SourceProvider",
    "StreamingDataFrame",
    "StreamingQuery",
    "StreamingQueryException",
    "StreamingQueryListener",
    "StreamingQueryManager",
    "StreamingSession",
    "SystemClock",
    "jars",
    "register_sink",
    "register_source",
    "session",
    "spark_conf",
]

"""``lockgate.session(spark)``: the entry point, bound to one SparkSession."""

from __future__ import annotations

import logging
import os
import sys
import threading
import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lockgate.api.manager import StreamingQueryManager
    from lockgate.api.read import LockgateReader
    from lockgate.api.reader import DataStreamReader

logger = logging.getLogger(__name__)

_sessions: weakref.WeakKeyDictionary[SparkSession, StreamingSession] = weakref.WeakKeyDictionary()
_lock = threading.Lock()

UNIX_SOCKET_CONF = "spark.python.unix.domain.socket.enabled"


def spark_conf() -> dict[str, str]:
    """Static Spark confs that make lockgate's batches cheaper, for a SparkSession you
    build yourself (``lockgate.session()`` sets them on the one it starts):

    >>> SparkSession.builder.config(map=lockgate.spark_conf()).getOrCreate()  # doctest: +SKIP

    * ``spark.python.unix.domain.socket.enabled``: the executors talk to their Python
      workers over Unix domain sockets instead of loopback TCP. Every Python stage of a
      batch (a state step, a Kafka writer) then skips a ~40 ms stall of TCP's delayed
      acknowledgements: one ``mapInArrow`` over a small batch costs about 18 ms more
      than the JVM alone instead of about 74 ms (``python -m bench.python_stages
      --unix-socket true|false``). Only where the platform has Unix sockets.
    """
    import socket

    return {UNIX_SOCKET_CONF: "true"} if hasattr(socket, "AF_UNIX") else {}


def _hint_missing_conf(spark: SparkSession) -> None:
    conf = spark.sparkContext.getConf()
    missing = {k: v for k, v in spark_conf().items() if conf.get(k, "false") != v}
    if missing:
        logger.info(
            "This SparkSession lacks %s: every Python stage of a lockgate batch costs about "
            "50 ms more over loopback TCP. Build the session with lockgate.spark_conf().",
            ", ".join(f"{k}={v}" for k, v in missing.items()),
        )


class StreamingSession:
    """Streaming on top of one SparkSession: ``readStream``, ``streams``, and ``sql``
    and ``read`` that also know lockgate's views and state; every other attribute is the
    SparkSession's, so code written against ``spark`` runs against ``ls``.

    Use :func:`lockgate.session` to get one; all calls for the same SparkSession share
    one query manager, as ``spark.streams`` does.
    """

    def __init__(self, spark: SparkSession) -> None:
        from lockgate.api.manager import StreamingQueryManager
        from lockgate.api.shipping import ship_code

        ship_code(spark)  # on a cluster, make lockgate importable on the executors
        _hint_missing_conf(spark)
        self._spark = spark
        self._streams = StreamingQueryManager(self)

    @classmethod
    def for_spark(cls, spark: SparkSession) -> StreamingSession:
        with _lock:
            existing = _sessions.get(spark)
            if existing is None:
                existing = cls(spark)
                _sessions[spark] = existing
            return existing

    @property
    def spark(self) -> SparkSession:
        return self._spark

    @property
    def readStream(self) -> DataStreamReader:
        from lockgate.api.reader import DataStreamReader

        return DataStreamReader(self)

    @property
    def read(self) -> LockgateReader:
        """Batch reads of lockgate's own data, e.g. ``ls.read.state(checkpoint)``."""
        from lockgate.api.read import LockgateReader

        return LockgateReader(self)

    def sql(self, sqlQuery: str, args: Any = None, **kwargs: Any) -> Any:
        """``spark.sql`` that also reads lockgate's streaming views (``docs/sql.md``)."""
        from lockgate.api.sql import sql

        return sql(self, sqlQuery, args, **kwargs)

    @property
    def streams(self) -> StreamingQueryManager:
        return self._streams

    @property
    def _streamingCheckpointManager(self) -> Any:
        """PySpark's ``spark._streamingCheckpointManager`` for lockgate's checkpoints:
        ``repartition()`` rewrites lockgate's state (Spark's own manager cannot read it)."""
        from lockgate.api.checkpoint_manager import StreamingCheckpointManager

        return StreamingCheckpointManager(self._spark)

    def __getattr__(self, name: str) -> Any:
        """Everything else is the SparkSession's (``ls.createDataFrame``, ``ls.range``,
        ``ls.conf``, ``ls.table``, ``ls.catalog``, ``ls.udf``, ``ls.sparkContext``, ...),
        so ``ls`` stands wherever code used ``spark``."""
        if name.startswith("__") or name in ("_spark", "_streams"):
            raise AttributeError(name)
        return getattr(self._spark, name)

    def __repr__(self) -> str:
        return f"lockgate.StreamingSession(spark={self._spark!r})"


def _check_java() -> None:
    import shutil

    if os.environ.get("JAVA_HOME") or shutil.which("java"):
        return
    raise RuntimeError(
        "lockgate runs on PySpark, which needs Java 17 or 21, and no 'java' was found on "
        "PATH (and JAVA_HOME is not set). Install it, e.g. 'apt-get install "
        "openjdk-17-jre-headless' on Debian/Ubuntu or 'brew install openjdk@17' on macOS."
    )


def session(spark: SparkSession | None = None) -> StreamingSession:
    """The lockgate streaming session for ``spark``.

    Without ``spark``, uses the active SparkSession, or starts an embedded
    ``local[*]`` one.

    >>> import lockgate                     # doctest: +SKIP
    >>> ls = lockgate.session()             # doctest: +SKIP
    >>> ls.readStream.format("rate").load() # doctest: +SKIP
    """
    if spark is None:
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
        if spark is None:
            _check_java()
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
            from lockgate.sinks.kafka_jvm import jars

            builder = SparkSession.builder
            if jars():  # the exactly-once Kafka sink's JVM writer (docs/kafka.md)
                builder = builder.config("spark.jars", ",".join(jars()))
            spark = (
                builder.master("local[*]")
                .appName("lockgate")
                .config("spark.sql.shuffle.partitions", str(max(2, (os.cpu_count() or 2))))
                .config(map=spark_conf())
                .getOrCreate()
            )
    from lockgate.api.static_side import install

    install()  # static.join(stream) builds lockgate's join (lockgate.api.static_side)
    return StreamingSession.for_spark(spark)

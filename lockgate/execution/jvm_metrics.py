"""A lockgate query's gauges in Spark's metrics system, under Spark's names.

With ``spark.sql.streaming.metricsEnabled=true`` a native query registers a
``MetricsReporter`` source named ``spark.streaming.<query name or id>`` in
``SparkEnv.metricsSystem`` when it starts and removes it when it ends; its gauges
(``inputRate-total``, ``processingRate-total``, ``latency``, ``eventTime-watermark``,
``states-rowsTotal``, ``states-usedBytes``) read the query's ``lastProgress``. Every
sink of the metrics system (the Prometheus servlet, JMX, CSV, ...) carries them.

lockgate registers a source of the same name and gauges, built from Spark's own
classes so that nothing runs in Python when a sink reads them: a Dropwizard
``MetricRegistry`` of ``DefaultSettableGauge`` s (metrics-core 4.2, which Spark ships),
wrapped in a ``Source`` by Spark's ``BlockManager.ShuffleMetricsSource`` (a public
constructor in the bytecode taking a source name and a ``MetricSet``: the one class
in Spark that turns any metric set into a named source). lockgate sets the gauges
from each progress it records. Spark's own ``MetricsReporter`` cannot be used: it
reads a JVM ``StreamExecution``. A py4j callback ``Gauge`` implemented in Python would
work too, but would make every scrape call back into the Python driver (and fail once
the callback server is gone); the settable gauges do not.

Integral gauges hold what py4j passes for a Python int (``Integer`` below 2**31,
``Long`` above); sinks render both alike.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

logger = logging.getLogger(__name__)

METRICS_ENABLED = "spark.sql.streaming.metricsEnabled"

_DEFAULTS: dict[str, Any] = {
    "inputRate-total": 0.0,
    "processingRate-total": 0.0,
    "latency": 0,
    "eventTime-watermark": 0,
    "states-rowsTotal": 0,
    "states-usedBytes": 0,
}


def metrics_enabled(spark: SparkSession) -> bool:
    return str(spark.conf.get(METRICS_ENABLED, "false")).strip().lower() == "true"


class QueryMetricsSource:
    """The gauges of one query run, registered in the driver's metrics system."""

    def __init__(self, spark: SparkSession, query_name: str | None, query_id: str) -> None:
        jvm = spark._jvm  # type: ignore[attr-defined]
        self.source_name = f"spark.streaming.{query_name or query_id}"
        registry = jvm.com.codahale.metrics.MetricRegistry()
        self._gauges: dict[str, Any] = {}
        for name, default in _DEFAULTS.items():
            gauge = jvm.com.codahale.metrics.DefaultSettableGauge(default)
            registry.register(name, gauge)
            self._gauges[name] = gauge
        source_class = getattr(jvm, "org.apache.spark.storage.BlockManager$ShuffleMetricsSource")
        self._source = source_class(self.source_name, registry)
        self._metrics_system = _metrics_system(spark)
        self._metrics_system.registerSource(self._source)

    def update(self, progress: dict[str, Any]) -> None:
        """Set the gauges from a progress (Spark's progress JSON, as a dict)."""
        operators = progress.get("stateOperators") or []
        values = {
            "inputRate-total": float(progress.get("inputRowsPerSecond") or 0.0),
            "processingRate-total": float(progress.get("processedRowsPerSecond") or 0.0),
            "latency": int((progress.get("durationMs") or {}).get("triggerExecution", 0)),
            "eventTime-watermark": _millis((progress.get("eventTime") or {}).get("watermark")),
            "states-rowsTotal": sum(int(op.get("numRowsTotal", 0)) for op in operators),
            "states-usedBytes": sum(int(op.get("memoryUsedBytes", 0)) for op in operators),
        }
        for name, value in values.items():
            self._gauges[name].setValue(value)

    def remove(self) -> None:
        self._metrics_system.removeSource(self._source)


def _metrics_system(spark: SparkSession) -> Any:
    """``SparkEnv.metricsSystem`` of the driver. Read through ``java.lang.reflect``: py4j
    cannot call a method on the ``SparkEnv`` object itself, as it lists the class's
    methods first and one of them names a class Spark does not ship
    (com.google.protobuf.MessageOrBuilder: NoClassDefFoundError)."""
    jvm = spark._jvm  # type: ignore[attr-defined]
    env = spark.sparkContext._jsc.sc().env()  # type: ignore[union-attr]
    field = jvm.java.lang.Class.forName("org.apache.spark.SparkEnv").getDeclaredField("metricsSystem")
    field.setAccessible(True)
    return field.get(env)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _millis(timestamp: str | None) -> int:
    if not timestamp:
        return 0
    parsed = datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%S.%f%z")
    return (parsed - _EPOCH) // timedelta(milliseconds=1)

"""Lockgate's listener events on Spark's own streaming listener bus (the JVM's).

Spark's ``StreamingQueryManager`` owns a ``StreamingQueryListenerBus``; its
``postListenerEvent`` (``private[sql]`` in Scala, public in the bytecode, so reachable
through py4j) is what every native query posts through. Posting lockgate's events
there gives them everything native events get:

- listeners added with ``spark.streams.addListener`` (Python ones, through PySpark's
  callback server, and JVM ones such as those named in
  ``spark.sql.streaming.streamingQueryListeners``) receive lockgate's started,
  progress, idle and terminated events;
- Spark's Structured Streaming UI tab (``StreamingQueryStatusListener``, added to the
  manager when the manager is created, if ``spark.ui.enabled`` and
  ``spark.sql.streaming.ui.enabled``) lists lockgate's queries with their charts;
- the event log (``spark.eventLog.enabled``) records them, so the History Server
  shows them too.

The bus delivers a ``QueryStartedEvent`` synchronously and the others through Spark's
``LiveListenerBus`` (queue ``streams``), and only for run ids it saw start: lockgate
posts the started event first, as Spark does.

The JVM progress is built with Spark's own Jackson reader of progress
(``StreamingQueryProgress.fromJson``, the one Spark Connect uses to ship listener
events), from lockgate's progress JSON turned into that reader's shape: offsets as
JSON text, observed metrics as ``{"values": [...], "schema": <struct JSON>}``.
Observed metrics' types are the JSON values' (long, double, boolean, string): the
progress JSON, where lockgate keeps them, holds no more.

``spark.streams.active`` does not list lockgate's queries and cannot: Spark's manager
keeps ``StreamingQueryWrapper``s of JVM ``StreamExecution`` objects (an abstract Scala
class py4j cannot implement), and PySpark's ``active`` drives those through the JVM.
``ls.streams.active`` lists them.

With ``spark.sql.streaming.metricsEnabled=true`` at start, the same hooks keep the
query's gauges in Spark's metrics system (lockgate/execution/jvm_metrics.py).

A failure to post (the JVM gone at shutdown, say) never affects the query: it is
logged once per query at WARNING, then at DEBUG.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from typing import TYPE_CHECKING, Any

from lockgate.execution.jvm_metrics import QueryMetricsSource, metrics_enabled
from lockgate.jvm import jvm_name

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

logger = logging.getLogger(__name__)


class JvmListenerBus:
    """Posts lockgate's listener events to ``spark.streams``' listener bus."""

    def __init__(self, spark: SparkSession) -> None:
        self._spark = spark
        self._jvm = spark._jvm  # type: ignore[attr-defined]
        # Touching the manager creates it (it is lazy in Spark's SessionState), and with
        # it the Structured Streaming UI tab, which then shows even a session whose only
        # streaming queries are lockgate's.
        try:
            self._jsqm: Any = spark._jsparkSession.streams()  # type: ignore[attr-defined]
        except Exception:
            logger.warning(
                "spark.streams' listener bus is out of reach: lockgate's queries will not "
                "show on spark.streams listeners, the Spark UI or the metrics system",
                exc_info=True,
            )
            self._jsqm = None
        self._warned: set[str] = set()
        self._lock = threading.Lock()
        self._metrics: dict[str, QueryMetricsSource] = {}

    # -- events --------------------------------------------------------------------------
    def post_started(self, query_id: str, run_id: str, name: str | None, timestamp: str) -> None:
        def event() -> Any:
            cls = self._class("org.apache.spark.sql.streaming.StreamingQueryListener$QueryStartedEvent")
            return cls(self._uuid(query_id), self._uuid(run_id), name, timestamp)

        self._post(run_id, "started", event)
        if metrics_enabled(self._spark):
            self._guard(run_id, "metrics source", lambda: self._register_metrics(run_id, name, query_id))

    def _register_metrics(self, run_id: str, name: str | None, query_id: str) -> None:
        source = QueryMetricsSource(self._spark, name, query_id)
        with self._lock:
            self._metrics[run_id] = source

    def post_progress(self, progress: dict[str, Any]) -> None:
        def event() -> Any:
            reader = self._class("org.apache.spark.sql.streaming.StreamingQueryProgress$.MODULE$")
            jprogress = reader.fromJson(json.dumps(jackson_progress(progress)))
            cls = self._class("org.apache.spark.sql.streaming.StreamingQueryListener$QueryProgressEvent")
            return cls(jprogress)

        self._post(str(progress.get("runId")), "progress", event)
        self._update_metrics(str(progress.get("runId")), progress)

    def _update_metrics(self, run_id: str, progress: dict[str, Any] | None) -> None:
        with self._lock:
            source = self._metrics.get(run_id)
        if source is not None and progress is not None:
            self._guard(run_id, "metrics", lambda: source.update(progress))

    def post_idle(
        self, query_id: str, run_id: str, timestamp: str, progress: dict[str, Any] | None = None
    ) -> None:
        """``progress``: the idle trigger's progress (lastProgress), for the gauges."""
        def event() -> Any:
            cls = self._class("org.apache.spark.sql.streaming.StreamingQueryListener$QueryIdleEvent")
            return cls(self._uuid(query_id), self._uuid(run_id), timestamp)

        self._post(run_id, "idle", event)
        self._update_metrics(run_id, progress)

    def post_terminated(
        self, query_id: str, run_id: str, exception: str | None, error_class: str | None
    ) -> None:
        def event() -> Any:
            cls = self._class("org.apache.spark.sql.streaming.StreamingQueryListener$QueryTerminatedEvent")
            option = self._class("scala.Option")
            return cls(self._uuid(query_id), self._uuid(run_id), option.apply(exception), option.apply(error_class))

        self._post(run_id, "terminated", event)
        with self._lock:
            source = self._metrics.pop(run_id, None)
        if source is not None:
            self._guard(run_id, "metrics source", source.remove)

    # -- helpers -------------------------------------------------------------------------
    def _class(self, name: str) -> Any:
        """The JVM class or object ``name``, looked up once per gateway (a py4j call each)."""
        return jvm_name(self._jvm, name)

    def _uuid(self, text: str) -> Any:
        return self._class("java.util.UUID").fromString(str(text))

    def _post(self, run_id: str, kind: str, build: Any) -> None:
        self._guard(run_id, f"{kind} event", lambda: self._jsqm.postListenerEvent(build()))

    def _guard(self, run_id: str, what: str, action: Any) -> None:
        if self._jsqm is None:
            return
        try:
            action()
        except Exception:
            with self._lock:
                first = run_id not in self._warned
                self._warned.add(run_id)
            logger.log(
                logging.WARNING if first else logging.DEBUG,
                "Could not hand the %s of run %s to Spark (spark.streams listeners, Spark UI, "
                "metrics system); the query goes on",
                what,
                run_id,
                exc_info=True,
            )


def jackson_progress(progress: dict[str, Any]) -> dict[str, Any]:
    """Spark's progress JSON in the shape ``StreamingQueryProgress.fromJson`` reads:
    the constructor's fields, offsets as JSON text, observed metrics as rows with a
    schema."""
    out: dict[str, Any] = {
        "id": progress["id"],
        "runId": progress["runId"],
        "name": progress.get("name"),
        "timestamp": progress["timestamp"],
        "batchId": progress["batchId"],
        "batchDuration": progress.get("batchDuration", 0),
        "durationMs": dict(progress.get("durationMs") or {}),
        "eventTime": dict(progress.get("eventTime") or {}),
        "stateOperators": [
            dict(op, customMetrics=dict(op.get("customMetrics") or {}))
            for op in progress.get("stateOperators") or []
        ],
        "sources": [
            {
                "description": source.get("description"),
                "startOffset": _offset_text(source.get("startOffset")),
                "endOffset": _offset_text(source.get("endOffset")),
                "latestOffset": _offset_text(source.get("latestOffset")),
                "numInputRows": source.get("numInputRows", 0),
                "inputRowsPerSecond": _number(source.get("inputRowsPerSecond")),
                "processedRowsPerSecond": _number(source.get("processedRowsPerSecond")),
                "metrics": {k: str(v) for k, v in (source.get("metrics") or {}).items()},
            }
            for source in progress.get("sources") or []
        ],
        "sink": {
            "description": (progress.get("sink") or {}).get("description"),
            "numOutputRows": (progress.get("sink") or {}).get("numOutputRows", -1),
            "metrics": {k: str(v) for k, v in ((progress.get("sink") or {}).get("metrics") or {}).items()},
        },
        "observedMetrics": {
            name: _row_with_schema(values) for name, values in (progress.get("observedMetrics") or {}).items()
        },
    }
    return out


def _offset_text(offset: Any) -> str | None:
    if offset is None or isinstance(offset, str):
        return offset
    return json.dumps(offset, separators=(",", ":"))


def _number(value: Any) -> float:
    # Spark leaves NaN/infinite rates out of its JSON; Jackson needs a finite number.
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return 0.0


def _row_with_schema(values: dict[str, Any]) -> dict[str, Any]:
    fields = []
    for key, value in values.items():
        if isinstance(value, bool):
            kind = "boolean"
        elif isinstance(value, int):
            kind = "long"
        elif isinstance(value, float):
            kind = "double"
        else:
            kind = "string"
        fields.append({"name": key, "type": kind, "nullable": True, "metadata": {}})
    return {"values": list(values.values()), "schema": {"type": "struct", "fields": fields}}

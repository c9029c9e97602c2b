"""``StreamingQueryManager``: ``ls.streams``, as ``spark.streams`` in PySpark."""

from __future__ import annotations

import json
import threading
from typing import TYPE_CHECKING, Any

from pyspark.sql.streaming.listener import (
    QueryIdleEvent,
    QueryProgressEvent,
    QueryStartedEvent,
    QueryTerminatedEvent,
    StreamingQueryListener,
)

from lockgate.api.listener import ListenerBus
from lockgate.errors import AnalysisError, StreamingQueryException
from lockgate.execution.jvm_events import JvmListenerBus
from lockgate.execution.progress import format_timestamp

if TYPE_CHECKING:
    from pyspark.sql.streaming.listener import StreamingQueryProgress

    from lockgate.api.query import StreamingQuery
    from lockgate.api.session import StreamingSession
    from lockgate.execution.stream import StreamExecution


class StreamingQueryManager:
    """Active queries of one lockgate session, listeners, and waiting for termination."""

    def __init__(self, session: StreamingSession) -> None:
        self._session = session
        self._active: dict[str, StreamingQuery] = {}
        self._lock = threading.RLock()
        self._terminated = threading.Condition(self._lock)
        self._last_terminated: StreamingQuery | None = None
        self._handles: dict[str, StreamingQuery] = {}
        self.listener_bus = ListenerBus()
        # The same events on spark.streams' bus: its listeners, Spark's UI tab, the event log.
        self.jvm_listener_bus = JvmListenerBus(session.spark)

    # -- queries -----------------------------------------------------------------------
    @property
    def active(self) -> list[StreamingQuery]:
        with self._lock:
            return list(self._active.values())

    def get(self, id: str) -> StreamingQuery | None:  # noqa: A002 - pyspark's name
        with self._lock:
            return self._active.get(str(id))

    def awaitAnyTermination(self, timeout: float | None = None) -> bool | None:  # noqa: N802
        """Wait until any query ends (since the last :meth:`resetTerminated`)."""
        if timeout is not None and (not isinstance(timeout, (int, float)) or timeout <= 0):
            raise ValueError(f"timeout must be a positive integer or float. Got {timeout}")
        with self._terminated:
            ended = self._terminated.wait_for(lambda: self._last_terminated is not None, timeout)
            last = self._last_terminated
        if last is not None and last.exception() is not None:
            raise last.exception()  # type: ignore[misc]
        return ended if timeout is not None else None

    def resetTerminated(self) -> None:  # noqa: N802
        with self._lock:
            self._last_terminated = None

    def addListener(self, listener: StreamingQueryListener) -> None:  # noqa: N802
        self.listener_bus.add(listener)

    def removeListener(self, listener: StreamingQueryListener) -> None:  # noqa: N802
        self.listener_bus.remove(listener)

    # -- engine side -------------------------------------------------------------------
    def _check_name_available(self, name: str | None) -> None:
        if name is None:
            return
        with self._lock:
            for other in self._active.values():
                if other.name == name:
                    raise AnalysisError(
                        f"Cannot start query with name {name} as a query with that name is "
                        "already active in this SparkSession"
                    )

    def _start_query(self, execution: StreamExecution) -> StreamingQuery:
        from lockgate.api.query import StreamingQuery

        handle = StreamingQuery(execution)  # type: ignore[arg-type]
        self._check_name_available(execution.name)
        with self._lock:
            previous = self._active.get(execution.id)
        if previous is not None:
            stop_old = str(
                self._session.spark.conf.get("spark.sql.streaming.stopActiveRunOnRestart", "true")
            ).lower() == "true"
            if not stop_old:
                raise AnalysisError(
                    f"Cannot start query with id {execution.id} as another query with same "
                    "id is already active. Perhaps you are attempting to restart a query "
                    "from checkpoint that is already active."
                )
            # Spark's default (spark.sql.streaming.stopActiveRunOnRestart): the new run
            # replaces the active one.
            previous.stop()
        with self._lock:
            if execution.id in self._active:
                raise AnalysisError(
                    f"Cannot start query with id {execution.id} as another query with same "
                    "id is already active. Perhaps you are attempting to restart a query "
                    "from checkpoint that is already active."
                )
            self._active[execution.id] = handle
        try:
            execution.start()
        except BaseException:
            with self._lock:
                self._active.pop(execution.id, None)
            raise
        return handle

    def _notify_query_termination(self, execution: StreamExecution) -> None:
        with self._terminated:
            handle = self._active.get(execution.id)
            if handle is not None and handle._execution is execution:
                del self._active[execution.id]
            if handle is None:
                from lockgate.api.query import StreamingQuery

                handle = StreamingQuery(execution)  # type: ignore[arg-type]
            self._last_terminated = handle
            self._terminated.notify_all()

    def _post_started(self, execution: StreamExecution) -> None:
        timestamp = format_timestamp(execution.clock.get_time_millis())
        event = QueryStartedEvent.fromJson(
            {"id": execution.id, "runId": execution.run_id, "name": execution.name, "timestamp": timestamp}
        )
        self.listener_bus.post(event)
        self.jvm_listener_bus.post_started(execution.id, execution.run_id, execution.name, timestamp)

    def _post_progress(self, execution: StreamExecution, progress: StreamingQueryProgress) -> None:
        self.listener_bus.post(QueryProgressEvent(progress))
        self.jvm_listener_bus.post_progress(json.loads(progress.json))

    def _post_idle(self, execution: StreamExecution, now_ms: int) -> None:
        event = QueryIdleEvent.fromJson(
            {"id": execution.id, "runId": execution.run_id, "timestamp": format_timestamp(now_ms)}
        )
        self.listener_bus.post(event)
        last = execution.last_progress()
        self.jvm_listener_bus.post_idle(
            execution.id, execution.run_id, format_timestamp(now_ms), json.loads(last.json) if last else None
        )

    def _post_terminated(self, execution: StreamExecution) -> None:
        cause: StreamingQueryException | None = execution.stream_death_cause
        payload: dict[str, Any] = {
            "id": execution.id,
            "runId": execution.run_id,
            "exception": str(cause) if cause is not None else None,
            "errorClassOnException": "STREAM_FAILED" if cause is not None else None,
        }
        self.listener_bus.post(QueryTerminatedEvent.fromJson(payload))
        self.jvm_listener_bus.post_terminated(
            execution.id, execution.run_id, payload["exception"], payload["errorClassOnException"]
        )

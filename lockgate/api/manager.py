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
from lockgate.errors import AnalysisError, StreamingQueryException, error_class_of, exception_string
from lockgate.execution.jvm_events import JvmListenerBus
from lockgate.execution.progress import format_timestamp

if TYPE_CHECKING:
    from pyspark.sql.streaming.listener import StreamingQueryProgress

    from lockgate.api.query import StreamingQuery
    from lockgate.api.session import StreamingSession
    from lockgate.execution.stream import StreamExecution


_APP_ACTIVE: dict[tuple[str, str], StreamingQuery] = {}
"""Active runs of every lockgate session of a Spark application, by (application id,
query id): Spark's ``sharedState.activeStreamingQueries``."""
_APP_LOCK = threading.Lock()


def _already_active(query_id: str) -> AnalysisError:
    return AnalysisError(
        f"Cannot start query with id {query_id} as another query with same id is already "
        "active. Perhaps you are attempting to restart a query from checkpoint that is "
        "already active. You may stop the old query by setting the SQL configuration: "
        'spark.conf.set("spark.sql.streaming.stopActiveRunOnRestart", true) and retry.'
    )


class _ListenerListView:
    """``ls.streams._jsqm``: the one thing PySpark code reads from ``spark.streams._jsqm``
    to inspect a manager, ``listListeners()`` (PySpark's own streaming tests count
    listeners with it), answered with lockgate's listeners. lockgate's manager has no
    JVM counterpart; anything else is refused rather than answered by Spark's."""

    def __init__(self, manager: StreamingQueryManager) -> None:
        self._manager = manager

    def listListeners(self) -> list[StreamingQueryListener]:
        return self._manager.listener_bus.listeners

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(
            f"ls.streams._jsqm has no {name!r}: lockgate's query manager is not Spark's JVM "
            "StreamingQueryManager; only listListeners() is answered (with lockgate's "
            "listeners). Use ls.streams' public methods."
        )


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

    @property
    def _jsqm(self) -> _ListenerListView:
        return _ListenerListView(self)

    # -- queries -----------------------------------------------------------------------
    @property
    def active(self) -> list[StreamingQuery]:
        with self._lock:
            return list(self._active.values())

    def get(self, id: str) -> StreamingQuery | None:
        with self._lock:
            return self._active.get(str(id))

    def awaitAnyTermination(self, timeout: float | None = None) -> bool | None:
        """Wait until any query ends (since the last :meth:`resetTerminated`)."""
        if timeout is not None and (not isinstance(timeout, (int, float)) or timeout < 0):
            from lockgate.api.query import timeout_not_positive

            raise timeout_not_positive(timeout)  # PySpark's check: 0 is allowed here
        with self._terminated:
            ended = self._terminated.wait_for(lambda: self._last_terminated is not None, timeout)
            last = self._last_terminated
        if last is not None and last.exception() is not None:
            raise last.exception()  # type: ignore[misc]
        return ended if timeout is not None else None

    def resetTerminated(self) -> None:
        with self._lock:
            self._last_terminated = None

    def addListener(self, listener: StreamingQueryListener) -> None:
        self.listener_bus.add(listener)

    def removeListener(self, listener: StreamingQueryListener) -> None:
        self.listener_bus.remove(listener)

    def drain_listener_events(self, timeout: float = 30.0) -> None:
        """Wait until the listeners have had every event posted so far (see
        :meth:`StreamingQuery.stop`); a no-op on the listener thread itself."""
        self.listener_bus.wait_until_empty(timeout)

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
        app_key = (str(self._session.spark.sparkContext.applicationId), execution.id)
        with self._lock, _APP_LOCK:
            previous = self._active.get(execution.id) or _APP_ACTIVE.get(app_key)
        if previous is not None:
            stop_old = str(
                self._session.spark.conf.get("spark.sql.streaming.stopActiveRunOnRestart", "true")
            ).lower() == "true"
            if not stop_old:
                raise _already_active(execution.id)
            # Spark's default (spark.sql.streaming.stopActiveRunOnRestart): the new run
            # replaces the active one, in whichever session of the application it runs.
            previous.stop()
        with self._lock, _APP_LOCK:
            if execution.id in self._active or _APP_ACTIVE.get(app_key, handle) is not handle:
                # another session started the same query meanwhile
                raise AnalysisError(
                    "[CONCURRENT_QUERY] Another instance of this query was just started by a "
                    "concurrent session."
                )
            self._active[execution.id] = handle
            _APP_ACTIVE[app_key] = handle
        try:
            execution.start()
        except BaseException:
            with self._lock, _APP_LOCK:
                self._active.pop(execution.id, None)
                if _APP_ACTIVE.get(app_key) is handle:
                    del _APP_ACTIVE[app_key]
            raise
        return handle

    def _notify_query_termination(self, execution: StreamExecution) -> None:
        with self._terminated:
            handle = self._active.get(execution.id)
            if handle is not None and handle._execution is execution:
                del self._active[execution.id]
            with _APP_LOCK:
                for key, other in list(_APP_ACTIVE.items()):
                    if other._execution is execution:
                        del _APP_ACTIVE[key]
            if handle is None:
                from lockgate.api.query import StreamingQuery

                handle = StreamingQuery(execution)  # type: ignore[arg-type]
            self._last_terminated = handle
            self._terminated.notify_all()

    # -- QueryEvents (lockgate.execution.stream): what a run tells its manager --------

    def query_started(self, execution: StreamExecution) -> None:
        timestamp = format_timestamp(execution.clock.get_time_millis())
        event = QueryStartedEvent.fromJson(
            {"id": execution.id, "runId": execution.run_id, "name": execution.name, "timestamp": timestamp}
        )
        self.listener_bus.post(event)
        self.jvm_listener_bus.post_started(execution.id, execution.run_id, execution.name, timestamp)

    def query_progress(self, execution: StreamExecution, progress: StreamingQueryProgress) -> None:
        self.listener_bus.post(QueryProgressEvent(progress))
        self.jvm_listener_bus.post_progress(json.loads(progress.json))

    def query_idle(self, execution: StreamExecution, now_ms: int) -> None:
        event = QueryIdleEvent.fromJson(
            {"id": execution.id, "runId": execution.run_id, "timestamp": format_timestamp(now_ms)}
        )
        self.listener_bus.post(event)
        last = execution.last_progress()
        self.jvm_listener_bus.post_idle(
            execution.id, execution.run_id, format_timestamp(now_ms), json.loads(last.json) if last else None
        )

    def query_terminated(self, execution: StreamExecution) -> None:
        self._notify_query_termination(execution)
        self._post_terminated(execution)

    def _post_terminated(self, execution: StreamExecution) -> None:
        cause: StreamingQueryException | None = execution.stream_death_cause
        payload: dict[str, Any] = {
            "id": execution.id,
            "runId": execution.run_id,
            # Spark's: the cause's exception string (Utils.exceptionString), not the
            # StreamingQueryException's message
            "exception": exception_string(cause.cause or cause) if cause is not None else None,
            # Spark's: the cause's error class, None for a cause without one
            "errorClassOnException": error_class_of(cause.cause) if cause is not None else None,
        }
        self.listener_bus.post(QueryTerminatedEvent.fromJson(payload))
        self.jvm_listener_bus.post_terminated(
            execution.id, execution.run_id, payload["exception"], payload["errorClassOnException"]
        )

"""Listener events, delivered asynchronously and in order on one listener thread.

``lockgate.StreamingQueryListener`` *is* PySpark's
:class:`pyspark.sql.streaming.StreamingQueryListener`, and the events are PySpark's
event classes, so an existing listener works with lockgate unchanged.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any

from pyspark.sql.streaming.listener import (
    QueryIdleEvent,
    QueryProgressEvent,
    QueryStartedEvent,
    QueryTerminatedEvent,
    StreamingQueryListener,
)

logger = logging.getLogger(__name__)

_STOP = object()


class ListenerBus:
    """Posts events to listeners from a single daemon thread.

    A listener that raises is logged and skipped; it never affects the query or the
    other listeners.
    """

    def __init__(self) -> None:
        self._listeners: list[StreamingQueryListener] = []
        self._lock = threading.Lock()
        self._queue: queue.Queue[Any] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._idle = threading.Condition()
        self._pending = 0

    def add(self, listener: StreamingQueryListener) -> None:
        for method in ("onQueryStarted", "onQueryProgress", "onQueryTerminated"):
            if not callable(getattr(listener, method, None)):
                raise TypeError(
                    f"{type(listener).__name__} is not a StreamingQueryListener: it has no "
                    f"{method} method. Subclass lockgate.StreamingQueryListener."
                )
        with self._lock:
            self._listeners.append(listener)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="lockgate streaming listener bus", daemon=True
                )
                self._thread.start()

    def remove(self, listener: StreamingQueryListener) -> None:
        with self._lock:
            self._listeners = [x for x in self._listeners if x is not listener]

    @property
    def listeners(self) -> list[StreamingQueryListener]:
        """The listeners, in the order they were added."""
        with self._lock:
            return list(self._listeners)

    def post(self, event: Any) -> None:
        with self._lock:
            if not self._listeners:
                return
        with self._idle:
            self._pending += 1
        self._queue.put(event)

    def wait_until_empty(self, timeout: float = 10.0) -> bool:
        """Block until every posted event was delivered; False at once when called from
        a listener (the bus thread would wait for itself)."""
        if threading.current_thread() is self._thread:
            return False
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def _run(self) -> None:
        while True:
            event = self._queue.get()
            if event is _STOP:
                return
            with self._lock:
                listeners = list(self._listeners)
            for listener in listeners:
                self._deliver(listener, event)
            with self._idle:
                self._pending -= 1
                self._idle.notify_all()

    @staticmethod
    def _deliver(listener: StreamingQueryListener, event: Any) -> None:
        try:
            if isinstance(event, QueryStartedEvent):
                listener.onQueryStarted(event)
            elif isinstance(event, QueryProgressEvent):
                listener.onQueryProgress(event)
            elif isinstance(event, QueryIdleEvent):
                on_idle = getattr(listener, "onQueryIdle", None)
                if on_idle is not None:
                    on_idle(event)
            elif isinstance(event, QueryTerminatedEvent):
                listener.onQueryTerminated(event)
        except Exception:
            logger.exception("Listener %s threw an exception", type(listener).__name__)


__all__ = [
    "ListenerBus",
    "QueryIdleEvent",
    "QueryProgressEvent",
    "QueryStartedEvent",
    "QueryTerminatedEvent",
    "StreamingQueryListener",
]

"""StreamExecution: the lifecycle of one streaming query run.

One dedicated thread (``stream execution thread for <prettyIdString>``) runs the
query; the user's thread talks to it only through events and locks: ``start()``
returns once the started event is posted, ``stop()`` asks the thread to end and joins
it, ``processAllAvailable()`` waits until a trigger finds no new data. Subclasses
implement :meth:`run_activated_stream` (micro-batch here; continuous in its own
package).
"""

from __future__ import annotations

import enum
import logging
import re
import threading
import traceback
import uuid
from typing import TYPE_CHECKING, Any, Protocol

from lockgate.checkpoint.run_lock import CheckpointRunLock
from lockgate.errors import StreamingQueryException, error_class_of
from lockgate.interrupt import interruptible_by
from lockgate.plan.state_udf import query_running
from lockgate.state.provider import (
    PROVIDER_CONF,
    check_state_written_by_lockgate,
    warn_unhonoured_provider,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.listener import StreamingQueryProgress

    from lockgate.checkpoint.fs import CheckpointFileSystem
    from lockgate.clock import Clock

logger = logging.getLogger("lockgate.execution.StreamExecution")


class QueryState(enum.Enum):
    INITIALIZING = "INITIALIZING"
    ACTIVE = "ACTIVE"
    RECONFIGURING = "RECONFIGURING"
    TERMINATED = "TERMINATED"


class _StoppedByUser(Exception):
    """Raised inside the stream thread when ``stop()`` interrupted a batch."""


class QueryEvents(Protocol):
    """What a run tells its query manager (``lockgate.api.manager``, which posts the
    events to the listeners and keeps the active and terminated queries)."""

    def query_started(self, execution: StreamExecution) -> None: ...

    def query_progress(self, execution: StreamExecution, progress: StreamingQueryProgress) -> None: ...

    def query_idle(self, execution: StreamExecution, now_ms: int) -> None: ...

    def query_terminated(self, execution: StreamExecution) -> None:
        """The run ended (after its last progress): forget it, then post the event."""


class StreamExecution:
    """Base of the stream execution engines: thread, state, latches, status."""

    def __init__(
        self,
        *,
        spark: SparkSession,
        manager: QueryEvents,
        name: str | None,
        query_id: str,
        checkpoint_root: str,
        checkpoint_fs: CheckpointFileSystem,
        delete_checkpoint_on_stop: bool,
        clock: Clock,
    ) -> None:
        self.spark = spark
        self.manager = manager
        self.name = name
        self.id = query_id
        self.run_id = str(uuid.uuid4())
        self.checkpoint_root = checkpoint_root
        self.fs = checkpoint_fs
        self.delete_checkpoint_on_stop = delete_checkpoint_on_stop
        self.clock = clock

        self._state = QueryState.INITIALIZING
        self._state_lock = threading.RLock()
        # start() and a stop() of a run whose thread is not running yet exclude each
        # other: another session may stop this run between its registration and its start
        # (spark.sql.streaming.stopActiveRunOnRestart), and then it must not start at all.
        self._lifecycle_lock = threading.Lock()
        self._start_latch = threading.Event()
        self._termination_latch = threading.Event()
        self.stop_event = threading.Event()
        # Set by stop() and processAllAvailable(): ends a trigger's wait for data
        # (spark.sql.streaming.pollingDelay) early, so the waiter's next trigger lists
        # the sources at once instead of after the delay.
        self.wake_event = threading.Event()
        self._await_progress = threading.Condition()
        self._no_new_data = False
        self._registered = False
        self.stream_death_cause: StreamingQueryException | None = None
        self._status: dict[str, Any] = {
            "message": "Initializing StreamExecution",
            "isDataAvailable": False,
            "isTriggerActive": False,
        }
        self._thread = threading.Thread(
            target=self._run_stream,
            name=f"stream execution thread for {self.pretty_id_string}",
            daemon=True,
        )

    # -- identity --------------------------------------------------------------------
    @property
    def pretty_id_string(self) -> str:
        ids = f"[id = {self.id}, runId = {self.run_id}]"
        return f"{self.name} {ids}" if self.name else ids

    def batch_description(self, batch: str) -> str:
        name = self.name or ""
        return f"{name}<br/>id = {self.id}<br/>runId = {self.run_id}<br/>batch = {batch}"

    # -- state -----------------------------------------------------------------------
    @property
    def state(self) -> QueryState:
        with self._state_lock:
            return self._state

    def _transition(self, expected: QueryState | None, new: QueryState) -> bool:
        with self._state_lock:
            if expected is not None and self._state is not expected:
                return False
            self._state = new
            return True

    @property
    def is_active(self) -> bool:
        return self.state is not QueryState.TERMINATED

    @property
    def status(self) -> dict[str, Any]:
        with self._state_lock:
            return dict(self._status)

    def update_status(self, message: str | None = None, **flags: bool) -> None:
        with self._state_lock:
            if message is not None:
                self._status["message"] = message
            self._status.update(flags)

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        logger.info(
            "Starting %s. Use %s to store the query checkpoint.",
            self.pretty_id_string,
            self.checkpoint_root,
        )

        with self._lifecycle_lock:
            if self._termination_latch.is_set():
                return  # stopped (by a newer run of this query) before it started
            # Before anything is written under the checkpoint: refuse a second run of
            # another driver process (runs of this application were settled by the manager).
            self._run_lock = CheckpointRunLock.acquire(
                self.fs, self.checkpoint_root, self.run_id, f"query {self.pretty_id_string}"
            )
            try:
                self._check_state_provider()
                self._thread.start()
            except BaseException:
                self._run_lock.release()
                raise
        self._start_latch.wait()

    def _check_state_provider(self) -> None:
        """Warn once about a state store provider conf lockgate does not honour, and
        refuse a checkpoint whose state native Spark wrote (lockgate.state.provider)."""

        warn_unhonoured_provider(self.spark.conf, self.pretty_id_string)
        recorded = None
        log = getattr(self, "offset_log", None)
        try:
            latest = log.get_latest() if log is not None else None
        except Exception:  # noqa: BLE001 - the run reports a bad offsets log itself
            latest = None
        if latest is not None:
            recorded = latest[1].metadata.conf.get(PROVIDER_CONF)
        check_state_written_by_lockgate(self.fs, self.checkpoint_root, recorded)

    def _run_stream(self) -> None:
        sc = self.spark.sparkContext
        try:
            sc.setJobGroup(self.run_id, self.batch_description("init"), interruptOnCancel=True)
            sc.setLocalProperty("sql.streaming.queryId", self.id)
            self._registered = True
            query_running(self.id, True)
            self.manager.query_started(self)
            self._start_latch.set()
            self.update_status("Initializing sources")
            if self._transition(QueryState.INITIALIZING, QueryState.ACTIVE):
                with interruptible_by(self.stop_event):
                    self.run_activated_stream()
            self.update_status("Stopped")
        except BaseException as exc:  # noqa: BLE001 - every failure must reach the user
            if self.stop_event.is_set() and not isinstance(exc, StreamingQueryException):
                logger.info("Query %s was stopped", self.pretty_id_string)
            else:
                self._record_failure(exc)
                # Spark's runStream: the status keeps the failure's own message
                cause = exc.__cause__ if isinstance(exc, StreamingQueryException) else exc
                self.update_status(f"Terminated with exception: {_cause_message(cause or exc)}")
        finally:
            if self._registered:
                query_running(self.id, False)
            self._start_latch.set()
            self._finish()

    def _record_failure(self, exc: BaseException) -> None:
        if isinstance(exc, StreamingQueryException):
            self.stream_death_cause = exc
        else:
            self.stream_death_cause = StreamingQueryException.failed(
                exc, _cause_message(exc), query_id=self.id, run_id=self.run_id,
                batch_id=getattr(self, "current_batch_id", None),
                identifier=self.pretty_id_string,
            )
            self.stream_death_cause.__cause__ = exc
        logger.error(
            "Query %s terminated with error\n%s",
            self.pretty_id_string,
            "".join(traceback.format_exception(exc)),
        )

    def _finish(self) -> None:
        try:
            self.stop_sources()
        finally:
            self._transition(None, QueryState.TERMINATED)
            # a failed run's status keeps its "Terminated with exception" message, as Spark's
            message = "Stopped" if self.stream_death_cause is None else None
            self.update_status(message, isTriggerActive=False, isDataAvailable=False)
            if self.delete_checkpoint_on_stop and (
                self.stream_death_cause is None or self._force_delete_temp_checkpoint()
            ):
                self.fs.delete_recursive(self.checkpoint_root)
            # The checkpoint is free before the manager hears the run ended: a run of the
            # same query that the manager then lets start finds the lock released.
            run_lock = getattr(self, "_run_lock", None)
            if run_lock is not None:
                run_lock.release()
            self.manager.query_terminated(self)
            self._termination_latch.set()
            with self._await_progress:
                self._await_progress.notify_all()

    def _force_delete_temp_checkpoint(self) -> bool:
        value = self.spark.conf.get("spark.sql.streaming.forceDeleteTempCheckpointLocation", "false")
        return str(value).lower() == "true"

    def run_activated_stream(self) -> None:
        raise NotImplementedError

    def stop_sources(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        """Stop the query, waiting for the stream thread to end."""
        self.stop_event.set()
        self.wake_event.set()
        self._transition(None, QueryState.TERMINATED)
        if threading.current_thread() is not self._thread:
            with self._lifecycle_lock:
                if self._thread.ident is None and not self._termination_latch.is_set():
                    self._finish()  # never started; start() sees it and never will
            if self._thread.is_alive():
                try:
                    self.spark.sparkContext.cancelJobGroup(self.run_id)
                except Exception:
                    logger.debug("cancelJobGroup failed for %s", self.run_id, exc_info=True)
                self._thread.join()
        logger.info("Query %s was stopped", self.pretty_id_string)

    def await_termination(self, timeout: float | None = None) -> bool:
        finished = self._termination_latch.wait(timeout)
        if self.stream_death_cause is not None:
            raise self.stream_death_cause
        return finished

    # -- processAllAvailable -----------------------------------------------------------
    def signal_no_new_data(self) -> None:
        with self._await_progress:
            self._no_new_data = True
            self._await_progress.notify_all()

    def process_all_available(self) -> None:
        if threading.current_thread() is self._thread:
            raise RuntimeError(
                "Cannot wait for a query state from the same thread that is running the query"
            )
        if self.stream_death_cause is not None:
            raise self.stream_death_cause
        if not self.is_active:
            return
        with self._await_progress:
            self._no_new_data = False
            self.wake_event.set()
            while not self._no_new_data and self.is_active:
                self._await_progress.wait(10.0)
                if self.stream_death_cause is not None:
                    break
        if self.stream_death_cause is not None:
            raise self.stream_death_cause

    @property
    def stream_thread(self) -> threading.Thread:
        return self._thread


def _cause_message(exc: BaseException) -> str:
    """The cause's message in a STREAM_FAILED message, as Spark puts it there: a Spark
    error's own message (``[CLASS] ... SQLSTATE: ...``), else the exception described."""
    if error_class_of(exc) is not None:
        try:
            return str(exc.getMessage())  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001, S110 - a captured exception whose JVM side is gone
            pass
    return _describe(exc)


def _describe(exc: BaseException, limit: int = 4000) -> str:
    """The failure's own words: for JVM errors the Java exception and its causes."""
    java = getattr(exc, "java_exception", None)
    if java is not None:
        parts = []
        current = java
        try:
            while current is not None and len(parts) < 5:
                parts.append(str(current.toString()))
                current = current.getCause()
        except Exception:  # noqa: BLE001, S110 - the JVM may be gone
            pass
        text = " Caused by: ".join(parts) or str(exc)
        name = "Py4JJavaError"
    else:
        text = str(exc).strip()
        name = type(exc).__name__
    if len(text) > limit:
        text = text[:limit] + " ..."
    if java is None and _SPARK_ERROR.match(text):
        return text  # a Spark error class's message: as Spark puts it, with no type before it
    return f"{name}: {text}" if text else name


_SPARK_ERROR = re.compile(r"\[[A-Z][A-Z0-9_]*(\.[A-Z][A-Z0-9_]*)*\] ")

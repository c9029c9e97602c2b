"""``StreamingQuery``: the handle ``writeStream.start()`` returns."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lockgate.plan.explain import explain_execution

if TYPE_CHECKING:
    from pyspark.sql.streaming.listener import StreamingQueryProgress

    from lockgate.errors import StreamingQueryException
    from lockgate.execution.microbatch import MicroBatchExecution


def timeout_not_positive(timeout: object) -> Exception:
    """PySpark's error for a ``timeout`` that is not a positive number."""
    from pyspark.errors import PySparkValueError

    return PySparkValueError(
        errorClass="VALUE_NOT_POSITIVE",
        messageParameters={"arg_name": "timeout", "arg_value": type(timeout).__name__},
    )


class StreamingQuery:
    """A running (or finished) streaming query, as ``pyspark.sql.streaming.StreamingQuery``."""

    def __init__(self, execution: MicroBatchExecution) -> None:
        self._execution = execution

    @property
    def id(self) -> str:
        """The query id, which survives restarts from the same checkpoint."""
        return self._execution.id

    @property
    def runId(self) -> str:
        """Unique to this run of the query."""
        return self._execution.run_id

    @property
    def name(self) -> str | None:
        return self._execution.name

    @property
    def isActive(self) -> bool:
        return self._execution.is_active

    @property
    def status(self) -> dict[str, Any]:
        return self._execution.status

    @property
    def lastProgress(self) -> StreamingQueryProgress | None:
        return self._execution.last_progress()

    @property
    def recentProgress(self) -> list[StreamingQueryProgress]:
        return self._execution.recent_progress()

    def awaitTermination(self, timeout: float | None = None) -> bool | None:
        """Wait for the query to end; re-raise its failure.

        With ``timeout`` (seconds) returns whether it ended in time.
        """
        if timeout is not None:
            if not isinstance(timeout, (int, float)) or timeout <= 0:
                raise timeout_not_positive(timeout)
            return self._execution.await_termination(float(timeout))
        self._execution.await_termination(None)
        return None

    def processAllAvailable(self) -> None:
        """Block until every source's available data is processed (for tests)."""
        self._execution.process_all_available()

    def stop(self) -> None:
        """Stop the query; return once listeners have had its last events.

        Spark posts the terminated event before ``stop()`` returns and PySpark code waits
        for Spark's listener bus to drain (``listenerBus().waitUntilEmpty()``) before it
        reads what its listeners saw; lockgate's listener bus is its own, so ``stop()``
        drains it (except when called from a listener, which would wait for itself).
        """
        self._execution.stop()
        drain = getattr(self._execution.manager, "drain_listener_events", None)
        if drain is not None:
            drain()

    def exception(self) -> StreamingQueryException | None:
        return self._execution.stream_death_cause

    def explain(self, extended: bool = False) -> None:
        print(self._explain_string(extended))

    def _explain_string(self, extended: bool) -> str:
        continuous = getattr(self._execution, "explain_string", None)
        if continuous is not None:
            return str(continuous())
        execution = self._execution.last_execution
        if execution is None:
            return "No physical plan. Waiting for data."
        return explain_execution(execution, extended)

    def __repr__(self) -> str:
        return f"<lockgate.StreamingQuery {self._execution.pretty_id_string}>"

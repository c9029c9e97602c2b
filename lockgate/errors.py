"""Exceptions raised by lockgate.

One root, :class:`LockgateError`; one branch per subsystem. Where PySpark has an
exception for the same situation, the lockgate exception also inherits it, so code
written against ``pyspark.sql.streaming`` catches lockgate's errors unchanged.
"""

from __future__ import annotations

import traceback

from pyspark.errors import AnalysisException as _PySparkAnalysisException
from pyspark.errors import PySparkException as _PySparkException
from pyspark.errors import SparkRuntimeException as _PySparkSparkRuntimeException
from pyspark.errors import StreamingQueryException as _PySparkStreamingQueryException
from pyspark.errors.exceptions.captured import (
    StreamingQueryException as _CapturedStreamingQueryException,
)


class LockgateError(Exception):
    """Root of every exception lockgate raises on purpose."""


class OptionError(LockgateError, ValueError):
    """A source, sink or writer option is missing or has a bad value."""

    def __init__(self, message: str, *, option: str | None = None) -> None:
        super().__init__(message)
        self.option = option


def spark_error_message(error_class: str, parameters: dict[str, str]) -> tuple[str, str | None]:
    """Spark's own message (``[CLASS] text SQLSTATE: x``) and SQLSTATE for one of its error
    classes, from the JVM's ``error-conditions.json``."""
    from pyspark import SparkContext

    jvm = SparkContext._jvm
    helper = getattr(jvm, "org.apache.spark.SparkThrowableHelper")
    message = str(helper.getMessage(error_class, parameters))
    state = helper.getSqlState(error_class)
    return message, (str(state) if state is not None else None)


class _SparkErrorText:
    """What PySpark's errors answer, for lockgate's errors that carry one of Spark's error
    classes: the message (``message_text``) and SQL state (``_sql_state``) set by the
    subclass, with nothing added to the message (PySpark's ``__str__`` would)."""

    message_text: str
    _sql_state: str | None

    def getSqlState(self) -> str | None:
        return self._sql_state

    def getMessage(self) -> str:
        return self.message_text

    def __str__(self) -> str:
        return self.message_text


class AnalysisError(_SparkErrorText, LockgateError, _PySparkAnalysisException):
    """A query is invalid or not supported in streaming, found before it runs.

    Inherits PySpark's :class:`pyspark.errors.AnalysisException`, so
    ``except AnalysisException`` keeps working. :meth:`spark` builds one with a Spark
    error class, whose message, condition and SQLSTATE are Spark's.
    """

    def __init__(
        self,
        message: str,
        *,
        error_class: str | None = None,
        parameters: dict[str, str] | None = None,
        sql_state: str | None = None,
    ) -> None:
        _PySparkAnalysisException.__init__(
            self, message=message, errorClass=error_class, messageParameters=parameters
        )
        self.message_text = message
        self._sql_state = sql_state

    @classmethod
    def spark(cls, error_class: str, parameters: dict[str, str]) -> AnalysisError:
        message, state = spark_error_message(error_class, parameters)
        return cls(message, error_class=error_class, parameters=parameters, sql_state=state)


class StateDataSourceError(_SparkErrorText, LockgateError, _PySparkSparkRuntimeException, ValueError):
    """A bad option of ``ls.read.state``, with the error class of Spark's state data
    source (``STDS_*``); inherits PySpark's ``SparkRuntimeException``, which Spark's
    reader raises for the same options."""

    def __init__(self, error_class: str, parameters: dict[str, str]) -> None:
        message, state = spark_error_message(error_class, parameters)
        _PySparkSparkRuntimeException.__init__(
            self, message=message, errorClass=error_class, messageParameters=parameters
        )
        self.message_text = message
        self._sql_state = state


class NotSupportedYetError(LockgateError, NotImplementedError):
    """An operation Spark supports that lockgate does not support yet."""

    def __init__(self, operation: str, detail: str = "") -> None:
        message = f"{operation} is not supported yet by lockgate."
        if detail:
            message += " " + detail
        super().__init__(message)
        self.operation = operation


class ArithmeticOverflowError(LockgateError, ArithmeticError):
    """A value overflowed its type in a stateful operator (Spark's ARITHMETIC_OVERFLOW)."""


class CheckpointError(LockgateError, OSError):
    """A checkpoint file or directory is missing, corrupt, of an unknown version,
    or belongs to a different query."""

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path

    def __str__(self) -> str:
        return str(self.args[0])


class ConcurrentWriteError(CheckpointError):
    """Another writer already wrote the same batch file of a checkpoint log."""


class SourceError(LockgateError):
    """A streaming source failed to report offsets or produce a batch."""


class SinkError(LockgateError):
    """A streaming sink failed to write a batch."""


class ForeachBatchUserFunctionError(_SparkErrorText, SinkError, _PySparkException):
    """The function given to ``foreachBatch`` raised: Spark's
    ``FOREACH_BATCH_USER_FUNCTION_ERROR``, with the function's exception as ``__cause__``."""

    ERROR_CLASS = "FOREACH_BATCH_USER_FUNCTION_ERROR"

    def __init__(self, reason: str) -> None:
        parameters = {"reason": reason}
        message, self._sql_state = spark_error_message(self.ERROR_CLASS, parameters)
        _PySparkException.__init__(
            self, message=message, errorClass=self.ERROR_CLASS, messageParameters=parameters
        )
        self.message_text = message


class StreamingQueryException(LockgateError, _CapturedStreamingQueryException):
    """The exception that stopped a streaming query.

    Raised by :meth:`StreamingQuery.awaitTermination` and
    :meth:`StreamingQuery.processAllAvailable` and returned by
    :meth:`StreamingQuery.exception`. ``cause`` is the original exception.
    Inherits PySpark's :class:`pyspark.errors.StreamingQueryException` and carries what
    Spark's does: condition ``STREAM_FAILED`` (:meth:`getCondition`), parameters ``id``,
    ``runId`` and ``message`` (the cause's), SQLSTATE ``XXKST``; :meth:`failed` builds it
    with Spark's message, "[STREAM_FAILED] Query [id = ..., runId = ...] terminated with
    exception: ...".
    """

    ERROR_CLASS = "STREAM_FAILED"
    SQL_STATE = "XXKST"
    # pyspark's captured StreamingQueryException (what native Spark raises, and what
    # code catches) keeps the JVM exception in _origin: lockgate's has none, and answers
    # from its own condition and parameters (PySparkException's) instead.
    _origin = None
    _stackTrace = ""

    def __init__(
        self,
        message: str,
        *,
        cause: BaseException | None = None,
        query_id: str | None = None,
        run_id: str | None = None,
        batch_id: int | None = None,
        parameters: dict[str, str] | None = None,
    ) -> None:
        _PySparkStreamingQueryException.__init__(
            self,
            message=message,
            errorClass=self.ERROR_CLASS if parameters is not None else None,
            messageParameters=parameters,
        )
        self.message_text = message
        self.cause = cause
        self.query_id = query_id
        self.run_id = run_id
        self.batch_id = batch_id

    @classmethod
    def failed(
        cls, cause: BaseException, cause_message: str, *, query_id: str, run_id: str,
        batch_id: int | None = None, identifier: str | None = None,
    ) -> StreamingQueryException:
        parameters = {"id": query_id, "runId": run_id, "message": cause_message}
        message = (
            f"[{cls.ERROR_CLASS}] Query [id = {query_id}, runId = {run_id}] terminated with "
            f"exception: {cause_message} SQLSTATE: {cls.SQL_STATE}"
        )
        # str() adds the query's identifier (with its name), as Spark's debug string does
        text = f"{message}\n=== Streaming Query ===\nIdentifier: {identifier}" if identifier else message
        exc = cls(
            text, cause=cause, query_id=query_id, run_id=run_id, batch_id=batch_id,
            parameters=parameters,
        )
        exc._spark_message = message
        return exc

    _spark_message: str | None = None

    def getSqlState(self) -> str | None:
        return self.SQL_STATE if self.getCondition() is not None else None

    def getCondition(self) -> str | None:
        return _PySparkException.getCondition(self)

    def getErrorClass(self) -> str | None:
        return _PySparkException.getCondition(self)

    def getMessageParameters(self) -> dict[str, str] | None:
        return _PySparkException.getMessageParameters(self)

    def getQueryContext(self) -> list:  # type: ignore[type-arg]
        return _PySparkException.getQueryContext(self)

    def getMessage(self) -> str:
        return self._spark_message or self.message_text

    def __str__(self) -> str:
        return self.message_text

    def desc(self) -> str:  # pyspark's CapturedException API
        return self.message_text

    # The fields of PySpark's CapturedException, which code (PySpark's own tests among it)
    # walks to find a failure's root: the message, then the cause while it is captured too.
    @property
    def _desc(self) -> str:
        return self.message_text  # as the JVM's getMessage: with the query's description

    @property
    def _cause(self) -> BaseException | None:
        return self.cause if hasattr(self.cause, "_desc") else None


def exception_string(exc: BaseException) -> str:
    """``exc`` as Spark's ``Utils.exceptionString`` writes a failure into
    ``QueryTerminatedEvent.exception``: the class and message, the frames, then each cause.
    A captured JVM exception brings the JVM's own string (PySpark keeps it as
    ``_stackTrace``); a Python one gets its Python frames in the same shape."""
    trace = getattr(exc, "_stackTrace", None)
    if isinstance(trace, str) and trace:
        return trace
    lines: list[str] = []
    current: BaseException | None = exc
    seen: set[int] = set()
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        head = f"{type(current).__module__}.{type(current).__qualname__}: {current}"
        lines.append(head if not lines else f"Caused by: {head}")
        lines.extend(
            f"\tat {frame.name}({frame.filename}:{frame.lineno})"
            for frame in traceback.extract_tb(current.__traceback__)
        )
        current = current.__cause__ or current.__context__
    return "\n".join(lines) + "\n"


def error_class_of(exc: BaseException | None) -> str | None:
    """The Spark error class of ``exc`` (its ``getCondition()``), or None: what Spark puts
    in ``QueryTerminatedEvent.errorClassOnException`` for the cause of a failure."""
    get = getattr(exc, "getCondition", None)
    if get is None:
        return None
    try:
        condition = get()
    except Exception:  # noqa: BLE001 - a captured exception whose JVM side is gone
        return None
    return str(condition) if condition else None

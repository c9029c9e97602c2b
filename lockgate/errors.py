"""Exceptions raised by lockgate.

One root, :class:`LockgateError`; one branch per subsystem. Where PySpark has an
exception for the same situation, the lockgate exception also inherits it, so code
written against ``pyspark.sql.streaming`` catches lockgate's errors unchanged.
"""

from __future__ import annotations

from pyspark.errors import AnalysisException as _PySparkAnalysisException
from pyspark.errors import StreamingQueryException as _PySparkStreamingQueryException


class LockgateError(Exception):
    """Root of every exception lockgate raises on purpose."""


class OptionError(LockgateError, ValueError):
    """A source, sink or writer option is missing or has a bad value."""

    def __init__(self, message: str, *, option: str | None = None) -> None:
        super().__init__(message)
        self.option = option


class AnalysisError(LockgateError, _PySparkAnalysisException):
    """A query is invalid or not supported in streaming, found before it runs.

    Inherits PySpark's :class:`pyspark.errors.AnalysisException`, so
    ``except AnalysisException`` keeps working.
    """

    def __init__(self, message: str) -> None:
        _PySparkAnalysisException.__init__(self, message=message)
        self.message_text = message

    def __str__(self) -> str:
        return self.message_text


class NotSupportedYetError(LockgateError, NotImplementedError):
    """An operation Spark supports that lockgate does not support yet."""

    def __init__(self, operation: str, detail: str = "") -> None:
        message = f"{operation} is not supported yet by lockgate."
        if detail:
            message += " " + detail
        super().__init__(message)
        self.operation = operation


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


class StreamingQueryException(LockgateError, _PySparkStreamingQueryException):
    """The exception that stopped a streaming query.

    Raised by :meth:`StreamingQuery.awaitTermination` and
    :meth:`StreamingQuery.processAllAvailable` and returned by
    :meth:`StreamingQuery.exception`. ``cause`` is the original exception.
    Inherits PySpark's :class:`pyspark.errors.StreamingQueryException`.
    """

    def __init__(
        self,
        message: str,
        *,
        cause: BaseException | None = None,
        query_id: str | None = None,
        run_id: str | None = None,
        batch_id: int | None = None,
    ) -> None:
        _PySparkStreamingQueryException.__init__(self, message=message)
        self.message_text = message
        self.cause = cause
        self.query_id = query_id
        self.run_id = run_id
        self.batch_id = batch_id

    def __str__(self) -> str:
        return self.message_text

    def desc(self) -> str:  # pyspark's CapturedException API
        return self.message_text

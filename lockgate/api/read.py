"""``ls.read``: batch reads lockgate adds to Spark's, such as a query's state."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from lockgate.api.session import StreamingSession


class LockgateReader:
    def __init__(self, session: StreamingSession) -> None:
        self._session = session

    def state(
        self,
        checkpointLocation: str,
        operatorId: int = 0,
        batchId: int | None = None,
        joinSide: str | None = None,
    ) -> DataFrame:
        """The keys and values of stateful operator ``operatorId`` after batch ``batchId``
        (default: the last committed batch), as columns ``key``, ``value``,
        ``partition_id``, as Spark's state data source (``format("statestore")``) gives
        them.

        A stream-stream join keeps each side's rows apart: ``joinSide`` (``"left"`` or
        ``"right"``, as Spark's option of that name) picks the side, whose buffered rows
        come back as ``value``, keyed by their join keys.
        """
        from lockgate.state.reader import read_state

        return read_state(self._session.spark, checkpointLocation, operatorId, batchId, joinSide)

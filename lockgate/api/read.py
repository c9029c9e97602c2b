"""``ls.read``: batch reads lockgate adds to Spark's, such as a query's state."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lockgate.state.reader import read_state

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
        stateVarName: str | None = None,
        readRegisteredTimers: bool | str = False,
        flattenCollectionTypes: bool | str = True,
    ) -> DataFrame:
        """The keys and values of stateful operator ``operatorId`` after batch ``batchId``
        (default: the last committed batch), as columns ``key``, ``value``,
        ``partition_id``, as Spark's state data source (``format("statestore")``) gives
        them.

        A stream-stream join keeps each side's rows apart: ``joinSide`` (``"left"`` or
        ``"right"``, as Spark's option of that name) picks the side, whose buffered rows
        come back as ``value``, keyed by their join keys.

        A ``transformWithState(InPandas)`` operator keeps each state variable apart, as
        Spark's options of these names: ``stateVarName`` picks one (columns ``key``,
        ``value`` for a ``ValueState``; ``key``, ``list_element`` for a ``ListState``, or
        ``list_value`` with ``flattenCollectionTypes=False``; ``key``, ``user_map_key``,
        ``user_map_value`` for a ``MapState``, or ``map_value``), ``readRegisteredTimers``
        its timers (``key``, ``expiration_timestamp_ms``); then ``partition_id``.
        """
        return read_state(
            self._session.spark,
            checkpointLocation,
            operatorId,
            batchId,
            joinSide,
            state_var_name=stateVarName,
            read_registered_timers=readRegisteredTimers,
            flatten_collection_types=flattenCollectionTypes,
        )

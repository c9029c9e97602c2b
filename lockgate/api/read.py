"""``ls.read``: Spark's ``spark.read``, which also reads a lockgate query's state.

``ls.read.state(checkpoint, ...)`` and Spark's spelling of the same read,
``ls.read.format("statestore").option(...).load(checkpoint)``, read the state of a
lockgate checkpoint; every other format, option and method is Spark's
``DataFrameReader``'s (``ls.read.parquet(path)``, ``ls.read.format("json")...``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lockgate.errors import NotSupportedYetError, OptionError
from lockgate.execution import assembly
from lockgate.state.reader import read_state, read_state_metadata

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, DataFrameReader

    from lockgate.api.session import StreamingSession

STATE_FORMAT = "statestore"
STATE_METADATA_FORMAT = "state-metadata"

_STATE_OPTIONS = {
    "path": "path",
    "operatorid": "operatorId",
    "batchid": "batchId",
    "joinside": "joinSide",
    "statevarname": "stateVarName",
    "readregisteredtimers": "readRegisteredTimers",
    "flattencollectiontypes": "flattenCollectionTypes",
    "storename": "storeName",
    "readchangefeed": "readChangeFeed",
    "changestartbatchid": "changeStartBatchId",
    "changeendbatchid": "changeEndBatchId",
    "snapshotstartbatchid": "snapshotStartBatchId",
    "snapshotpartitionid": "snapshotPartitionId",
}
"""The options of Spark's state data source that lockgate reads (lower case -> Spark's
spelling); any other is refused."""


class LockgateReader:
    """Spark's ``DataFrameReader`` for the session, with the state of lockgate's
    checkpoints behind ``state(...)`` and ``format("statestore")``."""

    def __init__(self, session: StreamingSession) -> None:
        self._session = session
        self._reader: DataFrameReader = session.spark.read
        self._format: str | None = None
        self._options: dict[str, tuple[str, Any]] = {}
        """Each option given, by its lower-cased name: (its name as given, its value)."""

    # -- the builder: kept here too, for a state read ---------------------------------
    def format(self, source: str) -> LockgateReader:
        self._format = source
        self._reader.format(source)
        return self

    def schema(self, schema: Any) -> LockgateReader:
        self._reader.schema(schema)
        return self

    def option(self, key: str, value: Any) -> LockgateReader:
        self._options[key.lower()] = (key, value)
        self._reader.option(key, value)
        return self

    def options(self, **options: Any) -> LockgateReader:
        for key, value in options.items():
            self.option(key, value)
        return self

    def load(
        self,
        path: str | list[str] | None = None,
        format: str | None = None,
        schema: Any = None,
        **options: Any,
    ) -> DataFrame:
        source = format if format is not None else self._format
        if source is not None and source.lower() == STATE_METADATA_FORMAT:
            # Spark's state-metadata source, over lockgate's checkpoint files
            self.options(**options)
            location = path if path is not None else self._options.get("path", (None, None))[1]
            if not location or isinstance(location, (list, tuple)):
                raise OptionError(
                    "The state-metadata source reads one checkpoint: give its location, "
                    "load(checkpointLocation) or option('path', checkpointLocation).",
                    option="path",
                )
            return read_state_metadata(self._session.spark, str(location))
        if source is None or source.lower() != STATE_FORMAT:
            return self._reader.load(path, format, schema, **options)
        self.options(**options)
        if schema is not None:
            raise OptionError(
                "The statestore source has a schema of its own (the operator's key and "
                "value); do not give it one with schema().",
                option="schema",
            )
        if path is not None:
            self._options["path"] = ("path", path)
        return self._state_from_options()

    def _state_from_options(self) -> DataFrame:
        given = {k: value for k, (_, value) in self._options.items()}
        unknown = sorted(name for k, (name, _) in self._options.items() if k not in _STATE_OPTIONS)
        if unknown:
            raise NotSupportedYetError(
                f"Option {unknown[0]!r} of the statestore source",
                "lockgate's state reader takes "
                + ", ".join(v for k, v in _STATE_OPTIONS.items() if k != "storename")
                + ".",
            )
        path = given.get("path")
        if not path or isinstance(path, (list, tuple)):
            raise OptionError(
                "The statestore source reads one checkpoint: give its location, "
                "load(checkpointLocation) or option('path', checkpointLocation).",
                option="path",
            )
        store = str(given.get("storename", "default")).strip()
        if store != "default":
            raise NotSupportedYetError(
                f"storeName {store!r} of the statestore source",
                "lockgate reads a join's state by joinSide ('left' or 'right').",
            )
        batch = given.get("batchid")
        return self.state(
            str(path),
            operatorId=int(given.get("operatorid", 0)),
            batchId=None if batch is None else int(batch),
            joinSide=given.get("joinside"),
            stateVarName=given.get("statevarname"),
            readRegisteredTimers=given.get("readregisteredtimers", False),
            flattenCollectionTypes=given.get("flattencollectiontypes", True),
            readChangeFeed=given.get("readchangefeed", False),
            changeStartBatchId=_long_option(given, "changestartbatchid"),
            changeEndBatchId=_long_option(given, "changeendbatchid"),
            snapshotStartBatchId=_long_option(given, "snapshotstartbatchid"),
            snapshotPartitionId=_long_option(given, "snapshotpartitionid"),
        )

    def state(
        self,
        checkpointLocation: str,
        operatorId: int = 0,
        batchId: int | None = None,
        joinSide: str | None = None,
        stateVarName: str | None = None,
        readRegisteredTimers: bool | str = False,
        flattenCollectionTypes: bool | str = True,
        readChangeFeed: bool | str = False,
        changeStartBatchId: int | None = None,
        changeEndBatchId: int | None = None,
        snapshotStartBatchId: int | None = None,
        snapshotPartitionId: int | None = None,
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

        ``readChangeFeed`` with ``changeStartBatchId`` (and ``changeEndBatchId``, default
        the last committed batch) gives instead the changes each batch made, as Spark's
        option of that name: ``batch_id``, ``change_type`` (``update``: a key put,
        ``delete``: a key removed, its ``value`` null), ``key``, ``value``,
        ``partition_id``; not for joins and session windows, and of a
        transformWithState operator for its value states only (``stateVarName``).

        ``snapshotStartBatchId`` with ``snapshotPartitionId`` read that one partition's
        state at ``batchId`` from the snapshot after batch ``snapshotStartBatchId`` and
        the deltas after it, as Spark's options of these names (where lockgate has no
        snapshot at that batch, the state is loaded from the files that hold it).
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
            read_change_feed=readChangeFeed,
            change_start_batch_id=changeStartBatchId,
            change_end_batch_id=changeEndBatchId,
            snapshot_start_batch_id=snapshotStartBatchId,
            snapshot_partition_id=snapshotPartitionId,
        )

    def __getattr__(self, name: str) -> Any:
        """The rest is Spark's reader's (``parquet``, ``json``, ``table``, ``schema``,
        ...), with the format and options given so far."""
        if name.startswith("__") or name in ("_reader", "_session", "_format", "_options"):
            raise AttributeError(name)
        return getattr(self._reader, name)


def _long_option(given: dict[str, Any], name: str) -> int | None:
    value = given.get(name)
    return None if value is None else int(value)


class _PlainSession:
    """What :class:`LockgateReader` takes of a session: ``spark``, a SparkSession whose
    ``read`` is Spark's own ``DataFrameReader`` (a batch session's own ``read`` is this
    reader)."""

    def __init__(self, session: Any) -> None:
        self.spark = _SparkReads(session)


class _SparkReads:
    def __init__(self, session: Any) -> None:
        self._session = session

    @property
    def read(self) -> Any:
        from pyspark.sql.readwriter import DataFrameReader

        return DataFrameReader(self._session)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_session":
            raise AttributeError(name)
        return getattr(self._session, name)


def _batch_reader(session: Any) -> LockgateReader:
    return LockgateReader(_PlainSession(session))  # type: ignore[arg-type]


assembly.BATCH_READER = _batch_reader

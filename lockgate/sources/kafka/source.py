"""``readStream.format("kafka")``: Kafka topics as a replayable, offset-based source.

The driver only asks Kafka for metadata: the partitions of the subscription and their
earliest/latest offsets (or the offsets of timestamps), through one librdkafka consumer
that never fetches records. Each batch is ``spark.range(n)`` in ``n`` partitions, one
Spark task per topic-partition range (Spark's ``KafkaSourceRDD``; ``minPartitions``
splits large ranges), turned into records by ``mapInArrow`` with a function that holds
the ranges and consumes range ``id`` from Kafka inside the task (:class:`RangeReader`),
with a consumer kept in the Python worker between tasks (``clients.py``). When the
session has Spark's Kafka connector (``spark.lockgate.kafka.io``), the batch is read by
Spark's batch Kafka reader in the JVM instead (``connector.py``), over the same ranges.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from lockgate import interrupt
from lockgate.checkpoint.log import MetadataLog
from lockgate.compat import override
from lockgate.errors import CheckpointError, ConcurrentWriteError, OptionError
from lockgate.interrupt import call_in_slices
from lockgate.sources.base import (
    ReadLimit,
    Source,
    SourceContext,
)
from lockgate.sources.kafka import connector
from lockgate.sources.kafka.clients import (
    KEPT_TIMEOUT_S,
    ClientPool,
    KeptClient,
    discard,
    pool_key,
)
from lockgate.sources.kafka.errors import DATA_LOSS_PREFIX, KafkaDataLossError, KafkaError
from lockgate.sources.kafka.offsets import (
    EARLIEST,
    LATEST,
    OffsetRange,
    PartitionOffsets,
    TopicPartition,
    describe,
    from_json,
    rate_limit,
    split_ranges,
    to_json,
)
from lockgate.sources.kafka.options import KafkaSourceOptions, check_consumer_config

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame


logger = logging.getLogger(__name__)
T = TypeVar("T")

HEADERS_TYPE = ArrayType(
    StructType([StructField("key", StringType(), True), StructField("value", BinaryType(), True)]),
    True,
)
KAFKA_SCHEMA = StructType(
    [
        StructField("key", BinaryType(), True),
        StructField("value", BinaryType(), True),
        StructField("topic", StringType(), True),
        StructField("partition", IntegerType(), True),
        StructField("offset", LongType(), True),
        StructField("timestamp", TimestampType(), True),
        StructField("timestampType", IntegerType(), True),
    ]
)
KAFKA_SCHEMA_WITH_HEADERS = StructType(
    [*KAFKA_SCHEMA.fields, StructField("headers", HEADERS_TYPE, True)]
)
METADATA_TIMEOUT_S = 30.0
INTERNAL_TOPICS = ("__consumer_offsets", "__transaction_state", "__share_group_state")
# librdkafka's answers to a call whose time ran out, or that found no broker up yet: a
# slice of a sliced metadata call (lockgate.interrupt) that may succeed on the next one
_NOT_YET = frozenset({"_TIMED_OUT", "_TRANSPORT", "_ALL_BROKERS_DOWN"})


def _not_yet(exc: BaseException) -> bool:
    error = exc.args[0] if exc.args else None
    name = getattr(error, "name", None)
    return callable(name) and name() in _NOT_YET


def kafka_schema(include_headers: bool) -> StructType:
    return KAFKA_SCHEMA_WITH_HEADERS if include_headers else KAFKA_SCHEMA


def report_data_loss(fail: bool, sub: str, reason: str) -> None:
    """Spark's ``reportDataLoss``: raise with failOnDataLoss, else warn and go on."""
    if fail:
        raise KafkaDataLossError(DATA_LOSS_PREFIX.format(sub=sub) + reason)
    logger.warning(
        "%s. Some data may have been lost because they are not available in Kafka any more; "
        "either the data was aged out by Kafka or the topic may have been deleted before all "
        "the data in the topic was processed. If you want your streaming query to fail on "
        'such cases, set the source option "failOnDataLoss" to "true".',
        reason,
    )


class OffsetReader:
    """Driver-side metadata through one consumer that never fetches records."""

    def __init__(self, options: KafkaSourceOptions, group_id: str) -> None:
        self.options = options
        self.config = {
            **options.consumer,
            "group.id": group_id,
            "enable.auto.commit": "false",
            "isolation.level": options.consumer.get("isolation.level", "read_uncommitted"),
        }
        check_consumer_config(self.config)
        self._consumer: Any = None

    @property
    def consumer(self) -> Any:
        if self._consumer is None:
            from confluent_kafka import Consumer

            self._consumer = Consumer(self.config)
        return self._consumer

    def partitions(self) -> list[TopicPartition]:
        """The subscription's topic-partitions now (missing topics have none)."""
        strategy = self.options.strategy
        if strategy.kind == "assign":
            return sorted(set(strategy.assigned))
        try:
            metadata = call_in_slices(
                lambda t: self.consumer.list_topics(timeout=t), METADATA_TIMEOUT_S, again=_not_yet
            )
        except interrupt.Interrupted:
            raise
        except Exception as exc:
            raise KafkaError(
                f"Could not read the topic metadata from Kafka at "
                f"{self.config.get('bootstrap.servers')}: {exc}"
            ) from exc
        out = []
        for name, topic in metadata.topics.items():
            if name in INTERNAL_TOPICS or topic.error is not None or not strategy.matches(name):
                continue
            out.extend((name, p) for p in topic.partitions)
        return sorted(out)

    def exists(self, tp: TopicPartition) -> bool:
        """Whether Kafka has the topic-partition now (whatever the subscription); False
        when the metadata cannot be read."""
        try:
            metadata = call_in_slices(
                lambda t: self.consumer.list_topics(timeout=t), METADATA_TIMEOUT_S, again=_not_yet
            )
        except interrupt.Interrupted:
            raise
        except Exception:  # the caller takes the path that reports it
            logger.debug("Kafka metadata unavailable while checking %s", tp, exc_info=True)
            return False
        topic = metadata.topics.get(tp[0])
        return topic is not None and topic.error is None and tp[1] in topic.partitions

    def with_retries(self, fetch: Callable[[], T]) -> T:
        """Spark's ``withRetries``: run ``fetch`` (a listing of the partitions and their
        offsets, as one unit) up to ``fetchOffset.numRetries`` times,
        ``fetchOffset.retryIntervalMs`` apart. A topic being deleted or created answers
        for a moment with unknown partitions or no leader."""
        attempts = self.options.fetch_offset_attempts
        for attempt in range(1, attempts + 1):
            try:
                return fetch()
            except KafkaDataLossError:
                raise
            except KafkaError as exc:
                if attempt == attempts:
                    raise
                logger.warning(
                    "Kafka offsets fetch failed (attempt %d of %d), retrying: %s",
                    attempt, attempts, exc,
                )
                interrupt.sleep(self.options.fetch_offset_retry_interval_ms / 1000.0)
        raise AssertionError("unreachable")

    def latest_of_all(self) -> PartitionOffsets:
        """The latest offsets of the subscription's partitions now."""
        return self.with_retries(lambda: self.latest(self.partitions()))

    def _watermarks(self, tp: TopicPartition) -> tuple[int, int]:
        from confluent_kafka import TopicPartition as KTP

        try:
            low, high = call_in_slices(
                lambda t: self.consumer.get_watermark_offsets(KTP(tp[0], tp[1]), timeout=t, cached=False),
                METADATA_TIMEOUT_S,
                again=_not_yet,
            )
        except interrupt.Interrupted:
            raise
        except Exception as exc:
            raise KafkaError(
                f"Could not read the offsets of {tp[0]}-{tp[1]} from Kafka: {exc}"
            ) from exc
        return int(low), int(high)

    def earliest(self, partitions: list[TopicPartition]) -> PartitionOffsets:
        return {tp: self._watermarks(tp)[0] for tp in partitions}

    def latest(self, partitions: list[TopicPartition]) -> PartitionOffsets:
        return {tp: self._watermarks(tp)[1] for tp in partitions}

    def for_timestamps(self, wanted: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        """The first offset at or after each timestamp; -1 where there is none."""
        from confluent_kafka import TopicPartition as KTP

        if not wanted:
            return {}
        found = call_in_slices(
            lambda t: self.consumer.offsets_for_times(
                [KTP(topic, p, ts) for (topic, p), ts in wanted.items()], timeout=t
            ),
            METADATA_TIMEOUT_S,
            again=_not_yet,
        )
        return {(k.topic, k.partition): int(k.offset) for k in found}

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


class _InitialOffsetLog(MetadataLog[dict[str, dict[str, int]]]):
    """``sources/<i>/0``: the resolved starting offsets, as Spark's KafkaSourceInitialOffsetWriter."""

    def serialize(self, entry: dict[str, dict[str, int]]) -> str:
        import json

        return json.dumps(entry, separators=(",", ":"))

    def deserialize(self, body: str, path: str) -> dict[str, dict[str, int]]:
        import json

        try:
            value = json.loads(body)
            from_json(value)
        except (TypeError, ValueError) as exc:
            raise CheckpointError(
                f"Kafka source log {path} is corrupt: {body!r} ({exc}). Restore it or start "
                "the query with a new checkpoint location.",
                path=path,
            ) from exc
        return dict(value)


class KafkaSource(Source):
    """Offsets are Spark's ``KafkaSourceOffset`` (see :mod:`.offsets`)."""

    supportsTriggerAvailableNow = True

    def __init__(
        self, context: SourceContext, options: KafkaSourceOptions, *, jvm: bool = False
    ) -> None:
        """``jvm``: read batches with Spark's Kafka connector (``connector.use_jvm``)."""
        self._spark = context.spark
        self._clock = context.clock
        self.options = options
        if options.group_id is not None:
            driver_group = options.group_id
            self._executor_group = options.group_id
        else:
            driver_group = (
                f"{options.group_id_prefix}-{uuid.uuid4()}-{_java_hash(context.metadata_path)}"
            )
            self._executor_group = driver_group + "-executor"
        self._reader = OffsetReader(options, driver_group)
        self._log = _InitialOffsetLog(context.fs, context.metadata_path)
        self._initial: PartitionOffsets | None = None
        self._available_now: PartitionOffsets | None = None
        self._available_now_requested = False
        self._latest_seen: PartitionOffsets | None = None
        self._last_trigger_ms = 0
        self._ids: tuple[int, DataFrame] | None = None
        self._fs = context.fs
        self._metadata_path = context.metadata_path
        self._jvm = jvm
        self._fresh = False
        self._readers: _ReaderLog | None = None
        self._reader_used: str | None = None

    @property
    def schema(self) -> StructType:
        return kafka_schema(self.options.include_headers)

    # -- offsets -----------------------------------------------------------------------
    def initialOffset(self) -> dict[str, dict[str, int]]:
        if self._initial is None:
            logged = self._log.get(0)
            if logged is None:
                logged = to_json(self._reader.with_retries(self._resolve_starting))
                self._fresh = True
                try:
                    self._log.add(0, logged)
                except ConcurrentWriteError:
                    logged = self._log.get(0) or logged
                logger.info("Kafka source initial offsets: %s", logged)
            self._initial = from_json(logged)
        return to_json(self._initial)

    def _resolve_starting(self) -> PartitionOffsets:
        starting = self.options.starting
        partitions = self._reader.partitions()
        if starting.kind == "earliest":
            return self._reader.earliest(partitions)
        if starting.kind == "latest":
            return self._reader.latest(partitions)
        if starting.kind == "offsets":
            specified = starting.offsets
            if set(specified) != set(partitions):
                raise OptionError(
                    "[KAFKA_START_OFFSET_DOES_NOT_MATCH_ASSIGNED] Partitions specified for Kafka "
                    "start offsets don't match what are assigned. Maybe topic partitions are "
                    "created or deleted while the query is running. Use -1 for latest, -2 for "
                    f"earliest. Specified: {describe(specified)} Assigned: {describe(partitions)}",
                    option="startingOffsets",
                )
            # As Spark's admin-based reader: explicit offsets are taken as given; offsets
            # that are gone are found (and reported as data loss) by the task reading them.
            need = [tp for tp, o in specified.items() if o in (EARLIEST, LATEST)]
            earliest = self._reader.earliest(need) if need else {}
            latest = self._reader.latest(need) if need else {}
            out: PartitionOffsets = {}
            for tp, offset in specified.items():
                if offset == EARLIEST:
                    out[tp] = earliest[tp]
                elif offset == LATEST:
                    out[tp] = latest[tp]
                else:
                    out[tp] = offset
            return out
        # timestamps
        if starting.kind == "timestamp":
            assert starting.timestamp is not None
            wanted = dict.fromkeys(partitions, starting.timestamp)
        else:
            wanted = starting.offsets
            if set(wanted) != set(partitions):
                raise OptionError(
                    "[KAFKA_TIMESTAMP_OFFSET_DOES_NOT_MATCH_ASSIGNED] Partitions specified for "
                    "Kafka timestamp based starting offsets don't match what are assigned. "
                    "Maybe topic partitions are created or deleted while the query is running, "
                    "or you didn't specify all the partitions. Specified: "
                    f"{describe(wanted)} Assigned: {describe(partitions)}",
                    option="startingOffsetsByTimestamp",
                )
        found = self._reader.for_timestamps(wanted)
        latest = self._reader.latest(partitions)
        out = {}
        for tp, offset in found.items():
            if offset < 0:
                if starting.strategy_on_no_match == "latest":
                    offset = latest[tp]
                else:
                    raise KafkaError(
                        f"No offset matched from request of topic-partition {tp[0]}-{tp[1]} "
                        f"and timestamp {wanted[tp]}. Set option "
                        "'startingOffsetsByTimestampStrategy' to 'latest' to start such "
                        "partitions at their latest offset."
                    )
            out[tp] = offset
        return out

    def _start_of(self, start: Any) -> PartitionOffsets:
        return from_json(start if start is not None else self.initialOffset())

    def latestOffset(self, start: Any, limit: ReadLimit) -> dict[str, dict[str, int]] | None:
        begin = self._start_of(start)
        if self._available_now_requested:
            if self._available_now is None:
                self._available_now = self._fetch_latest()
            latest = self._available_now
        else:
            latest = self._fetch_latest()
        self._latest_seen = latest
        o = self.options
        if limit.is_all_available and not self._available_now_requested:
            end = latest
        else:
            end = None
            if (
                o.min_offsets_per_trigger is not None
                and not self._available_now_requested
                and self._delay_batch(o.min_offsets_per_trigger, latest, begin)
            ):
                end = begin
            if end is None and o.max_offsets_per_trigger is not None:
                new = sorted(set(latest) - set(begin))
                end = rate_limit(
                    o.max_offsets_per_trigger,
                    begin,
                    latest,
                    self._reader.earliest(new) if new else {},
                )
            if end is None:
                end = latest
        if not end:
            return None
        return to_json(end)

    def reportLatestOffset(self) -> dict[str, dict[str, int]] | None:
        """Spark's: the partitions' latest offsets the last :meth:`latestOffset` fetched
        (past ``maxOffsetsPerTrigger``), None before any."""
        return to_json(self._latest_seen) if self._latest_seen else None

    def _fetch_latest(self) -> PartitionOffsets:
        return self._reader.latest_of_all()

    def _delay_batch(
        self, min_rows: int, latest: PartitionOffsets, current: PartitionOffsets
    ) -> bool:
        """Spark's ``delayBatch``: wait for ``minOffsetsPerTrigger`` records unless
        ``maxTriggerDelay`` has passed since the last batch."""
        now = self._clock.get_time_millis()
        if now - self._last_trigger_ms >= self.options.max_trigger_delay_ms:
            self._last_trigger_ms = now
            return False
        new_records = sum(offset - current.get(tp, 0) for tp, offset in latest.items())
        if new_records < min_rows:
            return True
        self._last_trigger_ms = now
        return False

    def getDefaultReadLimit(self) -> ReadLimit:
        o = self.options
        if o.max_offsets_per_trigger is None and o.min_offsets_per_trigger is None:
            return ReadLimit()
        # Any non-empty limit routes latestOffset through the limits above.
        return ReadLimit(max_rows=o.max_offsets_per_trigger or 2**63 - 1)

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now_requested = True

    def availableNowBacklog(self, end: Any) -> tuple[int, str] | None:
        if not self._available_now_requested:
            return None
        if self._available_now is None:
            self._available_now = self._fetch_latest()
        read = self._start_of(end)
        return sum(max(0, offset - read.get(tp, 0)) for tp, offset in self._available_now.items()), "records"

    def deserializeOffset(self, text: str) -> dict[str, dict[str, int]]:
        import json

        try:
            value = json.loads(text)
            from_json(value)
        except (TypeError, ValueError) as exc:
            raise CheckpointError(
                f"Invalid Kafka source offset {text!r} in the offsets log: {exc}. Expected "
                'Spark\'s KafkaSourceOffset JSON, e.g. {"topic":{"0":42}}.'
            ) from exc
        return dict(value)

    # -- batches -----------------------------------------------------------------------
    def offset_ranges(self, start: Any, end: Any) -> list[OffsetRange]:
        """Spark's ``getOffsetRangesFromResolvedOffsets`` with its data-loss checks."""
        fail = self.options.fail_on_data_loss
        begin = self._start_of(start)
        until = from_json(end)
        new = sorted(set(until) - set(begin))

        def earliest_of_new() -> PartitionOffsets:
            existing = set(self._reader.partitions()) if new else set()
            return self._reader.earliest([tp for tp in new if tp in existing])

        new_initial = self._reader.with_retries(earliest_of_new)
        missing = [tp for tp in new if tp not in new_initial]
        if missing:
            report_data_loss(
                fail,
                "INITIAL_OFFSET_NOT_FOUND_FOR_PARTITIONS",
                f"Cannot find initial offsets for partitions {describe(missing)}. They may have "
                "been deleted.",
            )
        for tp, offset in sorted(new_initial.items()):
            if offset != 0:
                report_data_loss(
                    fail,
                    "ADDED_PARTITION_DOES_NOT_START_FROM_OFFSET_ZERO",
                    f"Added partition {tp[0]}-{tp[1]} starts from {offset} instead of 0.",
                )
        deleted = set(begin) - set(until)
        if deleted:
            report_data_loss(
                fail, "PARTITIONS_DELETED", f"Partitions {describe(deleted)} have been deleted."
            )
        ranges = []
        for tp in sorted(until):
            if tp not in begin and tp not in new_initial:
                continue
            from_offset = begin.get(tp, new_initial.get(tp, 0))
            until_offset = until[tp]
            if until_offset < from_offset:
                report_data_loss(
                    fail,
                    "PARTITION_OFFSET_CHANGED",
                    f"Partition {tp[0]}-{tp[1]} offset was changed from {from_offset} to "
                    f"{until_offset}. This could be either 1) a user error that the start "
                    "offset is set beyond available offset when starting query, or 2) the "
                    "kafka topic-partition is deleted and re-created.",
                )
            ranges.append(OffsetRange(tp[0], tp[1], from_offset, until_offset))
        return split_ranges(
            ranges, self.options.min_partitions, self.options.max_records_per_partition
        )

    def getBatch(self, start: Any, end: Any) -> DataFrame:
        ranges = self.offset_ranges(start, end)
        schema = self.schema
        if not ranges:
            return self._spark.createDataFrame([], schema)
        if self._choose_reader() == JVM_READER:
            # One range is read by the connector's RDD without Spark's per-batch offset
            # lookup, when its partition is there: a topic deleted under the query then
            # still fails in the batch relation's lookup, as in Spark's streaming source.
            read = {(r.topic, r.partition) for r in ranges if r.size > 0}
            return connector.read_ranges(
                self._spark,
                ranges,
                spark_options=self.options.spark_options,
                executor_group=self._executor_group,
                fail_on_data_loss=self.options.fail_on_data_loss,
                include_headers=self.options.include_headers,
                direct=len(read) == 1 and self._reader.exists(next(iter(read))),
            )
        reader = RangeReader(
            config=self.executor_config(),
            include_headers=self.options.include_headers,
            fail_on_data_loss=self.options.fail_on_data_loss,
            poll_timeout_ms=self.options.poll_timeout_ms,
            fetch_offset_attempts=self.options.fetch_offset_attempts,
            fetch_offset_retry_interval_ms=self.options.fetch_offset_retry_interval_ms,
            ranges=tuple(ranges),
        )
        return self._task_ids(len(ranges)).mapInArrow(reader, schema)

    def _choose_reader(self) -> str:
        """Which reader reads this batch: the session's choice
        (``spark.lockgate.kafka.io``), except for the first batch of a restarted query,
        which may be the last batch of the previous run, run again after a failure. That
        one is read by the reader that read the previous run's last batch (recorded in
        ``sources/<i>/reader/``), so that it splits into the same tasks as when it ran
        first: the exactly-once Kafka sink relies on a batch run again having the same
        partitions. A change of reader is recorded before the batch is read."""
        wanted = JVM_READER if self._jvm else PYTHON_READER
        if self._readers is None:
            self._readers = _ReaderLog(self._fs, self._fs.join(self._metadata_path, "reader"))
            latest = self._readers.get_latest()
            self._reader_used = latest[1] if latest is not None else PYTHON_READER
            if not self._fresh and self._reader_used != wanted:
                if self._reader_used == JVM_READER and not connector.connector_loadable(
                    self._spark
                ):
                    if connector.io_setting(self._spark) != "python":
                        raise CheckpointError(
                            "The last Kafka batch before this restart was read by Spark's "
                            "Kafka connector, which this session does not have. If that "
                            "batch runs again, librdkafka may split it into other "
                            "partitions, and a kafka sink writing exactly once could then "
                            "write some of its records twice or not at all. Add the "
                            "connector to the session (spark.jars.packages "
                            f"org.apache.spark:spark-sql-kafka-0-10_2.13:{self._spark.version}) "
                            f"to run that batch as it first ran; or set {connector.IO_CONF} "
                            "to 'python' to read it with librdkafka anyway (safe when the "
                            "sink is not an exactly-once kafka sink).",
                            path=self._fs.join(self._metadata_path, "reader"),
                        )
                    logger.warning(
                        "Kafka source: the last batch before this restart was read by "
                        "Spark's Kafka connector, which this session does not have; %s is "
                        "'python', so if that batch runs again it is read by librdkafka and "
                        "may split into other partitions (an exactly-once kafka sink may "
                        "write some of its records twice or not at all).",
                        connector.IO_CONF,
                    )
                else:
                    logger.info(
                        "Kafka source: the first batch after the restart is read as the "
                        "last one before it (%s), the next ones by %s",
                        self._reader_used,
                        wanted,
                    )
                    return self._reader_used
        if wanted != self._reader_used:
            latest = self._readers.get_latest()
            self._readers.add(0 if latest is None else latest[0] + 1, wanted)
            self._reader_used = wanted
        return wanted

    def _task_ids(self, count: int) -> DataFrame:
        """``spark.range(count)`` in ``count`` partitions, one task per offset range (the
        task reads ``reader.ranges[id]``). Kept for the next batch of as many ranges: a
        batch then analyses one new plan node (the ``mapInArrow``), where ranges passed as
        column literals cost three and a py4j call per literal (~50 ms a batch)."""
        if self._ids is None or self._ids[0] != count:
            self._ids = (count, self._spark.range(0, count, 1, count))
        return self._ids[1]

    def executor_config(self) -> dict[str, str]:
        return {
            **self.options.consumer,
            "group.id": self._executor_group,
            "enable.auto.commit": "false",
            "auto.offset.reset": "error",
            "enable.partition.eof": "true",
            "isolation.level": self.options.consumer.get("isolation.level", "read_uncommitted"),
        }

    @property
    def offset_reader(self) -> OffsetReader:
        """The driver's metadata reader (the continuous stream asks it for partitions)."""
        return self._reader

    def stop(self) -> None:
        self._reader.close()

    def description(self) -> str:
        return f"KafkaV2[{self.options.strategy.describe()}]"


JVM_READER = "jvm"
PYTHON_READER = "python"


class _ReaderLog(MetadataLog[str]):
    """``sources/<i>/reader/N``: from its N-th change on, which reader read the source's
    batches (``jvm``: Spark's Kafka connector; ``python``: librdkafka). No entry: librdkafka
    (checkpoints from before the connector reader). Spark lists only numbered files in
    ``sources/<i>``, so it does not see this directory."""

    def serialize(self, entry: str) -> str:
        import json

        return json.dumps({"reader": entry}, separators=(",", ":"))

    def deserialize(self, body: str, path: str) -> str:
        import json

        try:
            reader = json.loads(body)["reader"]
            if reader not in (JVM_READER, PYTHON_READER):
                raise ValueError(f"unknown reader {reader!r}")
        except (TypeError, ValueError, KeyError) as exc:
            raise CheckpointError(
                f"Kafka source reader log {path} is corrupt: {body!r} ({exc}). Restore it, "
                "or delete the directory if no batch is left to run again.",
                path=path,
            ) from exc
        return str(reader)


def _java_hash(text: str) -> int:
    """Java's ``String.hashCode`` (Spark names the driver's group with it)."""
    h = 0
    for ch in text:
        h = (31 * h + ord(ch)) & 0xFFFFFFFF
    return h - 2**32 if h >= 2**31 else h


class StaleConsumerError(KafkaError):
    """A kept consumer's answer that a new consumer must confirm (see RangeReader)."""


@dataclass
class _Cursor:
    position: int


class _KeptConsumer(KeptClient):
    """A task's consumer, kept in the Python worker for the next task with its
    configuration (``lockgate.sources.kafka.clients``)."""

    def __init__(self, config: dict[str, str]) -> None:
        from confluent_kafka import Consumer

        super().__init__()
        self.consumer: Any = Consumer({**config, "error_cb": self.on_error})

    @override
    def serve_callbacks(self) -> None:
        self.consumer.poll(0)

    @override
    def close(self) -> None:
        consumer, self.consumer = self.consumer, None
        if consumer is not None:
            consumer.close()


_CONSUMERS: ClientPool[_KeptConsumer] = ClientPool("consumer")


TIMESTAMP_TYPES = {0: -1, 1: 0, 2: 1}
"""librdkafka's timestamp type -> Kafka's TimestampType id (Spark's ``timestampType``)."""


@dataclass(frozen=True)
class RangeReader:
    """The task side of a batch: the ids of offset ranges in (``ranges[id]``), the records
    of each ``[from, until)`` out.

    Records beyond the range are never returned; gaps inside it (transaction markers,
    compaction, aborted records under ``read_committed``) are skipped. Records that are
    gone (retention) are data loss: the task fails with failOnDataLoss, else it reads
    from the earliest offset still there.
    """

    config: dict[str, str]
    include_headers: bool
    fail_on_data_loss: bool
    poll_timeout_ms: int
    fetch_offset_attempts: int = 3
    fetch_offset_retry_interval_ms: int = 1000
    ranges: tuple[OffsetRange, ...] = ()
    batch_rows: int = 4096

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        key = pool_key(self.config)
        kept = _CONSUMERS.take(key)
        client = kept if kept is not None else _KeptConsumer(self.config)
        try:
            for batch in batches:
                for index in batch.column("id").to_pylist():
                    offsets = self.ranges[index]
                    topic, partition = offsets.topic, offsets.partition
                    cursor = _Cursor(offsets.from_offset)
                    while True:
                        try:
                            yield from self.read_range(
                                client.consumer,
                                topic,
                                partition,
                                cursor.position,
                                offsets.until_offset,
                                cursor=cursor,
                                kept=kept is not None,
                            )
                            break
                        except KafkaDataLossError:
                            raise
                        except Exception as exc:
                            if kept is None:
                                raise
                            # A kept consumer that fails, times out or finds records
                            # gone hands over to a new one, from where it got to.
                            logger.warning(
                                "Kafka source: a kept consumer failed reading %s-%d at offset "
                                "%d (%s); reading on with a new consumer",
                                topic,
                                partition,
                                cursor.position,
                                exc,
                            )
                            discard(client)
                            kept = None
                            client = _KeptConsumer(self.config)
        except BaseException:
            discard(client)
            raise
        _CONSUMERS.give_back(key, client)

    def read_range(
        self,
        consumer: Any,
        topic: str,
        partition: int,
        start: int,
        until: int,
        *,
        cursor: _Cursor | None = None,
        kept: bool = False,
    ) -> Iterator[pa.RecordBatch]:
        """The records of ``[start, until)``; ``cursor`` follows the next offset to read
        (past what was yielded). A ``kept`` consumer (one of an earlier task) waits at
        most :data:`KEPT_TIMEOUT_S` and never reports data loss: it raises
        :class:`StaleConsumerError` so that a new consumer reads the range on."""
        from confluent_kafka import KafkaError as KErr
        from confluent_kafka import TopicPartition as KTP

        cursor = cursor if cursor is not None else _Cursor(start)

        def lost(begin: int, end: int) -> None:
            if kept and begin < end:
                raise StaleConsumerError(
                    f"a kept consumer found offsets [{begin}, {end}) of {topic}-{partition} gone"
                )
            self._lost(topic, partition, begin, end)

        tp = KTP(topic, partition)
        marks = self._watermarks(consumer, tp, kept=kept)
        if marks is None:
            # The topic was deleted after the batch was planned: its records are gone.
            if kept:
                raise StaleConsumerError(f"a kept consumer found {topic} gone")
            self._lost(topic, partition, start, until)
            return
        low, high = marks
        position = start
        if start < low:
            lost(start, min(low, until))
            position = low
        if high < until:
            # The records up to `until` existed when the batch was planned: the partition
            # was truncated or re-created.
            lost(max(position, high), until)
            until = high
        cursor.position = position
        if position >= until:
            return
        consumer.assign([KTP(topic, partition, position)])
        rows: list[Any] = []
        timeout_s = self.poll_timeout_ms / 1000.0
        if kept:
            timeout_s = min(timeout_s, KEPT_TIMEOUT_S)
        try:
            while position < until:
                msgs = consumer.consume(num_messages=min(1000, until - position), timeout=timeout_s)
                if not msgs:
                    raise TimeoutError(
                        f"Cannot fetch record for offset {position} in {timeout_s * 1000:.0f} "
                        f"milliseconds (topic-partition {topic}-{partition}). Raise the source "
                        "option 'kafkaConsumer.pollTimeoutMs' if the broker is slow."
                    )
                for msg in msgs:
                    err = msg.error()
                    if err is not None:
                        if err.code() == KErr._PARTITION_EOF:
                            # Caught up: what remains below `until` is not readable here
                            # (aborted transactions, control records).
                            position = until
                            break
                        if (
                            err.code() == KErr._AUTO_OFFSET_RESET
                            or err.code() == KErr.OFFSET_OUT_OF_RANGE
                        ):
                            low, _ = consumer.get_watermark_offsets(
                                tp, timeout=METADATA_TIMEOUT_S, cached=False
                            )
                            lost(position, min(low, until))
                            position = low
                            consumer.assign([KTP(topic, partition, position)])
                            break
                        raise RuntimeError(
                            f"Kafka failed reading {topic}-{partition} at offset {position}: {err}"
                        )
                    offset = msg.offset()
                    if offset >= until:
                        position = until
                        break
                    rows.append(msg)
                    position = offset + 1
                    if len(rows) >= self.batch_rows:
                        yield self._to_arrow(rows)
                        rows = []
                        cursor.position = position
        finally:
            consumer.unassign()
        if rows:
            yield self._to_arrow(rows)
        cursor.position = until

    def _watermarks(self, consumer: Any, tp: Any, *, kept: bool = False) -> tuple[int, int] | None:
        """The partition's low and high offsets, retried as the driver retries them;
        None when the partition no longer exists (a kept consumer asks once)."""
        from confluent_kafka import KafkaError as KErr
        from confluent_kafka import KafkaException

        attempts = 1 if kept else self.fetch_offset_attempts
        for attempt in range(1, attempts + 1):
            try:
                low, high = consumer.get_watermark_offsets(
                    tp, timeout=KEPT_TIMEOUT_S if kept else METADATA_TIMEOUT_S, cached=False
                )
                return int(low), int(high)
            except KafkaException as exc:
                gone = exc.args and exc.args[0].code() == KErr.UNKNOWN_TOPIC_OR_PART
                if attempt == attempts:
                    if gone:
                        return None
                    raise
                time.sleep(self.fetch_offset_retry_interval_ms / 1000.0)
        raise AssertionError("unreachable")

    def _lost(self, topic: str, partition: int, start: int, end: int) -> None:
        if start >= end:
            return
        group = self.config.get("group.id")
        report_data_loss(
            self.fail_on_data_loss,
            "COULD_NOT_READ_OFFSET_RANGE",
            f"Could not read records in offset [{start}, {end}) for topic partition "
            f"{topic}-{partition} with consumer group {group}.",
        )

    def _to_arrow(self, msgs: list[Any]) -> pa.RecordBatch:
        import pyarrow as pa

        ts_types = []
        micros = []
        for m in msgs:
            kind, ms = m.timestamp()
            ts_types.append(TIMESTAMP_TYPES.get(kind, -1))
            micros.append(ms * 1000)
        arrays = [
            pa.array([m.key() for m in msgs], type=pa.binary()),
            pa.array([m.value() for m in msgs], type=pa.binary()),
            pa.array([m.topic() for m in msgs], type=pa.string()),
            pa.array([m.partition() for m in msgs], type=pa.int32()),
            pa.array([m.offset() for m in msgs], type=pa.int64()),
            pa.array(micros, type=pa.timestamp("us", tz="UTC")),
            pa.array(ts_types, type=pa.int32()),
        ]
        names = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
        if self.include_headers:
            header_type = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
            headers = []
            for m in msgs:
                h = m.headers()
                headers.append(None if not h else [{"key": k, "value": v} for k, v in h])
            arrays.append(pa.array(headers, type=header_type))
            names.append("headers")
        return pa.RecordBatch.from_arrays(arrays, names=names)


__all__ = ["KAFKA_SCHEMA", "KafkaSource", "RangeReader", "kafka_schema"]

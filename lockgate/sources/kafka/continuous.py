"""The Kafka source in continuous mode (``trigger(continuous=...)``), as Spark's
``KafkaContinuousStream``.

One long-running task per topic-partition. Each task consumes its partition with its own
librdkafka consumer (the executors' group id, as micro-batch) from its start offset and
hands records to the query as they arrive; at the end of each epoch it reports the next
offset to read, and the engine writes the merged ``{"topic":{"0":42}}`` (Spark's
``KafkaSourceOffset``) to ``offsets/<epoch>``. A restart resumes from the offsets of the
latest committed epoch (at-least-once, as continuous processing is).

Starting offsets are resolved as in micro-batch (``startingOffsets``,
``startingOffsetsByTimestamp``, ``startingTimestamp``) and recorded in ``sources/0/0``,
so a restart before the first epoch commits starts where the first run did (Spark
resolves them again). ``maxOffsetsPerTrigger``, ``minOffsetsPerTrigger``,
``maxTriggerDelay`` and ``minPartitions`` have no meaning without batches and are
ignored, as Spark ignores them. When the subscription's partitions change (a partition
added, a topic matching ``subscribePattern`` created), the stream asks for
reconfiguration and the tasks restart from the committed offsets, new partitions at their
earliest offset (Spark's ``needsReconfiguration``/``planInputPartitions``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from pyspark.sql.types import StructType

from lockgate.sources.base import ContinuousPartitionReader, ContinuousStream, SourceContext
from lockgate.sources.kafka.offsets import (
    PartitionOffsets,
    TopicPartition,
    describe,
    from_json,
    to_json,
)
from lockgate.sources.kafka.options import KafkaSourceOptions
from lockgate.sources.kafka.source import (
    METADATA_TIMEOUT_S,
    TIMESTAMP_TYPES,
    KafkaSource,
    report_data_loss,
)

logger = logging.getLogger(__name__)

CONTINUOUS_POLL_TIMEOUT_MS = 512
"""Spark's ``kafkaConsumer.pollTimeoutMs`` default in continuous mode: how long one fetch
waits before the task looks at the epoch again (a timeout is not an error here)."""

MAX_RECORDS_PER_READ = 1000
"""Records one read hands the task at most (those already fetched; it never waits for more)."""


@dataclass(frozen=True)
class KafkaContinuousPartition:
    """What one task reads: a topic-partition from ``start`` on (shipped to the executor)."""

    topic: str
    partition: int
    start: int
    config: dict[str, str]
    include_headers: bool
    fail_on_data_loss: bool


class KafkaContinuousStream(ContinuousStream):
    def __init__(self, context: SourceContext, options: KafkaSourceOptions) -> None:
        self.options = options
        # Group ids, the driver's metadata consumer and the starting offsets (with their
        # record in sources/0/0) are the micro-batch source's.
        self._micro = KafkaSource(context, options)
        self._known: set[TopicPartition] | None = None

    @property
    def schema(self) -> StructType:
        return self._micro.schema

    def initialOffset(self) -> dict[str, dict[str, int]]:
        return self._micro.initialOffset()

    def planInputPartitions(self, start: dict[str, dict[str, int]]) -> list[Any]:
        old = from_json(start)
        reader = self._micro.offset_reader
        current, earliest = reader.with_retries(lambda: self._listing(old))
        new = sorted(current - set(old))
        deleted = set(old) - current
        if deleted:
            report_data_loss(
                self.options.fail_on_data_loss,
                "PARTITIONS_DELETED",
                f"{describe(deleted)} are gone. Some data may have been missed.",
            )
        offsets: PartitionOffsets = {
            **earliest,
            **{tp: o for tp, o in old.items() if tp not in deleted},
        }
        if new:
            logger.info("Kafka continuous source: new partitions %s", describe(new))
        self._known = set(offsets)
        config = self._micro.executor_config()
        return [
            KafkaContinuousPartition(
                topic=topic,
                partition=partition,
                start=offset,
                config=config,
                include_headers=self.options.include_headers,
                fail_on_data_loss=self.options.fail_on_data_loss,
            )
            for (topic, partition), offset in sorted(offsets.items())
        ]

    def _listing(self, old: PartitionOffsets) -> tuple[set[TopicPartition], PartitionOffsets]:
        """The partitions now, and the earliest offsets of those not in ``old``."""
        reader = self._micro.offset_reader
        current = set(reader.partitions())
        return current, reader.earliest(sorted(current - set(old)))

    def createReaderFactory(self) -> Any:
        return KafkaContinuousPartitionReader

    def mergeOffsets(self, partitionOffsets: list[Any]) -> dict[str, dict[str, int]]:
        merged: PartitionOffsets = {}
        for topic, partition, offset in partitionOffsets:
            merged[(str(topic), int(partition))] = int(offset)
        return to_json(merged)

    def needsReconfiguration(self) -> bool:
        if self._known is None:
            return False
        reader = self._micro.offset_reader
        return set(reader.with_retries(reader.partitions)) != self._known

    def deserializeOffset(self, text: str) -> dict[str, dict[str, int]]:
        return self._micro.deserializeOffset(text)

    def stop(self) -> None:
        self._micro.stop()

    def description(self) -> str:
        return f"KafkaSource[{self.options.strategy.describe()}]"


class KafkaContinuousPartitionReader(ContinuousPartitionReader):
    """Reads one topic-partition for ever (in the task), from its start offset.

    Rows are Spark's internal values in the source schema's order: key, value, topic,
    partition, offset, timestamp (microseconds), timestampType[, headers]. Offsets that
    are gone (retention, a truncated or re-created partition) are data loss, reported as
    Spark's ``KAFKA_DATA_LOSS``: the task fails with failOnDataLoss, else it warns and
    reads on from what is there.
    """

    def __init__(self, partition: KafkaContinuousPartition, client: Any) -> None:
        from confluent_kafka import Consumer
        from confluent_kafka import TopicPartition as KTP

        self.partition = partition
        self.next_offset = partition.start
        self._tp = KTP(partition.topic, partition.partition)
        self._consumer = Consumer(partition.config)
        self._assign(self.next_offset)

    def _assign(self, offset: int) -> None:
        from confluent_kafka import TopicPartition as KTP

        self._consumer.assign([KTP(self.partition.topic, self.partition.partition, offset)])

    def read(self, timeout_s: float) -> list[tuple[Any, ...]]:
        from confluent_kafka import KafkaError as KErr

        wait = min(max(timeout_s, 0.0), CONTINUOUS_POLL_TIMEOUT_MS / 1000.0)
        # consume(n, timeout) returns only when it has n messages or the timeout has
        # passed, so at 1,000 records/s every record waited for the task's next epoch
        # poll (p50 55 ms). poll() returns with the first record; what else is already
        # fetched is taken without waiting.
        first = self._consumer.poll(wait)
        if first is None:
            return []
        msgs = [first, *self._consumer.consume(num_messages=MAX_RECORDS_PER_READ - 1, timeout=0)]
        rows: list[tuple[Any, ...]] = []
        headers = self.partition.include_headers
        for msg in msgs:
            err = msg.error()
            if err is not None:
                code = err.code()
                if code == KErr._PARTITION_EOF:
                    continue
                if code in (KErr._AUTO_OFFSET_RESET, KErr.OFFSET_OUT_OF_RANGE):
                    self._out_of_range()
                    break
                raise RuntimeError(
                    f"Kafka failed reading {self.partition.topic}-{self.partition.partition} "
                    f"at offset {self.next_offset}: {err}"
                )
            offset = msg.offset()
            if offset < self.next_offset:
                continue
            kind, ms = msg.timestamp()
            row: tuple[Any, ...] = (
                msg.key(),
                msg.value(),
                msg.topic(),
                msg.partition(),
                offset,
                ms * 1000,
                TIMESTAMP_TYPES.get(kind, -1),
            )
            if headers:
                h = msg.headers()
                row = (*row, None if not h else [(k, v) for k, v in h])
            rows.append(row)
            self.next_offset = offset + 1
        return rows

    def _out_of_range(self) -> None:
        """``next_offset`` is not in the partition: retry when it is back in range (Spark
        retries an offset between the earliest and the latest), else data loss."""
        low, high = self._consumer.get_watermark_offsets(
            self._tp, timeout=METADATA_TIMEOUT_S, cached=False
        )
        position = self.next_offset
        p = self.partition
        if low <= position <= high:
            self._assign(position)
            return
        if position < low:
            detail = f"Could not read records in offset [{position}, {low})"
            resume = low
        else:
            detail = (
                f"Offset {position} is after the latest offset {high} (the partition was "
                "truncated or re-created)"
            )
            resume = high
        group = p.config.get("group.id")
        report_data_loss(
            p.fail_on_data_loss,
            "COULD_NOT_READ_OFFSET_RANGE",
            f"{detail} for topic partition {p.topic}-{p.partition} with consumer group {group}.",
        )
        self.next_offset = resume
        self._assign(resume)

    def offset(self) -> tuple[str, int, int]:
        return (self.partition.topic, self.partition.partition, self.next_offset)

    def close(self) -> None:
        try:
            self._consumer.close()
        except Exception:
            logger.debug("closing the Kafka consumer failed", exc_info=True)


__all__ = ["KafkaContinuousPartitionReader", "KafkaContinuousStream"]

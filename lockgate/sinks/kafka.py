"""``writeStream.format("kafka")``: rows to Kafka, exactly once with Kafka transactions.

Columns as Spark's Kafka sink takes them: ``value`` (string or binary, required),
``key`` (string or binary), ``topic`` (string; or ``option("topic", ...)`` for every
row, which takes precedence as in Spark), ``partition`` (int; else Kafka's default
partitioner, murmur2 of the key as Java's client), ``headers``
(``array<struct<key:string,value:binary>>``). Every ``kafka.<name>`` option goes to the
producer as librdkafka property ``<name>``.

**Exactly once** (the default; Spark's sink is at-least-once). The rows are written by
the Spark tasks, never collected on the driver. The task of partition ``p`` of batch
``N`` uses a transactional producer with ``transactional.id``
``<transactionalIdPrefix>-<p>`` (default prefix ``lockgate-<queryId>``):
``init_transactions`` fences any earlier producer of that id (a failed attempt, a task
of a dead driver) and aborts its open transaction; then, if the partition's marker says
batch ``N`` is already written, the task writes nothing; otherwise it sends its rows
and the marker in one transaction. The marker is the committed offset ``N + 1`` of the
consumer group ``<transactionalIdPrefix>-<p>`` on partition 0 of the marker topic
(``option("markerTopic")``, default the ``topic`` option), committed with
``send_offsets_to_transaction``, so "partition p of batch N is written" and its rows
become visible together or not at all. Consumers with ``isolation.level=read_committed``
see every row once; ``read_uncommitted`` consumers may also see rows of aborted
attempts. A re-run must split the batch into the same partitions (true for lockgate's
sources and for shuffles by key). The tasks learn ``N`` from the job's local property
:data:`BATCH_ID_PROPERTY`, so that the writer's Python UDF is made once per run.

Producers (and the marker's consumer) are kept between batches, as Spark keeps its
producers (``lockgate.sources.kafka.clients``). Transactional producers are kept by one
process per executor, the producer host (:mod:`lockgate.sinks.kafka_host`), which the
tasks send their rows to: kept in each Python worker, they fenced each other whenever a
partition's task ran in another worker than the batch before. A kept transactional
producer skips ``init_transactions``, and the marker read when it committed an earlier
batch of the partition last (another producer of the id would have fenced it), and
anything that goes wrong with it (fenced by another producer of its id, an error
reported since its last use, a timeout) aborts its transaction and writes the partition
again with a new producer.

The writes above are librdkafka's. When the session has lockgate's jar and Kafka's Java
client (``spark.lockgate.kafka.transactionalWriter``, :mod:`lockgate.sinks.kafka_jvm`),
the same protocol (same transactional ids and markers) runs in the JVM instead: no Python
stage, no producer host.

``option("exactlyOnce", "false")`` writes as Spark does: an idempotent producer (kept
per worker), at least once across failures. When the session has Spark's Kafka
connector (``spark.lockgate.kafka.io``, :mod:`lockgate.sources.kafka.connector`), those
writes are Spark's own: ``df.write.format("kafka")``, in the JVM.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lockgate.compat import override
from lockgate.errors import AnalysisError, OptionError, SinkError
from lockgate.sinks import kafka_host, kafka_jvm
from lockgate.sinks.base import (
    ContinuousDataWriter,
    ContinuousSink,
    Sink,
    SinkContext,
    SinkProvider,
)
from lockgate.sources.kafka import connector
from lockgate.sources.kafka.clients import (
    KEPT_TIMEOUT_S,
    ClientPool,
    KeptClient,
    discard,
    pool_key,
    using,
)
from lockgate.sources.kafka.options import connector_params, kafka_params

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from lockgate.jvm import ArrowMapOver
    from lockgate.options import Options

logger = logging.getLogger(__name__)

QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "lockgate.kafkaSink.batchId"
"""The Spark local property that gives the sink's tasks their batch's id: the writer's
function, and so its Python UDF, is the same for every batch of a run (a UDF per batch
cost ~20 ms of pickling, py4j calls and registration on the driver)."""
_SUMMARY_SCHEMA = "partition INT, rows LONG, written BOOLEAN"
TIMEOUT_S = 60.0


@dataclass(frozen=True)
class KafkaSinkOptions:
    topic: str | None
    producer: dict[str, str]
    exactly_once: bool
    transactional_id_prefix: str | None
    marker_topic: str | None
    spark_options: dict[str, str]
    """What Spark's batch Kafka writer is given when the JVM writes: the ``kafka.*``
    options as written (Java client property names) and the topic."""

    @classmethod
    def parse(cls, options: Options) -> KafkaSinkOptions:
        producer = kafka_params(options)
        lowered = {k.lower() for k in producer}
        for which in ("key", "value"):
            if f"{which}.serializer" in lowered:
                raise OptionError(
                    f"Kafka option '{which}.serializer' is not supported as {which}s are "
                    "serialized with ByteArraySerializer.",
                    option=f"kafka.{which}.serializer",
                )
        if "bootstrap.servers" not in lowered:
            raise OptionError(
                "Option 'kafka.bootstrap.servers' must be specified for configuring Kafka producer",
                option="kafka.bootstrap.servers",
            )
        if "transactional.id" in lowered:
            raise OptionError(
                "Kafka option 'transactional.id' is set by the kafka sink itself (one per "
                "query and partition); use option('transactionalIdPrefix', ...) to choose its "
                "prefix, or option('exactlyOnce', 'false') for Spark's at-least-once writes.",
                option="kafka.transactional.id",
            )
        producer.setdefault("partitioner", "murmur2_random")  # Java's default partitioner
        topic = options.get_str("topic")
        topic = topic.strip() if topic and topic.strip() else None
        spark_options = connector_params(options)
        if topic is not None:
            spark_options["topic"] = topic
        return cls(
            topic=topic,
            spark_options=spark_options,
            producer=producer,
            exactly_once=options.get_bool("exactlyOnce", True),
            transactional_id_prefix=options.get_str("transactionalIdPrefix"),
            marker_topic=options.get_str("markerTopic"),
        )


def validate_schema(schema: StructType, topic: str | None) -> dict[str, int]:
    """Spark's ``KafkaWriter.validateQuery``; the index of each column the sink uses."""
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        StringType,
        StructField,
        StructType,
    )

    names = {f.name.lower(): (i, f.dataType) for i, f in enumerate(schema.fields)}
    out: dict[str, int] = {}
    if "topic" in names:
        if not isinstance(names["topic"][1], StringType):
            raise AnalysisError("topic attribute type must be a StringType")
        out["topic"] = names["topic"][0]
    elif topic is None:
        raise AnalysisError(
            "topic option required when no 'topic' attribute is present. Use the topic "
            "option for setting a topic."
        )
    if "value" not in names:
        raise AnalysisError("Required attribute 'value' not found")
    if not isinstance(names["value"][1], (StringType, BinaryType)):
        raise AnalysisError("value attribute type must be a StringType or BinaryType")
    out["value"] = names["value"][0]
    if "key" in names:
        if not isinstance(names["key"][1], (StringType, BinaryType)):
            raise AnalysisError("key attribute type must be a StringType or BinaryType")
        out["key"] = names["key"][0]
    if "partition" in names:
        if not isinstance(names["partition"][1], IntegerType):
            raise AnalysisError("partition attribute type must be an IntegerType")
        out["partition"] = names["partition"][0]
    if "headers" in names:
        expected = ArrayType(
            StructType([StructField("key", StringType()), StructField("value", BinaryType())])
        )
        got = names["headers"][1]
        ok = (
            isinstance(got, ArrayType)
            and isinstance(got.elementType, StructType)
            and [(f.name, type(f.dataType)) for f in got.elementType.fields]
            == [(f.name, type(f.dataType)) for f in expected.elementType.fields]  # type: ignore[union-attr]
        )
        if not ok:
            raise AnalysisError(
                "headers attribute type must be an ArrayType(StructType(StructField(key,"
                "StringType,true),StructField(value,BinaryType,true)),true)"
            )
        out["headers"] = names["headers"][0]
    return out


@dataclass(frozen=True)
class PartitionWriter:
    """Writes one partition of one batch (runs in the task); see the module docstring."""

    producer_config: dict[str, str]
    topic: str | None
    exactly_once: bool
    id_prefix: str
    marker_topic: str | None
    batch_id: int | None = None
    """None in the one writer a sink makes for its whole run: the task reads its batch's
    id from the job's local property :data:`BATCH_ID_PROPERTY` (:meth:`for_task`)."""
    columns: dict[str, int] | None = None
    """Where each of the sink's columns is in the input (``validate_schema``); None: the
    input is exactly those columns, by name."""

    def for_task(self, context: Any) -> PartitionWriter:
        """This writer with its batch id: its own, or the one the driver set for the job
        (``KafkaSink.addBatch``). A task with neither refuses to run rather than write
        under a wrong batch id (exactly once goes by it)."""
        if self.batch_id is not None:
            return self
        raw = context.getLocalProperty(BATCH_ID_PROPERTY) if context is not None else None
        if raw is None:
            raise SinkError(
                "The kafka sink's writer ran outside the batch that planned it (no Spark "
                f"local property {BATCH_ID_PROPERTY!r} in its task): a batch DataFrame "
                "written to Kafka must be executed while KafkaSink.addBatch runs, from the "
                "thread that called it."
            )
        return dataclasses.replace(self, batch_id=int(raw))

    @property
    def batch(self) -> int:
        """The batch id, once the task knows it (:meth:`for_task`)."""
        if self.batch_id is None:
            raise AssertionError("PartitionWriter.batch before for_task")
        return self.batch_id

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        context = TaskContext.get()
        yield from self.for_task(context).write_partition(context, batches)

    def write_partition(
        self, context: Any, batches: Iterator[pa.RecordBatch]
    ) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        partition = context.partitionId() if context is not None else 0
        received = [batch for batch in batches if batch.num_rows]
        count = sum(batch.num_rows for batch in received)
        if not count:
            # A re-run gives this partition no rows either: no producer, no transaction
            # (a shuffle's many empty partitions cost nothing).
            written = False
        elif self.exactly_once and context is not None and kafka_host.available():
            # In a Spark task: the executor's producer host writes, with the one producer
            # of the partition's transactional id it keeps for all workers.
            written = self._write_through_host(partition, received)
        elif self.exactly_once:
            written = self.write_exactly_once(partition, self._all_rows(received))
        else:
            written = self._write_at_least_once(self._all_rows(received))
        yield pa.RecordBatch.from_pydict(
            {"partition": [partition], "rows": [count], "written": [written]},
            schema=pa.schema(
                [("partition", pa.int32()), ("rows", pa.int64()), ("written", pa.bool_())]
            ),
        )

    def _write_through_host(self, partition: int, batches: list[pa.RecordBatch]) -> bool:
        import pyarrow as pa

        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batches[0].schema) as stream:
            for batch in batches:
                stream.write_batch(batch)
        try:
            # The host's own calls time out after TIMEOUT_S each; this bounds a stuck host.
            return bool(
                kafka_host.request(
                    ("write", self, partition, sink.getvalue().to_pybytes()), 4 * TIMEOUT_S
                )
            )
        except RuntimeError as exc:
            message = str(exc).removeprefix("SinkError: ")
            raise SinkError(message) from None

    def _all_rows(self, batches: list[pa.RecordBatch]) -> list[dict[str, Any]]:
        return [row for batch in batches for row in self.rows_of(batch)]

    def rows_of(self, batch: pa.RecordBatch) -> list[dict[str, Any]]:
        if self.columns is None:
            return batch.to_pylist()
        values = {name: batch.column(i).to_pylist() for name, i in self.columns.items()}
        for name in ("key", "value"):  # Spark's cast to binary: a string's UTF-8 bytes
            if name in values:
                values[name] = [_as_bytes(v) for v in values[name]]
        names = list(values)
        return [dict(zip(names, row, strict=True)) for row in zip(*values.values(), strict=True)]

    def _produce_all(self, producer: Any, rows: list[dict[str, Any]]) -> list[Any]:
        errors: list[Any] = []

        def report(err: Any, _msg: Any) -> None:
            if err is not None:
                errors.append(err)

        for row in rows:
            topic = self.topic if self.topic is not None else row.get("topic")
            if topic is None:
                raise SinkError(
                    "[KAFKA_NULL_TOPIC_IN_DATA] The Kafka message data sent to the producer "
                    "contains a null topic. Use the `topic` option for setting a default topic."
                )
            kwargs: dict[str, Any] = {"value": row["value"], "key": row.get("key")}
            if row.get("partition") is not None:
                kwargs["partition"] = row["partition"]
            headers = row.get("headers")
            if headers:
                kwargs["headers"] = [(h["key"], h["value"]) for h in headers]
            while True:
                try:
                    producer.produce(topic, on_delivery=report, **kwargs)
                    break
                except BufferError:
                    producer.poll(0.1)  # the local queue is full: let it drain
            producer.poll(0)
        return errors

    def _write_at_least_once(self, rows: list[dict[str, Any]]) -> bool:
        key = pool_key(self.producer_config)
        client, fresh = using(_IDEMPOTENT, key, lambda: _Idempotent(self.producer_config))
        if not fresh:
            try:
                self._send(client, rows, KEPT_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 - redone below with a new producer
                logger.warning(
                    "Kafka sink: a kept producer failed in batch %d (%s); sending the rows "
                    "again with a new one",
                    self.batch,
                    exc,
                )
                discard(client)
                client = _Idempotent(self.producer_config)
            else:
                _IDEMPOTENT.give_back(key, client)
                return True
        try:
            self._send(client, rows, TIMEOUT_S)
        except BaseException:
            discard(client)
            raise
        _IDEMPOTENT.give_back(key, client)
        return True

    def _send(self, client: _Idempotent, rows: list[dict[str, Any]], timeout: float) -> None:
        errors = self._produce_all(client.producer, rows)
        left = client.producer.flush(timeout)
        if errors or left:
            raise SinkError(
                f"Batch {self.batch}: Kafka did not acknowledge {left or len(errors)} "
                f"record(s): {errors[:1] or 'timed out'}"
            )

    def write_exactly_once(self, partition: int, rows: list[dict[str, Any]]) -> bool:
        """Partition ``partition`` of the batch in one transaction, with a kept producer
        when this worker has one for the transactional id, else a new one.

        A kept producer skips ``init_transactions``. That is safe because it was given
        back only after its last transaction committed, and because fencing goes by the
        producer epoch: if another producer of this id was initialised since (another
        worker took this partition in a later batch, a task attempt elsewhere), the
        broker refuses this one's transaction. Whatever fails on a kept producer (fenced,
        timed out, an outage) aborts its transaction, and the partition is written again
        by a new producer, whose ``init_transactions`` completes or aborts whatever the
        old one left open before the marker is read: so the redo is exactly once too.
        """
        transactional_id = f"{self.id_prefix}-{partition}"
        key = pool_key(self.producer_config, transactional_id)

        def make() -> _Transactional:
            return _Transactional(self.producer_config, transactional_id, TIMEOUT_S)

        client, fresh = using(_TRANSACTIONAL, key, make)
        if not fresh:
            try:
                written = self._transact(client, partition, rows, KEPT_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 - redone below with a new producer
                logger.warning(
                    "Kafka sink: the kept transactional producer %s failed in batch %d (%s); "
                    "aborting and writing the partition again with a new producer",
                    transactional_id,
                    self.batch,
                    exc,
                )
                discard(client)
                client = make()
            else:
                _TRANSACTIONAL.give_back(key, client)
                return written
        try:
            written = self._transact(client, partition, rows, TIMEOUT_S)
        except BaseException:
            discard(client)
            raise
        _TRANSACTIONAL.give_back(key, client)
        return written

    def _transact(
        self, client: _Transactional, partition: int, rows: list[dict[str, Any]], timeout: float
    ) -> bool:
        from confluent_kafka import TopicPartition as KTP

        producer = client.producer
        if client.last_batch is None or client.last_batch >= self.batch:
            marker = committed_marker(client.consumer, KTP(self.marker_topic, 0), timeout)
            committed = marker.offset
            if committed is not None and committed > self.batch:
                logger.info(
                    "Kafka sink: partition %d of batch %d was written before; skipped",
                    partition,
                    self.batch,
                )
                return False
        # Else this producer committed an earlier batch of the partition last, and the
        # marker is not read (a round trip, and up to ~100 ms more while the broker still
        # completes that commit): had another producer of the id been initialised since
        # (the only way a later batch could have been written), this one is fenced, its
        # transaction below fails, and the partition is written again by a new producer,
        # which reads the marker.
        producer.begin_transaction()
        client.in_transaction = True
        errors = self._produce_all(producer, rows)
        # The marker joins the transaction while the rows are on their way: its two round
        # trips (AddOffsetsToTxn, TxnOffsetCommit) overlap the produce requests instead of
        # following their acknowledgements (17 -> 9 ms a transaction on a local broker).
        # Nothing is visible before the commit below, which comes only after every row
        # is acknowledged.
        producer.send_offsets_to_transaction(
            [KTP(self.marker_topic, 0, self.batch + 1)],
            client.consumer.consumer_group_metadata(),
            timeout,
        )
        left = producer.flush(timeout)
        if errors or left:
            raise SinkError(
                f"Batch {self.batch}, partition {partition}: Kafka refused "
                f"{len(errors)} record(s), first: {errors[0] if errors else None}; "
                f"{left} not acknowledged in {timeout:.0f} s; the transaction was aborted."
            )
        producer.commit_transaction(timeout)
        client.in_transaction = False
        client.last_batch = self.batch
        return True


_COORDINATOR_MOVING = frozenset({14, 15, 16})
"""``COORDINATOR_LOAD_IN_PROGRESS``, ``COORDINATOR_NOT_AVAILABLE``, ``NOT_COORDINATOR``:
the group's coordinator is starting or moving (a broker just started or restarted)."""


def committed_marker(consumer: Any, partition: Any, timeout: float) -> Any:
    """The marker's committed offset, asked again while the group's coordinator is
    starting or moving (librdkafka reports those as errors of ``committed()`` instead of
    retrying them), up to ``timeout`` seconds in all."""
    import time

    from confluent_kafka import KafkaException

    deadline = time.monotonic() + timeout
    while True:
        try:
            return consumer.committed([partition], timeout=max(0.1, deadline - time.monotonic()))[0]
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            code = error.code() if hasattr(error, "code") else None
            if code not in _COORDINATOR_MOVING or time.monotonic() >= deadline:
                raise
            time.sleep(0.1)


ABORT_TIMEOUT_S = 5.0
"""How long a discarded producer may take to abort its open transaction. Not needed for
correctness (the next producer of the id aborts it in ``init_transactions``), so short."""


class _Idempotent(KeptClient):
    """The at-least-once sink's producer, kept in the worker between batches."""

    def __init__(self, config: dict[str, str]) -> None:
        from confluent_kafka import Producer

        super().__init__()
        self.producer: Any = Producer(
            {"enable.idempotence": "true", **config, "error_cb": self.on_error}
        )

    @override
    def serve_callbacks(self) -> None:
        self.producer.poll(0)

    @override
    def close(self) -> None:
        producer, self.producer = self.producer, None
        if producer is not None:
            producer.purge()


class _Transactional(KeptClient):
    """A transactional producer and the consumer that reads and commits its marker,
    kept in the worker between batches (see ``PartitionWriter.write_exactly_once``)."""

    def __init__(self, config: dict[str, str], transactional_id: str, timeout: float) -> None:
        from confluent_kafka import Consumer, Producer

        super().__init__()
        kafka_host.producer_made()
        self.in_transaction = False
        self.last_batch: int | None = None
        """The batch this producer last committed a transaction for (None: none yet)."""
        self.producer: Any = Producer(
            {
                **config,
                "transactional.id": transactional_id,
                "enable.idempotence": "true",
                "error_cb": self.on_error,
            }
        )
        self.consumer: Any = Consumer(
            {
                "bootstrap.servers": config["bootstrap.servers"],
                **{k: v for k, v in config.items() if k.startswith(("security.", "ssl.", "sasl."))},
                "group.id": transactional_id,
                "enable.auto.commit": "false",
                "isolation.level": "read_committed",
                "error_cb": self.on_error,
            }
        )
        try:
            # Fences earlier producers of this id and completes their open transaction.
            self.producer.init_transactions(timeout)
        except BaseException:
            discard(self)
            raise

    @override
    def serve_callbacks(self) -> None:
        self.producer.poll(0)
        self.consumer.poll(0)

    @override
    def close(self) -> None:
        producer, self.producer = self.producer, None
        consumer, self.consumer = self.consumer, None
        try:
            if producer is not None:
                producer.purge()
                if self.in_transaction:
                    self.in_transaction = False
                    producer.abort_transaction(ABORT_TIMEOUT_S)
        finally:
            if consumer is not None:
                consumer.close()


_TRANSACTIONAL: ClientPool[_Transactional] = ClientPool("transactional producer")

_IDEMPOTENT: ClientPool[_Idempotent] = ClientPool("producer")


class KafkaSink(Sink):
    def __init__(self, context: SinkContext, options: KafkaSinkOptions) -> None:
        self._spark = context.spark
        self.options = options
        self._columns = validate_schema(context.schema, options.topic)
        self._query_id: str | None = None
        self._udf_calls: dict[tuple[Any, ...], ArrowMapOver] = {}
        """The writer's UDF applied to the batch's columns, per input shape (one per run
        in practice): see ``_written``."""
        # The exactly-once writes (transactions) are lockgate's own; Spark's writer has none.
        self._jvm = not options.exactly_once and connector.use_jvm(context.spark)
        # lockgate's transactional writer in the JVM (kafka_jvm), when the session has it
        self.jvm_transactions = options.exactly_once and kafka_jvm.use_jvm_writer(context.spark)
        self._jvm_writers: dict[tuple[tuple[str, int], ...], kafka_jvm.JvmTransactionalWriter] = {}
        # lockgate's own writers report each partition's rows (the batch then needs no
        # count of its own); Spark's JVM writer returns nothing
        self.counts_output_rows = not self._jvm

    def _prefix(self) -> str:
        if self.options.transactional_id_prefix:
            return self.options.transactional_id_prefix
        if self._query_id is None:
            query_id = self._spark.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
            if not query_id:
                raise SinkError(
                    "The kafka sink cannot find the query id that names its transactional "
                    "producers (Spark local property 'sql.streaming.queryId'). Start it with "
                    "writeStream...start(), or set option('transactionalIdPrefix', ...)."
                )
            self._query_id = query_id
        return f"lockgate-{self._query_id}"

    def writer(self, columns: dict[str, int] | None) -> PartitionWriter:
        """The run's writer for input columns ``columns``: no batch id of its own, the
        tasks read it from :data:`BATCH_ID_PROPERTY`."""
        o = self.options
        return PartitionWriter(
            columns=columns,
            producer_config=o.producer,
            topic=o.topic,
            exactly_once=o.exactly_once,
            id_prefix=self._prefix() if o.exactly_once else "",
            marker_topic=o.marker_topic or o.topic,
        )

    def _written(
        self, prepared: DataFrame, names: tuple[str, ...], columns: dict[str, int] | None
    ) -> DataFrame:
        """``prepared.mapInArrow(writer, ...)`` with one UDF and one UDF call per input
        shape for the whole run (as ``lockgate.plan.state_udf.map_with_state``): a
        ``mapInArrow`` per batch would pickle the writer and register a new Python
        function in the JVM every batch, and analyse a new Dataset (the node is copied
        over each batch's plan instead, :class:`~lockgate.jvm.ArrowMapOver`). What
        changes per batch is the batch id, which the tasks read from a local property."""
        from lockgate.jvm import ArrowMapOver, arrow_map_call

        key = (names, tuple(sorted(columns.items())) if columns is not None else None)
        mapping = self._udf_calls.get(key)
        if mapping is None:
            mapping = self._udf_calls[key] = ArrowMapOver(
                arrow_map_call(self.writer(columns), _SUMMARY_SCHEMA, names)
            )
        return mapping.apply(prepared)

    def addBatch(self, batchId: int, data: DataFrame) -> int | None:
        """Write the batch; the rows of the batch (the written and those a run before
        wrote), unless Spark's Kafka writer wrote it (None)."""
        from pyspark.sql import functions as F

        o = self.options
        if self._jvm:  # the columns were checked at start, and Spark checks them again
            connector.write_batch(data, o.spark_options)
            logger.info("Kafka sink wrote batch %d with Spark's Kafka writer", batchId)
            return None
        fields = data.schema.fields
        used = validate_schema(data.schema, o.topic)
        if self.jvm_transactions:
            summary = self._write_in_jvm(batchId, data, used)
            self._log_written(batchId, summary)
            return sum(s.rows for s in summary)
        if sorted(used.values()) == list(range(len(fields))):
            # Every column is one the sink takes: the writer reads them where they are and
            # casts key and value itself, and the batch needs no projection of its own
            # (a plan analysed per batch).
            prepared, columns = data, used
            names = tuple(f.name for f in fields)
        else:
            # Other columns may be of types Arrow does not carry: pick the sink's columns.
            selected = []
            for name in ("topic", "key", "value", "partition", "headers"):
                if name not in used:
                    continue
                col = F.col(f"`{fields[used[name]].name}`")
                if name in ("key", "value"):
                    col = col.cast("binary")
                selected.append(col.alias(name))
            prepared, columns = data.select(*selected), None
            names = tuple(n for n in ("topic", "key", "value", "partition", "headers") if n in used)
        sc = self._spark.sparkContext
        previous = sc.getLocalProperty(BATCH_ID_PROPERTY)
        sc.setLocalProperty(BATCH_ID_PROPERTY, str(batchId))
        try:
            summary = [
                kafka_jvm.Summary(r["partition"], r["rows"], r["written"])
                for r in self._written(prepared, names, columns).collect()
            ]
        except Exception as exc:
            _raise_task_error(exc)
            raise
        finally:
            sc.setLocalProperty(BATCH_ID_PROPERTY, previous)  # type: ignore[arg-type]
        self._log_written(batchId, summary)
        return sum(s.rows for s in summary)

    def _write_in_jvm(
        self, batch_id: int, data: DataFrame, columns: dict[str, int]
    ) -> list[kafka_jvm.Summary]:
        """The batch written by lockgate's JVM writer, with the run's writer for these
        input columns (made once: a batch is then one py4j call)."""
        key = tuple(sorted(columns.items()))
        writer = self._jvm_writers.get(key)
        if writer is None:
            o = self.options
            writer = self._jvm_writers[key] = kafka_jvm.JvmTransactionalWriter(
                self._spark,
                config={
                    k[len("kafka.") :]: v
                    for k, v in o.spark_options.items()
                    if k.lower().startswith("kafka.")
                },
                topic=o.topic,
                id_prefix=self._prefix(),
                marker_topic=o.marker_topic or o.topic,  # type: ignore[arg-type] # validate()
                columns=columns,
            )
        try:
            return writer.write(data, batch_id)
        except Exception as exc:
            _raise_task_error(exc)
            raise

    @staticmethod
    def _log_written(batch_id: int, summary: list[kafka_jvm.Summary]) -> None:
        logger.info(
            "Kafka sink wrote batch %d: %d rows in %d partitions (%d already written)",
            batch_id,
            sum(s.rows for s in summary if s.written),
            sum(1 for s in summary if s.written),
            sum(1 for s in summary if s.rows and not s.written),
        )

    def forContinuous(self, schema: StructType, spark: SparkSession) -> ContinuousSink:
        if self.options.exactly_once:
            # An epoch's rows are not a unit that can be written again: after a restart the
            # replayed records fall into epochs of other bounds, so a per-epoch transaction
            # and marker would skip or repeat rows; and a transaction per epoch would hold
            # every row back until the epoch ends, which is what continuous mode avoids.
            raise OptionError(
                "The kafka sink writes exactly once only under micro-batch triggers: in "
                "continuous processing (trigger(continuous=...)) a replayed epoch does not "
                "hold the same records, so its Kafka transaction cannot be made idempotent. "
                "Set option('exactlyOnce', 'false') for Spark's at-least-once writes (what "
                "continuous processing guarantees), or use a micro-batch trigger.",
                option="exactlyOnce",
            )
        return KafkaContinuousSink(schema, self.options)

    def description(self) -> str:
        return "KafkaSink" + ("[exactly-once]" if self.options.exactly_once else "")


def _raise_task_error(exc: Exception) -> None:
    """Raise a writer's error from a Spark task (a Python writer's, or the JVM writer's
    ``lockgate.kafka.KafkaSinkException``, or Kafka's) as a :class:`SinkError` with its
    message; return when ``exc`` holds none."""
    match = re.findall(r"(SinkError|KafkaSinkException|KafkaException|KafkaError): (.+)", str(exc))
    if match:
        raise SinkError(match[-1][1].strip() + " (raised in a Spark task)") from exc


# -- continuous processing ------------------------------------------------------------------
_PRODUCERS: dict[frozenset[tuple[str, str]], Any] = {}
"""Producers of this Python worker, one per configuration (Spark's CachedKafkaProducer):
a task creates one writer per epoch, and a producer per epoch would reconnect each time."""


def cached_producer(config: dict[str, str]) -> Any:
    from confluent_kafka import Producer

    key = frozenset(config.items())
    producer = _PRODUCERS.get(key)
    if producer is None:
        producer = _PRODUCERS[key] = Producer(config)
    return producer


def _as_bytes(value: Any) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    return bytes(value)


class KafkaContinuousWriter(ContinuousDataWriter):
    """One partition's rows of one epoch, sent as they come; flushed at the epoch's end
    (Spark's ``KafkaDataWriter``: commit waits for every acknowledgement)."""

    def __init__(self, factory: KafkaContinuousWriterFactory, epoch: int) -> None:
        self._factory = factory
        self._epoch = epoch
        self._producer = cached_producer(factory.producer_config)
        self._errors: list[Any] = []
        self.rows = 0

    def _report(self, err: Any, _msg: Any) -> None:
        if err is not None:
            self._errors.append(err)

    def _check(self) -> None:
        if self._errors:
            raise SinkError(
                f"Epoch {self._epoch}: Kafka refused {len(self._errors)} record(s), first: "
                f"{self._errors[0]}"
            )

    def write(self, row: tuple[Any, ...]) -> None:
        f = self._factory
        columns = f.columns
        topic = f.topic if f.topic is not None else row[columns["topic"]]
        if topic is None:
            raise SinkError(
                "[KAFKA_NULL_TOPIC_IN_DATA] The Kafka message data sent to the producer "
                "contains a null topic. Use the `topic` option for setting a default topic."
            )
        kwargs: dict[str, Any] = {"value": _as_bytes(row[columns["value"]])}
        if "key" in columns:
            kwargs["key"] = _as_bytes(row[columns["key"]])
        if "partition" in columns and row[columns["partition"]] is not None:
            kwargs["partition"] = row[columns["partition"]]
        if "headers" in columns and row[columns["headers"]]:
            kwargs["headers"] = [(k, _as_bytes(v)) for k, v in row[columns["headers"]]]
        self._check()
        producer = self._producer
        while True:
            try:
                producer.produce(topic, on_delivery=self._report, **kwargs)
                break
            except BufferError:
                producer.poll(0.1)  # the local queue is full: let it drain
        producer.poll(0)
        self.rows += 1

    def commit(self) -> tuple[dict[str, Any], bytes | None]:
        left = self._producer.flush(TIMEOUT_S)
        self._check()
        if left:
            raise SinkError(
                f"Epoch {self._epoch}: Kafka did not acknowledge {left} record(s) in "
                f"{TIMEOUT_S:.0f} s."
            )
        return {"rows": self.rows}, None

    def abort(self) -> None:
        self._producer.flush(TIMEOUT_S)


@dataclass(frozen=True)
class KafkaContinuousWriterFactory:
    """Shipped to the tasks: the producer's configuration and where each column is."""

    producer_config: dict[str, str]
    topic: str | None
    columns: dict[str, int]

    def __call__(self, partition: int, epoch: int) -> ContinuousDataWriter:
        return KafkaContinuousWriter(self, epoch)


class KafkaContinuousSink(ContinuousSink):
    """The kafka sink under ``trigger(continuous=...)``: at least once, as Spark's
    ``KafkaStreamingWrite`` (each task's idempotent producer sends rows as they arrive and
    flushes at the end of each epoch; nothing to commit on the driver)."""

    def __init__(self, schema: StructType, options: KafkaSinkOptions) -> None:
        self.options = options
        self._columns = validate_schema(schema, options.topic)

    def createWriterFactory(self) -> Any:
        return KafkaContinuousWriterFactory(
            producer_config={"enable.idempotence": "true", **self.options.producer},
            topic=self.options.topic,
            columns=dict(self._columns),
        )

    def description(self) -> str:
        return "KafkaSink"


class KafkaSinkProvider(SinkProvider):
    """``writeStream.format("kafka")``."""

    name = "kafka"
    supports_continuous = True

    def validate(self, spark: SparkSession, options: Options, path: str | None) -> None:
        parsed = KafkaSinkOptions.parse(options)
        if parsed.exactly_once and not (parsed.marker_topic or parsed.topic):
            raise OptionError(
                "The exactly-once kafka sink records the batches it wrote in a marker topic: "
                "with the topic taken from a 'topic' column, set option('markerTopic', ...) to "
                "an existing topic (e.g. one of the output topics), or use "
                "option('exactlyOnce', 'false') for Spark's at-least-once writes.",
                option="markerTopic",
            )

    def createSink(self, context: SinkContext) -> Sink:
        return KafkaSink(context, KafkaSinkOptions.parse(context.options))


__all__ = [
    "KafkaContinuousSink",
    "KafkaSink",
    "KafkaSinkOptions",
    "KafkaSinkProvider",
    "PartitionWriter",
]

"""The Kafka source's options, parsed and checked once, with Spark's messages.

Every ``kafka.<name>`` option goes to the consumers (driver and tasks) as librdkafka
property ``<name>``; librdkafka's property names are Kafka's Java client's for the
common settings (``bootstrap.servers``, ``security.protocol``, ``ssl.*``,
``sasl.username`` ...). ``sasl.mechanism`` is translated to librdkafka's
``sasl.mechanisms``. A property librdkafka does not know fails the query at start
naming the option.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from lockgate.errors import OptionError
from lockgate.options import Options, parse_duration_ms
from lockgate.sources.kafka.offsets import EARLIEST, LATEST

STRATEGY_KEYS = ("subscribe", "subscribepattern", "assign")
DEFAULT_GROUP_ID_PREFIX = "spark-kafka-source"
DEFAULT_MAX_TRIGGER_DELAY = "15m"
DEFAULT_POLL_TIMEOUT_MS = 120_000
# Spark's KafkaOffsetReader: offsets are fetched up to 3 times, 1 s apart
DEFAULT_FETCH_OFFSET_ATTEMPTS = 3
DEFAULT_FETCH_OFFSET_RETRY_INTERVAL_MS = 1000

# Kafka Java client names that librdkafka spells differently.
_JAVA_TO_LIBRDKAFKA = {"sasl.mechanism": "sasl.mechanisms"}

AUTO_OFFSET_RESET_MESSAGE = (
    "Kafka option 'auto.offset.reset' is not supported.\n"
    "Instead set the source option 'startingoffsets' to 'earliest' or 'latest'\n"
    "to specify where to start. Structured Streaming manages which offsets are consumed\n"
    "internally, rather than relying on the kafkaConsumer to do it. This will ensure that no\n"
    "data is missed when new topics/partitions are dynamically subscribed. Note that\n"
    "'startingoffsets' only applies when a new Streaming query is started, and\n"
    "that resuming will always pick up from where the query left off. See the docs for more\n"
    "details."
)


SPARK_READER_KEYS = (
    "kafkaconsumer.polltimeoutms",
    "fetchoffset.numretries",
    "fetchoffset.retryintervalms",
    "minpartitions",
    "maxrecordsperpartition",
)
"""Options besides ``kafka.*`` that Spark's batch reader takes as the source does (the
JVM reader of :mod:`lockgate.sources.kafka.connector` passes them on as given; it sets
``failOnDataLoss`` and ``includeHeaders`` from the parsed values)."""


def connector_params(options: Options, keys: tuple[str, ...] = ()) -> dict[str, str]:
    """The options Spark's Kafka connector is given, as the user wrote them: every
    ``kafka.*`` option (Java client property names, prefix kept) and those in ``keys``
    (lower case)."""
    return {
        key: options[key]
        for key in options
        if key.lower().startswith("kafka.") or key.lower() in keys
    }


def kafka_params(options: Options) -> dict[str, str]:
    """``kafka.*`` options without the prefix, as librdkafka properties."""
    out: dict[str, str] = {}
    for key in options:
        if key.lower().startswith("kafka."):
            name = key[len("kafka.") :]
            out[_JAVA_TO_LIBRDKAFKA.get(name, name)] = options[key]
    return out


@dataclass(frozen=True)
class Strategy:
    """Which partitions to read: ``subscribe``, ``subscribePattern`` or ``assign``."""

    kind: str
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assigned: tuple[tuple[str, int], ...] = ()

    def describe(self) -> str:
        if self.kind == "subscribe":
            return f"Subscribe[{','.join(self.topics)}]"
        if self.kind == "subscribepattern":
            return f"SubscribePattern[{self.pattern}]"
        return "Assign[" + ", ".join(f"{t}-{p}" for t, p in self.assigned) + "]"

    def matches(self, topic: str) -> bool:
        if self.kind == "subscribe":
            return topic in self.topics
        if self.kind == "subscribepattern":
            assert self.pattern is not None
            return re.fullmatch(self.pattern, topic) is not None
        return any(t == topic for t, _ in self.assigned)


@dataclass(frozen=True)
class StartingOffsets:
    """``earliest``, ``latest``, per-partition offsets, or timestamps (global or per partition)."""

    kind: str  # earliest | latest | offsets | timestamps | timestamp
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    timestamp: int | None = None
    strategy_on_no_match: str = "error"


def _illegal(message: str, option: str | None = None) -> OptionError:
    return OptionError(message, option=option)


def _partition_json(text: str, what: str) -> dict[tuple[str, int], int]:
    try:
        parsed = json.loads(text)
        if not isinstance(parsed, dict):
            raise TypeError
        out: dict[tuple[str, int], int] = {}
        for topic, parts in parsed.items():
            if not isinstance(parts, dict):
                raise TypeError
            for p, value in parts.items():
                if isinstance(value, bool) or not isinstance(value, int):
                    raise TypeError
                out[(str(topic), int(p))] = value
        return out
    except (ValueError, TypeError):
        raise _illegal(
            f'Expected e.g. {{"topicA":{{"0":23,"1":-1}},"topicB":{{"0":-2}}}}, got {text}',
            what,
        ) from None


def _parse_starting(options: Options) -> StartingOffsets:
    strategy = (options.get_str("startingOffsetsByTimestampStrategy") or "error").strip().lower()
    if strategy not in ("error", "latest"):
        raise _illegal(
            f"Invalid value {options.get_str('startingOffsetsByTimestampStrategy')!r} for "
            "option 'startingOffsetsByTimestampStrategy': expected 'error' or 'latest'.",
            "startingOffsetsByTimestampStrategy",
        )
    global_ts = options.get_str("startingTimestamp")
    if global_ts is not None:
        try:
            ts = int(global_ts.strip())
        except ValueError:
            raise _illegal(
                f"Invalid value {global_ts!r} for option 'startingTimestamp': expected "
                "milliseconds since the epoch.",
                "startingTimestamp",
            ) from None
        return StartingOffsets("timestamp", timestamp=ts, strategy_on_no_match=strategy)
    by_ts = options.get_str("startingOffsetsByTimestamp")
    if by_ts is not None:
        return StartingOffsets(
            "timestamps",
            offsets=_partition_json(by_ts.strip(), "startingOffsetsByTimestamp"),
            strategy_on_no_match=strategy,
        )
    raw = options.get_str("startingOffsets")
    if raw is None or raw.strip().lower() == "latest":
        return StartingOffsets("latest")
    if raw.strip().lower() == "earliest":
        return StartingOffsets("earliest")
    offsets = _partition_json(raw.strip(), "startingOffsets")
    for (topic, partition), offset in offsets.items():
        if offset < EARLIEST:
            raise _illegal(
                f"Invalid value {raw!r} for option 'startingOffsets': offset {offset} of "
                f"{topic}-{partition} is negative; use -2 for earliest, -1 for latest.",
                "startingOffsets",
            )
    return StartingOffsets("offsets", offsets=offsets)


def _parse_strategy(options: Options) -> Strategy:
    given = [k for k in STRATEGY_KEYS if k in options]
    if not given:
        raise _illegal(
            "One of the following options must be specified for Kafka source: "
            + ", ".join(STRATEGY_KEYS)
            + ". See the docs for more details."
        )
    if len(given) > 1:
        raise _illegal(
            "Only one of the following options can be specified for Kafka source: "
            + ", ".join(STRATEGY_KEYS)
            + ". See the docs for more details."
        )
    kind = given[0]
    value = options[kind]
    if kind == "assign":
        bad = _illegal(
            f"No topicpartitions to assign as specified value for option 'assign' is '{value}'",
            "assign",
        )
        if not value.strip().startswith("{"):
            raise bad
        try:
            parsed = json.loads(value)
            assigned = tuple(
                (str(t), int(p))
                for t, parts in parsed.items()
                for p in parts
                if not isinstance(p, bool)
            )
        except (ValueError, TypeError, AttributeError):
            raise _illegal(
                f'Expected e.g. {{"topicA":[0,1],"topicB":[0,1]}}, got {value}', "assign"
            ) from None
        return Strategy("assign", assigned=assigned)
    if kind == "subscribe":
        topics = tuple(t.strip() for t in value.split(",") if t.strip())
        if not topics:
            raise _illegal(
                f"No topics to subscribe to as specified value for option 'subscribe' is '{value}'",
                "subscribe",
            )
        return Strategy("subscribe", topics=topics)
    pattern = value.strip()
    if not pattern:
        raise _illegal(
            "Pattern to subscribe is empty as specified value for option 'subscribePattern' "
            f"is '{value}'",
            "subscribePattern",
        )
    try:
        re.compile(pattern)
    except re.error as exc:
        raise _illegal(
            f"Invalid value {value!r} for option 'subscribePattern': {exc}", "subscribePattern"
        ) from None
    return Strategy("subscribepattern", pattern=pattern)


def _positive_long(options: Options, key: str) -> int | None:
    value = options.get_str(key)
    if value is None:
        return None
    try:
        number = int(value.strip())
    except ValueError:
        raise _illegal(
            f"Invalid value {value!r} for option '{key}': expected a positive integer.", key
        ) from None
    if number <= 0:
        raise _illegal(f"Invalid value {value!r} for option '{key}': must be positive.", key)
    return number


@dataclass(frozen=True)
class KafkaSourceOptions:
    strategy: Strategy
    starting: StartingOffsets
    consumer: dict[str, str]
    group_id: str | None
    group_id_prefix: str
    fail_on_data_loss: bool
    include_headers: bool
    max_offsets_per_trigger: int | None
    min_offsets_per_trigger: int | None
    max_trigger_delay_ms: int
    min_partitions: int | None
    poll_timeout_ms: int
    max_records_per_partition: int | None = None
    fetch_offset_attempts: int = DEFAULT_FETCH_OFFSET_ATTEMPTS
    fetch_offset_retry_interval_ms: int = DEFAULT_FETCH_OFFSET_RETRY_INTERVAL_MS
    spark_options: dict[str, str] = field(default_factory=dict)
    """What Spark's batch reader is given when the JVM reads (``connector_params``)."""

    @classmethod
    def parse(cls, options: Options) -> KafkaSourceOptions:
        """Spark's ``validateStreamOptions`` then ``validateGeneralOptions``."""
        if "endingOffsets" in options:
            raise _illegal("ending offset not valid in streaming queries", "endingOffsets")
        if "endingOffsetsByTimestamp" in options or "endingTimestamp" in options:
            raise _illegal("ending timestamp not valid in streaming queries", "endingTimestamp")
        strategy = _parse_strategy(options)
        min_partitions = None
        if "minPartitions" in options:
            raw = options["minPartitions"]
            try:
                min_partitions = int(raw.strip())
            except ValueError:
                raise _illegal(
                    f"Invalid value {raw!r} for option 'minPartitions': expected an integer.",
                    "minPartitions",
                ) from None
            if min_partitions <= 0:
                raise _illegal("minPartitions must be positive", "minPartitions")
        max_records = None
        if "maxRecordsPerPartition" in options:
            raw = options["maxRecordsPerPartition"]
            try:
                max_records = int(raw.strip())
            except ValueError:
                raise _illegal(
                    f"Invalid value {raw!r} for option 'maxRecordsPerPartition': expected an "
                    "integer.",
                    "maxRecordsPerPartition",
                ) from None
            if max_records <= 0:
                raise _illegal(
                    "maxrecordsperpartition must be positive", "maxRecordsPerPartition"
                )
        consumer = kafka_params(options)
        lowered = {k.lower(): k for k in consumer}
        if "auto.offset.reset" in lowered:
            raise _illegal(AUTO_OFFSET_RESET_MESSAGE, "kafka.auto.offset.reset")
        for which in ("key", "value"):
            if f"{which}.deserializer" in lowered:
                raise _illegal(
                    f"Kafka option '{which}.deserializer' is not supported as {which}s are "
                    "deserialized as byte arrays with ByteArrayDeserializer. Use DataFrame "
                    f"operations to explicitly deserialize the {which}s.",
                    f"kafka.{which}.deserializer",
                )
        for name in ("enable.auto.commit", "interceptor.classes"):
            if name in lowered:
                raise _illegal(f"Kafka option '{name}' is not supported", f"kafka.{name}")
        if "bootstrap.servers" not in lowered:
            raise _illegal(
                "Option 'kafka.bootstrap.servers' must be specified for configuring Kafka consumer",
                "kafka.bootstrap.servers",
            )
        delay_text = options.get_str("maxTriggerDelay", DEFAULT_MAX_TRIGGER_DELAY)
        assert delay_text is not None
        poll = options.get_int("kafkaConsumer.pollTimeoutMs", DEFAULT_POLL_TIMEOUT_MS, minimum=1)
        assert poll is not None
        attempts = options.get_int(
            "fetchOffset.numRetries", DEFAULT_FETCH_OFFSET_ATTEMPTS, minimum=1
        )
        interval = options.get_int(
            "fetchOffset.retryIntervalMs", DEFAULT_FETCH_OFFSET_RETRY_INTERVAL_MS, minimum=0
        )
        assert attempts is not None and interval is not None
        return cls(
            strategy=strategy,
            starting=_parse_starting(options),
            consumer=consumer,
            group_id=consumer.get("group.id"),
            group_id_prefix=options.get_str("groupIdPrefix", DEFAULT_GROUP_ID_PREFIX)
            or DEFAULT_GROUP_ID_PREFIX,
            fail_on_data_loss=options.get_bool("failOnDataLoss", True),
            include_headers=options.get_bool("includeHeaders", False),
            max_offsets_per_trigger=_positive_long(options, "maxOffsetsPerTrigger"),
            min_offsets_per_trigger=_positive_long(options, "minOffsetsPerTrigger"),
            max_trigger_delay_ms=parse_duration_ms(delay_text, what="option 'maxTriggerDelay'"),
            min_partitions=min_partitions,
            max_records_per_partition=max_records,
            poll_timeout_ms=poll,
            fetch_offset_attempts=attempts,
            fetch_offset_retry_interval_ms=interval,
            spark_options=connector_params(options, SPARK_READER_KEYS),
        )


def check_consumer_config(config: dict[str, Any]) -> None:
    """Fail at start, naming the option, on a ``kafka.*`` property librdkafka rejects."""
    from confluent_kafka import Consumer, KafkaException

    try:
        Consumer(config).close()
    except (KafkaException, ValueError, TypeError) as exc:
        raise OptionError(
            f"Kafka rejected the consumer configuration: {exc}. The kafka.* options are "
            "passed to librdkafka (confluent-kafka) without the 'kafka.' prefix; check the "
            "property names and values.",
            option="kafka.*",
        ) from exc


LATEST_OFFSET = LATEST

"""Helpers of the Kafka tests: the broker of ``bench/kafka_broker.py`` (a single-node
KRaft broker of Apache Kafka on loopback, shared with ``bench/kafka_latency.py``), and
the skips.

Without java, the broker's classpath file, or confluent-kafka the tests are skipped,
except with ``CI=true`` in the environment, where they fail.
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

from bench.kafka_broker import (  # noqa: F401 - the tests' names for them
    BROKER_CLASSPATH,
    CONNECTOR_CLASSPATH,
    HOST,
    KafkaBroker,
    broker_problem,
    connector_jars,
    free_port,
    read_classpath,
)


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def _skip_or_fail(problem: str) -> None:
    if in_ci():
        pytest.fail(f"CI=true and the Kafka tests cannot run: {problem}", pytrace=False)
    pytest.skip(f"Kafka tests skipped: {problem} (with CI=true this fails)")


def require_kafka() -> str:
    """The broker's classpath; skip (fail under CI) when something is missing."""
    problem = broker_problem()
    if problem is not None:
        _skip_or_fail(problem)
    classpath = read_classpath(BROKER_CLASSPATH)
    assert classpath is not None
    return classpath


def require_connector_jars() -> str:
    """Spark's Kafka connector as a ``spark.jars`` value for a driver subprocess; skip
    (fail under CI) when ``tools/fetch_kafka.sh`` has not fetched it."""
    jars = connector_jars()
    if jars is None:
        _skip_or_fail(f"{CONNECTOR_CLASSPATH} is missing: run tools/fetch_kafka.sh")
    assert jars is not None
    return jars


def require_connector(spark: Any) -> None:
    """Skip (fail under CI) when the oracle session has no Kafka connector."""
    jars = spark.sparkContext.getConf().get("spark.jars", "") or ""
    if "spark-sql-kafka" not in jars:
        _skip_or_fail(
            f"the native Spark session has no Kafka connector ({CONNECTOR_CLASSPATH} is "
            "missing: run tools/fetch_kafka.sh)"
        )


def require_jvm_writer(spark: Any) -> None:
    """Skip (fail under CI) when the session cannot load lockgate's JVM writer."""
    from lockgate.sinks.kafka_jvm import missing

    lacking = missing(spark)
    if lacking:
        _skip_or_fail(
            f"the session cannot load {' and '.join(lacking)} (run make jvm-jar, and "
            "tools/fetch_kafka.sh for kafka-clients)"
        )


def writer_jars() -> str | None:
    """Spark's Kafka connector and lockgate's jar (the JVM writer, when built) as a
    ``spark.jars`` value for a driver subprocess."""
    import lockgate

    jars = [j for j in (connector_jars() or "").split(",") if j] + lockgate.jars()
    return ",".join(jars) or None


def read_committed_values(broker: Any, topic: str, expected: int) -> list[str]:
    """Every record of ``topic`` a read_committed consumer sees (waits for ``expected``)."""
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": f"check-{time.monotonic_ns()}",
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    seen: list[str] = []
    deadline = time.monotonic() + 60
    idle_since = None
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None or message.error():
                if len(seen) >= expected:
                    idle_since = idle_since or time.monotonic()
                    if time.monotonic() - idle_since > 2:  # nothing more behind them
                        break
                continue
            idle_since = None
            seen.append(message.value().decode())
    finally:
        consumer.close()
    return seen

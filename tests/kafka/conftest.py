"""Fixtures of the Kafka tests: one Apache Kafka broker (KRaft, loopback) per session.

See ``kafka_testing.py`` for how the broker is fetched and started. Tests keep apart by
unique topic names (``names``); tests that restart or kill the broker make their own
:class:`KafkaBroker`.
"""

from __future__ import annotations

import uuid

import pytest
from kafka_testing import KafkaBroker, require_connector, require_kafka


@pytest.fixture(scope="session")
def kafka_classpath() -> str:
    return require_kafka()


@pytest.fixture(scope="session")
def kafka(kafka_classpath: str, tmp_path_factory: pytest.TempPathFactory):
    broker = KafkaBroker(kafka_classpath, tmp_path_factory.mktemp("kafka-broker"))
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def native_kafka(spark):
    """The oracle session, with Spark's Kafka connector on its classpath."""
    require_connector(spark)
    return spark


@pytest.fixture(params=["jvm", "python"])
def kafka_io(request, native_kafka):
    """Each Kafka reader and at-least-once writer in turn (``spark.lockgate.kafka.io``):
    Spark's Kafka connector in the JVM, and librdkafka in the Python workers."""
    from differential import spark_conf

    from lockgate.sources.kafka.connector import IO_CONF

    with spark_conf(native_kafka, IO_CONF, request.param):
        yield request.param


@pytest.fixture
def python_writer(spark):
    """The exactly-once sink's librdkafka writer (the Python stage and the producer host)
    for the test, whether or not the session has lockgate's JVM writer."""
    from differential import spark_conf

    from lockgate.sinks.kafka_jvm import WRITER_CONF

    with spark_conf(spark, WRITER_CONF, "python"):
        yield


@pytest.fixture
def jvm_writer(spark):
    """The exactly-once sink's JVM writer for the test (skipped, or failed under CI, when
    ``make jvm-jar`` has not built it)."""
    from differential import spark_conf
    from kafka_testing import require_jvm_writer

    from lockgate.sinks.kafka_jvm import WRITER_CONF

    require_jvm_writer(spark)
    with spark_conf(spark, WRITER_CONF, "jvm"):
        yield


@pytest.fixture(params=["jvm", "python"])
def transactional_writer(request, spark):
    """Each exactly-once writer in turn (``spark.lockgate.kafka.transactionalWriter``):
    lockgate's JVM writer and librdkafka in the Python workers."""
    request.getfixturevalue(f"{request.param}_writer")
    return request.param


@pytest.fixture
def names():
    """Unique topic names for one test: ``names("in")`` -> ``"in-<random>"``."""
    token = uuid.uuid4().hex[:8]
    return lambda name: f"{name}-{token}"

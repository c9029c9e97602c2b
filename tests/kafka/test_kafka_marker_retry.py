"""The exactly-once sink's marker read asks again while the group's coordinator is
starting or moving (a broker just started: ``NOT_COORDINATOR``), and fails at once on
any other error."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from lockgate.sinks.kafka import committed_marker


class _Consumer:
    def __init__(self, errors: list[int]) -> None:
        self.errors, self.calls = errors, 0

    def committed(self, partitions: list[Any], timeout: float) -> list[Any]:
        self.calls += 1
        if self.errors:
            raise KafkaException(KafkaError(self.errors.pop(0)))
        return [TopicPartition(partitions[0].topic, 0, 7)]


def test_a_coordinator_that_is_moving_is_asked_again():
    consumer = _Consumer([KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS])
    assert committed_marker(consumer, TopicPartition("t", 0), 5.0).offset == 7
    assert consumer.calls == 3


def test_another_error_fails_at_once():
    consumer = _Consumer([KafkaError.TOPIC_AUTHORIZATION_FAILED])
    with pytest.raises(KafkaException):
        committed_marker(consumer, TopicPartition("t", 0), 5.0)
    assert consumer.calls == 1


def test_a_coordinator_that_never_settles_fails_at_the_timeout():
    consumer = _Consumer([KafkaError.NOT_COORDINATOR] * 1000)
    with pytest.raises(KafkaException):
        committed_marker(consumer, TopicPartition("t", 0), 0.3)
    assert 2 <= consumer.calls < 1000

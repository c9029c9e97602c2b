"""Exceptions of the Kafka source and sink."""

from __future__ import annotations

from lockgate.errors import LockgateError


class KafkaError(LockgateError):
    """Talking to Kafka failed (metadata, offsets, reading or writing records)."""


class KafkaDataLossError(KafkaError, RuntimeError):
    """Offsets the query was going to read are gone (Spark's ``KAFKA_DATA_LOSS``); raised
    only with ``failOnDataLoss`` true (the default), otherwise logged as a warning."""


DATA_LOSS_PREFIX = (
    "[KAFKA_DATA_LOSS.{sub}] Some data may have been lost because they are not available in "
    "Kafka any more; either the data was aged out by Kafka or the topic may have been deleted "
    "before all the data in the topic was processed. If you don't want your streaming query "
    "to fail on such cases, set the source option failOnDataLoss to false. Reason: "
)

"""Triggers: when the micro-batch engine runs its next batch."""

from __future__ import annotations

from dataclasses import dataclass

from lockgate.options import trigger_interval_ms


class Trigger:
    """Base of the trigger kinds, as ``org.apache.spark.sql.streaming.Trigger``."""


@dataclass(frozen=True)
class ProcessingTimeTrigger(Trigger):
    """Run a batch every ``interval_ms`` (0: as fast as possible, Spark's default)."""

    interval_ms: int = 0

    @classmethod
    def parse(cls, text: str) -> ProcessingTimeTrigger:
        """``trigger(processingTime=text)``: PySpark's checks, then Spark's own parser."""
        return cls(trigger_interval_ms("processingTime", _interval_text("processingTime", text)))


@dataclass(frozen=True)
class OnceTrigger(Trigger):
    """One batch of everything available, then stop (deprecated in Spark; kept for ports)."""


@dataclass(frozen=True)
class AvailableNowTrigger(Trigger):
    """Process everything available at start, in batches respecting read limits, then stop."""


@dataclass(frozen=True)
class ContinuousTrigger(Trigger):
    interval_ms: int

    @classmethod
    def parse(cls, text: str) -> ContinuousTrigger:
        """``trigger(continuous=text)``: PySpark's checks, then Spark's own parser."""
        return cls(trigger_interval_ms("continuous", _interval_text("continuous", text)))


def _interval_text(arg_name: str, text: object) -> str:
    """PySpark's check of a trigger's interval argument (before Spark parses it)."""
    from pyspark.errors import PySparkValueError

    if not isinstance(text, str) or not text.strip():
        raise PySparkValueError(
            errorClass="VALUE_NOT_NON_EMPTY_STR",
            messageParameters={"arg_name": arg_name, "arg_value": str(text)},
        )
    return text.strip()


DEFAULT_TRIGGER = ProcessingTimeTrigger(0)

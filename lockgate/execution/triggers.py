"""Triggers: when the micro-batch engine runs its next batch."""

from __future__ import annotations

from dataclasses import dataclass

from lockgate.errors import OptionError
from lockgate.options import parse_duration_ms


class Trigger:
    """Base of the trigger kinds, as ``org.apache.spark.sql.streaming.Trigger``."""


@dataclass(frozen=True)
class ProcessingTimeTrigger(Trigger):
    """Run a batch every ``interval_ms`` (0: as fast as possible, Spark's default)."""

    interval_ms: int = 0

    @classmethod
    def parse(cls, text: str) -> ProcessingTimeTrigger:
        if not isinstance(text, str) or not text.strip():
            raise OptionError(
                f"Value for processingTime must be a non empty string. Got: {text!r}",
                option="processingTime",
            )
        ms = parse_duration_ms(text, what="processingTime")
        if ms < 0:
            raise OptionError(
                f"Interval cannot be negative: processingTime={text!r}", option="processingTime"
            )
        return cls(ms)


@dataclass(frozen=True)
class OnceTrigger(Trigger):
    """One batch of everything available, then stop (deprecated in Spark; kept for ports)."""


@dataclass(frozen=True)
class AvailableNowTrigger(Trigger):
    """Process everything available at start, in batches respecting read limits, then stop."""


@dataclass(frozen=True)
class ContinuousTrigger(Trigger):
    interval_ms: int


DEFAULT_TRIGGER = ProcessingTimeTrigger(0)

"""ProgressReporter: per-trigger timings and the StreamingQueryProgress they become."""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from pyspark.sql.streaming.listener import StreamingQueryProgress

logger = logging.getLogger("lockgate.execution.MicroBatchExecution")


def format_timestamp(ms: int) -> str:
    """Spark's progress timestamp format: ``2017-08-14T20:30:00.004Z``."""
    dt = datetime.fromtimestamp(ms / 1000.0, tz=UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


class ProgressTracker:
    """Collects the durations and counts of the current trigger; keeps recent progress."""

    def __init__(self, max_recent: int) -> None:
        # Spark keeps numRecentProgressUpdates - 1 entries.
        self.recent: deque[StreamingQueryProgress] = deque(maxlen=max(1, max_recent - 1))
        self.durations: dict[str, int] = {}
        self.trigger_start_ms = -1
        self.last_trigger_start_ms = -1
        self.last_no_data_event_ms = -1

    def start_trigger(self, now_ms: int) -> None:
        self.durations = {}
        self.trigger_start_ms = now_ms

    @contextmanager
    def time(self, key: str) -> Iterator[None]:
        """Add the wall time of the block to ``durationMs[key]``."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            elapsed = int((time.perf_counter() - t0) * 1000)
            self.durations[key] = self.durations.get(key, 0) + elapsed

    def last(self) -> StreamingQueryProgress | None:
        return self.recent[-1] if self.recent else None

    def record(self, progress: dict[str, Any]) -> StreamingQueryProgress:
        parsed = StreamingQueryProgress.fromJson(progress)
        self.recent.append(parsed)
        if logger.isEnabledFor(logging.INFO):
            logger.info("Streaming query made progress: %s", json.dumps(progress, indent=2))
        return parsed


def json_or_none(text: str | None) -> Any:
    """A source offset's JSON text as the value progress reports (the text itself when it
    is not JSON; None for no offset)."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def rate(rows: int, seconds: float) -> float:
    """Rows per second, rounded half-up to one decimal as Spark renders progress."""
    if seconds <= 0:
        return 0.0
    from decimal import ROUND_HALF_UP, Decimal

    return float(Decimal(repr(float(rows) / seconds)).quantize(Decimal("0.1"), rounding=ROUND_HALF_UP))

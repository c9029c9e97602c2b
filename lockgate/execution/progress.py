"""ProgressReporter: per-trigger timings and the StreamingQueryProgress they become,
assembled here for every engine (:func:`query_progress`, :func:`source_progress`)."""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from decimal import ROUND_HALF_UP, Decimal
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
    return float(Decimal(repr(float(rows) / seconds)).quantize(Decimal("0.1"), rounding=ROUND_HALF_UP))


def source_progress(
    description: str,
    start: str | None,
    end: str | None,
    rows: int,
    input_secs: float,
    process_secs: float,
    latest: str | None = None,
) -> dict[str, Any]:
    """A ``sources[]`` entry of a progress: the offsets a trigger read from and to, the
    latest offset the source reported (:meth:`Source.reportLatestOffset`; null when it
    reports none) and the source's rows."""
    return {
        "description": description,
        "startOffset": json_or_none(start),
        "endOffset": json_or_none(end),
        "latestOffset": json_or_none(latest),
        "numInputRows": rows,
        "inputRowsPerSecond": rate(rows, input_secs),
        "processedRowsPerSecond": rate(rows, process_secs),
    }


def query_progress(
    *,
    query_id: str,
    run_id: str,
    name: str | None,
    timestamp_ms: int,
    batch_id: int,
    batch_duration_ms: int,
    durations: dict[str, int],
    input_secs: float,
    process_secs: float,
    event_time: dict[str, str] | None,
    state_operators: list[dict[str, Any]],
    sources: list[dict[str, Any]],
    sink_description: str,
    output_rows: int,
    observed: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A ``StreamingQueryProgress`` as JSON, in Spark's field order: the query, the
    trigger, its input rows (the sum of ``sources``) and rates, durations, event time
    (None for none), state operators, sources, sink and observed metrics (None or empty
    for none)."""
    rows = sum(int(s["numInputRows"]) for s in sources)
    progress: dict[str, Any] = {
        "id": query_id,
        "runId": run_id,
        "name": name,
        "timestamp": format_timestamp(timestamp_ms),
        "batchId": batch_id,
        "batchDuration": batch_duration_ms,
        "numInputRows": rows,
        "inputRowsPerSecond": rate(rows, input_secs),
        "processedRowsPerSecond": rate(rows, process_secs),
        "durationMs": dict(durations),
    }
    if event_time is not None:
        progress["eventTime"] = event_time
    progress["stateOperators"] = state_operators
    progress["sources"] = sources
    progress["sink"] = {"description": sink_description, "numOutputRows": output_rows}
    if observed:
        progress["observedMetrics"] = observed
    return progress

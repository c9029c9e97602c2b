"""WatermarkTracker: the global event-time watermark across ``withWatermark`` operators."""

from __future__ import annotations

import logging
from collections.abc import Sequence

logger = logging.getLogger(__name__)

MIN_POLICY = "min"
MAX_POLICY = "max"


class WatermarkTracker:
    """Holds each operator's max event time and the global watermark.

    The global watermark is the min (default) or max over operators of
    ``max event time - delay``; it only rises. Batch N runs with the watermark
    computed through batch N-1.
    """

    def __init__(self, delays_ms: Sequence[int], policy: str = MIN_POLICY) -> None:
        policy = policy.lower()
        if policy not in (MIN_POLICY, MAX_POLICY):
            from lockgate.errors import OptionError

            raise OptionError(
                f"Invalid value {policy!r} for spark.sql.streaming.multipleWatermarkPolicy: "
                "expected 'min' or 'max'.",
                option="spark.sql.streaming.multipleWatermarkPolicy",
            )
        self.policy = policy
        self.delays_ms = list(delays_ms)
        self._operator_watermarks: list[int | None] = [None] * len(self.delays_ms)
        self.current_watermark_ms = 0

    def set_watermark(self, value_ms: int) -> None:
        self.current_watermark_ms = value_ms

    def update(self, max_event_time_ms: Sequence[int | None]) -> None:
        """Fold in one batch's max event time per operator (None: no rows seen)."""
        for i, max_ms in enumerate(max_event_time_ms):
            if max_ms is None:
                continue
            candidate = max_ms - self.delays_ms[i]
            previous = self._operator_watermarks[i]
            if previous is None or candidate > previous:
                self._operator_watermarks[i] = candidate
        known = [w for w in self._operator_watermarks if w is not None]
        if not known:
            return
        if self.policy == MIN_POLICY:
            # An operator that has seen no data yet holds the min watermark back,
            # as Spark's MinWatermark policy does.
            if len(known) < len(self._operator_watermarks):
                return
            new = min(known)
        else:
            new = max(known)
        if new > self.current_watermark_ms:
            logger.info("Updating event-time watermark from %s to %s ms", self.current_watermark_ms, new)
            self.current_watermark_ms = new

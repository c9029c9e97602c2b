"""Injected time: the engine asks a clock for "now" and never calls ``time.time()``."""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    """What the engine needs of time: wall-clock millis, and a wait that tests can drive."""

    def get_time_millis(self) -> int: ...

    def wait_till_time(self, target_ms: int, stop: threading.Event) -> int:
        """Block until ``target_ms`` or until ``stop`` is set; return the time then."""
        ...


class SystemClock:
    """The real clock."""

    def get_time_millis(self) -> int:
        return int(time.time() * 1000)

    def wait_till_time(self, target_ms: int, stop: threading.Event) -> int:
        while True:
            now = self.get_time_millis()
            if now >= target_ms or stop.is_set():
                return now
            stop.wait(min((target_ms - now) / 1000.0, 0.1))

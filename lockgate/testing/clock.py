"""``ManualClock``: a clock for tests, which moves only when told to (Spark's ManualClock)."""

from __future__ import annotations

import threading


class ManualClock:
    """A clock that only moves when told to, for deterministic tests of triggers and timestamps.

    >>> c = ManualClock(1000)
    >>> c.advance(500)
    >>> c.get_time_millis()
    1500
    """

    def __init__(self, start_ms: int = 0) -> None:
        self._now = start_ms
        self._cond = threading.Condition()
        self._waiters = 0

    def get_time_millis(self) -> int:
        with self._cond:
            return self._now

    def set_time(self, ms: int) -> None:
        with self._cond:
            self._now = ms
            self._cond.notify_all()

    def advance(self, ms: int) -> None:
        with self._cond:
            self._now += ms
            self._cond.notify_all()

    def is_waiting(self) -> bool:
        """True while some thread blocks in :meth:`wait_till_time`."""
        with self._cond:
            return self._waiters > 0

    def wait_till_time(self, target_ms: int, stop: threading.Event) -> int:
        with self._cond:
            self._waiters += 1
            try:
                while self._now < target_ms and not stop.is_set():
                    self._cond.wait(0.05)
                return self._now
            finally:
                self._waiters -= 1

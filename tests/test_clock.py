"""Clocks: SystemClock follows the wall clock; ManualClock moves only when told to."""

from __future__ import annotations

import threading
import time

import pytest

import lockgate
from lockgate.clock import SystemClock
from lockgate.testing import ManualClock


def _wait_until(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return predicate()


class _Waiter(threading.Thread):
    """Runs clock.wait_till_time(target, stop) and records what it returned."""

    def __init__(self, clock, target: int, stop: threading.Event | None = None) -> None:
        super().__init__(daemon=True)
        self.clock = clock
        self.target = target
        self.stop_event = stop or threading.Event()
        self.result: int | None = None
        self.done = threading.Event()

    def run(self) -> None:
        self.result = self.clock.wait_till_time(self.target, self.stop_event)
        self.done.set()


def test_public_names():
    assert lockgate.ManualClock is ManualClock
    assert lockgate.SystemClock is SystemClock


# -- ManualClock ---------------------------------------------------------------------------


def test_manual_clock_moves_only_when_told():
    clock = ManualClock()
    assert clock.get_time_millis() == 0
    time.sleep(0.01)
    assert clock.get_time_millis() == 0
    clock.advance(500)
    assert clock.get_time_millis() == 500
    clock.advance(0)
    assert clock.get_time_millis() == 500
    clock.set_time(10_000)
    assert clock.get_time_millis() == 10_000
    assert ManualClock(1234).get_time_millis() == 1234


def test_manual_clock_wait_returns_at_once_when_target_reached():
    clock = ManualClock(1000)
    stop = threading.Event()
    assert clock.wait_till_time(1000, stop) == 1000
    assert clock.wait_till_time(0, stop) == 1000
    assert not clock.is_waiting()


def test_manual_clock_wait_blocks_until_advanced_past_target():
    clock = ManualClock(0)
    waiter = _Waiter(clock, 1000)
    waiter.start()
    assert _wait_until(clock.is_waiting)
    clock.advance(999)
    # Still short of the target: the waiter keeps waiting.
    assert not waiter.done.wait(0.15)
    assert clock.is_waiting()
    clock.advance(1)
    assert waiter.done.wait(5)
    assert waiter.result == 1000
    assert _wait_until(lambda: not clock.is_waiting())


def test_manual_clock_wait_returns_the_time_reached_when_overshooting():
    clock = ManualClock(0)
    waiter = _Waiter(clock, 100)
    waiter.start()
    assert _wait_until(clock.is_waiting)
    clock.set_time(5_000)
    assert waiter.done.wait(5)
    assert waiter.result == 5_000


def test_manual_clock_wait_returns_when_stop_is_set():
    clock = ManualClock(0)
    waiter = _Waiter(clock, 10_000)
    waiter.start()
    assert _wait_until(clock.is_waiting)
    waiter.stop_event.set()
    assert waiter.done.wait(5)
    assert waiter.result == 0  # the time has not moved
    assert _wait_until(lambda: not clock.is_waiting())


def test_manual_clock_wait_with_stop_already_set_returns_immediately():
    clock = ManualClock(0)
    stop = threading.Event()
    stop.set()
    t0 = time.monotonic()
    assert clock.wait_till_time(10_000, stop) == 0
    assert time.monotonic() - t0 < 1


def test_manual_clock_many_waiters():
    clock = ManualClock(0)
    waiters = [_Waiter(clock, target) for target in (100, 200, 300)]
    for w in waiters:
        w.start()
    assert _wait_until(clock.is_waiting)
    clock.advance(250)
    assert waiters[0].done.wait(5) and waiters[1].done.wait(5)
    assert not waiters[2].done.wait(0.1)
    assert clock.is_waiting()
    clock.advance(50)
    assert waiters[2].done.wait(5)
    assert [w.result for w in waiters] == [250, 250, 300]


# -- SystemClock ---------------------------------------------------------------------------


def test_system_clock_is_wall_clock_millis():
    clock = SystemClock()
    before = int(time.time() * 1000)
    now = clock.get_time_millis()
    after = int(time.time() * 1000)
    assert isinstance(now, int)
    assert before <= now <= after + 1


def test_system_clock_wait_in_the_past_returns_immediately():
    clock = SystemClock()
    stop = threading.Event()
    t0 = time.monotonic()
    now = clock.wait_till_time(clock.get_time_millis() - 10_000, stop)
    assert time.monotonic() - t0 < 0.1
    assert abs(now - clock.get_time_millis()) < 1000


def test_system_clock_waits_until_target():
    clock = SystemClock()
    stop = threading.Event()
    target = clock.get_time_millis() + 120
    t0 = time.monotonic()
    returned = clock.wait_till_time(target, stop)
    elapsed = time.monotonic() - t0
    assert returned >= target
    assert 0.1 <= elapsed < 2.0


def test_system_clock_wait_returns_early_when_stopped():
    clock = SystemClock()
    waiter = _Waiter(clock, clock.get_time_millis() + 60_000)
    waiter.start()
    time.sleep(0.05)
    t0 = time.monotonic()
    waiter.stop_event.set()
    assert waiter.done.wait(2)
    assert time.monotonic() - t0 < 1
    assert waiter.result < waiter.target


@pytest.mark.parametrize("clock", [SystemClock(), ManualClock(5)])
def test_clocks_satisfy_the_clock_protocol(clock):
    assert callable(clock.get_time_millis)
    assert callable(clock.wait_till_time)

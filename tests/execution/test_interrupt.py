"""lockgate.interrupt: a stopped query's blocking waits end (Spark interrupts the thread)."""

from __future__ import annotations

import threading

import pytest

from lockgate import interrupt


class NotYet(Exception):
    """What a client raises when a call's time ran out."""


@pytest.fixture(autouse=True)
def short_slices(monkeypatch):
    # slices of a millisecond: the sliced call's bookkeeping, not its waits, is tested
    monkeypatch.setattr(interrupt, "SLICE_S", 0.001)


def test_a_sliced_call_returns_what_a_slice_returns_and_raises_real_failures():
    stop = threading.Event()
    answers = iter([NotYet(), NotYet(), "metadata"])
    timeouts: list[float] = []

    def call(timeout: float) -> str:
        timeouts.append(timeout)
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    with interrupt.interruptible_by(stop):
        assert interrupt.call_in_slices(call, 30.0, again=lambda e: isinstance(e, NotYet)) == "metadata"
        assert len(timeouts) == 3 and max(timeouts) <= interrupt.SLICE_S
        with pytest.raises(ValueError):
            interrupt.call_in_slices(_raise(ValueError()), 30.0, again=lambda e: isinstance(e, NotYet))


def test_a_stop_ends_a_sliced_call_and_a_sleep():
    stop = threading.Event()
    calls = [0]

    def call(timeout: float) -> str:
        calls[0] += 1
        if calls[0] == 3:
            stop.set()  # stop() while the third slice waits
        raise NotYet()

    with interrupt.interruptible_by(stop):
        with pytest.raises(interrupt.Interrupted):
            interrupt.call_in_slices(call, 3600.0, again=lambda e: isinstance(e, NotYet))
        assert calls[0] == 3
        with pytest.raises(interrupt.Interrupted):
            interrupt.sleep(3600.0)


def test_outside_a_stream_thread_the_call_is_the_plain_call():
    timeouts: list[float] = []

    def call(timeout: float) -> str:
        timeouts.append(timeout)
        return "ok"

    assert interrupt.call_in_slices(call, 30.0, again=lambda e: True) == "ok"  # one call
    assert timeouts == [30.0]
    interrupt.check()  # nothing to interrupt


def _raise(exc: Exception):
    def call(timeout: float) -> str:
        raise exc

    return call


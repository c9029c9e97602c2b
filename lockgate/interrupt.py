"""Stopping a query while its stream thread waits on something outside lockgate.

Spark's ``StreamingQuery.stop()`` interrupts the query's thread, and the blocking calls
of its sources (a Kafka consumer's metadata fetch, a retry's sleep) end at once. A
Python thread cannot be interrupted, so the stream thread declares what stops it
(:func:`interruptible_by`, with the run's stop event), and code that blocks for long
waits through this module: :func:`sleep`, and :func:`call_in_slices` for a client call
that takes a timeout. Both raise :class:`Interrupted` once the query is stopped; the
stream thread treats any exception raised after ``stop()`` as the end of the run.

Outside a stream thread (a test, the CLI) nothing interrupts, and both behave as the
plain call would.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

T = TypeVar("T")

SLICE_S = 0.5
"""How long one slice of a sliced call blocks: the most a stop waits for it."""

_local = threading.local()


class Interrupted(Exception):
    """The query was stopped while its thread waited."""


@contextmanager
def interruptible_by(stop: threading.Event) -> Iterator[None]:
    """Within the block, this thread's waits end when ``stop`` is set."""
    before = getattr(_local, "stop", None)
    _local.stop = stop
    try:
        yield
    finally:
        _local.stop = before


def _stop_event() -> threading.Event | None:
    return getattr(_local, "stop", None)


def check() -> None:
    """Raise :class:`Interrupted` if this thread's query was stopped."""
    stop = _stop_event()
    if stop is not None and stop.is_set():
        raise Interrupted("the query was stopped")


def sleep(seconds: float) -> None:
    """``time.sleep(seconds)``, ended early (with :class:`Interrupted`) by a stop."""
    stop = _stop_event()
    if stop is None:
        time.sleep(seconds)
    elif stop.wait(seconds):
        raise Interrupted("the query was stopped")


def call_in_slices(
    call: Callable[[float], T], timeout: float, *, again: Callable[[BaseException], bool]
) -> T:
    """``call(timeout)``, made as calls of at most :data:`SLICE_S` each until one
    succeeds or ``timeout`` has passed, so that a stop ends the wait within a slice.

    ``again(exc)`` tells a slice that ran out of time (or found no server yet) from a
    real failure, which is raised at once; the last slice's exception is raised when
    the time is up.
    """
    if _stop_event() is None:
        return call(timeout)
    deadline = time.monotonic() + timeout
    while True:
        check()
        started = time.monotonic()
        length = min(SLICE_S, deadline - started)
        try:
            return call(max(0.001, length))
        except Exception as exc:
            if not again(exc) or time.monotonic() >= deadline:
                raise
        # a slice that failed at once (a refused connection) waits out its length
        sleep(max(0.0, started + length - time.monotonic()))

"""Helpers shared by the tests that drive lockgate queries step by step (not a test module).

``tests/`` is on ``sys.path`` (it holds ``conftest.py``), so test modules anywhere under
it import these as ``from streaming_helpers import ...``.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any


def wait_until(predicate, timeout: float = 60.0, interval: float = 0.02, message: str = "") -> None:
    """Poll ``predicate`` until it is true; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    assert predicate(), message or "condition not reached in time"


def batch_progress(query) -> list:
    """Progress of triggers that ran a batch (idle triggers also report progress, as in
    Spark 4, but have no addBatch duration)."""
    return [p for p in query.recentProgress if "addBatch" in p.durationMs]


def last_batch(query):
    batches = batch_progress(query)
    return batches[-1] if batches else None


def end_offset(query, source: int = 0):
    progress = last_batch(query)
    if progress is None:
        return None
    return json.loads(progress.sources[source].endOffset)


def feed(query, stream: Any, data) -> int:
    """Add data to a MemoryStream and wait until the query has committed it."""
    offset = stream.addData(data)

    def done() -> bool:
        if query.exception() is not None:
            raise query.exception()
        current = end_offset(query)
        return current is not None and current >= offset

    wait_until(done)
    return offset


def unique(prefix: str = "q") -> str:
    """A fresh query / table name."""
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


@contextlib.contextmanager
def spark_conf(spark, key: str, value: str) -> Iterator[None]:
    """Set a session conf for the block, restoring the previous value afterwards."""
    previous = spark.conf.get(key, None)
    spark.conf.set(key, value)
    try:
        yield
    finally:
        if previous is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, previous)

"""Kafka clients kept in a Spark Python worker between tasks, and when one is stale.

A new librdkafka client per task costs a connection, a metadata round trip and, for a
transactional producer, ``init_transactions`` (tens of milliseconds each, up to half a
second on a loaded machine), every batch. Spark keeps its JVM clients in a pool per
executor (``CachedKafkaProducer``, ``KafkaDataConsumer``); lockgate keeps its clients per
Python worker (``spark.python.worker.reuse``, Spark's default), in a :class:`ClientPool`.

A kept client must not outlive what it knew: a client that saw the broker go away may be
stuck in a state a fresh one would not be in (a transactional producer whose
coordinator went away, a consumer whose partitions moved). So:

* every client is made with an ``error_cb``: librdkafka reports a lost connection, all
  brokers down, a fatal error or fencing there, and a client that reported anything
  since it was made is **stale** and never used again (:attr:`KeptClient.stale`);
* a client is taken out of the pool for one task's use and given back only when that use
  succeeded; a use that failed leaves it out, to be closed;
* every blocking call on a kept client has a short timeout (:data:`KEPT_TIMEOUT_S`), and
  the callers redo what failed on a kept client once with a fresh one (the sink aborts
  the transaction first, so the redo is still exactly once).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

logger = logging.getLogger(__name__)

KEPT_TIMEOUT_S = 10.0
"""How long a blocking call on a kept client may take before the client is given up and
the work redone with a fresh client (which gets the full timeout). A healthy broker
answers in milliseconds; this only bounds how long a client that is stuck in a way its
error callback did not report can hold a task."""

POOL_CAPACITY = 16
"""Idle clients a pool keeps per Python worker (see :class:`ClientPool`)."""


class KeptClient:
    """Base of what a pool keeps: records the first error librdkafka reports.

    Subclasses make their clients with ``error_cb=self.on_error`` and serve their
    callbacks in :meth:`serve_callbacks` (librdkafka queues errors until ``poll``).
    """

    def __init__(self) -> None:
        self.stale: str | None = None

    def on_error(self, error: Any) -> None:
        """librdkafka's ``error_cb``: any error makes the client stale."""
        if self.stale is None:
            self.stale = str(error)

    def serve_callbacks(self) -> None:
        """Deliver the errors queued since the client was last used (non-blocking)."""

    def close(self) -> None:
        """Let the client go without waiting on a broker (bounded by timeouts)."""


K = TypeVar("K", bound=KeptClient)


class ClientPool(Generic[K]):
    """Idle clients of this Python worker by key (a configuration, a transactional id).

    :meth:`take` hands out an idle client that is not stale, or None; :meth:`give_back`
    returns a client after a successful use. A client is in use by one task at a time.
    At most ``capacity`` idle clients are kept, the least recently given back closed
    first (Spark's ``spark.kafka.consumer.cache.capacity`` bounds its pool likewise): a
    sink after a shuffle of many partitions would otherwise keep a producer, with its
    librdkafka threads and connections, for every partition the worker ever wrote.
    """

    def __init__(self, name: str, capacity: int = POOL_CAPACITY) -> None:
        self._name = name
        self._capacity = capacity
        self._idle: OrderedDict[Hashable, K] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, key: Hashable) -> K | None:
        with self._lock:
            client = self._idle.pop(key, None)
        if client is None:
            return None
        client.serve_callbacks()
        if client.stale is not None:
            # Not the key: a configuration may hold credentials.
            logger.info("A kept Kafka %s is stale (%s): making a new one", self._name, client.stale)
            discard(client)
            return None
        return client

    def give_back(self, key: Hashable, client: K) -> None:
        if client.stale is not None:
            discard(client)
            return
        with self._lock:
            evicted = [c for c in [self._idle.pop(key, None)] if c is not None]
            self._idle[key] = client
            while len(self._idle) > self._capacity:
                evicted.append(self._idle.popitem(last=False)[1])
        for old in evicted:
            discard(old)

    def clear(self) -> None:
        """Close every idle client (tests; a worker's clients otherwise live with it)."""
        with self._lock:
            idle, self._idle = list(self._idle.values()), {}
        for client in idle:
            discard(client)


def discard(client: KeptClient) -> None:
    """Close ``client``, logging (not raising) what its close reports."""
    try:
        client.close()
    except Exception as exc:  # noqa: BLE001 - a client given up on may fail to close
        logger.debug("Closing a discarded Kafka client failed: %s", exc)


def pool_key(config: dict[str, str], *extra: Hashable) -> Hashable:
    return (frozenset(config.items()), *extra)


def using(
    pool: ClientPool[K], key: Hashable, make: Callable[[], K]
) -> tuple[K, bool]:
    """A client for ``key``: a kept one (``fresh=False``) or a new one."""
    kept = pool.take(key)
    if kept is not None:
        return kept, False
    return make(), True


__all__ = ["KEPT_TIMEOUT_S", "ClientPool", "KeptClient", "discard", "pool_key", "using"]

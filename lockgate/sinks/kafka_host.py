"""One process per Spark executor that keeps the Kafka sink's transactional producers.

A transactional producer belongs to its ``transactional.id`` (``<prefix>-<partition>``,
:mod:`lockgate.sinks.kafka`), and initialising a producer of an id fences every other
producer of that id. Spark gives a partition's task to whichever of the executor's Python
workers is idle, so producers kept in the workers fenced each other: with a state step and
a writer in each of two tasks, most batches of a partition landed on a worker whose kept
producer had been fenced, and paid a failed attempt and a new producer's
``init_transactions`` (60 ms; 500 ms when the broker was still completing the previous
transaction, librdkafka's fixed retry). The host keeps one producer per id for all the
workers of its executor, so a partition keeps its producer whichever worker runs it.

A host process of :mod:`lockgate.hosts` (protocol, one per executor, lifetime). A worker
sends ``("write", writer, partition, arrow_ipc)`` (the batch's rows as an Arrow IPC
stream); the host writes them exactly once with its own pools
(``writer.write_exactly_once``) and answers ``("ok", written)`` or ``("error", "<type>:
<message>")``. A host that dies fails the request, which is sent again once to a new host
(writing a partition twice is still exactly once: the marker); its open transaction is
aborted by the next producer of the id, as for a worker that died.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lockgate import hosts

_client = hosts.HostClient("kafka", __name__, "The Kafka sink's producer host")
_producers_made = 0


def producer_made() -> None:
    """Count a transactional producer made by this process (each one an
    ``init_transactions``): what the host reports to its tests."""
    global _producers_made
    _producers_made += 1


def _directory() -> Path:
    return hosts.private_directory("kafka")


def available() -> bool:
    """Whether this platform can run a host (Unix sockets)."""
    return hosts.available()


def request(message: tuple[Any, ...], timeout: float) -> Any:
    """Send ``message`` to this executor's host and return its answer's value; raises
    RuntimeError with the host's message when it failed."""
    status, value = _client.request(message, timeout)
    if status == "error":
        raise RuntimeError(value)
    return value


# -- the host ---------------------------------------------------------------------------


def _handle(message: tuple[Any, ...]) -> Any:
    kind = message[0]
    if kind == "write":
        import pyarrow as pa

        _, writer, partition, ipc = message
        rows = [row for batch in pa.ipc.open_stream(ipc) for row in writer.rows_of(batch)]
        return writer.write_exactly_once(partition, rows)
    if kind == "stats":
        return {"transactional_producers_made": _producers_made}
    raise ValueError(f"unknown request {kind!r}")


def main(argv: list[str] | None = None) -> None:
    hosts.serve(
        _handle,
        lambda exc: f"{type(exc).__name__}: {exc}",
        one_at_a_time=False,
        description="lockgate's Kafka producer host (started by the sink)",
        argv=argv,
    )


if __name__ == "__main__":
    # Run as lockgate.sinks.kafka_host, not as __main__: the sink imports this module by
    # that name, and its counters must be the ones the host reports.
    import importlib

    importlib.import_module("lockgate.sinks.kafka_host").main()

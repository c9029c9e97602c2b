"""State hosts: one process per Spark executor and state task slot that keeps the state.

A stateful operator's state step runs in a Python task, and the state partitions it
serves are cached in the memory of the process that ran it (``store._cache``): the next
batch finds them there and reads no file. But Spark gives a task to whichever of the
executor's Python workers is idle, so with two workers and two state tasks, task ``t``
lands on the other worker about every other batch, whose copy of its partitions is a
batch or more behind; the worker then catches it up from the deltas the other one wrote
(a Python dict update per changed key), and holds a second copy of the state. At 250,000
changed keys per partition and batch, that was ~500 ms per batch, and the memory doubled.

A host keeps the partitions of one task slot instead: the state step of task ``t``
(of any query and operator of this executor) is sent to host ``t``, which runs it as the
worker would have, so the partitions stay in one process whichever worker Spark picks.

A host process of :mod:`lockgate.hosts` (protocol, lifetime), one per executor and task
slot, running one state step at a time. A worker sends ``("run", function, inputs,
context)``: the state function, the partitions and their input batches, and the task's
context (stage, partition, attempt, local properties); the host runs the function under a
:class:`pyspark.TaskContext` with the same values and answers ``("ok", (output batches,
accumulator updates))`` or ``("error", exception)``. A host that dies (killed, out of
memory) is replaced and the step sent again once: a state step may run again, as when
Spark retries its task (it commits the same version with the same content).

The state a host holds is a cache like a worker's: it is dropped for queries that stop
(``store.retain_cached``) and never needed for correctness (every version is in files).
"""

from __future__ import annotations

from typing import Any

from lockgate import hosts

ENABLED_CONF = "spark.lockgate.stateHosts"
"""``auto`` (the default), ``true`` or ``false``: whether the built-in stateful operators
run their state steps in the executor's state hosts (``MicroBatchExecution`` decides per
batch under ``auto``)."""

_client = hosts.HostClient("state", __name__, "lockgate's state host")


def available() -> bool:
    """Whether this platform can run hosts (Unix sockets)."""
    return hosts.available()


def host_stats() -> dict[int, dict[str, Any]]:
    """Slot -> what each running host of this executor holds (its pid and the query ids
    of its cached state partitions); starts none."""
    return {
        int(name.rsplit("-", 1)[1]): value
        for name, value in _client.ask_running(("stats",)).items()
    }


# -- in the task ----------------------------------------------------------------------------


def run_in_host(slot: int, function: Any, inputs: dict[int, list[Any]]) -> list[Any]:
    """Run ``function(partition, batches)`` for each of ``inputs`` in host ``slot`` under
    this task's context; the output batches, with the accumulator updates the function
    made there added to this task's accumulators."""
    from pyspark import TaskContext
    from pyspark.accumulators import _accumulatorRegistry

    ctx = TaskContext.get()
    assert ctx is not None
    context = {
        "stageId": ctx.stageId(),
        "partitionId": ctx.partitionId(),
        "attemptNumber": ctx.attemptNumber(),
        "taskAttemptId": ctx.taskAttemptId(),
        "cpus": ctx.cpus(),
        "localProperties": dict(ctx._localProperties or {}),
    }
    status, value = _client.request(("run", function, inputs, context), slot=slot)
    if status == "error":
        raise value
    out, updates = value
    for aid, update in updates:
        accumulator = _accumulatorRegistry.get(aid)
        if accumulator is not None:
            accumulator.add(update)
    return out  # type: ignore[no-any-return]


# -- the host ---------------------------------------------------------------------------


def _error(exc: Exception) -> Exception:
    """The exception to send back: ``exc`` itself, or a RuntimeError with its type and
    message when it would not reach the task intact."""
    try:
        hosts.loads(hosts.dumps(exc))
        return exc
    except Exception as failed:  # noqa: BLE001 - an exception that does not round-trip
        return RuntimeError(f"{type(exc).__name__}: {exc} (sent from a state host: {failed})")


def _handle(message: tuple[Any, ...]) -> Any:
    kind = message[0]
    if kind == "run":
        return _run(*message[1:])
    if kind == "stats":
        import os

        from lockgate.state.store import cached_queries

        return {"pid": os.getpid(), "cached_queries": sorted(cached_queries())}
    raise ValueError(f"unknown request {kind!r}")


def _run(function: Any, inputs: dict[int, list[Any]], context: dict[str, Any]) -> Any:
    from pyspark import TaskContext
    from pyspark.accumulators import _accumulatorRegistry

    TaskContext._setTaskContext(None)
    TaskContext(**context)
    try:
        out = [
            batch
            for partition, batches in inputs.items()
            for batch in function(partition, iter(batches))
        ]
        updates = [(aid, acc._value) for aid, acc in _accumulatorRegistry.items()]
    finally:
        TaskContext._setTaskContext(None)
        # the function's accumulators were registered when the message was unpickled
        _accumulatorRegistry.clear()
    return out, updates


def main(argv: list[str] | None = None) -> None:
    hosts.serve(
        _handle,
        _error,
        one_at_a_time=True,
        description="lockgate's state host (started by a state task)",
        argv=argv,
    )

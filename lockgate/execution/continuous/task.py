"""The long-running task of a continuous query: read, transform, write, forever.

One task per source partition runs :func:`run_partition` until the coordinator says
stop. It reads rows as they arrive, applies the query's row program, hands each result
row to the sink's writer, and polls the coordinator every
``spark.sql.streaming.continuous.executorPollIntervalMs`` for the current epoch: when
the epoch moved on, the task reports its reader's offset for the epoch that ended,
commits its writer, and starts a writer for the next epoch. No per-record scheduling
by the driver; the only traffic is the poll and the two end-of-epoch messages.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from lockgate.execution.continuous.protocol import CoordinatorClient
from lockgate.plan.row_expressions import Program, build_row_function

RETRY_MESSAGE = "Continuous execution does not support task retry"


class ContinuousTaskRetryException(RuntimeError):
    """A continuous task was restarted by Spark: the query fails instead (Spark's rule)."""

    def __init__(self) -> None:
        super().__init__(RETRY_MESSAGE)


@dataclass(frozen=True)
class TaskSpec:
    """Everything a task needs; shipped to the executors with the job."""

    host: str
    port: int
    secret: str
    start_epoch: int
    poll_interval_ms: int
    partitions: tuple[Any, ...]
    reader_factory: Any
    writer_factory: Any
    program: Program


def run_partition(spec: TaskSpec, index: int) -> dict[str, Any]:
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is not None and context.attemptNumber() > 0:
        raise ContinuousTaskRetryException()
    client = CoordinatorClient(spec.host, spec.port, spec.secret)
    reader = spec.reader_factory(spec.partitions[index], client)
    row_fn = build_row_function(spec.program)
    epoch = spec.start_epoch
    writer = spec.writer_factory(index, epoch)
    poll_s = spec.poll_interval_ms / 1000.0
    next_poll = time.monotonic() + poll_s
    rows_in = 0
    try:
        while True:
            rows = reader.read(max(0.0, next_poll - time.monotonic()))
            if rows:
                rows_in += len(rows)
                write = writer.write
                for row in rows:
                    out = row_fn(row)
                    if out is not None:
                        write(out)
            now = time.monotonic()
            if now < next_poll:
                continue
            next_poll = now + poll_s
            reply, _ = client.call({"type": "GetCurrentEpoch"})
            if reply["stop"]:
                break
            while epoch < int(reply["epoch"]):
                client.call(
                    {
                        "type": "ReportPartitionOffset",
                        "partition": index,
                        "epoch": epoch,
                        "offset": reader.offset(),
                        "rows": rows_in,
                    }
                )
                message, payload = writer.commit()
                client.call(
                    {
                        "type": "CommitPartitionEpoch",
                        "partition": index,
                        "epoch": epoch,
                        "message": message,
                    },
                    payload,
                )
                epoch += 1
                rows_in = 0
                writer = spec.writer_factory(index, epoch)
    except BaseException:
        writer.abort()
        raise
    else:
        writer.abort()
    finally:
        reader.close()
        client.close()
    return {"partition": index, "epoch": epoch}

"""A stateful operator's state step as one Python UDF for the whole query run.

The state step of an operator (``mapInArrow`` over the shuffled batch) needs a few
values that change every batch: the state version to commit and the watermarks. Baked
into the task function, they would make PySpark pickle and register a new UDF every
batch (~25 py4j round trips). Instead the UDF is created once per run, and the batch's
values travel as a Spark *local property* of the stream thread, which every task of the
jobs that thread submits receives (``TaskContext.getLocalProperty``), as Spark passes
the query id to its own tasks.

A task that finds no values for its query and operator refuses to run: its DataFrame
was executed outside the micro-batch that built it (kept and reused after
``foreachBatch`` returned, or run from a thread that does not inherit the stream
thread's properties), and state must never be written for the wrong batch.

A task may serve several state partitions
(:func:`~lockgate.plan.stateful.state_task_count`): on a machine
with fewer cores than state partitions, one Spark task per core runs the state step of
``num_partitions / tasks`` partitions in turn (:func:`run_state_partitions`). Every
Python task has a fixed cost in Spark (~25-50 ms on a 2-core machine: the JVM's Python
runner and the hand-off of each task), which this pays once per core instead of once per
state partition. The state stays partitioned as before: partition ``p`` is served by
task ``p % tasks``, and its files, versions and cache are its own.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from lockgate.state import host
from lockgate.state.arrow_types import unique_column_types

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

    from lockgate.plan.stateful import StatefulContext

_PROPERTY = "lockgate.stateBatch."
_PID = "__lockgate_pid"
TASKS_CONF = "spark.lockgate.stateTasks"
"""How many Spark tasks run a state step at most (default: the cluster's cores,
``defaultParallelism``); set it to ``spark.sql.shuffle.partitions`` or more for one task
per state partition, as Spark's own engine runs."""


def run_state_partitions(
    function: Callable[[int, Any], Any],
    num_partitions: int,
    num_tasks: int,
    batches: Any,
    hosted: tuple[str, int] | None = None,
) -> Any:
    """Run ``function(partition, batches)`` for each state partition this task serves
    (inside a task). With one task per partition the input streams through; otherwise it
    is split by the rows' ``__lockgate_pid`` and every served partition runs, the ones
    without rows too (they still commit their version and evict). Either way a row of a
    partition the task does not serve fails the task: the plan lost the state's
    partitioning, and state must not be written from it.

    ``hosted``: ``(query id, operator id)`` of a state step that may run in the
    executor's state host of this task's slot (:mod:`lockgate.state.host`), which keeps
    the partitions from batch to batch whichever Python worker Spark gives the task; it
    does when the driver says so for this batch (:func:`encode_params`)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    task = ctx.partitionId() if ctx is not None else 0
    served = range(task, num_partitions, num_tasks)
    parts = _by_partition(batches, served)
    if hosted and ctx is not None and _hosted_now(ctx, *hosted) and host.available():
        inputs: dict[int, list[Any]] = {p: [] for p in served}
        for partition, batch in parts:
            inputs[partition].append(batch)
        yield from host.run_in_host(task, function, inputs)
        return
    if num_tasks == num_partitions:
        yield from function(task, (batch for _, batch in parts))
        return
    inputs = {p: [] for p in served}
    for partition, batch in parts:
        inputs[partition].append(batch)
    for partition, batch_list in inputs.items():
        yield from function(partition, iter(batch_list))


def _hosted_now(ctx: Any, checkpoint_id: str, operator_id: int) -> bool:
    raw = ctx.getLocalProperty(property_key(checkpoint_id))
    return bool(raw) and operator_id in json.loads(raw).get(_HOSTED_KEY, ())


def _by_partition(batches: Any, served: range) -> Iterator[tuple[int, Any]]:
    """``(state partition, rows of it)`` for each non-empty batch, by ``__lockgate_pid``."""
    import pyarrow.compute as pc

    for batch in batches:
        if batch.num_rows == 0:
            continue
        pids = batch.column(_PID)
        bounds = pc.min_max(pids).as_py()
        single = bounds["min"] == bounds["max"]
        for pid in [bounds["min"]] if single else pc.unique(pids).to_pylist():
            if pid not in served:
                raise RuntimeError(
                    f"lockgate state partitioning is broken: the task serving state partitions "
                    f"{list(served)} received rows of partition {pid}. Adaptive query "
                    "execution must be off for stateful queries."
                )
            yield pid, batch if single else batch.filter(pc.equal(pids, pid))


def partitioned(
    function: Callable[[int, Any], Any],
    num_partitions: int,
    num_tasks: int,
    hosted: tuple[str, int] | None = None,
) -> Callable[[Any], Any]:
    """``function(partition, batches)`` as a ``mapInArrow`` function over ``num_tasks``
    tasks serving ``num_partitions`` state partitions (in state hosts, see
    :func:`run_state_partitions`)."""
    from functools import partial

    return partial(run_state_partitions, function, num_partitions, num_tasks, hosted=hosted)


def property_key(checkpoint_id: str) -> str:
    """The local property holding one query's per-operator batch values."""
    return _PROPERTY + checkpoint_id


_running: dict[str, int] = {}
"""Query id -> how many of its runs are running (a restart may overlap the run it stops)."""
_running_lock = threading.Lock()


def query_running(query_id: str, running: bool) -> None:
    """Record that a query of this driver started or stopped running (its stream thread).

    Every state task hears which queries run (:func:`encode_params`) and its worker drops
    the cached state partitions of the others (:func:`~lockgate.state.store.retain_cached`),
    as Spark unloads the state stores of a stopped query: a stopped query's state must not
    stay in the Python workers' memory until the cache's partition count pushes it out."""
    with _running_lock:
        count = _running.get(query_id, 0) + (1 if running else -1)
        if count > 0:
            _running[query_id] = count
        else:
            _running.pop(query_id, None)


def encode_params(params: dict[int, dict[str, Any]], hosted: Iterable[int] = ()) -> str:
    """The local property of one batch: each operator's values, the running queries, and
    the operators whose state steps run in the state hosts this batch."""
    encoded: dict[str, Any] = {str(op): values for op, values in params.items()}
    with _running_lock:
        encoded[_RUNNING_KEY] = sorted(_running)
    encoded[_HOSTED_KEY] = sorted(hosted)
    return json.dumps(encoded, sort_keys=True)


_RUNNING_KEY = "runningQueries"
_HOSTED_KEY = "hostedOperators"


def batch_params(checkpoint_id: str, operator_id: int) -> dict[str, Any]:
    """This batch's values for ``operator_id`` (inside a task)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    raw = ctx.getLocalProperty(property_key(checkpoint_id)) if ctx is not None else None
    decoded = json.loads(raw) if raw else {}
    values = decoded.get(str(operator_id))
    running = decoded.get(_RUNNING_KEY)
    if running is not None:
        from lockgate.state.store import retain_cached

        retain_cached({checkpoint_id, *running})
    if values is None:
        raise RuntimeError(
            f"lockgate: the state step of stateful operator {operator_id} ran outside the "
            "micro-batch that planned it. A batch DataFrame of a stateful query can only be "
            "executed while its batch runs (inside foreachBatch, not after it returns), "
            "and from the stream thread or a pyspark.InheritableThread it started."
        )
    return values  # type: ignore[no-any-return]


def with_batch_params(task: Any, checkpoint_id: str) -> Any:
    """A state task (a frozen dataclass with ``version`` and ``operator_id``) with this
    batch's values, when it was built without them (``version == 0``: the UDF serves
    every batch of the run). Inside a task."""
    if task.version:
        return task
    return dataclasses.replace(task, **batch_params(checkpoint_id, task.operator_id))


def map_with_state(
    df: DataFrame,
    ctx: StatefulContext,
    owner: object,
    make_function: Callable[[], Callable[[int, Any], Any]],
    return_schema: StructType,
    operator_id: int,
    params: dict[str, Any],
    num_partitions: int,
    hosted: bool = False,
    unique_names: bool = True,
) -> DataFrame:
    """``df.mapInArrow(function, return_schema)`` with a UDF made once per run.

    ``make_function`` is called on the first batch only: the function it returns takes
    a state partition and its batches, and must read its per-batch values with
    :func:`batch_params`; ``params`` are this batch's. ``df`` is partitioned into
    ``ctx.state_tasks(num_partitions)`` parts (:func:`run_state_partitions`).
    ``hosted``: the function may run in a state host (lockgate's own functions, which
    use nothing of the Python worker but the task's context), when ``ctx.state_hosts``
    and the operator runs in no more tasks than there are cores; it does in the batches
    the driver chooses (``MicroBatchExecution``, by the rows the step updates).

    A struct with duplicated field names, which Arrow refuses, crosses into the step
    under unique names (:func:`~lockgate.state.arrow_types.unique_field_names`, as the
    function's state types have them) and comes back under Spark's. ``unique_names``
    False: not for a step whose rows reach the user's function (``applyInPandasWithState``,
    ``transformWithState``), where Spark fails such a struct with
    ``DUPLICATED_FIELD_NAME_IN_ARROW_STRUCT`` and so does this step.
    """
    from lockgate.jvm import arrow_map_call, cast_columns, map_in_arrow

    ctx.batch_params[operator_id] = params
    shape = repr(ctx.shape)

    tasks = ctx.state_tasks(num_partitions)
    # at most one host per core: with more tasks than cores (one task per partition), the
    # workers keep the state as before
    may_host = hosted and ctx.state_hosts and tasks <= (ctx.max_state_tasks or 0)

    columns = tuple(df.columns)
    arrow_schema = unique_column_types(return_schema) if unique_names else return_schema

    def make_call() -> Any:
        host = (ctx.checkpoint_id, operator_id) if may_host else None
        function = partitioned(make_function(), num_partitions, tasks, host)
        return arrow_map_call(function, arrow_schema, columns)

    call = ctx.cache.get(owner, f"state_udf_call/{shape}/{columns}", make_call)
    if unique_names:  # (df's schema is fetched already, for its columns)
        df = cast_columns(df, unique_column_types(df.schema))
    out = map_in_arrow(df, call)
    # the step's output has arrow_schema's types: cast back only where it renamed a field
    return out if arrow_schema is return_schema else cast_columns(out, return_schema)

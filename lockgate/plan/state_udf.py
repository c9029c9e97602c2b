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
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

    from lockgate.plan.aggregate import StatefulContext

_PROPERTY = "lockgate.stateBatch."


def property_key(checkpoint_id: str) -> str:
    """The local property holding one query's per-operator batch values."""
    return _PROPERTY + checkpoint_id


def encode_params(params: dict[int, dict[str, Any]]) -> str:
    return json.dumps({str(op): values for op, values in params.items()}, sort_keys=True)


def batch_params(checkpoint_id: str, operator_id: int) -> dict[str, Any]:
    """This batch's values for ``operator_id`` (inside a task)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    raw = ctx.getLocalProperty(property_key(checkpoint_id)) if ctx is not None else None
    values = json.loads(raw).get(str(operator_id)) if raw else None
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
    make_function: Callable[[], Callable[[Any], Any]],
    return_schema: StructType,
    operator_id: int,
    params: dict[str, Any],
) -> DataFrame:
    """``df.mapInArrow(function, return_schema)`` with a UDF made once per run.

    ``make_function`` is called on the first batch only: the function it returns must
    read its per-batch values with :func:`batch_params`; ``params`` are this batch's.
    """
    from pyspark.sql import DataFrame as PySparkDataFrame
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.functions import pandas_udf
    from pyspark.util import PythonEvalType

    ctx.batch_params[operator_id] = params
    shape = ",".join(str(s) for s in sorted(ctx.shape))  # type: ignore[type-var]

    def make_udf() -> Any:
        return pandas_udf(  # type: ignore[call-overload]
            make_function(), returnType=return_schema, functionType=PythonEvalType.SQL_MAP_ARROW_ITER_UDF
        )

    udf = ctx.cache.get(owner, f"state_udf/{shape}", make_udf)
    columns = tuple(df.columns)

    def udf_column() -> Any:
        return udf(*[F.col("`" + c.replace("`", "``") + "`") for c in columns])

    column = ctx.cache.get(owner, f"state_udf_call/{shape}/{columns}", udf_column)
    jdf = df._jdf.mapInArrow(column._jc, False, None)
    return PySparkDataFrame(jdf, df.sparkSession)

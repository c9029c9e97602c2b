"""Streaming ``limit(n)`` (Spark's StreamingGlobalLimitExec): at most n rows over the stream.

State is one counter in a single state partition; each batch passes rows on until the
counter reaches n. Only in Append mode, as in Spark; in Complete mode Spark plans a limit
as a plain limit of each batch's rows (:func:`limits_per_batch`), and refuses it in
Update mode.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial as bind
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField, StructType

from lockgate.compat import override
from lockgate.jvm import cast_columns
from lockgate.plan.aggregate import Aggregate
from lockgate.plan.nodes import PlanNode, Transform, with_children
from lockgate.plan.stateful import (
    OutputColumn,
    StatefulContext,
    StatefulOperator,
    stateful_operators,
)
from lockgate.state.arrow_types import schema_to_arrow, unique_column_types
from lockgate.state.schema import OperatorStateSchema
from lockgate.state.store import StateStore, StateStoreConf

if TYPE_CHECKING:
    from pyspark.sql import DataFrame



@dataclass(frozen=True, eq=False)
class StreamingLimit(StatefulOperator):
    child: PlanNode
    limit: int
    evicts_by_watermark = False

    @property
    @override
    def operator_name(self) -> str:
        return "globalLimit"

    @override
    def qualified_outputs(
        self, outputs: Callable[[PlanNode], list[OutputColumn] | None]
    ) -> list[OutputColumn] | None:
        """Rows pass through as they are, qualifiers and event time too."""
        return outputs(self.child)

    @override
    def build_state(
        self, inputs: list[DataFrame], ctx: StatefulContext, operator_id: int, batch_id: int
    ) -> tuple[DataFrame, OperatorStateSchema]:
        """A state step built each batch (its version baked in): not reused."""
        return build_limit(self, inputs[0], ctx, operator_id, batch_id)

    @property
    def children(self) -> tuple[PlanNode, ...]:
        return (self.child,)

    def describe(self) -> str:
        return f"StreamingGlobalLimit {self.limit}"


@dataclass(frozen=True)
class LimitTask:
    store: Any
    version: int
    limit: int
    out_schema: pa.Schema
    accumulator: Any
    operator_id: int


def run_limit_task(task: LimitTask, batches: Any) -> Any:
    store = StateStore(task.store, 0, task.version - 1)
    current = store.get(())
    count = int(current[0]) if current is not None else 0
    start = count
    for batch in batches:
        if count >= task.limit or batch.num_rows == 0:
            continue
        take = min(batch.num_rows, task.limit - count)
        count += take
        sliced = batch.select(task.out_schema.names).slice(0, take)
        yield pa.RecordBatch.from_arrays(sliced.columns, schema=task.out_schema)
    # As Spark: the count is written only when rows passed (no state row before the first)
    if count != start:
        store.put((), [count])
    store.commit()
    op = task.operator_id
    task.accumulator.add(
        {
            f"{op}.numRowsTotal": len(store),
            f"{op}.numRowsUpdated": int(count != start),
            f"{op}.commitTimeMs": int(store.metrics.commit_ms),
            f"{op}.memoryUsedBytes": store.memory_bytes(),
            f"{op}.numStateStoreInstances": 1,
            f"{op}.loadedFromCache": int(store.metrics.loaded_from_cache),
            f"{op}.loadedFromFiles": int(not store.metrics.loaded_from_cache),
        }
    )


def build_limit(
    node: StreamingLimit, child: DataFrame, ctx: StatefulContext, operator_id: int, batch_id: int
) -> tuple[DataFrame, Any]:
    tz = ctx.session_timezone
    key_schema = pa.schema([])
    value_schema = schema_to_arrow(StructType([StructField("count", LongType(), True)]), tz)
    store = StateStoreConf(
        root=ctx.state_root,
        operator_id=operator_id,
        num_partitions=1,
        key_schema=key_schema,
        value_schema=value_schema,
        snapshot_interval=ctx.snapshot_interval,
        background_snapshot_min_rows=ctx.background_snapshot_min_rows,
        min_versions_to_retain=ctx.min_versions_to_retain,
        checkpoint_id=ctx.checkpoint_id,
    )
    task = LimitTask(
        store=store,
        version=batch_id + 1,
        limit=node.limit,
        out_schema=schema_to_arrow(child.schema, tz),
        accumulator=ctx.accumulator,
        operator_id=operator_id,
    )
    # A local limit per partition first, then one task holds the global count. Over
    # another stateful operator's output there is no local limit: it would stop reading
    # that operator's task before its state is committed (Spark's StreamingLocalLimitExec
    # drains its input for the same reason).
    local = child if stateful_operators(node.child) else child.limit(node.limit)
    staged = local.repartition(1).withColumn("__lockgate_pid", F.lit(0))
    arrow_schema = unique_column_types(child.schema)
    if arrow_schema is child.schema:
        result = staged.mapInArrow(bind(run_limit_task, task), child.schema)
    else:  # a struct with duplicated field names crosses Arrow under unique names (map_with_state)
        unique = cast_columns(staged, unique_column_types(staged.schema))
        result = cast_columns(unique.mapInArrow(bind(run_limit_task, task), arrow_schema), child.schema)
    return result, OperatorStateSchema(
        operator_id, node.operator_name, key_schema, value_schema, 1, metadata_partitions=ctx.num_partitions
    )


def limits_per_batch(plan: PlanNode) -> PlanNode:
    """Complete mode: ``plan`` with every limit over a streaming aggregation made a plain
    ``limit`` of each batch's rows, as Spark's planner makes it (its stateful
    StreamingGlobalLimitExec serves what appends only: Append mode, or a limit with no
    aggregation below it, ``limit(5).groupBy().count()``). So ``orderBy(...).limit(n)``
    over an aggregation is the top n rows of each batch's whole result."""
    if isinstance(plan, StreamingLimit) and any(isinstance(op, Aggregate) for op in stateful_operators(plan.child)):
        return Transform(limits_per_batch(plan.child), "limit", (plan.limit,))
    return with_children(plan, limits_per_batch)

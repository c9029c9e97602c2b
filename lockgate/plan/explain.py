"""``explain()`` text for streaming queries.

Spark shows a streaming aggregation as
``StateStoreSave <- Aggregate(merge) <- StateStoreRestore <- Exchange <- Aggregate(partial)``.
lockgate runs restore, merge and save in one task per state partition (a ``MapInArrow``
step in Spark's physical plan), so the explain text shows both: lockgate's stateful
operators with their state info, then the Spark physical plan that runs the batch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lockgate.plan.nodes import PlanNode
from lockgate.plan.stateful import StatefulOperator, stateful_operators

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from lockgate.plan.incremental import IncrementalExecution


def stateful_tree(
    plan: PlanNode,
    *,
    operator_ids: dict[int, int],
    state_root: str,
    version: int | None,
    num_partitions: int,
    output_mode: str,
    watermark_ms: int | None,
    operator_watermarks: dict[int, tuple[int, int]] | None = None,
) -> str:
    lines: list[str] = []

    def eviction_watermark(op_id: int) -> int | None:
        """The operator's own eviction watermark (Spark's watermark propagation)."""
        if watermark_ms is not None and operator_watermarks and op_id in operator_watermarks:
            return operator_watermarks[op_id][0]
        return watermark_ms

    def info(op_id: int) -> str:
        ver = "?" if version is None else str(version)
        return (
            f"state info [ checkpoint = {state_root}, opId = {op_id}, ver = {ver}, "
            f"numPartitions = {num_partitions}]"
        )

    def visit(node: PlanNode, depth: int) -> None:
        if isinstance(node, StatefulOperator):
            op_id = operator_ids.get(id(node), 0)
            wm = None if watermark_ms is None else eviction_watermark(op_id)
            steps = node.explain_steps(info(op_id), output_mode, wm, num_partitions)
        else:
            steps = [node.describe()]
        for i, step in enumerate(steps):
            lines.append(("   " * (depth + i) + "+- " if depth + i else "") + step)
        for child in node.children:
            visit(child, depth + len(steps))

    visit(plan, 0)
    return "\n".join(lines)


def physical_plan(frame: DataFrame) -> str:
    """Spark's executed (physical) plan of ``frame``, as ``explain()`` prints it."""
    return str(frame._jdf.queryExecution().executedPlan().toString()).rstrip()


def explain_definition(plan: PlanNode, template: DataFrame, num_partitions: int, extended: bool) -> str:
    """``explain()`` of a streaming DataFrame before it runs: lockgate's plan (extended),
    its stateful operators without state info, and Spark's physical plan of
    ``template`` (sources as empty relations)."""
    lines = []
    if extended:
        lines += ["== Parsed Logical Plan (lockgate) ==", plan.tree_string(), ""]
    operators = stateful_operators(plan)
    if operators:
        lines += [
            "== Stateful Operators (lockgate; state info is known once the query runs) ==",
            stateful_tree(
                plan,
                operator_ids={id(op): i for i, op in enumerate(operators)},
                state_root="<checkpoint>/state",
                version=None,
                num_partitions=num_partitions,
                output_mode="append",
                watermark_ms=None,
            ),
            "",
        ]
    lines += ["== Physical Plan (per batch, sources as empty relations) ==", physical_plan(template)]
    return "\n".join(lines)


def explain_execution(execution: IncrementalExecution, extended: bool) -> str:
    ctx = execution.stateful
    parts: list[str] = []
    if extended:
        parts += ["== Logical Plan (lockgate) ==", execution.plan.tree_string(), ""]
    if ctx is not None:
        parts += [
            "== Stateful Operators (lockgate) ==",
            stateful_tree(
                execution.plan,
                operator_ids=execution.operator_ids,
                state_root=ctx.state_root,
                version=execution.batch_id + 1,
                num_partitions=ctx.num_partitions,
                output_mode=ctx.output_mode,
                watermark_ms=ctx.batch_watermark_ms,
                operator_watermarks=ctx.operator_watermarks,
            ),
            "",
        ]
    parts.append(f"== Physical Plan (batch {execution.batch_id}) ==")
    parts.append(physical_plan(execution.build()))
    return "\n".join(parts)

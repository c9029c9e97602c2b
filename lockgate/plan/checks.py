"""Unsupported-operation checks at ``start()`` (Spark's UnsupportedOperationChecker).

Messages are Spark's, so users can search them.
"""

from __future__ import annotations

from lockgate.errors import AnalysisError, NotSupportedYetError
from lockgate.plan.aggregate import Aggregate
from lockgate.plan.dedup import Deduplicate
from lockgate.plan.join import StreamJoin, check_stream_join
from lockgate.plan.limit import StreamingLimit
from lockgate.plan.nodes import PlanNode, Transform
from lockgate.plan.session_window import SessionWindowAggregate

_SORTS = ("orderBy", "sort")


StatefulNode = Aggregate | Deduplicate | StreamingLimit | StreamJoin


def stateful_operators(plan: PlanNode) -> list[StatefulNode]:
    """Stateful operators in operator-id order (bottom-up, as Spark numbers them)."""
    found: list[StatefulNode] = []
    seen: set[int] = set()

    def visit(node: PlanNode) -> None:
        for child in node.children:
            visit(child)
        if isinstance(node, (Aggregate, Deduplicate, StreamingLimit, StreamJoin)) and id(node) not in seen:
            seen.add(id(node))
            found.append(node)

    visit(plan)
    return found


def check_for_streaming(plan: PlanNode, output_mode: str) -> None:
    operators = stateful_operators(plan)
    aggregates = [op for op in operators if isinstance(op, Aggregate)]
    if len(operators) > 1:
        raise NotSupportedYetError(
            "More than one stateful operator (aggregation, deduplication) in one query",
            "Chain them through a second query reading the first one's output.",
        )
    for op in operators:
        if isinstance(op, StreamJoin):
            check_stream_join(op, output_mode)
    limits = [op for op in operators if isinstance(op, StreamingLimit)]
    if limits and output_mode in ("update", "complete"):
        raise AnalysisError(
            f"Limits are not supported on streaming DataFrames/Datasets in "
            f"{output_mode.capitalize()} output mode"
        )
    if output_mode == "complete" and not aggregates:
        raise AnalysisError(
            "[STREAMING_OUTPUT_MODE.UNSUPPORTED_OPERATION] Invalid streaming output mode: "
            "complete. This output mode is not supported for no streaming aggregations on "
            "streaming DataFrames/DataSets."
        )
    if output_mode == "append" and any(a.event_time_key is None for a in aggregates):
        raise AnalysisError(
            "[STREAMING_OUTPUT_MODE.UNSUPPORTED_OPERATION] Invalid streaming output mode: "
            "append. This output mode is not supported for streaming aggregations without "
            "watermark on streaming DataFrames/DataSets."
        )
    _check_session_windows(aggregates, output_mode)
    _check_sorts(plan, output_mode, under_aggregate=False)


def _check_session_windows(aggregates: list[Aggregate], output_mode: str) -> None:
    sessions = [a for a in aggregates if isinstance(a, SessionWindowAggregate)]
    if sessions and output_mode == "update":
        raise AnalysisError(
            "[STREAMING_OUTPUT_MODE.UNSUPPORTED_OPERATION] Invalid streaming output mode: "
            "update. This output mode is not supported for session window streaming "
            "aggregations on streaming DataFrames/DataSets."
        )
    if any(not s.keys_without_session for s in sessions):
        # Spark fails the query's first batch with this message.
        raise AnalysisError(
            "Global aggregation with session window in streaming query is not supported."
        )


def _check_sorts(node: PlanNode, output_mode: str, under_aggregate: bool) -> None:
    if isinstance(node, Transform) and node.method in _SORTS:
        has_agg = any(isinstance(n, Aggregate) for n in node.child.walk())
        if not (has_agg and output_mode == "complete"):
            raise AnalysisError(
                "Sorting is not supported on streaming DataFrames/Datasets, unless it is on "
                "aggregated DataFrame/Dataset in Complete output mode"
            )
    for child in node.children:
        _check_sorts(child, output_mode, under_aggregate)

"""Unsupported-operation checks at ``start()`` (Spark's UnsupportedOperationChecker).

Messages are Spark's, so users can search them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lockgate.errors import AnalysisError, NotSupportedYetError
from lockgate.jvm import jvm_name, seq
from lockgate.plan.aggregate import Aggregate
from lockgate.plan.flat_map_groups import (
    check_apply_in_pandas_with_state,
    check_several_apply_in_pandas_with_state,
    refuse_after_apply_in_pandas_with_state,
)
from lockgate.plan.join import StreamJoin, check_stream_join
from lockgate.plan.limit import StreamingLimit
from lockgate.plan.nodes import EventTimeWatermark, PlanNode, Transform
from lockgate.plan.session_window import SessionWindowAggregate
from lockgate.plan.stateful import StatefulOperator, stateful_operators
from lockgate.plan.transform_with_state import refuse_after_processing_time_transform_with_state

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

_SORTS = ("orderBy", "sort", "sortWithinPartitions")


CORRECTNESS_ERROR = (
    "Detected pattern of possible 'correctness' issue due to global watermark. The query "
    "contains stateful operation which can emit rows older than the current watermark plus "
    "allowed late record delay, which are \"late rows\" in downstream stateful operations and "
    "these rows can be discarded. Please refer the programming guide doc for more details. If "
    "you understand the possible risk of correctness issue and still need to run the query, "
    "you can disable this check by setting the config "
    "`spark.sql.streaming.statefulOperator.checkCorrectness.enabled` to false."
)
REDEFINED_WATERMARK_ERROR = (
    "Redefining watermark is disallowed. You can set the config "
    "'spark.sql.streaming.statefulOperator.allowMultiple' to 'false' to restore the previous "
    "behavior. Note that multiple stateful operators will be disallowed."
)


def check_for_streaming(plan: PlanNode, output_mode: str, check_correctness: bool = True) -> None:
    check_several_apply_in_pandas_with_state(plan)  # before the output-mode checks, as Spark
    operators = stateful_operators(plan)
    aggregates = [op for op in operators if isinstance(op, Aggregate)]
    limits = [op for op in operators if isinstance(op, StreamingLimit)]
    if limits and output_mode == "update":
        raise AnalysisError("Limits are not supported on streaming DataFrames/Datasets in Update output mode")
    if output_mode == "complete" and not aggregates:
        raise AnalysisError(
            "[STREAMING_OUTPUT_MODE.UNSUPPORTED_OPERATION] Invalid streaming output mode: "
            "complete. This output mode is not supported for no streaming aggregations on "
            "streaming DataFrames/DataSets."
        )
    # after the output mode's own check, as Spark's UnsupportedOperationChecker
    for op in operators:
        if isinstance(op, StreamJoin):
            check_stream_join(op, output_mode)
    # Spark checks the first (outermost) aggregation's analysed grouping expressions
    if output_mode == "append" and (
        any(a.event_time_key is None for a in aggregates) or (aggregates and not aggregates[0].event_time_key_is_attribute)
    ):
        raise AnalysisError(
            "[STREAMING_OUTPUT_MODE.UNSUPPORTED_OPERATION] Invalid streaming output mode: "
            "append. This output mode is not supported for streaming aggregations without "
            "watermark on streaming DataFrames/DataSets."
        )
    check_apply_in_pandas_with_state(plan, output_mode)  # after the output-mode checks, as Spark
    _check_session_windows(aggregates, output_mode)
    _check_sorts(plan, output_mode, under_aggregate=False)
    if len(operators) > 1:  # last, as Spark's checkStreamingQueryGlobalWatermarkLimit
        _check_chain(operators, output_mode, check_correctness)
    if operators:
        _check_redefined_watermark(plan)
    refuse_after_apply_in_pandas_with_state(plan)
    refuse_after_processing_time_transform_with_state(plan)


def _stateful_below(node: PlanNode) -> list[StatefulOperator]:
    return [n for child in node.children for n in stateful_operators(child)]


def _check_chain(operators: list[StatefulOperator], output_mode: str, check_correctness: bool) -> None:
    """Several stateful operators in one query (Spark's
    ``spark.sql.streaming.statefulOperator.allowMultiple``): Spark's global-watermark
    correctness check. With the check turned off Spark runs such a chain, dropping the
    rows it warns of as late; lockgate does not run it."""
    for op in operators:
        if op.counts_for_watermark_correctness and any(
            below.may_emit_late_rows(output_mode) for below in _stateful_below(op)
        ):
            if check_correctness:
                raise AnalysisError(CORRECTNESS_ERROR)
            raise NotSupportedYetError(
                f"A stateful operator after an aggregation in {output_mode.capitalize()} mode "
                "(spark.sql.streaming.statefulOperator.checkCorrectness.enabled=false)",
                "Run the chain in Append mode, or write the aggregation out and read it "
                "back in a second query.",
            )


def _check_redefined_watermark(plan: PlanNode) -> None:
    """Spark's watermark propagation refuses a ``withWatermark`` above another one."""

    def visit(node: PlanNode, above_watermark: bool) -> None:
        here = isinstance(node, EventTimeWatermark)
        if here and above_watermark:
            raise AnalysisError(REDEFINED_WATERMARK_ERROR)
        for child in node.children:
            visit(child, above_watermark or here)

    visit(plan, False)


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


def check_window_functions(template: DataFrame) -> None:
    """Spark refuses window functions (``OVER``) on a stream at start, the time-window
    ``window()`` aside (it is no ``Window`` node): NON_TIME_WINDOW_NOT_SUPPORTED_IN_STREAMING,
    with Spark's own message. ``template`` is the query's batch-shaped plan."""
    spark = template.sparkSession
    jvm = spark.sparkContext._jvm
    plan = template._jdf.queryExecution().analyzed()
    window = jvm_name(jvm, "org.apache.spark.sql.catalyst.trees.TreePattern").WINDOW()
    if not plan.containsPattern(window):  # one call; the walk below only when there is one
        return
    found = _first_window(plan)
    if found is None:
        return
    functions: list[str] = []
    columns: list[str] = []
    specs: list[str] = []
    for named in seq(found.windowExpressions()):
        for expression in _window_expressions(named):
            functions.append(expression.windowFunction().toString())
            columns.append(named.toAttribute().sql())
            specs.append(expression.windowSpec().sql())
    to_seq = jvm.PythonUtils.toSeq
    error = jvm_name(jvm, "org.apache.spark.sql.errors.QueryExecutionErrors").nonTimeWindowNotSupportedInStreamingError(
        to_seq(functions), to_seq(columns), to_seq(specs), found.origin()
    )
    raise AnalysisError(error.getMessage())


def check_unsupported_expressions(template: DataFrame) -> None:
    """Spark refuses ``monotonically_increasing_id()`` anywhere in a streaming query at
    start (``UnsupportedOperationChecker.checkUnsupportedExpressions``): its ids depend on
    the batch's partitions and restart at every batch. ``template`` is the query's
    batch-shaped plan; it is walked only when its text names the function."""
    plan = template._jdf.queryExecution().analyzed()
    if "monotonically_increasing_id" not in plan.toString():
        return
    found: list[str] = []

    def visit_expression(expression: Any) -> None:
        if expression.getClass().getSimpleName() == "MonotonicallyIncreasingID":
            if expression.sql() not in found:
                found.append(expression.sql())
            return
        for child in seq(expression.children()):
            visit_expression(child)

    def visit(node: Any) -> None:
        for child in seq(node.children()):
            visit(child)
        for expression in seq(node.expressions()):
            visit_expression(expression)

    visit(plan)
    if found:
        raise AnalysisError(
            f"Expression(s): {', '.join(found)} is not supported with streaming DataFrames/Datasets"
        )


def _first_window(plan: Any) -> Any:
    """The lowest ``Window`` node of ``plan`` (Spark checks bottom up), or None."""
    for child in seq(plan.children()):
        found = _first_window(child)
        if found is not None:
            return found
    return plan if plan.getClass().getSimpleName() == "Window" else None


def _window_expressions(expression: Any) -> list[Any]:
    if expression.getClass().getSimpleName() == "WindowExpression":
        return [expression]
    return [w for child in seq(expression.children()) for w in _window_expressions(child)]


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

"""The global event-time watermark across ``withWatermark`` operators
(:class:`WatermarkTracker`), and its propagation to each stateful operator
(:func:`propagate_watermark`, Spark's ``PropagateWatermarkSimulator``)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from lockgate.errors import OptionError
from lockgate.plan.nodes import EventTimeWatermark
from lockgate.plan.stateful import StatefulOperator

if TYPE_CHECKING:
    from lockgate.plan.nodes import PlanNode

logger = logging.getLogger(__name__)

MIN_POLICY = "min"
MAX_POLICY = "max"


class WatermarkTracker:
    """Holds each operator's max event time and the global watermark.

    The global watermark is the min (default) or max over operators of
    ``max event time - delay``; it only rises. Batch N runs with the watermark
    computed through batch N-1.
    """

    def __init__(self, delays_ms: Sequence[int], policy: str = MIN_POLICY) -> None:
        policy = policy.lower()
        if policy not in (MIN_POLICY, MAX_POLICY):
            raise OptionError(
                f"Invalid value {policy!r} for spark.sql.streaming.multipleWatermarkPolicy: "
                "expected 'min' or 'max'.",
                option="spark.sql.streaming.multipleWatermarkPolicy",
            )
        self.policy = policy
        self.delays_ms = list(delays_ms)
        self._operator_watermarks: list[int | None] = [None] * len(self.delays_ms)
        self.current_watermark_ms = 0

    def set_watermark(self, value_ms: int) -> None:
        self.current_watermark_ms = value_ms

    def update(self, max_event_time_ms: Sequence[int | None]) -> None:
        """Fold in one batch's max event time per operator (None: no rows seen)."""
        for i, max_ms in enumerate(max_event_time_ms):
            if max_ms is None:
                continue
            candidate = max_ms - self.delays_ms[i]
            previous = self._operator_watermarks[i]
            if previous is None or candidate > previous:
                self._operator_watermarks[i] = candidate
        known = [w for w in self._operator_watermarks if w is not None]
        if not known:
            return
        if self.policy == MIN_POLICY:
            # An operator that has seen no data yet holds the min watermark back,
            # as Spark's MinWatermark policy does.
            if len(known) < len(self._operator_watermarks):
                return
            new = min(known)
        else:
            new = max(known)
        if new > self.current_watermark_ms:
            logger.info("Updating event-time watermark from %s to %s ms", self.current_watermark_ms, new)
            self.current_watermark_ms = new


def propagate_watermark(plan: PlanNode, global_ms: int) -> dict[int, int]:
    """Each stateful operator's input watermark (keyed by ``id(node)``) for the global
    watermark ``global_ms``, as Spark's ``PropagateWatermarkSimulator`` computes it (on by
    default: ``spark.sql.streaming.statefulOperator.allowMultiple``).

    Bottom-up: a ``withWatermark`` outputs the global watermark; a stateless node the
    minimum of its children's outputs (children without event time are left out); a
    stateful operator's input is that minimum (0 when there is none, never negative),
    and its output is ``produceOutputWatermark(input)``: the input itself for
    aggregations, deduplications and limits, and for a stream-stream join the minimum of
    the input and both sides' state watermarks (a range condition's bound, so an
    operator after such a join sees a delayed watermark). A global watermark of 0 is not
    propagated: every operator gets 0. The eviction watermark of a batch is the
    propagation of its own global watermark, the late-row watermark that of the previous
    batch's.
    """
    inputs: dict[int, int] = {}
    outputs: dict[int, int | None] = {}

    def visit(node: PlanNode) -> int | None:
        key = id(node)
        if key in outputs:
            return outputs[key]
        known = [w for w in (visit(child) for child in node.children) if w is not None]
        incoming = min(known) if known else None
        result: int | None
        if isinstance(node, EventTimeWatermark):
            result = global_ms
        elif isinstance(node, StatefulOperator):
            inputs[key] = 0 if global_ms == 0 else max(incoming or 0, 0)
            result = None if incoming is None else node.output_watermark_ms(incoming)
        else:
            result = incoming
        outputs[key] = result
        return result

    visit(plan)
    return inputs

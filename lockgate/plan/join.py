"""Stream-stream joins (Spark's StreamingSymmetricHashJoinExec).

Not implemented yet: :func:`make_stream_join` refuses clearly. The interface below is
what the API, the checks and the planner call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lockgate.errors import NotSupportedYetError
from lockgate.plan.nodes import PlanNode

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from lockgate.api.dataframe import StreamingDataFrame
    from lockgate.plan.aggregate import StatefulContext


@dataclass(frozen=True, eq=False)
class StreamJoin(PlanNode):
    left: PlanNode
    right: PlanNode
    join_type: str
    operator_name = "symmetricHashJoin"

    @property
    def children(self) -> tuple[PlanNode, ...]:
        return (self.left, self.right)

    @property
    def evicts_by_watermark(self) -> bool:
        return False


def make_stream_join(
    left: StreamingDataFrame, right: StreamingDataFrame, on: Any, how: str | None
) -> tuple[StreamJoin, DataFrame]:
    raise NotSupportedYetError(
        "Stream-stream join",
        "It needs lockgate's symmetric hash join state; join a stream with a static "
        "DataFrame, or aggregate each stream first in separate queries.",
    )


def check_stream_join(node: StreamJoin, output_mode: str) -> None:
    """Start-time checks (Spark's UnsupportedOperationChecker rules for joins)."""


def build_stream_join(
    node: StreamJoin,
    left: DataFrame,
    right: DataFrame,
    ctx: StatefulContext,
    operator_id: int,
    batch_id: int,
) -> tuple[DataFrame, Any]:
    raise NotSupportedYetError("Stream-stream join")

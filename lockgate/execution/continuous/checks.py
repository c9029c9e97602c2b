"""What ``trigger(continuous=...)`` accepts, refused with Spark's own messages.

Spark's UnsupportedOperationChecker.checkForContinuous allows only map-like operators
(Project, Filter) over one source: any other plan node fails with "Continuous
processing does not support <node> operations.", and current-time functions with
"Continuous processing does not support current time operations.". The checks walk
Spark's analyzed plan of the query's template, bottom-up, as Spark does.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from lockgate.errors import AnalysisError
from lockgate.plan.nodes import EventTimeWatermark

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from lockgate.plan.nodes import PlanNode

_CURRENT_TIME = re.compile(r"\b(current_timestamp|now|current_date|localtimestamp|curdate)\(")
_ALLOWED = {"Project", "Filter", "SubqueryAlias", "LogicalRDD", "LocalRelation"}


def _node_name(jnode: Any) -> str:
    name = str(jnode.getClass().getSimpleName())
    return name.removesuffix("Exec")


def _bottom_up(jnode: Any) -> list[Any]:
    out: list[Any] = []
    children = jnode.children()
    for i in range(children.size()):
        out.extend(_bottom_up(children.apply(i)))
    out.append(jnode)
    return out


def check_for_continuous(plan: PlanNode, template: DataFrame) -> Any:
    """Raise Spark's error for an operation continuous processing cannot run in the
    query ``plan`` (whose template is ``template``); return the analyzed plan (a JVM
    object) the expressions are compiled from."""
    for node in plan.walk():
        if isinstance(node, EventTimeWatermark):
            raise AnalysisError(
                "Continuous processing does not support EventTimeWatermark operations."
            )
    analyzed = template._jdf.queryExecution().analyzed()
    for jnode in _bottom_up(analyzed):
        name = _node_name(jnode)
        if name not in _ALLOWED:
            raise AnalysisError(f"Continuous processing does not support {name} operations.")
    if _CURRENT_TIME.search(str(analyzed.toString())):
        raise AnalysisError("Continuous processing does not support current time operations.")
    return analyzed

"""The columns of a stream-stream join's sides that nothing reads.

Spark's optimizer prunes them below the join (``ColumnPruning``): a side column that no
operator above the join reads, nor the sink, nor the join's condition, is never
computed, nor buffered in the join's state. So an expression that would fail (an ANSI
overflow, a bad cast) in such a column fails nothing on Spark. lockgate runs the same
rule over the query's analysed template when the query starts and marks those columns
on its :class:`~lockgate.plan.join.planner.StreamJoin`; the join's tagging projection
puts a null in their place, so Spark's optimizer prunes their computation from the
side's batch, and the state keeps its value schema (a null column) from one run to the
next.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pyspark.sql import DataFrame

from lockgate.jvm import jvm_name, seq
from lockgate.plan.join.planner import StreamJoin
from lockgate.plan.nodes import PlanNode, with_children
from lockgate.plan.pushdown import fixed_point

_RULES = ("ColumnPruning", "CollapseProject", "RemoveNoopOperators")


def prune_unread_join_columns(plan: PlanNode, template: DataFrame) -> PlanNode:
    """``plan`` with each stream-stream join knowing which of its sides' columns nothing
    in ``template`` (the whole query's template) reads (``StreamJoin.unread``)."""
    joins = [n for n in plan.walk() if isinstance(n, StreamJoin) and n.join_plan is not None]
    if not joins:
        return plan
    pruned = _column_pruned(template)
    unread: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}
    for node in joins:
        found = _unread_of(node, pruned)
        if found is not None and any(found):
            unread[id(node)] = found
    if not unread:
        return plan
    return _rewrite(plan, unread, {})


def _column_pruned(template: DataFrame) -> list[Any]:
    """The ``Join`` nodes of ``template``'s analysed plan after Spark's column pruning."""
    jvm = template.sparkSession.sparkContext._jvm
    plan = template._jdf.queryExecution().analyzed()
    plan = jvm_name(jvm, "org.apache.spark.sql.catalyst.analysis.EliminateSubqueryAliases$.MODULE$").apply(plan)
    rules = [jvm_name(jvm, f"org.apache.spark.sql.catalyst.optimizer.{r}$.MODULE$") for r in _RULES]
    plan = fixed_point(rules, plan)
    joins, stack = [], [plan]
    while stack:
        node = stack.pop()
        if node.getClass().getSimpleName() == "Join":
            joins.append(node)
        stack.extend(seq(node.children()))
    return joins


def _ids(attributes: Any) -> list[int]:
    return [int(a.exprId().id()) for a in seq(attributes)]


def _references(join: Any) -> frozenset[int] | None:
    condition = join.condition()
    if condition.isEmpty():
        return None
    return frozenset(_ids(condition.get().references().toSeq()))


def _unread_of(node: StreamJoin, pruned: list[Any]) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """Per side, the indexes of the columns no occurrence of ``node``'s join in
    ``pruned`` keeps; None when the join is not found there."""
    join = node.join_plan
    refs = _references(join)
    sides = (_ids(join.left().output()), _ids(join.right().output()))
    kept: tuple[set[int], set[int]] = (set(), set())
    found = False
    for candidate in pruned:
        if _references(candidate) != refs:
            continue
        outputs = (set(_ids(candidate.left().output())), set(_ids(candidate.right().output())))
        if not all(outputs[s] <= set(sides[s]) for s in (0, 1)):
            continue  # another join with the same condition columns
        found = True
        for s in (0, 1):
            kept[s].update(outputs[s])
    if not found:
        return None
    # the event-time columns stay: the join evicts its state by them
    keep_always = node.watermark_columns
    return tuple(  # type: ignore[return-value]
        tuple(i for i, e in enumerate(sides[s]) if e not in kept[s] and i != keep_always[s])
        for s in (0, 1)
    )


def _rewrite(
    plan: PlanNode, unread: dict[int, tuple[tuple[int, ...], tuple[int, ...]]], done: dict[int, PlanNode]
) -> PlanNode:
    """``plan`` with the joins in ``unread`` marked; a node met twice (one DataFrame
    read twice) is rewritten once, so it stays one node."""
    if id(plan) in done:
        return done[id(plan)]
    new_plan = with_children(plan, lambda child: _rewrite(child, unread, done))
    if isinstance(new_plan, StreamJoin) and id(plan) in unread:
        new_plan = replace(new_plan, unread=unread[id(plan)])
    done[id(plan)] = new_plan
    return new_plan

"""PlanTemplate: one batch's analysed plan, reused by the next batches of the run.

Building a batch's DataFrame operation by operation makes the driver's JVM analyse a new
Dataset per operation: ~35 ms a batch for a deduplication, most of a stateful batch's
``queryPlanning``. Yet a batch's plan differs from the previous batch's only in its
sources' data and in the names of its observations; the state steps read their per-batch
values from a local property (:mod:`lockgate.plan.state_udf`), not from the plan.

So, as Spark's own ``MicroBatchExecution`` swaps each source's new data into the same
logical plan, lockgate captures the analysed plan of the first batch of each shape
(which sources are empty) and, for later batches, rebuilds only the nodes on the paths
from the root to

- each source's subtree, replaced by the batch's source plan under a ``Project`` that
  gives its columns the captured expression ids, so every node above still resolves;
- each ``CollectMetrics`` (``observe``), renamed for the batch and registered with a
  fresh ``Observation``.

The rebuilt plan is marked analysed (its nodes are copies of analysed nodes over
children of the same output), so ``Dataset.ofRows`` does not analyse it again: a
batch's planning costs a few dozen py4j calls instead of a Dataset per operation.

A plan is captured only when it is safe to reuse: the caller excludes queries with
per-batch literals (current-time functions) or operators whose state step is built per
batch, and :meth:`PlanTemplate.capture` refuses a plan in which a source's data appears
other than as its own subtree (Spark's analyser copies a relation used twice).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lockgate.jvm import analysed_frame, scala_list, seq

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from lockgate.plan.incremental import ObservationRole


class NotReusable(Exception):
    """The plan cannot serve later batches; they are planned one by one."""


@dataclass
class _Source:
    """A source's subtree in the captured plan: replaced by each batch's source plan."""

    relation_id: int
    output: Any
    """The captured subtree's output attributes (a JVM ``Seq``), whose ids the plan
    above uses."""
    columns: list[tuple[str, Any, Any]]
    """Each of those attributes' name, expression id and qualifier (JVM), read once:
    every batch's ``Alias`` of a column needs them."""

    @classmethod
    def of(cls, relation_id: int, node: Any) -> _Source:
        output = node.output()
        columns = [(a.name(), a.exprId(), a.qualifier()) for a in seq(output)]
        return cls(relation_id, output, columns)


@dataclass
class _Metrics:
    """A ``CollectMetrics`` node: renamed and observed afresh every batch."""

    role: ObservationRole
    metrics: Any
    dataframe_id: int


@dataclass
class _Path:
    """A node above a substitution point: copied over its rebuilt children."""

    node: Any
    children: list[_Part]
    metrics: _Metrics | None = None


_Part = Any | _Source | _Path
"""A captured JVM subtree kept as is, a source to substitute, or a node to rebuild."""


class PlanTemplate:
    """The analysed plan of one batch, ready to take another batch's sources."""

    def __init__(self, spark: SparkSession, root: _Path, sources: list[_Source]) -> None:
        self._spark = spark
        self._root = root
        self._sources = sources
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        self._jvm = jvm
        catalyst = jvm.org.apache.spark.sql.catalyst
        self._alias = catalyst.expressions.Alias
        self._project = catalyst.plans.logical.Project
        self._collect_metrics = catalyst.plans.logical.CollectMetrics
        self._nil = scala_list(jvm, [])
        self._none = jvm.scala.Option.empty()
        self._observations = spark._jsparkSession.observationManager()
        self._observation = jvm.org.apache.spark.sql.Observation

    @classmethod
    def capture(
        cls,
        spark: SparkSession,
        result: DataFrame,
        sources: dict[int, DataFrame],
        roles: dict[str, ObservationRole],
    ) -> PlanTemplate:
        """The template of ``result``, whose sources were ``sources`` (relation id ->
        the batch's source DataFrame) and whose observations are named as ``roles``
        says. Raises :class:`NotReusable` when the plan cannot be reused safely."""
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        identity = jvm.java.lang.System.identityHashCode
        wanted: dict[int, list[tuple[int, Any]]] = {}
        source_plans: dict[str, list[Any]] = {}
        for relation_id, df in sources.items():
            plan = df._jdf.queryExecution().analyzed()
            wanted.setdefault(identity(plan), []).append((relation_id, plan))
            source_plans.setdefault(plan.nodeName(), []).append(plan)
        found_sources: list[_Source] = []
        found_roles: set[ObservationRole] = set()
        lookalikes: list[tuple[Any, list[Any]]] = []

        def visit(node: Any) -> _Part:
            for relation_id, plan in wanted.get(identity(node), ()):
                if node.equals(plan):
                    found_sources.append(_Source.of(relation_id, node))
                    return found_sources[-1]
            name = node.nodeName()
            if name in source_plans:
                lookalikes.append((node, source_plans[name]))
            children = [visit(child) for child in seq(node.children())]
            metrics = None
            if name == "CollectMetrics":
                role = roles.get(node.name())
                if role is None or role in found_roles:
                    raise NotReusable(f"observation {node.name()} is not lockgate's own")
                found_roles.add(role)
                metrics = _Metrics(role, node.metrics(), node.dataframeId())
            if metrics is None and not any(isinstance(c, (_Source, _Path)) for c in children):
                return node
            return _Path(node, children, metrics)

        root = visit(result._jdf.queryExecution().analyzed())
        if {s.relation_id for s in found_sources} != set(sources) or found_roles != set(roles.values()):
            raise NotReusable("a source or an observation is not where the plan was built")
        for node, plans in lookalikes:
            # A copy of a source's batch plan (Spark's analyser copies a relation used
            # twice, with new column ids) would keep this batch's data in later batches.
            # Only a copy of the whole batch plan counts: a static relation that merely
            # equals one of its leaves (``spark.range(n)`` beside a rate source's range,
            # whose rows are in the projection above it) is not the source's data.
            if any(node.sameResult(plan) for plan in plans):
                raise NotReusable("a source's data appears in the plan a second time")
        if not isinstance(root, _Path):
            raise NotReusable("the plan reads no source")
        return cls(spark, root, found_sources)

    def instantiate(
        self, sources: dict[int, DataFrame], names: dict[ObservationRole, str]
    ) -> tuple[DataFrame, dict[ObservationRole, Any]]:
        """This batch's DataFrame over ``sources`` with observations named ``names``,
        and those observations (PySpark ``Observation`` objects) by role."""
        from pyspark.sql import Observation

        observations: dict[ObservationRole, Any] = {}
        rewired = {id(s): self._rewire(sources[s.relation_id], s) for s in self._sources}

        def build(part: _Part) -> Any:
            if isinstance(part, _Source):
                return rewired[id(part)]
            if not isinstance(part, _Path):
                return part
            children = [build(child) for child in part.children]
            if part.metrics is None:
                return part.node.withNewChildren(self._list(children))
            metrics = part.metrics
            name = names[metrics.role]
            observation = Observation(name)
            observation._jvm = self._jvm
            observation._jo = self._observation(name)
            self._observations.register(observation._jo, metrics.dataframe_id)
            observations[metrics.role] = observation
            return self._collect_metrics(name, metrics.metrics, children[0], metrics.dataframe_id)

        return analysed_frame(self._spark, build(self._root)), observations

    def _rewire(self, df: DataFrame, source: _Source) -> Any:
        """``df``'s analysed plan with its columns renamed to the ids of ``source``'s
        captured output: as it is when it has them already (a rate source's batches
        reuse one projection, and its ids), else under a ``Project`` of aliases."""
        plan = df._jdf.queryExecution().analyzed()
        output = plan.output()
        if output.equals(source.output):
            return plan
        columns = seq(output)
        if len(columns) != len(source.columns):
            raise NotReusable("a source's batch has other columns than the captured one")
        aliases = [
            self._alias(new, name, expr_id, qualifier, self._none, self._nil)
            for new, (name, expr_id, qualifier) in zip(columns, source.columns, strict=True)
        ]
        return self._project(self._list(aliases), plan)

    def _list(self, items: list[Any]) -> Any:
        return scala_list(self._jvm, items)


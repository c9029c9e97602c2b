"""py4j and Catalyst helpers shared by every layer: JVM names looked up once per gateway,
Scala collections, analysed DataFrames of JVM plans, Columns of Catalyst expressions."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession


_JVM_NAMES: dict[tuple[int, str], Any] = {}


def jvm_name(jvm: Any, name: str) -> Any:
    """The JVM class or Scala object ``name`` (``Nil$.MODULE$`` style for objects),
    looked up once per gateway: each lookup costs a py4j call per part of the name."""
    key = (id(jvm), name)
    found = _JVM_NAMES.get(key)
    if found is None:
        found = jvm
        for part in name.split("."):
            found = getattr(found, part)
        _JVM_NAMES[key] = found
    return found


def scala_list(jvm: Any, items: list[Any]) -> Any:
    """A Scala ``List`` of ``items`` (JVM objects or strings): one py4j call per item."""
    result = jvm_name(jvm, "scala.collection.immutable.Nil$.MODULE$")
    for item in reversed(items):
        result = getattr(result, "$colon$colon")(item)
    return result


def analysed_frame(spark: SparkSession, plan: Any) -> DataFrame:
    """A DataFrame of ``plan``, a plan built from analysed parts with the same outputs:
    marked analysed, so Spark does not analyse it again."""
    from pyspark.sql import DataFrame as PySparkDataFrame

    plan.setAnalyzed()
    dataset = jvm_name(spark.sparkContext._jvm, "org.apache.spark.sql.classic.Dataset")
    return PySparkDataFrame(dataset.ofRows(spark._jsparkSession, plan), spark)


def unresolved_column(
    expression: Any, spark: SparkSession | None = None, name_of: Callable[[Any], str] | None = None
) -> Column:
    """A Column computing ``expression``, a resolved Catalyst expression, with its
    attribute references made references by name again: it resolves against any frame
    with columns of those names (and types), or of the names ``name_of`` gives each
    attribute. ``spark`` defaults to the active session."""
    from pyspark.sql import SparkSession
    from pyspark.sql.classic.column import Column as ClassicColumn

    spark = spark or SparkSession.getActiveSession()
    assert spark is not None
    jvm = spark.sparkContext._jvm
    unresolved = jvm_name(jvm, "org.apache.spark.sql.catalyst.analysis.UnresolvedAttribute")

    def rebuild(e: Any) -> Any:
        if e.getClass().getSimpleName() == "AttributeReference":
            return unresolved.quoted(e.name() if name_of is None else name_of(e))
        children = e.children()
        if children.size() == 0:
            return e
        return e.withNewChildren(scala_list(jvm, [rebuild(children.apply(i)) for i in range(children.size())]))

    column = jvm_name(jvm, "org.apache.spark.sql.classic.ExpressionUtils").column(rebuild(expression))
    return ClassicColumn(column)


def seq(jseq: Any) -> list[Any]:
    """The items of a Scala ``Seq`` (one py4j call per item)."""
    return [jseq.apply(i) for i in range(jseq.size())]


def quoted(name: str) -> str:
    """``name`` as a Spark identifier in backquotes, for ``F.col`` and SQL text."""
    return "`" + name.replace("`", "``") + "`"

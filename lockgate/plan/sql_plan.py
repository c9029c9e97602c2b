"""Spark's parsed plan of a SQL query, as ``ls.sql`` reads it (``lockgate/api/sql.py``
applies it, node by node, as DataFrame operations): the parse, the kind, children,
subqueries and ``WITH`` queries of a node, the names a relation or expression reads,
Columns of parsed expressions, and a DataFrame of a subtree that reads no stream."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from py4j.protocol import Py4JJavaError
from pyspark.errors import ParseException
from pyspark.errors.exceptions.captured import convert_exception
from pyspark.sql.classic.column import Column
from pyspark.sql.classic.dataframe import DataFrame as ClassicDataFrame

from lockgate.jvm import jvm_name
from lockgate.jvm import seq as _seq

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def parse(spark: SparkSession, query: str) -> Any:
    """Spark's parsed (unresolved) plan of ``query``; None where Spark's parser fails
    (``spark.sql(query)`` raises its ``ParseException``)."""
    try:
        return spark._jsparkSession.sessionState().sqlParser().parsePlan(query)
    except (ParseException, Py4JJavaError):  # PySpark converts Spark's ParseException
        return None


def kind(node: Any) -> str:
    """The Catalyst class name of a plan node or expression (``Project``, ``Alias``)."""
    return str(node.getClass().getSimpleName())


def items(jseq: Any) -> list[Any]:
    """The items of a Scala ``Seq``."""
    return _seq(jseq)


def children(node: Any) -> list[Any]:
    return _seq(node.children())


def attribute_names(expr: Any) -> list[str]:
    """The (last parts of the) names of the columns a parsed expression reads."""
    if kind(expr) == "UnresolvedAttribute":
        return [str(_seq(expr.nameParts())[-1]).lower()]
    return [n for child in children(expr) for n in attribute_names(child)]


def cte_relations(node: Any) -> list[Any]:
    """The queries a ``WITH`` defines (not among its children)."""
    if kind(node) != "UnresolvedWith":
        return []
    return [pair._2() for pair in _seq(node.cteRelations())]


def subqueries(node: Any) -> list[Any]:
    try:
        return _seq(node.subqueries())
    except Exception:  # noqa: BLE001 - a node without expressions
        return []


def relation_parts(relation: Any) -> list[str]:
    """The parts of an ``UnresolvedRelation``'s name."""
    return [str(p) for p in _seq(relation.multipartIdentifier())]


def column(spark: SparkSession, expr: Any) -> Column:
    """A Column of the parsed expression ``expr``, which Spark analyses where it is used."""
    jvm = spark._jvm
    node = jvm_name(jvm, "org.apache.spark.sql.classic.ExpressionColumnNode").apply(expr)
    return Column(jvm.org.apache.spark.sql.Column(node))


def static_frame(spark: SparkSession, node: Any) -> DataFrame:
    """Spark's DataFrame of a parsed subtree that reads no streaming view, with Spark's
    analysis errors as PySpark raises them."""
    dataset = jvm_name(spark._jvm, "org.apache.spark.sql.classic.Dataset")
    try:
        jdf = dataset.ofRows(spark._jsparkSession, node)
    except Py4JJavaError as exc:
        raise convert_exception(exc.java_exception) from None
    return ClassicDataFrame(jdf, spark)

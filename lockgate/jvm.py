"""py4j and Catalyst helpers shared by every layer: JVM names looked up once per gateway,
Scala collections, analysed DataFrames of JVM plans, Columns of Catalyst expressions."""

from __future__ import annotations

from collections.abc import Callable, Sequence
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


def arrow_map_call(
    function: Callable[[Any], Any], return_schema: Any, columns: Sequence[str]
) -> Column:
    """``function`` as the Python UDF ``DataFrame.mapInArrow`` makes of it, applied to
    ``columns``: made once and kept, the call serves every DataFrame of those columns
    (:func:`map_in_arrow`), where ``mapInArrow`` pickles the function and registers a new
    UDF in the JVM at every call (~20 ms of py4j calls)."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.functions import pandas_udf
    from pyspark.util import PythonEvalType

    udf = pandas_udf(  # type: ignore[call-overload]
        function, returnType=return_schema, functionType=PythonEvalType.SQL_MAP_ARROW_ITER_UDF
    )
    return udf(*[F.col(quoted(c)) for c in columns])  # type: ignore[no-any-return]


def map_in_arrow(df: DataFrame, call: Column) -> DataFrame:
    """``df.mapInArrow`` of the UDF call :func:`arrow_map_call` made."""
    from pyspark.sql import DataFrame as PySparkDataFrame

    return PySparkDataFrame(df._jdf.mapInArrow(call._jc, False, None), df.sparkSession)


def class_loadable(spark: SparkSession, name: str) -> bool:
    """Whether the driver's JVM can load class ``name`` (``spark.jars``,
    ``spark.jars.packages`` or the classpath)."""
    from py4j.protocol import Py4JError

    jvm = spark.sparkContext._jvm
    assert jvm is not None
    try:
        loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
        jvm.java.lang.Class.forName(name, False, loader)
    except Py4JError:
        return False
    return True


def cast_columns(df: DataFrame, schema: Any) -> DataFrame:
    """``df`` with each column whose type differs from the one ``schema`` (a
    ``StructType``) has at the same position cast to it; ``df`` itself when none differs.

    Spark casts a struct's fields by position, so this renames nested fields: those of
    structs with duplicated field names, which cross into Arrow under the unique names
    of :func:`~lockgate.state.arrow_types.unique_field_names` and come back under
    Spark's."""
    from pyspark.sql import functions as F

    from lockgate.errors import NotSupportedYetError

    fields = df.schema.fields
    if all(f.dataType == t.dataType for f, t in zip(fields, schema.fields)):
        return df
    if len({f.name for f in fields}) < len(fields):
        raise NotSupportedYetError(
            "A struct with duplicated field names in rows that also have two columns of one name",
            f"The rows are {df.schema.simpleString()!r}; give the columns distinct names.",
        )
    return df.select(
        *[
            F.col(quoted(f.name))
            if f.dataType == t.dataType
            else F.col(quoted(f.name)).cast(t.dataType).alias(f.name, metadata=f.metadata)
            for f, t in zip(fields, schema.fields)
        ]
    )


class ArrowMapOver:
    """:func:`map_in_arrow` of one UDF call over the DataFrames of a run, each batch's
    ``MapInArrow`` node copied from the first one's over the batch's plan, so a batch
    skips the analysis of a new Dataset (~10-20 ms of the driver's time a batch on a
    2-core machine, ``docs/benchmarks.md``).

    The copy is taken only when the batch's plan has the output the captured node was
    analysed over (the same attributes: names, expression ids, types), as the plans of a
    query reused batch after batch do (:mod:`lockgate.plan.template`); any other plan
    gets a ``mapInArrow`` of its own, which is then the one copied."""

    def __init__(self, call: Column) -> None:
        self._call = call
        self._node: Any = None
        self._child_output: Any = None

    def apply(self, df: DataFrame) -> DataFrame:
        spark = df.sparkSession
        plan = df._jdf.queryExecution().analyzed()
        if self._node is not None and plan.output().equals(self._child_output):
            jvm = spark.sparkContext._jvm
            return analysed_frame(spark, self._node.withNewChildren(scala_list(jvm, [plan])))
        mapped = map_in_arrow(df, self._call)
        node = mapped._jdf.queryExecution().analyzed()
        if node.getClass().getSimpleName() == "MapInArrow" and node.child().output().equals(plan.output()):
            self._node, self._child_output = node, plan.output()
        return mapped


class DataSources:
    """Spark's ``DataSource(sparkSession, className, paths, userSpecifiedSchema,
    partitionColumns, bucketSpec, options, catalogTable, ...)``, the file formats'
    relation that ``DataFrameReader.load()``, ``DataFrameWriter.save()`` and Spark's
    file stream source and sink build, with the JVM objects every call passes made once."""

    def __init__(self, spark: SparkSession) -> None:
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        self._jspark = spark._jsparkSession
        self._class = jvm_name(jvm, "org.apache.spark.sql.execution.datasources.DataSource")
        self._to_seq = jvm.PythonUtils.toSeq
        self._empty = self._to_seq([])
        self._none = jvm_name(jvm, "scala.Option").empty()
        self._some = jvm_name(jvm, "scala.Some")

    def schema(self, schema: Any) -> Any:
        """``Some`` of a PySpark ``StructType``, for :meth:`new`."""
        return self._some(self._jspark.parseDataType(schema.json()))

    def new(
        self,
        format_name: str,
        *,
        paths: Sequence[str] = (),
        schema: Any = None,
        partition_columns: Sequence[str] = (),
        options: Any,
    ) -> Any:
        """A ``DataSource``; ``schema`` from :meth:`schema` (None: none given),
        ``options`` a Scala map (``PythonUtils.toScalaMap``)."""
        return self._class(
            self._jspark,
            format_name,
            self._seq(paths),
            self._none if schema is None else schema,
            self._seq(partition_columns),
            self._none,
            options,
            self._none,
            self._none,
        )

    def _seq(self, items: Sequence[str]) -> Any:
        return self._to_seq(list(items)) if items else self._empty

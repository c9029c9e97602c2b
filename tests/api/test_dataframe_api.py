"""The streaming DataFrame API: schema, definition-time validation by Spark's analyzer,
union/join/watermark rules, explain, and the package's public names."""

from __future__ import annotations

import inspect
import re
import types

import pytest
from pyspark.errors import AnalysisException, PySparkException
from pyspark.errors import IllegalArgumentException as PySparkIllegalArgumentException
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, StringType, StructField, StructType

import lockgate
from lockgate import MemoryStream
from lockgate.api.dataframe import _STATEFUL_NOT_YET, _STATELESS

SCHEMA = "a INT, b STRING, ts TIMESTAMP"


@pytest.fixture(scope="module")
def static(spark) -> DataFrame:
    return spark.createDataFrame([], SCHEMA)


@pytest.fixture
def sdf(ls) -> lockgate.StreamingDataFrame:
    return MemoryStream(ls, SCHEMA).toDF()


def _identity_pandas(batches):
    yield from batches


def _identity_arrow(batches):
    yield from batches


# Every method in _STATELESS, with a call that is valid and one Spark would reject (or, for
# the methods where Spark accepts a missing column as a no-op, the same no-op). Calls are
# built lazily: Columns need the SparkContext.
def _s(*args, **kwargs):
    return lambda: (args, kwargs)


STATELESS_CASES = {
    "select": [lambda: (("a", F.col("b").alias("c")), {}), _s("nope")],
    "selectExpr": [_s("a + 1 AS a1", "upper(b)"), _s("nope + 1")],
    "where": [_s("a > 1"), _s("nope > 1")],
    "filter": [lambda: ((F.col("a") > 1,), {}), lambda: ((F.col("nope") > 1,), {})],
    "withColumn": [lambda: (("x", F.col("a") * 2), {}), lambda: (("x", F.col("nope")), {})],
    "withColumns": [
        lambda: (({"x": F.lit(1), "y": F.col("b")},), {}),
        lambda: (({"x": F.col("nope")},), {}),
    ],
    "withColumnRenamed": [_s("a", "z"), _s("nope", "z")],
    "withColumnsRenamed": [_s({"a": "z"}), _s({"nope": "z"})],
    "withMetadata": [_s("a", {"comment": "x"}), _s("nope", {"comment": "x"})],
    "drop": [_s("b"), _s("nope"), lambda: ((F.col("nope"),), {})],
    "alias": [_s("t")],
    "toDF": [_s("x", "y", "z"), _s("x")],
    "fillna": [_s(0, subset=["a"]), _s(0, subset=["nope"])],
    "dropna": [_s(subset=["a"]), _s(subset=["nope"])],
    "replace": [_s(1, 2, subset=["a"]), _s(1, 2, subset=["nope"])],
    "repartition": [_s(2, "a"), _s(2, "nope")],
    "repartitionByRange": [_s(2, "a"), _s(2, "nope")],
    "coalesce": [_s(1)],
    "hint": [_s("broadcast")],
    "mapInPandas": [_s(_identity_pandas, SCHEMA), _s(_identity_pandas, "a nosuchtype")],
    "mapInArrow": [_s(_identity_arrow, SCHEMA), _s(_identity_arrow, "a nosuchtype")],
    "unpivot": [_s(["a"], ["b"], "var", "val"), _s(["nope"], ["b"], "var", "val")],
    "melt": [_s(["a"], ["b"], "var", "val"), _s(["a"], ["nope"], "var", "val")],
    "to": [
        _s(StructType([StructField("b", StringType()), StructField("a", IntegerType())])),
        _s(StructType([StructField("zz", IntegerType(), False)])),
    ],
    # Recorded at definition time; refused at start() unless after an aggregation in
    # complete mode (as Spark's UnsupportedOperationChecker does).
    "orderBy": [_s("a"), _s("nope")],
    "sort": [lambda: ((F.col("a").desc(),), {}), _s("nope")],
    "sortWithinPartitions": [_s("a"), _s("nope")],
}

_CASES = [
    pytest.param(method, make, id=f"{method}-{i}")
    for method, calls in STATELESS_CASES.items()
    for i, make in enumerate(calls)
]


def _condition(exc: BaseException) -> str | None:
    if isinstance(exc, PySparkException):
        return exc.getCondition()
    return None


def test_every_stateless_method_has_cases():
    assert set(STATELESS_CASES) == set(_STATELESS)


@pytest.mark.parametrize(("method", "make"), _CASES)
def test_stateless_methods_are_checked_like_spark_at_definition_time(static, sdf, method, make):
    args, kwargs = make()
    try:
        expected = getattr(static, method)(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - Spark's verdict, whatever it is
        with pytest.raises(type(exc)) as info:
            getattr(sdf, method)(*args, **kwargs)
        assert _condition(info.value) == _condition(exc)
        if isinstance(exc, AnalysisException):
            assert isinstance(info.value, AnalysisException)
        return
    result = getattr(sdf, method)(*args, **kwargs)
    assert isinstance(result, lockgate.StreamingDataFrame)
    assert result.isStreaming
    assert result.schema == expected.schema
    assert result is not sdf  # immutable: a new DataFrame


def test_bad_columns_raise_sparks_analysis_exception(sdf):
    for call in (
        lambda: sdf.select("nope"),
        lambda: sdf.selectExpr("nope"),
        lambda: sdf.where("nope = 1"),
        lambda: sdf.filter(F.col("nope") == 1),
        lambda: sdf.withColumn("x", F.col("nope") + 1),
        lambda: sdf.withColumns({"x": F.col("nope")}),
        lambda: sdf.repartition(3, "nope"),
        lambda: sdf.dropna(subset=["nope"]),
        lambda: sdf["nope"],
        lambda: sdf.select("a").select("b"),
        lambda: sdf.alias("t").select("u.a"),
    ):
        with pytest.raises(AnalysisException) as info:
            call()
        assert (_condition(info.value) or "").startswith(("UNRESOLVED_COLUMN", "CANNOT_RESOLVE"))


def test_schema_columns_dtypes_is_streaming(static, sdf, ls):
    assert sdf.isStreaming is True
    assert sdf.schema == static.schema
    assert sdf.columns == ["a", "b", "ts"]
    assert sdf.dtypes == [("a", "int"), ("b", "string"), ("ts", "timestamp")]
    assert sdf.sparkSession is ls.spark
    assert repr(sdf) == "StreamingDataFrame[a: int, b: string, ts: timestamp]"
    derived = sdf.select((F.col("a") + 1).alias("a1"), "b")
    assert derived.columns == ["a1", "b"]
    assert derived.dtypes == [("a1", "int"), ("b", "string")]
    # A chain of operations keeps every intermediate DataFrame usable.
    assert sdf.columns == ["a", "b", "ts"]


def test_print_schema_matches_spark(static, sdf, capsys):
    static.printSchema()
    expected = capsys.readouterr().out
    sdf.printSchema()
    assert capsys.readouterr().out == expected
    assert "|-- a: integer (nullable = true)" in expected
    static.printSchema(1)
    expected = capsys.readouterr().out
    sdf.printSchema(1)
    assert capsys.readouterr().out == expected


def test_column_access(sdf):
    # columns are bound to sdf (qualified by its hidden alias), like PySpark's df.a
    bound = sdf._alias_name
    assert str(sdf.a) == str(F.col(f"`{bound}`.`a`"))
    assert str(sdf["b"]) == str(F.col(f"`{bound}`.`b`"))
    assert str(sdf[0]) == str(F.col(f"`{bound}`.`a`"))
    assert sdf.select(sdf.a, sdf["b"]).columns == ["a", "b"]
    assert sdf[["a", "b"]].columns == ["a", "b"]
    filtered = sdf[F.col("a") > 1]
    assert isinstance(filtered, lockgate.StreamingDataFrame)
    assert filtered.columns == sdf.columns
    with pytest.raises(TypeError):
        sdf[1.5]
    with pytest.raises(AttributeError):
        sdf.no_such_attribute  # noqa: B018
    with pytest.raises(AttributeError):
        sdf._private  # noqa: B018


def test_transform_and_dir(sdf):
    out = sdf.transform(lambda df, n: df.withColumn("n", F.lit(n)), 3)
    assert out.columns == ["a", "b", "ts", "n"]
    with pytest.raises(TypeError):
        sdf.transform(lambda df: 1)
    assert set(_STATELESS) <= set(dir(sdf))


@pytest.mark.parametrize("action", ["count", "collect", "show", "first", "head", "take", "toPandas",
                                    "foreach", "write", "cache", "rdd",
                                    "isEmpty", "describe"])
def test_batch_actions_are_refused(sdf, action):
    with pytest.raises(AnalysisException, match="Queries with streaming sources must be executed with writeStream.start"):
        getattr(sdf, action)


@pytest.mark.parametrize("op", sorted(_STATEFUL_NOT_YET))
def test_stateful_operations_are_not_supported_yet(sdf, op):
    with pytest.raises(lockgate.NotSupportedYetError) as info:
        getattr(sdf, op)
    assert "not supported yet by lockgate" in str(info.value)
    assert isinstance(info.value, NotImplementedError)


@pytest.mark.parametrize("op", ["intersect", "intersectAll"])
def test_intersect_is_refused_as_spark(sdf, op):
    with pytest.raises(AnalysisException, match="Intersect of streaming DataFrames/Datasets is not supported"):
        getattr(sdf, op)


def test_sample_is_refused_as_spark(spark, sdf, tmp_path):
    """Spark's checker refuses a Sample node on a stream (at start()); lockgate refuses
    ``sample`` with its words when the query is defined. ``stat.sampleBy``, a filter on
    rand(), runs on both (test_spark_parity)."""
    native = spark.readStream.format("rate").load().sample(0.5)
    with pytest.raises(AnalysisException) as spark_says:
        native.writeStream.format("noop").option("checkpointLocation", str(tmp_path)).start()
    words = "Sampling is not supported on streaming DataFrames/Datasets"
    assert words in str(spark_says.value)
    with pytest.raises(AnalysisException, match=words):
        sdf.sample(0.5)


@pytest.mark.parametrize(
    "build",
    [
        lambda df, W: df.withColumn("rn", F.row_number().over(W.partitionBy(F.col("value") % 2).orderBy("timestamp"))),
        lambda df, W: df.select("value", F.sum("value").over(W.partitionBy(F.col("value") % 2)).alias("s")),
        lambda df, W: df.selectExpr("value", "rank() OVER (ORDER BY value) AS r"),
        lambda df, W: df.withWatermark("timestamp", "1 second").groupBy(F.window("timestamp", "1 second"))
        .count().withColumn("prev", F.lag("count").over(W.orderBy("window"))),
    ],
    ids=["row_number", "sum_over", "sql_rank", "lag_over_aggregate"],
)
def test_window_functions_are_refused_at_start_as_spark(spark, ls, tmp_path, build):
    """A window function (OVER) on a stream: Spark's NON_TIME_WINDOW_NOT_SUPPORTED_IN_STREAMING
    at start(), naming the function, its column and its window; before, lockgate ran it over
    each micro-batch alone. The time window ``window()`` is no window function."""
    from pyspark.sql import Window

    messages = []
    for engine, reader in (("native", spark.readStream), ("lockgate", ls.readStream)):
        query = build(reader.format("rate").load(), Window)  # defining it is allowed
        with pytest.raises(AnalysisException) as info:
            query.writeStream.format("noop").outputMode("update").option(
                "checkpointLocation", str(tmp_path / engine)
            ).start()
        messages.append(str(info.value))
    native, ours = (m.split("SQLSTATE")[0] for m in messages)
    assert "[NON_TIME_WINDOW_NOT_SUPPORTED_IN_STREAMING]" in ours
    strip_ids = lambda text: re.sub(r"#\d+L?", "", text.split("\n")[0])
    assert strip_ids(ours) == strip_ids(native)


@pytest.mark.parametrize(
    "build",
    [
        lambda df: df.select("value", F.monotonically_increasing_id().alias("id")),
        lambda df: df.where(F.monotonically_increasing_id() > 3),
        lambda df: df.groupBy((F.monotonically_increasing_id() % 2).alias("k")).count(),
    ],
    ids=["select", "filter", "grouping"],
)
def test_monotonically_increasing_id_is_refused_at_start_as_spark(spark, ls, tmp_path, build):
    """monotonically_increasing_id() anywhere in a streaming query: Spark's
    UnsupportedOperationChecker refuses it at start() (its ids restart at every batch);
    lockgate ran it. A column merely named so is no call."""
    messages = []
    for engine, reader in (("native", spark.readStream), ("lockgate", ls.readStream)):
        query = build(reader.format("rate").load())
        with pytest.raises(AnalysisException) as info:
            query.writeStream.format("noop").outputMode("update").option(
                "checkpointLocation", str(tmp_path / engine)
            ).start()
        messages.append(str(info.value).split(";")[0].split("SQLSTATE")[0].strip())
    assert messages[1] == messages[0]
    assert messages[1] == "Expression(s): monotonically_increasing_id() is not supported with streaming DataFrames/Datasets"
    named = ls.readStream.format("rate").load().select(F.col("value").alias("monotonically_increasing_id"))
    named.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "named")).start().stop()


@pytest.mark.parametrize("op", ["subtract", "exceptAll"])
def test_except_of_two_streams_is_refused_as_spark(sdf, op):
    with pytest.raises(AnalysisException, match="Except on a streaming DataFrame/Dataset on the right is not supported"):
        getattr(sdf, op)(sdf)


@pytest.mark.parametrize("op", ["subtract", "exceptAll"])
def test_except_of_a_stream_and_a_static_frame_is_not_supported_yet(spark, sdf, op):
    static = spark.createDataFrame([(1, "x", None)], sdf.schema)
    with pytest.raises(lockgate.NotSupportedYetError, match="left_anti"):
        getattr(sdf, op)(static)


def test_other_dataframe_methods_are_not_supported_yet(sdf):
    with pytest.raises(lockgate.NotSupportedYetError, match="crosstab"):
        sdf.crosstab  # noqa: B018


def test_nested_streaming_dataframe_arguments_are_refused(sdf):
    with pytest.raises(lockgate.NotSupportedYetError):
        sdf.select(sdf)


# -- explain -------------------------------------------------------------------------------


def test_explain_prints_the_physical_plan(sdf, capsys):
    df = sdf.where("a > 5").select("a", "b")
    df.explain()
    out = capsys.readouterr().out
    assert "== Physical Plan" in out
    assert "Filter" in out and "Project" in out
    assert "Parsed Logical Plan (lockgate)" not in out

    df.explain(True)
    out = capsys.readouterr().out
    assert "== Parsed Logical Plan (lockgate) ==" in out
    assert "StreamingRelation memory, [a, b, ts]" in out
    assert "where(" in out and "select(" in out
    assert "== Physical Plan" in out

    df.explain(mode="extended")
    assert "== Parsed Logical Plan (lockgate) ==" in capsys.readouterr().out


# -- union ---------------------------------------------------------------------------------


def test_union_of_streams(ls, sdf):
    other = MemoryStream(ls, SCHEMA).toDF()
    for method in ("union", "unionAll"):
        out = getattr(sdf, method)(other)
        assert isinstance(out, lockgate.StreamingDataFrame)
        assert out.schema == sdf.schema
    by_name = sdf.unionByName(other.select("ts", "b", "a"))
    assert by_name.columns == ["a", "b", "ts"]
    self_union = sdf.union(sdf)
    assert self_union.columns == sdf.columns


def test_union_with_static_dataframe_is_refused(sdf, static):
    for method in ("union", "unionAll", "unionByName"):
        with pytest.raises(AnalysisException) as info:
            getattr(sdf, method)(static)
        assert "Union between streaming and batch DataFrames/Datasets is not supported" in str(info.value)


def test_union_type_and_arity_checks(ls, sdf, static):
    narrow = MemoryStream(ls, "a INT").toDF()
    with pytest.raises(AnalysisException) as info:
        sdf.union(narrow)
    with pytest.raises(AnalysisException) as static_info:
        static.union(static.select("a"))
    assert _condition(info.value) == _condition(static_info.value)

    arrays = MemoryStream(ls, "a ARRAY<INT>, b STRING, ts TIMESTAMP").toDF()
    with pytest.raises(AnalysisException):
        sdf.union(arrays)

    missing = MemoryStream(ls, "a INT, b STRING").toDF()
    with pytest.raises(AnalysisException):
        sdf.unionByName(missing)
    filled = sdf.unionByName(missing, allowMissingColumns=True)
    assert filled.columns == ["a", "b", "ts"]
    with pytest.raises(TypeError):
        sdf.union([1, 2])


# -- joins ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "how",
    ["inner", "cross", "left", "leftouter", "left_outer", "LEFT_OUTER", "semi", "leftsemi",
     "left_semi", "anti", "leftanti", "left_anti"],
)
def test_joins_with_static_dataframes_that_spark_allows(spark, sdf, how):
    dim = spark.createDataFrame([(1, "one")], "a INT, name STRING")
    out = sdf.join(dim, "a", how)
    assert isinstance(out, lockgate.StreamingDataFrame)
    assert out.schema == spark.createDataFrame([], SCHEMA).join(dim, "a", how).schema


def test_join_defaults_to_inner(spark, sdf):
    dim = spark.createDataFrame([(1, "one")], "a INT, name STRING").withColumnRenamed("a", "k")
    assert sdf.join(dim, F.col("a") == F.col("k")).columns == [
        "a", "b", "ts", "k", "name"]
    assert sdf.join(dim.withColumnRenamed("k", "a"), "a").columns == ["a", "b", "ts", "name"]


def test_join_condition_with_dataframe_bound_columns(spark, sdf):
    dim = spark.createDataFrame([(1, "one")], "a INT, name STRING")
    assert sdf.join(dim, sdf.a == dim.a).columns == ["a", "b", "ts", "a", "name"]
    assert sdf.join(dim, sdf["a"] == dim["a"], "left").columns == ["a", "b", "ts", "a", "name"]


def test_bound_columns_run_in_a_query(ls, spark):
    import lockgate

    stream = lockgate.MemoryStream(ls, "a INT, b STRING")
    dim = spark.createDataFrame([(1, "one"), (2, "two")], "a INT, name STRING")
    sdf = stream.toDF()
    q = (
        sdf.join(dim, sdf.a == dim.a)
        .select(sdf["b"], dim["name"])
        .where(sdf.b != "skip")
        .writeStream.format("memory")
        .queryName("bound_columns")
        .start()
    )
    try:
        stream.addData([(1, "x"), (2, "skip"), (3, "y")])
        q.processAllAvailable()
        assert sorted(tuple(r) for r in spark.sql("select * from bound_columns").collect()) == [("x", "one")]
    finally:
        q.stop()


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("right", ("RightOuter join with a streaming DataFrame/Dataset on the left and a static "
                  "DataFrame/DataSet on the right not supported")),
        ("rightouter", "RightOuter join"),
        ("right_outer", "RightOuter join"),
        ("outer", "FullOuter joins with streaming DataFrames/Datasets on the left and a static"),
        ("full", "FullOuter joins"),
        ("fullouter", "FullOuter joins"),
        ("full_outer", "FullOuter joins"),
    ],
)
def test_outer_joins_spark_refuses(spark, sdf, how, message):
    dim = spark.createDataFrame([(1, "one")], "a INT, name STRING")
    with pytest.raises(AnalysisException) as info:
        sdf.join(dim, "a", how)
    assert message in str(info.value)


def test_join_errors(spark, sdf):
    dim = spark.createDataFrame([(1, "one")], "a INT, name STRING")
    with pytest.raises(AnalysisException):
        sdf.join(dim, "nope")
    with pytest.raises(Exception) as unknown:  # Spark's own error for an unknown join type
        sdf.join(dim, "a", "sideways")
    with pytest.raises(type(unknown.value)):
        spark.createDataFrame([], SCHEMA).join(dim, "a", "sideways")
    with pytest.raises(TypeError):
        sdf.join("not a dataframe", "a")
    native_stream = spark.readStream.format("rate").load()
    with pytest.raises(AnalysisException):
        sdf.join(native_stream, "a")


def test_cross_join_with_static_dataframe(spark, sdf):
    dim = spark.createDataFrame([("x",)], "name STRING")
    out = sdf.crossJoin(dim)
    assert out.columns == ["a", "b", "ts", "name"]


# -- withWatermark -------------------------------------------------------------------------


def test_with_watermark(sdf):
    out = sdf.withWatermark("ts", "10 seconds")
    assert isinstance(out, lockgate.StreamingDataFrame)
    assert out.schema == sdf.schema
    assert sdf.withWatermark("ts", "interval 1 minute").columns == sdf.columns
    chained = out.select("ts", "a").where("a > 0")
    assert chained.columns == ["ts", "a"]


def test_with_watermark_on_missing_column(sdf):
    with pytest.raises(AnalysisException) as info:
        sdf.withWatermark("nope", "10 seconds")
    assert "nope" in str(info.value)


@pytest.mark.parametrize("column", ["a", "b"])
def test_with_watermark_on_non_timestamp_column(spark, sdf, column, tmp_path):
    with pytest.raises(AnalysisException) as native:
        spark.readStream.schema(SCHEMA).json(str(tmp_path)).withWatermark(column, "10 seconds")
    with pytest.raises(AnalysisException) as info:
        sdf.withWatermark(column, "10 seconds")
    assert "EVENT_TIME_IS_NOT_ON_TIMESTAMP_TYPE" in str(info.value)
    assert str(info.value).split("SQLSTATE")[0] == str(native.value).split("SQLSTATE")[0]


def test_with_watermark_on_timestamp_ntz_is_refused_and_on_a_window_accepted(spark, sdf, tmp_path):
    """Spark's CheckAnalysis takes a TIMESTAMP column or a struct whose ``end`` is one (a
    window), and refuses TIMESTAMP_NTZ."""
    native_df = spark.readStream.schema(SCHEMA).json(str(tmp_path))
    with pytest.raises(AnalysisException) as native:
        native_df.withColumn("t2", F.col("ts").cast("timestamp_ntz")).withWatermark("t2", "10 seconds")
    with pytest.raises(AnalysisException) as info:
        sdf.withColumn("t2", F.col("ts").cast("timestamp_ntz")).withWatermark("t2", "10 seconds")
    assert '"TIMESTAMP_NTZ"' in str(info.value)
    assert str(info.value).split("SQLSTATE")[0] == str(native.value).split("SQLSTATE")[0]
    windowed = [df.select(F.window("ts", "10 seconds").alias("w"), "a") for df in (native_df, sdf)]
    assert [df.withWatermark("w", "10 seconds").columns for df in windowed] == [["w", "a"], ["w", "a"]]


def test_with_watermark_negative_delay(sdf):
    with pytest.raises((PySparkIllegalArgumentException, AnalysisException)) as info:
        sdf.withWatermark("ts", "-10 seconds")
    assert "should not be negative" in str(info.value)


def test_with_watermark_bad_arguments(sdf):
    # PySpark's and Spark's errors (differential: tests/api/test_spark_parity.py)
    with pytest.raises(AnalysisException, match="CANNOT_PARSE_INTERVAL"):
        sdf.withWatermark("ts", "10 parsecs")
    with pytest.raises(TypeError):
        sdf.withWatermark("ts", 10)
    with pytest.raises(TypeError):
        sdf.withWatermark("", "10 seconds")
    with pytest.raises(AnalysisException, match="CANNOT_PARSE_INTERVAL"):
        sdf.withWatermark("ts", "  ")


# -- the package ---------------------------------------------------------------------------


def test_all_is_sorted_and_complete():
    exported = lockgate.__all__
    assert exported == sorted(exported)
    assert len(set(exported)) == len(exported)
    for name in exported:
        assert hasattr(lockgate, name), name
    public = {
        name
        for name, value in vars(lockgate).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public == set(exported)


def test_public_names_are_what_they_claim():
    assert inspect.isclass(lockgate.StreamingDataFrame)
    assert callable(lockgate.session)
    assert issubclass(lockgate.AnalysisError, AnalysisException)
    assert issubclass(lockgate.MemoryStream, lockgate.Source)
    for exc in ("AnalysisError", "CheckpointError", "NotSupportedYetError", "OptionError",
                "StreamingQueryException"):
        assert issubclass(getattr(lockgate, exc), lockgate.LockgateError)
    assert isinstance(lockgate.__version__, str)


@pytest.mark.parametrize("method", ["sum", "avg", "mean", "min", "max"])
def test_numeric_shortcuts_aggregate_every_numeric_column_like_spark(spark, ls, method, tmp_path):
    """Without columns, ``groupBy(...).sum()`` and the like aggregate every numeric
    column, the grouping ones included (Spark 4)."""
    schema = "a INT, b STRING, c DOUBLE, ts TIMESTAMP"
    native = spark.readStream.schema(schema).json(str(tmp_path))
    mine = MemoryStream(ls, schema).toDF()
    for grouping in (["a"], ["b"], []):
        expected = getattr(native.groupBy(*grouping), method)().columns
        assert getattr(mine.groupBy(*grouping), method)().columns == expected

"""Expressions over aggregate functions inside ``agg()``, differential against native Spark.

``agg(F.round(F.avg("v"), 2))``, ``agg((F.sum("a") / F.count("b")).alias("r"))``,
``F.count("*") + 1``, ``F.col("k") + F.sum("v")``: Spark's analyzer splits each column
into its aggregate functions (kept in state) and a result expression over them and the
grouping keys, evaluated after the merge. Each query runs on native Spark Structured
Streaming (the oracle) and on lockgate over the same files (the harness of
``tests/differential.py``): after every step both agree on the sink's rows, the batches
that ran, their input rows and watermark and the state operators' metrics; the memory
sinks' schemas (names and types) are compared too.
"""

from __future__ import annotations

from typing import Any

import pytest
from differential import AGG_STEPS, RESTART_BEFORE_STEP, SCHEMA, headline
from pyspark.errors import AnalysisException
from pyspark.sql import functions as F

from lockgate.errors import NotSupportedYetError


def expressions(keyed: bool = True) -> list[Any]:
    """A class of expressions over aggregates: arithmetic over several, functions of
    them, the same aggregate twice (and once alone), literals, casts, CASE WHEN, struct
    and array constructors, and (``keyed``) expressions mixing keys and aggregates."""
    columns = [
        F.round(F.avg("v"), 2),
        (F.sum("v") / F.count("v")).alias("r"),
        F.count("v"),  # also inside r: one aggregate, computed once
        F.count("*") + 1,
        F.size(F.collect_list("v")).alias("size"),
        (F.max("v") - F.min("v")) * 2,
        F.lit(7).alias("seven"),
        F.lit(None).cast("string").alias("nothing"),
        F.sum("v").cast("int").alias("sum_int"),
        F.when(F.count("*") > 2, "many")
        .when(F.count("*") > 1, "two")
        .otherwise("one")
        .alias("many"),
        F.struct(F.sum("v").alias("s"), F.max("v")).alias("st"),
        F.array(F.min("v"), F.max("v"), F.lit(0.0)).alias("arr"),
        F.expr("sum(v) * 2 + count(1)"),
        F.coalesce(F.first("v", ignorenulls=True), F.lit(-1.0)).alias("first_or"),
        F.sqrt(F.var_pop("v")) - F.stddev_pop("v"),
        F.sort_array(F.collect_set("v")).alias("sorted_set"),
    ]
    if keyed:
        columns += [
            F.concat(F.col("k"), F.lit(":"), F.count("*").cast("string")).alias("label"),
            F.upper("k"),
            F.length("k") + F.sum("v"),
        ]
    return columns


def _source(reader: Any, inp: Any, watermark: bool = True) -> Any:
    df = reader.schema(SCHEMA).json(str(inp))
    return df.withWatermark("ts", "10 seconds") if watermark else df


def _columns(spark: Any, side: Any) -> list[tuple[str, str]]:
    """A memory sink's columns: names and types. (Nullability aside: native Spark's sink
    reports ``sort_array(collect_set(v))`` as ``array<double>`` that may hold nulls where
    its batch plan, and lockgate, say it holds none.)"""
    return [(f.name, f.dataType.simpleString()) for f in spark.table(side.table).schema]


def test_expressions_over_aggregates_match_native(spark, bench, tmp_path):
    """Append (window, watermark), update and complete mode, a global aggregation,
    orderBy after it in complete mode, a session window, and restarts from the
    checkpoint (the foreachBatch queries stop and start again mid-stream)."""
    inp = tmp_path / "in"
    inp.mkdir()

    def append_window(reader: Any) -> Any:
        df = _source(reader, inp)
        return df.groupBy(F.window("ts", "10 seconds"), "k").agg(
            *expressions(),
            (F.col("window.end").cast("long") - F.max("ts").cast("long")).alias("lag"),
        )

    def update_key(reader: Any) -> Any:
        return _source(reader, inp, watermark=False).groupBy("k").agg(*expressions())

    def complete_key_sorted(reader: Any) -> Any:
        df = _source(reader, inp, watermark=False)
        out = df.groupBy(F.col("k").alias("key")).agg(
            (F.count("*") * 10 + F.length("k")).alias("score"), F.round(F.avg("v"), 1).alias("a")
        )
        return out.orderBy(F.desc("score"), F.col("key").desc_nulls_last())

    def complete_global(reader: Any) -> Any:
        return _source(reader, inp, watermark=False).agg(*expressions(keyed=False))

    def update_window_restarting(reader: Any) -> Any:
        df = _source(reader, inp)
        return df.groupBy(F.window("ts", "10 seconds"), "k").agg(*expressions())

    def session(reader: Any) -> Any:
        df = _source(reader, inp)
        return df.groupBy(F.session_window("ts", "5 seconds"), "k").agg(
            F.round(F.avg("v"), 2),
            (F.sum("v") / F.count("v")).alias("r"),
            F.count("*") + 1,
            F.upper("k").alias("K"),
        )

    memory = [
        bench.add("append_window", append_window),
        bench.add("update_key", update_key, "update"),
        bench.add("complete_key_sorted", complete_key_sorted, "complete", ordered=True),
        bench.add("append_session", session),
    ]
    restarting = [
        bench.add("update_window", update_window_restarting, "update", sink="foreachBatch"),
        bench.add("complete_global", complete_global, "complete", sink="foreachBatch"),
    ]
    bench.start()
    for pair in memory:  # the sink's columns: Spark's names and types
        assert _columns(spark, pair.lockgate) == _columns(spark, pair.native), pair.name
    names = spark.table(memory[1].native.table).columns
    assert "round(avg(v), 2)" in names and "(count(1) + 1)" in names, names
    for i, rows in enumerate(AGG_STEPS):
        if i == RESTART_BEFORE_STEP:
            for pair in restarting:
                pair.stop()
            bench.start(restarting)
        bench.step(f"step {i}", {inp: rows})
    # the steps reached what they are meant to: rows emitted in append mode after the
    # watermark passed their window, late rows dropped
    progress = memory[0].native.progress()
    assert memory[0].native.rows(), "append mode emitted nothing"
    assert sum(op[2] for batch in progress for op in batch[3]) > 0, "no late rows dropped"


def test_expressions_over_grouping_sets_and_pivot_match_native(bench, tmp_path):
    """Expressions over aggregate functions with rollup (complete), cube (update),
    groupingSets by a window (append, evicted by the watermark) and a pivot (append: two
    chained aggregations, as Spark plans numeric pivots), batch by batch."""
    inp = tmp_path / "sets"
    inp.mkdir()

    def source(reader: Any) -> Any:
        return reader.schema(SCHEMA).json(str(inp)).withWatermark("ts", "10 seconds")

    def window() -> Any:
        return F.window("ts", "10 seconds")

    def over_aggregates() -> list[Any]:
        return [
            F.round(F.avg("v"), 2).alias("a"),
            (F.sum("v") / F.count("v")).alias("r"),
            F.count("*") + 1,
            F.size(F.collect_list("v")).alias("z"),
        ]

    bench.add("rollup_complete", lambda r: source(r).rollup("k", F.col("v") > 2).agg(*over_aggregates()), "complete")
    bench.add("cube_update", lambda r: source(r).cube("k", F.year("ts").alias("y")).agg(*over_aggregates()), "update")
    bench.add(
        "sets_append_window",
        lambda r: source(r).groupingSets([[window(), "k"], [window()]], window(), "k").agg(*over_aggregates()),
        "append",
    )
    bench.add(
        "pivot_append_window",
        lambda r: source(r)
        .groupBy(window())
        .pivot("k", ["a", "b"])
        .agg(F.round(F.sum("v") * 2, 1).alias("s"), F.max("v") + 1),
        "append",
    )
    bench.start()
    for i, rows in enumerate(AGG_STEPS[:4]):
        bench.step(f"step {i}", {inp: rows})


@pytest.mark.parametrize(
    "columns",
    [
        pytest.param(lambda: [F.sum(F.sum("v"))], id="nested_aggregate"),
        pytest.param(lambda: [F.col("v") + F.sum("v")], id="not_grouped"),
        pytest.param(lambda: [F.round(F.avg("v"), 2), F.col("ts")], id="not_grouped_alone"),
        pytest.param(lambda: [F.max(F.count("*") + 1)], id="nested_in_expression"),
    ],
)
def test_invalid_expressions_fail_as_in_spark(spark, ls, tmp_path, columns):
    """Spark's own analysis error, when the query is defined."""
    inp = str(tmp_path)
    with pytest.raises(AnalysisException) as native:
        spark.readStream.schema(SCHEMA).json(inp).groupBy("k").agg(*columns())
    with pytest.raises(AnalysisException) as got:
        ls.readStream.schema(SCHEMA).json(inp).groupBy("k").agg(*columns())
    assert headline(got.value) == headline(native.value)
    assert got.value.getCondition() == native.value.getCondition()


def test_unsupported_aggregate_inside_an_expression_is_named(ls, tmp_path):
    """A function lockgate's streaming aggregation does not run is refused by name also
    inside an expression, and a distinct aggregate with Spark's streaming message."""
    df = ls.readStream.schema(SCHEMA).json(str(tmp_path))
    with pytest.raises(NotSupportedYetError, match="percentile_approx"):
        df.groupBy("k").agg(F.round(F.percentile_approx("v", 0.5), 1))
    with pytest.raises(AnalysisException, match="Distinct aggregations are not supported"):
        df.groupBy("k").agg(F.count_distinct("v") + 1)

"""Differential tests: each query runs on native Spark Structured Streaming (the oracle)
and on lockgate; sink rows, batches and progress must agree after every step."""

from __future__ import annotations

import time

import pytest
from differential import Differential, write_csv, write_json, write_parquet, write_text
from pyspark.errors import AnalysisException
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQueryListener
from pyspark.sql.types import LongType

SCHEMA = "id LONG, name STRING, score DOUBLE"


def rows(start: int, n: int) -> list[dict]:
    return [{"id": i, "name": f"n{i % 3}", "score": i * 1.5} for i in range(start, start + n)]


@pytest.fixture
def diff(spark, ls, tmp_path):
    """``diff(query_fn, **options)`` -> a Differential; both queries stop at teardown."""
    made: list[Differential] = []

    def make(query_fn, **options):
        d = Differential(spark, ls, tmp_path / f"q{len(made)}", query_fn, **options)
        made.append(d)
        return d

    yield make
    for d in made:
        d.stop()


@pytest.fixture
def inp(tmp_path):
    path = tmp_path / "in"
    path.mkdir()
    return path


def json_stream(inp, schema=SCHEMA, **options):
    return lambda rs: rs.schema(schema).options(**options).json(str(inp))


# -- sources ---------------------------------------------------------------------------


def test_json_source(diff, inp):
    d = diff(json_stream(inp))
    write_json(inp, rows(0, 3))
    assert len(d.run()) == 3
    write_json(inp, rows(3, 2))
    assert len(d.run()) == 5
    assert len(d.run()) == 5  # nothing new: no batch on either side


def test_csv_source_with_header_and_schema(diff, inp):
    d = diff(lambda rs: rs.schema(SCHEMA).option("header", True).csv(str(inp)))
    write_csv(inp, [(1, "a", 0.5), (2, "b", 2.25)], header=["id", "name", "score"])
    assert len(d.run()) == 2
    write_csv(inp, [(3, "c", -1.0)], header=["id", "name", "score"])
    assert len(d.run()) == 3


def test_parquet_source(diff, inp):
    d = diff(lambda rs: rs.schema(SCHEMA).parquet(str(inp)))
    write_parquet(inp, rows(0, 4))
    assert len(d.run()) == 4
    write_parquet(inp, rows(4, 3))
    assert len(d.run()) == 7


def test_text_source(diff, inp):
    d = diff(lambda rs: rs.text(str(inp)))
    write_text(inp, ["hello", "", "wörld  "])
    assert len(d.run()) == 3
    write_text(inp, ["again"])
    assert len(d.run()) == 4


def test_rate_micro_batch_available_now(diff):
    def query(rs):
        return (
            rs.format("rate-micro-batch")
            .option("rowsPerBatch", 7)
            .option("startTimestamp", 1_000)
            .option("advanceMillisPerBatch", 250)
            .load()
        )

    d = diff(query, sink="foreachBatch", trigger={"availableNow": True})
    assert len(d.run()) == 7
    assert len(d.run()) == 14
    assert [b for b, _ in d.batches()] == [0, 1]
    # every row of a batch carries the batch's start timestamp, advancing 250 ms per batch
    (first,), (second,) = ({row.timestamp for row in rows} for _, rows in d.native.batches)
    assert (second - first).total_seconds() == 0.25


# -- file source options -----------------------------------------------------------------


def test_max_files_per_trigger_default_trigger(diff, inp):
    d = diff(json_stream(inp, maxFilesPerTrigger=2), sink="foreachBatch")
    for i in range(5):
        write_json(inp, rows(10 * i, i + 1))
    d.run()
    assert [(b, len(r)) for b, r in d.batches()] == [(0, 3), (1, 7), (2, 5)]
    write_json(inp, rows(100, 2))
    d.run()
    assert [b for b, _ in d.batches()] == [0, 1, 2, 3]


def test_max_files_per_trigger_available_now(diff, inp):
    d = diff(
        json_stream(inp, maxFilesPerTrigger=2), sink="foreachBatch", trigger={"availableNow": True}
    )
    for i in range(3):
        write_json(inp, rows(10 * i, i + 1))
    d.run()
    assert [(b, len(r)) for b, r in d.batches()] == [(0, 3), (1, 3)]
    for i in range(3, 8):
        write_json(inp, rows(10 * i, 1))
    d.run()
    assert [(b, len(r)) for b, r in d.batches()][2:] == [(2, 2), (3, 2), (4, 1)]


def test_trigger_once_ignores_max_files_per_trigger(diff, inp):
    d = diff(json_stream(inp, maxFilesPerTrigger=1), sink="foreachBatch", trigger={"once": True})
    for i in range(3):
        write_json(inp, rows(10 * i, 2))
    d.run()
    assert [(b, len(r)) for b, r in d.batches()] == [(0, 6)]
    write_json(inp, rows(50, 1))
    d.run()
    assert [(b, len(r)) for b, r in d.batches()] == [(0, 6), (1, 1)]


def test_latest_first(diff, inp):
    d = diff(json_stream(inp, latestFirst=True, maxFilesPerTrigger=1), sink="foreachBatch")
    for i in range(3):
        write_json(inp, rows(10 * i, i + 1))
    d.run()
    # newest file (3 rows) first
    assert [(b, len(r)) for b, r in d.batches()] == [(0, 3), (1, 2), (2, 1)]


def test_permissive_mode_with_corrupt_record(diff, inp):
    schema = SCHEMA + ", _corrupt_record STRING"
    d = diff(json_stream(inp, schema, mode="PERMISSIVE"))
    write_json(inp, [{"id": 1, "name": "a", "score": 1.0}, "{not json", '{"id": "x"}'])
    assert len(d.run()) == 3
    write_json(inp, ['{"id": 2, "name": "b"', {"id": 3}])
    assert len(d.run()) == 5


def test_dropmalformed_mode(diff, inp):
    d = diff(json_stream(inp, mode="DROPMALFORMED"))
    write_json(inp, [{"id": 1, "name": "a", "score": 1.0}, "{not json", '{"id": "x"}', {"id": 2}])
    assert len(d.run()) == 2


# -- sinks and triggers --------------------------------------------------------------------


def test_memory_sink_trigger_available_now(diff, inp):
    d = diff(json_stream(inp), trigger={"availableNow": True})
    write_json(inp, rows(0, 3))
    write_json(inp, rows(3, 3))
    assert len(d.run()) == 6


def test_parquet_sink_partitioned_with_restart(diff, inp):
    d = diff(json_stream(inp), sink="parquet", partition_by=("name",))
    write_json(inp, rows(0, 5))
    assert len(d.run()) == 5
    d.restart()
    write_json(inp, rows(5, 4))
    assert len(d.run()) == 9
    write_json(inp, rows(9, 1))
    assert len(d.run()) == 10


def test_parquet_sink_available_now(diff, inp):
    d = diff(json_stream(inp, maxFilesPerTrigger=1), sink="parquet", trigger={"availableNow": True})
    write_json(inp, rows(0, 2))
    write_json(inp, rows(2, 2))
    assert len(d.run()) == 4
    write_json(inp, rows(4, 1))
    assert len(d.run()) == 5


def test_restart_foreach_batch(diff, inp):
    d = diff(json_stream(inp), sink="foreachBatch")
    write_json(inp, rows(0, 2))
    d.run()
    write_json(inp, rows(2, 2))
    d.run()
    d.restart()
    d.run()  # nothing new after the restart: no batch, no duplicate
    write_json(inp, rows(4, 3))
    assert len(d.run()) == 7
    assert [b for b, _ in d.batches()] == [0, 1, 2]


# -- operators -----------------------------------------------------------------------------

OPERATORS = {
    "select": lambda df: df.select("name", (F.col("id") * 2).alias("id2")),
    "selectExpr": lambda df: df.selectExpr("upper(name) AS n", "score + id AS s"),
    "where_column": lambda df: df.where(F.col("id") % 2 == 0),
    # not pushable into the file scan (see test_num_input_rows_with_filter_pushed_into_scan)
    "filter_sql": lambda df: df.filter("id % 2 = 1 OR score > 100"),
    "withColumn": lambda df: df.withColumn("half", F.col("score") / 2),
    "withColumns": lambda df: df.withColumns({"a": F.lit(1), "name": F.concat("name", F.lit("!"))}),
    "withColumnRenamed": lambda df: df.withColumnRenamed("name", "label"),
    "drop": lambda df: df.drop("score"),
    "alias": lambda df: df.alias("t").select("t.id", "t.name"),
    "explode": lambda df: df.select(
        "id", F.explode(F.sequence(F.lit(1), F.col("id") % 3 + 1)).alias("k")
    ),
}


@pytest.mark.parametrize("op", list(OPERATORS))
def test_operator(diff, inp, op):
    d = diff(lambda rs: OPERATORS[op](json_stream(inp)(rs)))
    write_json(inp, rows(0, 4))
    assert len(d.run()) > 0
    write_json(inp, rows(4, 3))
    d.run()


def test_union_of_two_file_streams(diff, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    d = diff(lambda rs: json_stream(a)(rs).union(json_stream(b)(rs)), sink="foreachBatch")
    write_json(a, rows(0, 2))
    assert len(d.run()) == 2
    write_json(b, rows(10, 3))
    assert len(d.run()) == 5
    write_json(a, rows(20, 1))
    assert len(d.run()) == 6


def test_union_by_name(diff, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()

    def query(rs):
        left = rs.schema("id LONG, name STRING").json(str(a))
        right = rs.schema("name STRING, id LONG, extra INT").json(str(b))
        return left.unionByName(right, allowMissingColumns=True)

    d = diff(query, trigger={"availableNow": True}, sink="foreachBatch")
    write_json(a, [{"id": 1, "name": "x"}])
    write_json(b, [{"id": 2, "name": "y", "extra": 7}])
    assert len(d.run()) == 2


@pytest.mark.parametrize("how", ["inner", "left_outer"])
def test_join_with_static(diff, inp, spark, how):
    static = spark.createDataFrame(
        [("n0", "zero"), ("n1", "one"), ("n1", "uno")], "name STRING, word STRING"
    )
    d = diff(lambda rs: json_stream(inp)(rs).join(static, "name", how))
    write_json(inp, rows(0, 3))
    assert len(d.run()) == (3 if how == "inner" else 4)
    write_json(inp, rows(3, 2))
    d.run()


def test_python_udf(diff, inp):
    @F.udf(LongType())
    def digits(name, i):
        return len(name) * 100 + i

    d = diff(lambda rs: json_stream(inp)(rs).select("id", digits("name", "id").alias("d")))
    write_json(inp, rows(0, 3))
    assert len(d.run()) == 3


def test_map_in_pandas(diff, inp):
    def double(batches):
        for pdf in batches:
            pdf = pdf[pdf["id"] % 2 == 1]
            yield pdf.assign(score=pdf["score"] * 2)

    d = diff(lambda rs: json_stream(inp)(rs).mapInPandas(double, SCHEMA))
    write_json(inp, rows(0, 5))
    assert len(d.run()) == 2


def test_grouped_map_runs_per_batch(diff, inp):
    """groupBy().applyInPandas / applyInArrow on a stream: Spark applies the function to
    each group of each micro-batch, without state; so does lockgate."""
    import pyarrow as pa
    import pyarrow.compute as pc

    def summary(key, pdf):
        return pdf.head(1).assign(id=len(pdf), score=pdf["score"].sum())

    def arrow_summary(table):
        return pa.table({"name": table["name"][:1], "n": pa.array([table.num_rows], pa.int64()),
                         "top": pa.array([pc.max(table["score"]).as_py()], pa.float64())})

    pandas = diff(lambda rs: json_stream(inp)(rs).groupBy("name").applyInPandas(summary, SCHEMA))
    arrow = diff(
        lambda rs: json_stream(inp)(rs).groupBy(F.col("name")).applyInArrow(arrow_summary, "name STRING, n LONG, top DOUBLE")
    )
    for step in range(2):
        write_json(inp, rows(step * 5, 5))
        assert len(pandas.run()) == 3 * (step + 1)  # one row per name and batch
        assert len(arrow.run()) == 3 * (step + 1)


def test_with_watermark_stateless(diff, inp):
    schema = "id LONG, ts TIMESTAMP"
    d = diff(lambda rs: rs.schema(schema).json(str(inp)).withWatermark("ts", "10 seconds"))
    write_json(
        inp, [{"id": 1, "ts": "2024-01-01T00:00:05Z"}, {"id": 2, "ts": "2024-01-01T00:00:30"}]
    )
    assert len(d.run()) == 2
    write_json(inp, [{"id": 3, "ts": "2024-01-01T00:00:01Z"}])  # late, but nothing drops it
    assert len(d.run()) == 3
    native, lockgate = (s.query.lastProgress.eventTime for s in d.sides)
    assert lockgate == native


# -- progress --------------------------------------------------------------------------------


def test_num_input_rows_with_filter_pushed_into_scan(diff, inp):
    d = diff(lambda rs: json_stream(inp)(rs).where("score > 3"))
    write_json(inp, rows(0, 4))
    assert len(d.run()) == 1


def test_num_input_rows_with_partition_and_data_filters(diff, tmp_path):
    """Spark's scan prunes the files of other partitions and its JSON reader skips the
    rows a pushed data filter removes, before numInputRows counts them; a filter it
    cannot push (``id % 2 = 0``) is applied after the count."""
    inp = tmp_path / "in"
    for part in ("a", "b"):
        (inp / f"part={part}").mkdir(parents=True)
    schema = SCHEMA + ", part STRING"
    d = diff(lambda rs: rs.schema(schema).json(str(inp)).where("part = 'a' AND score > 1 AND id % 2 = 0"))
    write_json(inp / "part=a", rows(0, 5))
    write_json(inp / "part=b", rows(5, 4))
    assert len(d.run()) == 2


def test_idle_trigger_progress(diff, inp):
    d = diff(json_stream(inp), sink="foreachBatch")
    d.run()  # empty directory: no batch, one idle trigger at least
    native, lockgate = (
        [(p.batchId, p.numInputRows, "addBatch" not in p.durationMs) for p in q.recentProgress]
        for q in (d.native.query, d.lockgate.query)
    )
    assert native == [(0, 0, True)]
    assert lockgate == native


class _EventLog(StreamingQueryListener):
    """Events by query id (spark.streams' listeners also get lockgate's events)."""

    def __init__(self):
        self.by_query = {}

    def _add(self, query_id, text):
        self.by_query.setdefault(str(query_id), []).append(text)

    def onQueryStarted(self, event):
        self._add(event.id, "started")

    def onQueryProgress(self, event):
        self._add(event.progress.id, f"progress {event.progress.batchId}")

    def onQueryIdle(self, event):
        self._add(event.id, "idle")

    def onQueryTerminated(self, event):
        self._add(event.id, "terminated")


def test_listener_events(diff, inp, spark, ls):
    logs = {"native": _EventLog(), "lockgate": _EventLog()}
    spark.streams.addListener(logs["native"])
    ls.streams.addListener(logs["lockgate"])
    try:
        d = diff(json_stream(inp), sink="foreachBatch")
        d.run()
        write_json(inp, rows(0, 2))
        d.run()
        ids = {"native": str(d.native.query.id), "lockgate": str(d.lockgate.query.id)}
        d.stop()
        deadline = time.monotonic() + 30  # native listener events arrive asynchronously
        while time.monotonic() < deadline and any(
            logs[name].by_query.get(ids[name], [])[-1:] != ["terminated"] for name in logs
        ):
            time.sleep(0.1)
    finally:
        spark.streams.removeListener(logs["native"])
        ls.streams.removeListener(logs["lockgate"])
    assert logs["native"].by_query[ids["native"]] == ["started", "progress 0", "terminated"]
    assert logs["lockgate"].by_query == {ids["lockgate"]: logs["native"].by_query[ids["native"]]}


def test_memory_sink_append_does_not_recover_from_checkpoint(spark, ls, inp, tmp_path):
    write_json(inp, rows(0, 2))
    for name, reader in (("native", lambda: spark.readStream), ("lockgate", lambda: ls.readStream)):
        checkpoint = str(tmp_path / f"checkpoint_{name}")

        def start(reader=reader, name=name, checkpoint=checkpoint):
            return (
                json_stream(inp)(reader())
                .writeStream.format("memory")
                .queryName(f"memory_recovery_{name}")
                .option("checkpointLocation", checkpoint)
                .start()
            )

        query = start()
        query.processAllAvailable()
        query.stop()
        with pytest.raises(AnalysisException, match="does not support recovering from checkpoint"):
            start().stop()


def test_observed_metrics_in_progress(diff, inp, ls):
    """observe(name, ...) on a stream: each batch's progress reports the metrics under
    the query's names (observedMetrics), as Spark's; an Observation object and a name
    used twice for other metrics fail as in Spark."""
    from pyspark.errors import IllegalArgumentException
    from pyspark.sql import Observation

    def query(rs):
        df = json_stream(inp)(rs).observe("rows", F.count(F.lit(1)).alias("n"), F.max("id").alias("top"))
        return df.where("id % 2 = 0").observe("even", F.sum("score").alias("s"), F.min("name").alias("first"))

    d = diff(query)
    for step in range(2):
        write_json(inp, rows(step * 4, 4 - step))
        d.run()
        metrics = [
            [(p.batchId, {k: v.asDict() for k, v in p.observedMetrics.items()}) for p in side.batch_progress()]
            for side in (d.native, d.lockgate)
        ]
        assert metrics[1] == metrics[0], f"observedMetrics differ: native, lockgate = {metrics}"
        assert metrics[0][-1][1]["rows"]["n"] == 4 - step
    with pytest.raises(IllegalArgumentException, match="Observation does not support streaming"):
        json_stream(inp)(ls.readStream).observe(Observation("o"), F.count(F.lit(1)))
    with pytest.raises(AnalysisException, match="DUPLICATED_METRICS_NAME"):
        json_stream(inp)(ls.readStream).observe("m", F.count(F.lit(1))).observe("m", F.max("id"))


# Plans Spark's optimizer empties (the batch runs as an empty relation, the source's
# scan and lockgate's observations with it): no rows, and the input rows Spark reports.
EMPTIED = {
    "limit_0": lambda df: df.limit(0),
    "where_false": lambda df: df.where(F.lit(False)),
    "limit_0_then_select": lambda df: df.limit(0).select("name"),
}


@pytest.mark.parametrize("op", list(EMPTIED))
def test_plan_spark_empties(diff, inp, op):
    d = diff(lambda rs: EMPTIED[op](json_stream(inp)(rs)), sink="foreachBatch")
    write_json(inp, rows(0, 4))
    assert d.run() == []
    write_json(inp, rows(4, 3))
    d.run()
    assert [b for b, _ in d.batches()] == [0, 1]


# -- numInputRows of a source the plan reads more than once -------------------------------


def test_num_input_rows_of_a_stream_unioned_with_itself(diff, inp):
    """Spark counts a source's rows once per scan of it: ``df.union(df)`` reads it twice."""

    def query(rs):
        df = json_stream(inp)(rs)
        return df.union(df)

    d = diff(query, sink="foreachBatch")
    write_json(inp, rows(0, 3))
    assert len(d.run()) == 6
    write_json(inp, rows(3, 2))
    assert len(d.run()) == 10


def test_num_input_rows_of_a_rate_stream_read_by_both_sides_of_a_join(diff):
    def query(rs):
        df = rs.format("rate-micro-batch").option("rowsPerBatch", 9).option("startTimestamp", 1_000).load()
        return df.join(df.select(F.col("value").alias("v2")), F.col("value") == F.col("v2"))

    d = diff(query, sink="foreachBatch", trigger={"availableNow": True})
    assert len(d.run()) == 9
    assert len(d.run()) == 18

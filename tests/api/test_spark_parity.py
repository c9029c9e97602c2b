"""What a PySpark user types behaves as in Spark (issue 18): intervals parsed by Spark,
named sources, clusterBy, error classes. Each case runs the same call on native
``spark.readStream``/``writeStream`` and on lockgate and compares."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from differential import spark_conf, unique
from pyspark.errors import PySparkException
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQueryListener

import lockgate
from lockgate import MemoryStream
from lockgate.plan.nodes import EventTimeWatermark


def _outcome(call: Any) -> tuple[str, ...]:
    """What a call did: its result kind, or its error's PySpark family, condition and
    message (without SQLSTATE and JVM stack)."""
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - comparing what each engine raises
        family = next(
            (c.__name__ for c in type(exc).__mro__ if c.__module__.startswith("pyspark.errors")),
            type(exc).__name__,
        )
        condition = exc.getCondition() if isinstance(exc, PySparkException) else None
        message = str(exc).split("SQLSTATE")[0].split("\n\tat ")[0].strip()
        return ("error", family, str(condition), message)
    return ("ok",)


def _native(spark: Any) -> Any:
    return spark.readStream.format("rate").load()


def _lockgate(ls: Any) -> Any:
    return ls.readStream.format("rate").load()


# -- intervals: Spark's parser, Spark's errors (item 4) ---------------------------------------

DELAYS = [
    "1 month", "1 year", "100 microseconds", "1 week", "interval 2 days", "1 day -1 hour",
    "1.5 seconds", "10 seconds", "10", "5 m", "10 seconds 3 ms", "0.5 hours", "1 foo",
    "-1 second", " ", "",
]


@pytest.mark.parametrize("delay", DELAYS)
def test_watermark_delay_parsed_as_spark(spark, ls, delay):
    assert _outcome(lambda: _lockgate(ls).withWatermark("timestamp", delay)) == _outcome(
        lambda: _native(spark).withWatermark("timestamp", delay)
    )


@pytest.mark.parametrize(
    ("delay", "ms"),
    [
        ("1 month", 31 * 86_400_000),  # Spark's EventTimeWatermark.getDelayMs: 31 days
        ("1 year", 12 * 31 * 86_400_000),
        ("100 microseconds", 0),
        ("1 day -1 hour", 23 * 3_600_000),
        ("interval 1 minute 30 seconds", 90_000),
    ],
)
def test_watermark_delay_ms_is_sparks(spark, ls, delay, ms):
    sdf = _lockgate(ls).withWatermark("timestamp", delay)
    node = sdf._plan
    assert isinstance(node, EventTimeWatermark)
    assert node.delay_ms == ms
    # Spark's own number: the delay it puts in the event-time column's metadata
    native = _native(spark).withWatermark("timestamp", delay)
    field = native._jdf.queryExecution().analyzed().output().apply(0)
    assert int(field.metadata().getLong("spark.watermarkDelayMs")) == ms


def test_watermark_of_a_month_runs_and_records_its_delay(spark, ls, tmp_path):
    stream = MemoryStream(ls, "ts TIMESTAMP, v INT")
    counts = (
        stream.toDF().withWatermark("ts", "1 month")
        .groupBy(F.window("ts", "1 day")).count()
    )
    q = (
        counts.writeStream.format("memory").queryName(unique("month")).outputMode("update")
        .option("checkpointLocation", str(tmp_path / "ck")).start()
    )
    try:
        import datetime as dt

        stream.addData([(dt.datetime(2024, 3, 1), 1)])
        q.processAllAvailable()
        stream.addData([(dt.datetime(2024, 1, 1), 2)])
        q.processAllAvailable()
        # watermark = 2024-03-01 - 31 days = 2024-01-30: the January row is late
        assert q.lastProgress.eventTime["watermark"] == "2024-01-30T00:00:00.000Z"
    finally:
        q.stop()


TRIGGER_INTERVALS = [
    "10 seconds", "1 minute", "100 microseconds", "1.5 seconds", "interval 2 days",
    "10", "5 m", "1 month", "1 year", "-1 second", "0.5 hours", "10 seconds 3 ms", "", "  ",
]


@pytest.mark.parametrize("kind", ["processingTime", "continuous"])
@pytest.mark.parametrize("interval", TRIGGER_INTERVALS)
def test_trigger_interval_parsed_as_spark(spark, ls, kind, interval):
    assert _outcome(lambda: _lockgate(ls).writeStream.trigger(**{kind: interval})) == _outcome(
        lambda: _native(spark).writeStream.trigger(**{kind: interval})
    )


@pytest.mark.parametrize(
    ("text", "ms"),
    [("10 seconds", 10_000), ("1.5 seconds", 1_500), ("1 day -1 hour", 82_800_000),
     ("100 microseconds", 0), ("interval 1 week", 604_800_000)],
)
def test_trigger_interval_ms_is_sparks(spark, ls, text, ms):
    writer = _lockgate(ls).writeStream.trigger(processingTime=text)
    native = spark._jvm.org.apache.spark.sql.streaming.Trigger.ProcessingTime(text)
    assert writer._trigger.interval_ms == int(native.intervalMs()) == ms
    assert _lockgate(ls).writeStream.trigger(continuous=text)._trigger.interval_ms == ms


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"once": True, "availableNow": True}, {"processingTime": "1 second", "once": True},
     {"once": False}, {"availableNow": False}, {"availableNow": "yes"}],
)
def test_trigger_argument_errors_as_pysparks(spark, ls, kwargs):
    assert _outcome(lambda: _lockgate(ls).writeStream.trigger(**kwargs)) == _outcome(
        lambda: _native(spark).writeStream.trigger(**kwargs)
    )


def test_real_time_trigger_is_refused_clearly(ls):
    with pytest.raises(lockgate.NotSupportedYetError, match="realTime"):
        _lockgate(ls).writeStream.trigger(realTime="5 seconds")


@pytest.mark.parametrize("value", ["7d", "10s", "500ms", "2h", "7 days", "soon", "1.5s"])
def test_max_file_age_parsed_as_spark_time_string(spark, ls, tmp_path, value):
    from lockgate.options import Options

    jvm = spark._jvm
    try:
        expected: Any = int(jvm.org.apache.spark.network.util.JavaUtils.timeStringAsMs(value))
    except Exception:  # noqa: BLE001 - Spark refuses it
        expected = None
    opts = Options({"maxFileAge": value}, owner="file source option")
    if expected is None:
        with pytest.raises(lockgate.OptionError, match="maxFileAge"):
            opts.get_time_ms("maxFileAge")
    else:
        assert opts.get_time_ms("maxFileAge") == expected


# -- DataStreamReader.name, DataStreamWriter.clusterBy (item 5) -------------------------------


@pytest.mark.parametrize("name", ["src_1", "a b", "", "é", "x-y", 3, None])
def test_source_name_as_spark(spark, ls, name):
    assert _outcome(lambda: ls.readStream.format("rate").name(name).load()) == _outcome(
        lambda: spark.readStream.format("rate").name(name).load()
    )


def test_source_evolution_as_spark(spark, ls, tmp_path):
    """With source evolution on, every source must be named (Spark's error at start()),
    and a named source's offsets go to the v2 offsets log keyed by name, its files
    under sources/<name>, as Spark 4.3 writes them."""
    from pyspark.errors import AnalysisException

    with spark_conf(spark, "spark.sql.streaming.queryEvolution.enableSourceEvolution", "true"):
        for session in (spark, ls):
            with pytest.raises(AnalysisException, match="UNNAMED_STREAMING_SOURCES_WITH_ENFORCEMENT"):
                session.readStream.format("rate").load()
        checkpoint = tmp_path / "named"
        q = (
            ls.readStream.format("rate").name("src_a").load()
            .writeStream.format("noop").option("checkpointLocation", str(checkpoint)).start()
        )
        try:
            q.processAllAvailable()
        finally:
            q.stop()
        lines = (checkpoint / "offsets" / "0").read_text().split("\n")
        assert lines[0] == "v2" and lines[2].startswith("src_a:")
        assert (checkpoint / "sources" / "src_a").is_dir()


@pytest.mark.parametrize("first, then", [("lockgate", "native"), ("native", "lockgate")])
def test_a_named_source_resumes_on_the_other_engine(spark, ls, tmp_path, first, then):
    """A checkpoint of named sources, written with source evolution on, resumed by the
    other engine: each batch reads only the files the last one did not. lockgate records
    the conf in its offsets log as Spark does; without it Spark resumes with source
    evolution off, keys the source by position and reads every file again."""
    from differential import write_json

    inp, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    inp.mkdir()
    readers = {"lockgate": lambda: ls.readStream, "native": lambda: spark.readStream}
    seen: list[tuple[str, int, list[int]]] = []

    def run(engine: str) -> None:
        q = (
            readers[engine]().schema("v LONG").name("src").json(str(inp))
            .writeStream.option("checkpointLocation", str(checkpoint))
            .foreachBatch(lambda df, b: seen.append((engine, b, sorted(r.v for r in df.collect()))))
            .start()
        )
        try:
            q.processAllAvailable()
        finally:
            q.stop()

    with spark_conf(spark, "spark.sql.streaming.queryEvolution.enableSourceEvolution", "true"):
        write_json(inp, [{"v": 1}, {"v": 2}])
        run(first)
        write_json(inp, [{"v": 3}])
        run(then)
    assert seen == [(first, 0, [1, 2]), (then, 1, [3])]


def test_cluster_by_with_a_file_sink_writes_the_same_rows(spark, ls, tmp_path):
    def run(src: Any, name: str) -> list:
        out = tmp_path / name
        q = (
            src.format("rate-micro-batch").option("rowsPerBatch", 5).load()
            .writeStream.format("parquet").clusterBy("value").trigger(availableNow=True)
            .option("checkpointLocation", str(tmp_path / f"ck_{name}")).start(str(out))
        )
        q.awaitTermination()
        return sorted(r.value for r in spark.read.parquet(str(out)).collect())

    assert run(ls.readStream, "lg") == run(spark.readStream, "native") == [0, 1, 2, 3, 4]


@pytest.mark.parametrize(
    "configure",
    [lambda w: w.clusterBy("value").partitionBy("value"), lambda w: w.clusterBy("nope")],
    ids=["with-partitionBy", "missing-column"],
)
def test_cluster_by_errors_as_spark(spark, ls, tmp_path, configure):
    def start(sdf: Any, name: str) -> Any:
        q = configure(sdf.writeStream.format("parquet")).option(
            "checkpointLocation", str(tmp_path / f"ck_{name}")
        ).start(str(tmp_path / name))
        q.stop()

    lg, native = _outcome(lambda: start(_lockgate(ls), "lg")), _outcome(
        lambda: start(_native(spark), "native")
    )
    assert lg == native and lg[0] == "error"


def test_cluster_by_to_table_records_the_clustering_columns(spark, ls, tmp_path):
    def clustering(table: str, src: Any) -> list:
        q = (
            src.format("rate-micro-batch").option("rowsPerBatch", 3).load()
            .writeStream.clusterBy("value").trigger(availableNow=True)
            .option("checkpointLocation", str(tmp_path / f"ck_{table}")).toTable(table)
        )
        q.awaitTermination()
        rows = spark.sql(f"DESCRIBE TABLE EXTENDED {table}").collect()
        at = [r.col_name for r in rows].index("# Clustering Information")
        cols = [r.col_name for r in rows[at + 2 :] if r.col_name]
        return [cols[0]] + sorted(r.value for r in spark.table(table).collect())

    lg, native = unique("cb_lg"), unique("cb_native")
    try:
        assert clustering(lg, ls.readStream) == clustering(native, spark.readStream) == [
            "value", 0, 1, 2
        ]
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {lg}")
        spark.sql(f"DROP TABLE IF EXISTS {native}")


# -- error classes (item 8) -------------------------------------------------------------------


@pytest.mark.parametrize("name", ["", "   ", None, 5])
def test_query_name_errors_as_pysparks(spark, ls, name):
    assert _outcome(lambda: _lockgate(ls).writeStream.queryName(name)) == _outcome(
        lambda: _native(spark).writeStream.queryName(name)
    )


class _NoProcess:
    def open(self, partition_id, epoch_id):
        return True


class _ProcessNotCallable:
    process = 3


class _CloseNotCallable:
    def process(self, row):
        pass

    close = "x"


@pytest.mark.parametrize("writer", [_NoProcess(), _ProcessNotCallable(), _CloseNotCallable()])
def test_foreach_writer_errors_as_pysparks(spark, ls, writer):
    lg = _outcome(lambda: _lockgate(ls).writeStream.foreach(writer))
    assert lg == _outcome(lambda: _native(spark).writeStream.foreach(writer))
    assert lg[2] == "ATTRIBUTE_NOT_CALLABLE"


class _Terminations(StreamingQueryListener):
    def __init__(self) -> None:
        self.events: list[Any] = []

    def onQueryStarted(self, event):
        pass

    def onQueryProgress(self, event):
        pass

    def onQueryIdle(self, event):
        pass

    def onQueryTerminated(self, event):
        self.events.append(event)


def _fail_fb(df, batch_id):
    raise ValueError("boom in foreachBatch")


def _foreach_failing(sdf: Any) -> Any:
    def fail(row: Any) -> None:  # nested: pickled by value, the executors need not import tests
        raise ValueError("boom in foreach")

    return sdf.writeStream.foreach(fail)


FAILURES = {
    "foreachBatch": lambda sdf: sdf.writeStream.foreachBatch(_fail_fb),
    "foreach": _foreach_failing,
    "divide-by-zero": lambda sdf: sdf.select(
        (F.col("value") / 0).cast("int").alias("x")
    ).writeStream.format("noop"),
}


def _failure(streams: Any, sdf: Any, how: str) -> tuple[Any, Any]:
    listener = _Terminations()
    streams.addListener(listener)
    try:
        q = FAILURES[how](sdf).trigger(availableNow=True).start()
        with pytest.raises(Exception) as info:
            q.awaitTermination()
        deadline = time.monotonic() + 60
        while not listener.events and time.monotonic() < deadline:  # the listener bus is async
            time.sleep(0.05)
        return info.value, listener.events[0]
    finally:
        streams.removeListener(listener)


@pytest.mark.parametrize("how", sorted(FAILURES))
def test_streaming_query_exception_carries_what_pysparks_carries(spark, ls, how):
    def source(reader: Any) -> Any:
        return reader.format("rate-micro-batch").option("rowsPerBatch", 3).load()

    native, native_event = _failure(spark.streams, source(spark.readStream), how)
    lg, lg_event = _failure(ls.streams, source(ls.readStream), how)
    assert isinstance(lg, type(native).__mro__[2])  # pyspark.errors' StreamingQueryException
    assert lg.getCondition() == native.getCondition() == "STREAM_FAILED"
    assert lg.getSqlState() == native.getSqlState() == "XXKST"
    params, native_params = lg.getMessageParameters(), native.getMessageParameters()
    assert set(params) == set(native_params) == {"id", "runId", "message"}
    for exc, event in ((lg, lg_event), (native, native_event)):
        p = exc.getMessageParameters()
        assert str(exc).startswith(
            f"[STREAM_FAILED] Query [id = {p['id']}, runId = {p['runId']}] terminated with "
            f"exception: "
        )
    # the cause's error class, in the message and in the terminated event
    cause_class = re.match(r"\[([A-Z_.]+)\]", native_params["message"])
    lg_cause_class = re.match(r"\[([A-Z_.]+)\]", params["message"])
    assert cause_class is not None and lg_cause_class is not None
    assert native_event.errorClassOnException == cause_class.group(1)
    if how == "foreach":
        # native runs the writer in its write task (PYTHON_EXCEPTION); lockgate in a
        # foreachPartition job, whose failure Spark reports as the job's
        assert lg_event.errorClassOnException is not None
    else:
        assert lg_cause_class.group(1) == cause_class.group(1)
        assert lg_event.errorClassOnException == native_event.errorClassOnException
    assert "boom" in params["message"] or how == "divide-by-zero"


def test_foreach_batch_failure_is_foreach_batch_user_function_error(ls):
    exc, event = _failure(
        ls.streams, ls.readStream.format("rate-micro-batch").option("rowsPerBatch", 1).load(),
        "foreachBatch",
    )
    assert event.errorClassOnException == "FOREACH_BATCH_USER_FUNCTION_ERROR"
    assert exc.getMessageParameters()["message"].startswith(
        "[FOREACH_BATCH_USER_FUNCTION_ERROR] An error occurred in the user provided function "
        "in foreach batch sink. Reason: "
    )
    assert isinstance(exc.cause.__cause__, ValueError)


def test_to_table_in_a_format_lockgate_cannot_write_creates_nothing(spark, ls, tmp_path):
    table = unique("ice")
    with pytest.raises((lockgate.OptionError, lockgate.NotSupportedYetError), match="iceberg"):
        _lockgate(ls).writeStream.format("iceberg").option(
            "checkpointLocation", str(tmp_path / "ck")
        ).toTable(table)
    assert not spark.catalog.tableExists(table)
    with pytest.raises(Exception, match="iceberg"):
        _native(spark).writeStream.format("iceberg").option(
            "checkpointLocation", str(tmp_path / "ck2")
        ).toTable(table)
    assert not spark.catalog.tableExists(table)


@pytest.mark.parametrize(
    "call",
    [
        lambda df: df.na.drop(),
        lambda df: df.na.drop(subset=["value"]),
        lambda df: df.na.fill(0),
        lambda df: df.na.replace(1, 2),
        # fractions 0 and 1: the rows do not depend on how a batch is partitioned
        lambda df: df.stat.sampleBy("value", {0: 1.0, 1: 0.0}, seed=1),
    ],
    ids=["na.drop", "na.drop-subset", "na.fill", "na.replace", "stat.sampleBy"],
)
def test_na_and_stat_row_operations_run_as_spark(spark, ls, tmp_path, call):
    def run(reader: Any, name: str) -> list:
        sdf = reader.format("rate-micro-batch").option("rowsPerBatch", 10).load()
        sdf = sdf.select(F.when(F.col("value") % 3 == 0, None).otherwise(F.col("value") % 2).alias("value"))
        q = call(sdf).writeStream.format("memory").queryName(name).trigger(availableNow=True).start()
        q.awaitTermination()
        return sorted(str(r) for r in spark.table(name).collect())

    assert run(ls.readStream, unique("na_lg")) == run(spark.readStream, unique("na_native"))


@pytest.mark.parametrize(
    "call",
    [
        lambda df: df.stat.corr("value", "value"),
        lambda df: df.stat.cov("value", "value"),
        lambda df: df.stat.approxQuantile("value", [0.5], 0.1),
        lambda df: df.stat.crosstab("value", "value"),
    ],
    ids=["corr", "cov", "approxQuantile", "crosstab"],
)
def test_stat_batch_operations_refused_as_spark(spark, ls, call):
    lg, native = _outcome(lambda: call(_lockgate(ls))), _outcome(lambda: call(_native(spark)))
    assert lg[:2] == native[:2] == ("error", "AnalysisException")
    assert lg[3].split(";")[0] in native[3]

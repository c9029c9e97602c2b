"""Kafka to Kafka end-to-end latency on both engines, as Spark's ``RTMKafka*`` benchmarks.

    .venv/bin/python -m bench.kafka_latency                  # every query (= bench.run --kafka-latency)
    .venv/bin/python -m bench.kafka_latency --seconds 60 --rate 1000 --warmup 15 --queries stateless,dedup

One process, one SparkSession (with Spark's Kafka connector on ``spark.jars``), one
Apache Kafka broker on loopback (``bench/kafka_broker.py``, started here). For every query
and engine, one after the other (never two queries at once), on fresh topics of one
partition each:

1. the query starts, reading its input topic from the earliest offset and writing to its
   output topic with the ``kafka`` sink;
2. a producer thread (confluent-kafka, ``linger.ms=0``) sends a pair of records every
   half second until the first output record is in the output topic (the query is up);
3. the producer thread sends ``--rate`` records/s for ``--seconds``, paced in 5 ms steps.
   Each record: key ``k<seq % keys>``, value ``<seq>,<event_ms>,<source_ms>`` with
   ``source_ms`` the wall clock (ms) at ``produce()``, ``event_ms`` the source time of the
   pair's first record (records ``2i`` and ``2i+1`` are one event sent twice);
4. the query is drained (``processAllAvailable``) and stopped; a ``read_committed``
   consumer reads the output topic. Every output record ends in the source time of the
   input record it stands for (the largest one for a window count row), and its
   latency is the output record's Kafka CreateTime minus that source time. Records whose
   source time falls in the first ``--warmup`` seconds are dropped; p50 and p99 (nearest
   rank) are reported.

The queries (``k``, ``seq``, ``event_time``, ``source_ms`` parsed from key and value):

* ``stateless``: ``value = concat(upper(key), ",", value)`` (no parsing);
* ``dedup``: ``withWatermark(event_time, 10 s).dropDuplicates([id, event_time])`` with
  ``id = seq div 2`` (every event arrives twice, half the records are dropped);
* ``window``: ``withWatermark(event_time, 10 s).groupBy(window(event_time, 1 minute),
  k).agg(count, max(source_ms))`` over ``--keys`` keys, update mode.

Engines: ``native`` (Spark's micro-batch engine, default trigger, Spark's at-least-once
Kafka sink), ``lockgate`` (lockgate's micro-batch engine, default trigger, its default
exactly-once transactional sink), and for ``stateless`` ``lockgate-continuous``
(``trigger(continuous="1 second")``, ``option("exactlyOnce", "false")``: Spark's
at-least-once continuous writes). ``--engines`` may add ``lockgate-at-least-once``
(lockgate micro-batch with ``exactlyOnce=false``), which tells the exactly-once sink's
share of lockgate's figures, and ``lockgate-python-writer`` (exactly once with the
librdkafka writer instead of lockgate's JVM writer, ``lockgate.jars()``). See docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.common import (
    RESULTS_DIR,
    BenchError,
    close_run,
    fmt,
    loadavg,
    log_table,
    percentile,
    ratio,
)
from bench.kafka_broker import KafkaBroker, broker_problem, connector_jars, read_classpath
from lockgate.sinks.kafka_jvm import WRITER_CONF

QUERIES = ("stateless", "dedup", "window")
ENGINES = ("native", "lockgate", "lockgate-continuous")
EXTRA_ENGINES = ("lockgate-at-least-once", "lockgate-python-writer")
"""Run only when named in ``--engines``: lockgate micro-batch with ``exactlyOnce=false``,
to tell the exactly-once sink's share of lockgate's latency; and lockgate micro-batch
exactly once with the librdkafka writer (``spark.lockgate.kafka.transactionalWriter`` =
``python``), where ``lockgate`` writes with lockgate's JVM writer (when built)."""
CONTINUOUS_QUERIES = ("stateless",)
SINK_MODE = {
    "native": "Spark's Kafka sink (at least once)",
    "lockgate": "lockgate's Kafka sink, exactly once (transactions; read with read_committed)",
    "lockgate-continuous": "lockgate's continuous Kafka sink, exactlyOnce=false (at least once)",
    "lockgate-at-least-once": "lockgate's Kafka sink, exactlyOnce=false (at least once)",
    "lockgate-python-writer": "lockgate's Kafka sink, exactly once, librdkafka's transactions",
}
WATERMARK = "10 seconds"
CONTINUOUS_INTERVAL = "1 second"
PACE_S = 0.005
READY_TIMEOUT_S = 300.0
DRAIN_TIMEOUT_S = 300.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.kafka_latency", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--queries", default=",".join(QUERIES), help="comma-separated, of " + ",".join(QUERIES)
    )
    parser.add_argument(
        "--engines",
        default=",".join(ENGINES),
        help="comma-separated, of "
        + ",".join(ENGINES + EXTRA_ENGINES)
        + " (continuous runs the stateless query only; default: all but lockgate-at-least-once)",
    )
    parser.add_argument(
        "--seconds", type=float, default=60.0, help="seconds of input per query and engine"
    )
    parser.add_argument("--rate", type=int, default=1000, help="input records per second")
    parser.add_argument(
        "--warmup", type=float, default=15.0, help="seconds of input dropped at the start"
    )
    parser.add_argument(
        "--keys", type=int, default=1000, help="distinct keys (the window count's groups)"
    )
    parser.add_argument(
        "--kafka-io",
        default="auto",
        choices=("auto", "jvm", "python"),
        help="spark.lockgate.kafka.io: lockgate's Kafka reader and at-least-once writer "
        "(auto: Spark's connector, which the benchmark's session has; python: librdkafka)",
    )
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--shuffle-partitions", type=int, default=2)
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--results-dir", default=RESULTS_DIR)
    args = parser.parse_args(argv)
    args.queries = [q for q in args.queries.split(",") if q]
    args.engines = [e for e in args.engines.split(",") if e]
    for name, known in (("query", QUERIES), ("engine", ENGINES + EXTRA_ENGINES)):
        for value in args.queries if name == "query" else args.engines:
            if value not in known:
                parser.error(f"unknown {name} {value!r}: one of {', '.join(known)}")
    if args.warmup >= args.seconds:
        parser.error(f"--warmup ({args.warmup}) must be less than --seconds ({args.seconds})")
    return args


# -- the queries -----------------------------------------------------------------------------
def _parsed(df: Any) -> Any:
    from pyspark.sql import functions as F

    fields = F.split(F.col("value").cast("string"), ",")
    return df.select(
        F.col("key").cast("string").alias("k"),
        fields.getItem(0).cast("long").alias("seq"),
        (fields.getItem(1).cast("long") / 1000).cast("timestamp").alias("event_time"),
        fields.getItem(2).cast("long").alias("source_ms"),
    )


def stateless(df: Any) -> Any:
    """The value behind the upper-cased key (no arrays: a continuous task evaluates it)."""
    from pyspark.sql import functions as F

    key = F.col("key").cast("string")
    return df.select(
        key.alias("key"),
        F.concat(F.upper(key), F.lit(","), F.col("value").cast("string")).alias("value"),
    )


def dedup(df: Any) -> Any:
    from pyspark.sql import functions as F

    rows = _parsed(df).withColumn("id", F.expr("seq div 2"))
    return (
        rows.withWatermark("event_time", WATERMARK)
        .dropDuplicates(["id", "event_time"])
        .select(F.col("k").alias("key"), F.concat_ws(",", "id", "source_ms").alias("value"))
    )


def window_count(df: Any) -> Any:
    from pyspark.sql import functions as F

    rows = _parsed(df).withWatermark("event_time", WATERMARK)
    counts = rows.groupBy(F.window("event_time", "1 minute"), F.col("k")).agg(
        F.count("*").alias("n"), F.max("source_ms").alias("source_ms")
    )
    return counts.select(
        F.col("k").alias("key"),
        F.concat_ws(",", F.col("window.start").cast("long"), "n", "source_ms").alias("value"),
    )


BUILD: dict[str, tuple[Callable[[Any], Any], str]] = {
    "stateless": (stateless, "append"),
    "dedup": (dedup, "append"),
    "window": (window_count, "update"),
}


# -- the producer ----------------------------------------------------------------------------
class Producer(threading.Thread):
    """Sends records to ``topic``: pairs every half second until :meth:`go`, then ``rate``
    records/s for ``seconds``; records ``first_ms``/``last_ms`` of the timed phase."""

    def __init__(self, bootstrap: str, topic: str, *, rate: int, seconds: float, keys: int) -> None:
        super().__init__(name=f"producer-{topic}", daemon=True)
        from confluent_kafka import Producer as KafkaProducer

        self.producer = KafkaProducer(
            {"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": "all"}
        )
        self.topic, self.rate, self.seconds, self.keys = topic, rate, seconds, keys
        self.seq = 0
        self.event_ms = 0
        self.timed = threading.Event()
        self.done = threading.Event()
        self.stopped = threading.Event()
        self.first_ms: int | None = None
        self.last_ms: int | None = None
        self.timed_records = 0
        self.errors: list[str] = []

    def _send(self) -> int:
        source_ms = int(time.time() * 1000)
        if self.seq % 2 == 0:
            self.event_ms = source_ms
        self.producer.produce(
            self.topic,
            key=f"k{self.seq % self.keys}".encode(),
            value=f"{self.seq},{self.event_ms},{source_ms}".encode(),
            on_delivery=self._report,
        )
        self.seq += 1
        return source_ms

    def _report(self, err: Any, _msg: Any) -> None:
        if err is not None and len(self.errors) < 10:
            self.errors.append(str(err))

    def go(self) -> None:
        self.timed.set()

    def stop(self) -> None:
        self.stopped.set()

    def run(self) -> None:
        try:
            while not self.timed.is_set() and not self.stopped.is_set():
                self._send()
                self._send()
                self.producer.poll(0)
                self.timed.wait(0.5)
            if self.stopped.is_set():
                return
            if self.seq % 2:  # the timed phase starts with a whole pair
                self._send()
            start = time.monotonic()
            total = int(self.rate * self.seconds)
            sent = 0
            while sent < total and not self.stopped.is_set():
                due = min(total, int((time.monotonic() - start) * self.rate) + 1)
                while sent < due:
                    ms = self._send()
                    if self.first_ms is None:
                        self.first_ms = ms
                    self.last_ms = ms
                    sent += 1
                self.producer.poll(0)
                time.sleep(PACE_S)
            self.timed_records = sent
            if self.producer.flush(60) != 0:
                self.errors.append("records still unsent 60 s after the last one")
        finally:
            self.done.set()


# -- the output ------------------------------------------------------------------------------
def read_output(bootstrap: str, topic: str) -> list[tuple[int, int]]:
    """``(create_time_ms, source_ms)`` of every committed record of ``topic`` (one partition)."""
    return read_topic(
        bootstrap, topic, lambda m: (int(m.timestamp()[1]), int(m.value().decode().rsplit(",", 1)[1]))
    )


def read_topic(bootstrap: str, topic: str, row: Callable[[Any], Any]) -> list[Any]:
    """``row(message)`` of every committed record of ``topic`` (one partition), in order."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"kafka-latency-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
        }
    )
    out: list[Any] = []
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            msgs = consumer.consume(10_000, timeout=1.0)
            eof = False
            for m in msgs:
                if m.error() is not None:
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        eof = True
                        continue
                    raise BenchError(f"reading {topic}: {m.error()}")
                out.append(row(m))
            if eof:
                return out
        raise BenchError(f"reading {topic}: no end of partition in 120 s ({len(out)} records read)")
    finally:
        consumer.close()


def latency_figures(records: list[tuple[int, int]], start_ms: int, end_ms: int) -> dict[str, Any]:
    """p50/p99/max of CreateTime - source time over the records sourced in [start_ms, end_ms]."""
    lat = [float(c - s) for c, s in records if start_ms <= s <= end_ms]
    return {
        "records": len(lat),
        "output_records": len(records),
        "p50_ms": percentile(lat, 50) if lat else None,
        "p99_ms": percentile(lat, 99) if lat else None,
        "max_ms": max(lat) if lat else None,
        "min_ms": min(lat) if lat else None,
    }


# -- one run ---------------------------------------------------------------------------------
def _wait(query: Any, engine: str, what: str, ready: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if not query.isActive:
            raise BenchError(f"{engine} query stopped while {what}: {query.exception()}")
        if time.monotonic() > deadline:
            raise BenchError(f"{engine}: {what} for {timeout:.0f} s")
        time.sleep(0.2)


def _drain(query: Any) -> bool:
    """processAllAvailable with a bound; False when it did not return in time."""
    box: list[BaseException] = []

    def run() -> None:
        try:
            query.processAllAvailable()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            box.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(DRAIN_TIMEOUT_S)
    if box:
        raise box[0]
    return not t.is_alive()


def _high_watermark(bootstrap: str, topic: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "kafka-latency-probe",
            "isolation.level": "read_committed",
        }
    )
    try:
        _low, high = consumer.get_watermark_offsets(
            TopicPartition(topic, 0), timeout=10, cached=False
        )
        return int(high)
    finally:
        consumer.close()


def run_one(
    spark: Any,
    ls: Any,
    broker: KafkaBroker,
    query: str,
    engine: str,
    args: argparse.Namespace,
    workdir: Path,
) -> dict[str, Any]:
    token = uuid.uuid4().hex[:8]
    source, sink = f"in-{query}-{engine}-{token}", f"out-{query}-{engine}-{token}"
    broker.create_topic(source)
    broker.create_topic(sink)
    build, mode = BUILD[query]
    readers = spark.readStream if engine == "native" else ls.readStream
    df = (
        readers.format("kafka")
        .option("kafka.bootstrap.servers", broker.bootstrap)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
        .load()
    )
    writer = (
        build(df)
        .writeStream.format("kafka")
        .outputMode(mode)
        .option("kafka.bootstrap.servers", broker.bootstrap)
        .option("topic", sink)
        .option("checkpointLocation", str(workdir / f"{query}-{engine}"))
    )
    if engine in ("lockgate-continuous", "lockgate-at-least-once"):
        writer = writer.option("exactlyOnce", "false")
    if engine == "lockgate-continuous":
        writer = writer.trigger(continuous=CONTINUOUS_INTERVAL)
    producer = Producer(
        broker.bootstrap, source, rate=args.rate, seconds=args.seconds, keys=args.keys
    )
    started = time.perf_counter()
    # the exactly-once writer, read when the query starts: lockgate's JVM writer by default
    # (when its jar is on the session), librdkafka for lockgate-python-writer
    spark.conf.set(WRITER_CONF, "python" if engine == "lockgate-python-writer" else "auto")
    q = writer.start()
    producer.start()
    drained = False
    durations: dict[str, float] = {}
    phases: dict[str, float] = {}
    mark = time.perf_counter()

    def phase(name: str) -> None:
        nonlocal mark
        now = time.perf_counter()
        phases[name] = round(now - mark, 2)
        mark = now

    try:
        _wait(
            q,
            engine,
            "waiting for its first output record",
            lambda: _high_watermark(broker.bootstrap, sink) > 0,
            READY_TIMEOUT_S,
        )
        phase("ready_s")
        producer.go()
        _wait(q, engine, "the input was produced", producer.done.is_set, args.seconds + 120)
        phase("produce_s")
        drained = _drain(q)
        phase("drain_s")
        durations = duration_medians(q.recentProgress)
    finally:
        producer.stop()
        producer.join(60)
        q.stop()
        phase("stop_s")
    if producer.errors:
        raise BenchError(f"{engine} {query}: producing failed: {producer.errors}")
    if producer.first_ms is None or producer.last_ms is None:
        raise BenchError(f"{engine} {query}: no records produced in the timed phase")
    records = read_output(broker.bootstrap, sink)
    figures = latency_figures(
        records, producer.first_ms + int(args.warmup * 1000), producer.last_ms
    )
    figures.update(
        {
            "input_records": producer.timed_records,
            "sink": SINK_MODE[engine],
            "drained": drained,
            "phases": phases,
            "duration_ms_p50": durations,
            "elapsed_s": time.perf_counter() - started,
            "loadavg_after": loadavg(),
        }
    )
    return figures


def duration_medians(progress: list[Any]) -> dict[str, float]:
    """The median of each ``durationMs`` entry over the query's recent batches that read
    records (Spark keeps the last 100: the end of the timed phase)."""
    by_name: dict[str, list[float]] = {}
    for p in progress:
        if not p["numInputRows"]:
            continue
        for name, ms in p["durationMs"].items():
            by_name.setdefault(name, []).append(float(ms))
    return {name: sorted(v)[len(v) // 2] for name, v in sorted(by_name.items())}


def runs(queries: list[str], engines: list[str]) -> Iterator[tuple[str, str]]:
    for query in queries:
        for engine in engines:
            if engine == "lockgate-continuous" and query not in CONTINUOUS_QUERIES:
                continue
            yield query, engine


# -- the table -------------------------------------------------------------------------------
def table(results: dict[str, Any]) -> str:
    cfg = results["config"]
    lines = [
        (
            f"Kafka -> Kafka end-to-end latency (CreateTime of the output record - source time), "
            f"{cfg['rate']:,} records/s for {cfg['seconds']:g} s per query and engine, first "
            f"{cfg['warmup']:g} s dropped; load average {cfg['loadavg_start']} -> {results.get('loadavg_end')}"
        ),
        "",
        "| query | engine | sink | records | p50 ms | p99 ms | max ms | lockgate/native p50 |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for query, by_engine in results["queries"].items():
        native = (by_engine.get("native") or {}).get("p50_ms")
        for engine, res in by_engine.items():
            if "error" in res:
                lines.append(
                    f"| {query} | {engine} | {SINK_MODE[engine]} | - | - | - | - | failed: "
                    f"{res['error'][:300]} |"
                )
                continue
            r = ratio(res.get("p50_ms"), native) if engine != "native" else None
            lines.append(
                f"| {query} | {engine} | {res['sink']} | {fmt(res['records'])} | {fmt(res['p50_ms'])} | "
                f"{fmt(res['p99_ms'])} | {fmt(res['max_ms'])} | {f'{r:.2f}' if r else '-'} |"
            )
    return "\n".join(lines)


# -- entry point -----------------------------------------------------------------------------
def make_spark(args: argparse.Namespace) -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    jars = connector_jars()
    if jars is None:
        raise BenchError(
            "Spark's Kafka connector is missing (build/kafka/spark-connector.classpath): "
            "run tools/fetch_kafka.sh"
        )
    import lockgate

    # and lockgate's jar: the exactly-once sink's JVM writer (make jvm-jar)
    jars = ",".join([jars, *lockgate.jars()])
    return (
        SparkSession.builder.master(args.master)
        .appName("lockgate-bench-kafka-latency")
        .config("spark.jars", jars)
        .config("spark.sql.shuffle.partitions", str(args.shuffle_partitions))
        .config("spark.ui.enabled", "false")
        .config(map=lockgate.spark_conf())
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", args.driver_memory)
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
        .getOrCreate()
    )


@contextlib.contextmanager
def broker_running(directory: Path) -> Iterator[KafkaBroker]:
    from bench.kafka_broker import BROKER_CLASSPATH

    problem = broker_problem()
    if problem is not None:
        raise BenchError(f"cannot start a Kafka broker: {problem}")
    classpath = read_classpath(BROKER_CLASSPATH)
    assert classpath is not None
    broker = KafkaBroker(classpath, directory / "broker")
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


def main(
    argv: list[str] | None = None, spark: Any = None, log: Callable[[str], None] = print
) -> dict[str, Any]:
    import lockgate

    args = parse_args(argv)
    own_spark = spark is None
    if own_spark:
        spark = make_spark(args)
        spark.sparkContext.setLogLevel("FATAL")
    spark.conf.set("spark.lockgate.kafka.io", args.kafka_io)
    ls = lockgate.session(spark)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    results: dict[str, Any] = {
        "timestamp": stamp,
        "config": {
            "command": " ".join(
                [
                    "python",
                    "-m",
                    "bench.kafka_latency",
                    *(argv if argv is not None else sys.argv[1:]),
                ]
            ),
            "seconds": args.seconds,
            "rate": args.rate,
            "warmup": args.warmup,
            "keys": args.keys,
            "master": spark.sparkContext.master,
            "shuffle_partitions": spark.conf.get("spark.sql.shuffle.partitions"),
            "kafka_io": args.kafka_io,
            "cpus": os.cpu_count(),
            "loadavg_start": loadavg(),
            "sinks": SINK_MODE,
        },
        "queries": {},
    }
    started = time.perf_counter()
    try:
        with (
            tempfile.TemporaryDirectory(prefix="kafka-latency-") as tmp,
            broker_running(Path(tmp)) as broker,
        ):
            log(
                f"kafka latency: broker {broker.bootstrap}; {args.rate:,} records/s, {args.seconds:g} s per run; "
                f"load {loadavg()}"
            )
            for query, engine in runs(args.queries, args.engines):
                try:
                    res = run_one(spark, ls, broker, query, engine, args, Path(tmp))
                except Exception as exc:  # noqa: BLE001 - a failed run is a finding; the others still run
                    res = {
                        "error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                    }
                results["queries"].setdefault(query, {})[engine] = res
                log(f"  {query} {engine}: {res}")
    finally:
        close_run(results, started, args.results_dir, f"kafka-latency-{stamp}.json", spark if own_spark else None)
    log_table(log, table(results), results)
    return results


if __name__ == "__main__":
    main()

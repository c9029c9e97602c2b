"""Continuous processing: trigger(continuous=...) runs a ContinuousExecution."""

from __future__ import annotations

import json
import os
import socket
import threading

import pytest
from expression_cases import CASES, ROWS, SCHEMA
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQueryListener

from lockgate.errors import AnalysisError, NotSupportedYetError, StreamingQueryException
from lockgate.execution.continuous.coordinator import CoordinatorServer, EpochCoordinator
from lockgate.execution.continuous.protocol import CoordinatorClient, ProtocolError
from lockgate.testing import MemoryStream

INTERVAL = "100 milliseconds"


def _memory_query(ls, df, name, checkpoint=None):
    writer = df.writeStream.format("memory").queryName(name).trigger(continuous=INTERVAL)
    if checkpoint is not None:
        writer = writer.option("checkpointLocation", str(checkpoint))
    return writer.start()


def test_map_operators_give_spark_sql_rows(spark, ls):
    """The differential test: the same expressions through a continuous query and Spark batch."""
    stream = MemoryStream(ls, SCHEMA)
    cols = [c.alias(f"c{n}") for case in sorted(CASES) for n, c in enumerate(CASES[case]())]
    cols = [c.alias(f"c{n}") for n, c in enumerate(cols)]
    df = (
        stream.toDF()
        .where(F.col("i").isNull() | (F.col("i") != 3))
        .withColumn("extra", F.col("l") + 1)
    )
    q = _memory_query(ls, df.select(*cols), "cont_diff")
    try:
        stream.addData(ROWS)
        q.processAllAvailable()
        got = [tuple(r) for r in spark.table("cont_diff").collect()]
    finally:
        q.stop()
    batch = spark.createDataFrame(ROWS, SCHEMA)
    batch = batch.where(F.col("i").isNull() | (F.col("i") != 3)).withColumn("extra", F.col("l") + 1)
    expected = [tuple(r) for r in batch.select(*cols).collect()]
    assert len(got) == len(expected) == len(ROWS) - 1
    assert sorted(map(repr, got)) == sorted(map(repr, expected))


def test_epochs_checkpoint_progress_and_status(spark, ls, tmp_path):
    events = []

    class Listener(StreamingQueryListener):
        def onQueryStarted(self, event):
            events.append(("started", event.id))

        def onQueryProgress(self, event):
            events.append(("progress", event.progress.batchId, event.progress.numInputRows))

        def onQueryIdle(self, event):
            pass

        def onQueryTerminated(self, event):
            events.append(("terminated", event.id))

    listener = Listener()
    ls.streams.addListener(listener)
    stream = MemoryStream(ls, "v INT", numPartitions=1)
    ckpt = tmp_path / "ck"
    q = _memory_query(ls, stream.toDF().select((F.col("v") * 2).alias("w")), "cont_epochs", ckpt)
    try:
        assert q.status["message"] in ("Initializing sources", "Running") or q.status[
            "message"
        ].startswith("Committing epoch")
        stream.addData([1, 2, 3])
        q.processAllAvailable()
        stream.addData([4])
        q.processAllAvailable()
        assert sorted(r.w for r in spark.table("cont_epochs").collect()) == [2, 4, 6, 8]
        plan = q._explain_string(False)
        assert plan.startswith("WriteToContinuousDataSource MemorySink") and "Project" in plan
        assert q.status["message"] == "Running" or q.status["message"].startswith(
            "Committing epoch"
        )
        progress = q.lastProgress
        assert progress is not None and progress.sources[0].description.startswith("MemoryStream")
        assert progress.sink.description == "MemorySink"
        assert sum(p.numInputRows for p in q.recentProgress) == 4
    finally:
        q.stop()
        ls.streams.listener_bus.wait_until_empty(10)
        ls.streams.removeListener(listener)
    # Same checkpoint layout as micro-batch: JSON offsets per epoch, commit per epoch.
    commits = sorted(int(n) for n in os.listdir(ckpt / "commits") if n.isdigit())
    offsets = sorted(int(n) for n in os.listdir(ckpt / "offsets") if n.isdigit())
    assert commits and set(commits) <= set(offsets)
    lines = (ckpt / "offsets" / str(commits[-1])).read_text().split("\n")
    assert lines[0] == "v1"
    assert json.loads(lines[1])["batchWatermarkMs"] == 0
    assert json.loads(lines[2]) == {"0": 4}
    assert (ckpt / "commits" / str(commits[-1])).read_text().split("\n")[0] == "v1"
    assert json.loads((ckpt / "metadata").read_text())["id"] == q.id
    kinds = [e[0] for e in events]
    assert kinds[0] == "started" and kinds[-1] == "terminated" and "progress" in kinds
    epochs = [e[1] for e in events if e[0] == "progress"]
    assert epochs == sorted(epochs) and len(set(epochs)) == len(epochs)


def _file_writer(directory):
    class _FileWriter:
        """foreach writer: one JSON line per row into a file per (partition, epoch)."""

        def __init__(self, directory):
            self.directory = directory

        def open(self, partition_id, epoch_id):
            self.path = os.path.join(
                self.directory, f"p{partition_id}-e{epoch_id}-{os.getpid()}.jsonl"
            )
            self.f = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
            return True

        def process(self, row):
            self.f.write(json.dumps(row.asDict(), default=str) + "\n")
            self.f.flush()

        def close(self, error):
            self.f.close()

    return _FileWriter(directory)


def _values(directory):
    out = []
    for name in os.listdir(directory):
        with open(os.path.join(directory, name), encoding="utf-8") as f:
            out.extend(json.loads(line)["value"] for line in f if line.strip())
    return out


def test_rate_source_restarts_from_the_last_committed_epoch(ls, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    ckpt = tmp_path / "ck"

    def start():
        return (
            ls.readStream.format("rate")
            .option("rowsPerSecond", 200)
            .option("numPartitions", 1)
            .load()
            .where("value % 2 = 0")
            .writeStream.foreach(_file_writer(str(out)))
            .trigger(continuous=INTERVAL)
            .option("checkpointLocation", str(ckpt))
            .start()
        )

    q = start()
    _wait_for_commits(ckpt, 3)
    q.stop()
    first = _values(out)
    committed = _committed_rate_value(ckpt)
    assert committed is not None
    q = start()
    _wait_for_commits(ckpt, _latest_commit(ckpt) + 3)
    q.stop()
    values = _values(out)
    # Every even value up to the last committed one is there; nothing is skipped, and the
    # second run repeats only rows of epochs the first run had not committed.
    top = _committed_rate_value(ckpt)
    assert set(range(0, top + 1, 2)) <= set(values)
    assert all(v % 2 == 0 for v in values)
    repeated = {v for v in values if values.count(v) > 1}
    assert all(v > committed for v in repeated)
    assert len(first) > 0


def _latest_commit(ckpt):
    names = [int(n) for n in os.listdir(ckpt / "commits") if n.isdigit()]
    return max(names) if names else -1


def _committed_rate_value(ckpt):
    latest = _latest_commit(ckpt)
    if latest < 0:
        return None
    text = (ckpt / "offsets" / str(latest)).read_text().split("\n")[2]
    return json.loads(text)["0"]["value"]


def _wait_for_commits(ckpt, epoch, timeout=60.0):
    done = threading.Event()
    for _ in range(int(timeout / 0.05)):
        if (ckpt / "commits").exists() and _latest_commit(ckpt) >= epoch:
            return
        done.wait(0.05)
    raise AssertionError(f"epoch {epoch} did not commit in {timeout} s")


@pytest.mark.parametrize(
    "build, message",
    [
        (
            lambda s: s.groupBy("value").count(),
            "Continuous processing does not support Aggregate operations.",
        ),
        (
            lambda s: s.withWatermark("timestamp", "1 second"),
            "Continuous processing does not support EventTimeWatermark operations.",
        ),
        (
            lambda s: s.dropDuplicates(["value"]),
            "Continuous processing does not support Deduplicate operations.",
        ),
        (lambda s: s.union(s), "Continuous processing does not support Union operations."),
        (lambda s: s.limit(3), "Continuous processing does not support LocalLimit operations."),
        (
            lambda s: s.repartition(3),
            "Continuous processing does not support Repartition operations.",
        ),
        (
            lambda s: s.select(F.explode(F.array("value", "value"))),
            "Continuous processing does not support Generate operations.",
        ),
        (
            lambda s: s.select(F.current_timestamp()),
            "Continuous processing does not support current time operations.",
        ),
        (
            lambda s: s.select(F.current_date()),
            "Continuous processing does not support current time operations.",
        ),
    ],
    ids=[
        "aggregate",
        "watermark",
        "dedup",
        "union",
        "limit",
        "repartition",
        "generate",
        "ts",
        "date",
    ],
)
def test_unsupported_operations_get_sparks_messages(ls, build, message):
    source = ls.readStream.format("rate").option("numPartitions", 1).load()
    mode = "complete" if message.endswith("Aggregate operations.") else "append"
    with pytest.raises(AnalysisError) as info:
        build(source).writeStream.format("console").outputMode(mode).trigger(
            continuous="1 second"
        ).start()
    assert message in str(info.value)
    assert not ls.streams.active


def test_unsupported_sources_sinks_and_foreach_batch(ls, tmp_path):
    rate = ls.readStream.format("rate").option("numPartitions", 1).load()
    with pytest.raises(
        AnalysisError, match="'foreachBatch' is not supported with continuous trigger"
    ):
        rate.writeStream.foreachBatch(lambda df, i: None).trigger(continuous="1 second").start()
    micro = ls.readStream.format("rate-micro-batch").option("rowsPerBatch", 1).load()
    with pytest.raises(
        AnalysisError, match="Data source rate-micro-batch does not support continuous processing."
    ):
        micro.writeStream.format("console").trigger(continuous="1 second").start()
    with pytest.raises(
        AnalysisError, match="Data source parquet does not support continuous processing."
    ):
        (
            rate.writeStream.format("parquet")
            .option("path", str(tmp_path / "out"))
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(continuous="1 second")
            .start()
        )
    with pytest.raises(NotSupportedYetError, match="JsonToStructs.*continuous query"):
        rate.select(F.from_json(F.col("value").cast("string"), "a INT")).writeStream.format(
            "console"
        ).trigger(continuous="1 second").start()
    assert not ls.streams.active


def test_too_many_partitions_for_the_cores_fails_clearly(ls):
    q = (
        ls.readStream.format("rate")
        .option("numPartitions", 3)
        .load()
        .writeStream.format("noop")
        .trigger(continuous="1 second")
        .start()
    )
    with pytest.raises(StreamingQueryException, match="needs 3 task slots .* Spark has 2 cores"):
        q.awaitTermination(60)


def test_failing_task_fails_the_query(ls):
    def boom(v):
        if v is not None and v >= 2:
            raise ValueError("boom at two")
        return v

    stream = MemoryStream(ls, "v INT")
    udf = F.udf(boom, "int")
    q = (
        stream.toDF()
        .select(udf("v").alias("v"))
        .writeStream.format("noop")
        .trigger(continuous=INTERVAL)
        .start()
    )
    stream.addData([1, 2, 3])
    with pytest.raises(StreamingQueryException, match="boom at two"):
        q.awaitTermination(60)
    assert not q.isActive


def test_task_retry_is_refused(monkeypatch):
    from pyspark import TaskContext

    from lockgate.execution.continuous import task

    class Retried:
        def attemptNumber(self):
            return 1

    monkeypatch.setattr(TaskContext, "get", staticmethod(lambda: Retried()))
    with pytest.raises(
        task.ContinuousTaskRetryException, match="Continuous execution does not support task retry"
    ):
        task.run_partition(None, 0)  # type: ignore[arg-type]


class _Engine:
    def __init__(self):
        self.offsets = []
        self.commits = []

    def add_offset(self, epoch, partition_offsets, rows):
        self.offsets.append((epoch, partition_offsets, rows))

    def commit_epoch(self, epoch, messages):
        self.commits.append((epoch, messages))


def test_coordinator_refuses_connections_without_the_secret_and_commits_in_order():
    engine = _Engine()
    coordinator = EpochCoordinator(engine, start_epoch=0)
    coordinator.handle({"type": "SetReaderPartitions", "numPartitions": 2})
    coordinator.handle({"type": "SetWriterPartitions", "numPartitions": 2})
    server = CoordinatorServer(coordinator, "127.0.0.1")
    try:
        with pytest.raises(ProtocolError, match="refused"):
            CoordinatorClient("127.0.0.1", server.port, "not-the-secret")
        raw = socket.create_connection(("127.0.0.1", server.port))
        raw.sendall(b"\x00\x00\x00\x10not a json frame")
        assert raw.recv(100) == b""  # closed without an answer
        raw.close()
        assert server.refused >= 1
        a = CoordinatorClient("127.0.0.1", server.port, server.secret)
        b = CoordinatorClient("127.0.0.1", server.port, server.secret)
        assert a.call({"type": "GetCurrentEpoch"})[0] == {"epoch": 0, "stop": False}
        coordinator.handle({"type": "IncrementAndGetEpoch"})
        coordinator.handle({"type": "IncrementAndGetEpoch"})
        # Epoch 1 completes before epoch 0: it waits for 0.
        for client, p in ((a, 0), (b, 1)):
            client.call(
                {
                    "type": "ReportPartitionOffset",
                    "partition": p,
                    "epoch": 1,
                    "offset": 10 + p,
                    "rows": 1,
                }
            )
            client.call(
                {"type": "CommitPartitionEpoch", "partition": p, "epoch": 1, "message": {"rows": 1}}
            )
        assert [e for e, _, _ in engine.offsets] == [1] and engine.commits == []
        for client, p in ((a, 0), (b, 1)):
            client.call(
                {
                    "type": "ReportPartitionOffset",
                    "partition": p,
                    "epoch": 0,
                    "offset": p,
                    "rows": 0,
                }
            )
            client.call(
                {"type": "CommitPartitionEpoch", "partition": p, "epoch": 0, "message": {"rows": 0}}
            )
        assert [e for e, _ in engine.commits] == [0, 1]
        assert engine.offsets[-1] == (0, [0, 1], 0)
        a.call({"type": "StopContinuousExecutionWrites"})
        assert b.call({"type": "GetCurrentEpoch"})[0]["stop"] is True
        a.close()
        b.close()
    finally:
        server.close()


def _counting_source():
    """A continuous source of 0, 1, 2, ... that asks for reconfiguration once."""
    from pyspark.sql.types import LongType, StructField, StructType

    from lockgate.sources.base import ContinuousPartitionReader, ContinuousStream, SourceProvider

    schema = StructType([StructField("n", LongType())])

    class Reader(ContinuousPartitionReader):
        def __init__(self, partition, client):
            self.position = partition

        def read(self, timeout_s):
            import time

            time.sleep(min(timeout_s, 0.01))
            self.position += 1
            return [(self.position - 1,)]

        def offset(self):
            return self.position

    class Stream(ContinuousStream):
        def __init__(self, owner):
            self.owner = owner

        @property
        def schema(self):
            return schema

        def initialOffset(self):
            return {"0": 0}

        def planInputPartitions(self, start):
            self.owner.plans.append(start)
            return [int(start["0"])]

        def createReaderFactory(self):
            return Reader

        def mergeOffsets(self, partitionOffsets):
            return {"0": partitionOffsets[0]}

        def commit(self, end):
            self.owner.committed.append(end)

        def needsReconfiguration(self):
            return bool(len(self.owner.plans) == 1 and len(self.owner.committed) >= 2)

    class Provider(SourceProvider):
        name = "counting-test"
        supports_continuous = True

        def __init__(self):
            self.plans = []
            self.committed = []

        def sourceSchema(self, spark, options, user_schema):
            return schema

        def createSource(self, context):
            raise AssertionError("continuous only")

        def createContinuousStream(self, context):
            return Stream(self)

    return Provider()


def test_source_reconfiguration_restarts_the_tasks_from_committed_offsets(spark, ls):
    import lockgate

    provider = _counting_source()
    lockgate.register_source("counting-test", provider)
    twice = F.udf(lambda n: n * 2, "long")
    df = ls.readStream.format("counting-test").load().select("n", twice("n").alias("m"))
    q = _memory_query(ls, df, "cont_reconf")
    try:
        for _ in range(600):
            if len(provider.plans) >= 2 and len(provider.committed) >= 5:
                break
            threading.Event().wait(0.05)
        assert q.isActive and q.exception() is None
    finally:
        q.stop()
    assert len(provider.plans) >= 2, provider.plans
    assert provider.plans[1] in provider.committed  # restarted at a committed offset
    rows = [(r.n, r.m) for r in spark.table("cont_reconf").collect()]
    values = sorted(n for n, _ in rows)
    # The second run started at the committed offset: no row lost, none written twice.
    assert values == list(range(len(values)))
    assert all(m == 2 * n for n, m in rows)


def test_console_sink_prints_each_epoch_and_old_log_entries_are_purged(spark, ls, capsys, tmp_path):
    stream = MemoryStream(ls, "v INT")
    spark.conf.set("spark.sql.streaming.minBatchesToRetain", "2")
    try:
        q = (
            stream.toDF()
            .select((F.col("v") + 100).alias("w"))
            .writeStream.format("console")
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(continuous=INTERVAL)
            .start()
        )
    finally:
        spark.conf.unset("spark.sql.streaming.minBatchesToRetain")
    try:
        stream.addData([1, 2])
        q.processAllAvailable()
        _wait_for_commits(tmp_path / "ck", _latest_commit(tmp_path / "ck") + 3)
    finally:
        q.stop()
    out = capsys.readouterr().out
    assert "Batch: " in out and "|101|" in out and "|102|" in out
    latest = _latest_commit(tmp_path / "ck")
    kept = sorted(int(n) for n in os.listdir(tmp_path / "ck" / "commits") if n.isdigit())
    assert kept[0] >= latest - 1 and len(kept) <= 3

"""The ``redis`` sink: stream and hash modes, per-partition markers, cleanup, failures."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from pyspark.errors import AnalysisException
from redis_testing import free_port

from lockgate import MemoryStream
from lockgate.errors import OptionError, SinkError
from lockgate.options import Options
from lockgate.sinks.base import SinkContext
from lockgate.sinks.redis import RedisSinkProvider
from lockgate.sources.redis import RedisUnavailableError


def make_sink(spark, connection: dict, checkpoint: Path, schema, output_mode="append", **options):
    """A sink outside a query: its query id comes from <checkpoint>/metadata."""
    checkpoint.mkdir(parents=True, exist_ok=True)
    query_id = str(uuid.uuid4())
    (checkpoint / "metadata").write_text(json.dumps({"id": query_id}))
    opts = {**connection, "checkpointLocation": str(checkpoint), **options}
    context = SinkContext(
        spark=spark,
        options=Options(opts),
        output_mode=output_mode,
        partition_by=(),
        query_name=None,
        path=None,
        schema=schema,
    )
    return RedisSinkProvider().createSink(context), query_id


def entries(r, stream: str) -> list[dict]:
    return [fields for _, fields in r.xrange(stream)]


def marker_keys(r, query_id: str) -> list[str]:
    return sorted(r.scan_iter(match=f"lockgate:sink:{query_id}:*"))


def test_stream_mode_writes_rows_as_fields(ls, redis_server, r, names, tmp_path):
    out = names("out")
    source = MemoryStream(ls, "id INT, name STRING, score DOUBLE, tags ARRAY<STRING>")
    q = (
        source.toDF()
        .writeStream.format("redis")
        .options(**redis_server.options)
        .option("stream", out)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    source.addData([(1, "a", 1.5, ["x", "y"]), (2, None, None, None)])
    q.processAllAvailable()
    source.addData([(3, "c", 0.0, [])])
    q.processAllAvailable()
    q.stop()
    assert sorted(entries(r, out), key=lambda e: e["id"]) == [
        {"id": "1", "name": "a", "score": "1.5", "tags": '["x","y"]'},
        {"id": "2"},
        {"id": "3", "name": "c", "score": "0.0", "tags": "[]"},
    ]
    assert "RedisSink[mode=stream" in q.lastProgress.sink.description
    assert q.lastProgress.sink.numOutputRows == 1


def test_hash_mode_sets_fields_and_deletes_nulls(ls, redis_server, r, names, tmp_path):
    prefix = names("user") + ":"
    source = MemoryStream(ls, "user STRING, city STRING, visits LONG")
    q = (
        source.toDF()
        .writeStream.format("redis")
        .options(**redis_server.options)
        .option("mode", "hash")
        .option("keyColumn", "user")
        .option("keyPrefix", prefix)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    source.addData([("ann", "Oslo", 1), ("bob", "Rome", 2)])
    q.processAllAvailable()
    source.addData([("ann", None, 5)])
    q.processAllAvailable()
    q.stop()
    assert r.hgetall(prefix + "ann") == {"visits": "5"}
    assert r.hgetall(prefix + "bob") == {"city": "Rome", "visits": "2"}


def test_a_batch_is_written_once_per_partition(spark, redis_server, r, names, tmp_path):
    out = names("out")
    df = spark.createDataFrame([(i,) for i in range(6)], "v INT").repartition(2, "v")
    sink, query_id = make_sink(spark, redis_server.options, tmp_path / "ck", df.schema, stream=out)
    sink.addBatch(0, df)
    assert sorted(int(e["v"]) for e in entries(r, out)) == list(range(6))
    # The engine re-runs batch 0 after a crash: nothing is written twice.
    sink.addBatch(0, df)
    assert r.xlen(out) == 6
    # A crash in batch 1 after partition 0 was committed: only partition 1 is written.
    partition_0 = [row.v for row in df.rdd.mapPartitionsWithIndex(_only(0)).collect()]
    assert 0 < len(partition_0) < 6
    r.set(f"lockgate:sink:{query_id}:batch:1:0", json.dumps({"rows": len(partition_0)}))
    sink.addBatch(1, df)
    written = sorted(int(e["v"]) for e in entries(r, out)[6:])
    assert written == sorted(set(range(6)) - set(partition_0))
    assert json.loads(r.get(f"lockgate:sink:{query_id}:batch:1:1"))["partitions"] == 2
    sink.stop()


def _only(index: int):
    def keep(i, rows):
        return rows if i == index else iter(())

    return keep


def test_a_rerun_with_other_partitioning_is_refused(spark, redis_server, r, names, tmp_path):
    out = names("out")
    df = spark.createDataFrame([(i,) for i in range(4)], "v INT").repartition(2, "v")
    sink, _ = make_sink(spark, redis_server.options, tmp_path / "ck", df.schema, stream=out)
    sink.addBatch(0, df)
    with pytest.raises(
        SinkError, match="written before with 2 partitions and is now re-run with 1"
    ):
        sink.addBatch(0, df.coalesce(1))
    assert r.xlen(out) == 4


def test_old_markers_are_deleted(spark, redis_server, r, names, tmp_path):
    out = names("out")
    df = spark.createDataFrame([(1,), (2,)], "v INT").coalesce(1)
    sink, query_id = make_sink(
        spark, redis_server.options, tmp_path / "ck", df.schema, stream=out, minBatchesToRetain="2"
    )
    for batch in range(5):
        sink.addBatch(batch, df)
    base = f"lockgate:sink:{query_id}"
    assert marker_keys(r, query_id) == sorted(
        [f"{base}:batch:3", f"{base}:batch:3:0", f"{base}:batch:4", f"{base}:batch:4:0"]
        + [f"{base}:batches"]
    )
    assert r.zrange(f"{base}:batches", 0, -1) == ["3", "4"]
    assert r.xlen(out) == 10


def test_marker_ttl(spark, redis_server, r, names, tmp_path):
    df = spark.createDataFrame([(1,)], "v INT").coalesce(1)
    sink, query_id = make_sink(
        spark,
        redis_server.options,
        tmp_path / "ck",
        df.schema,
        stream=names("out"),
        markerTtl="1 hour",
    )
    sink.addBatch(0, df)
    for key in marker_keys(r, query_id):
        assert 0 < r.pttl(key) <= 3_600_000, key


def test_wrong_key_type_is_refused_before_writing(spark, redis_server, r, names, tmp_path):
    out = names("out")
    r.set(out, "not a stream")
    df = spark.createDataFrame([(1,)], "v INT").coalesce(1)
    sink, query_id = make_sink(spark, redis_server.options, tmp_path / "ck", df.schema, stream=out)
    with pytest.raises(SinkError, match=f"Key '{out}' at Redis .* holds a string, not a stream"):
        sink.addBatch(0, df)
    assert marker_keys(r, query_id) == []


def test_unreachable_server_names_host_and_port(spark, names, tmp_path):
    port = free_port()
    df = spark.createDataFrame([(1,)], "v INT").coalesce(1)
    down = {"host": "127.0.0.1", "port": str(port)}

    sink, _ = make_sink(
        spark, down, tmp_path / "ck", df.schema, stream="out", retries="1", retryBackoff="10ms"
    )
    with pytest.raises(RedisUnavailableError, match=f"Cannot reach Redis at 127.0.0.1:{port}") as e:
        sink.addBatch(0, df)
    assert "(raised in a Spark task)" in str(e.value)
    assert e.value.address == f"127.0.0.1:{port}"


def test_options_are_checked_at_start(ls, redis_server, tmp_path):
    source = MemoryStream(ls, "k STRING, v INT")
    writer = source.toDF().writeStream.format("redis").options(**redis_server.options)
    writer = writer.option("checkpointLocation", str(tmp_path / "ck"))
    with pytest.raises(OptionError, match="'stream' is required") as info:
        writer.start()
    assert info.value.option == "stream"
    with pytest.raises(OptionError, match="one of 'stream', 'hash'"):
        writer.option("mode", "set").start()
    counts = source.toDF().groupBy("k").count()
    update = counts.writeStream.format("redis").outputMode("update")
    update = update.options(**redis_server.options).option(
        "checkpointLocation", str(tmp_path / "u")
    )
    with pytest.raises(OptionError, match="'keyColumn' is required for mode 'hash'"):
        update.start()
    with pytest.raises(AnalysisException, match="Key column `nope`"):
        update.option("keyColumn", "nope").start()
    with pytest.raises(AnalysisException, match="needs a column besides"):
        source.toDF().select("k").writeStream.format("redis").option("mode", "hash").option(
            "keyColumn", "k"
        ).option("checkpointLocation", str(tmp_path / "h")).start()

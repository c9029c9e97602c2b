"""The ``redis`` source: exact ID ranges, maxEntriesPerTrigger, startingOffsets, queries."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyspark.sql import functions as F
from redis_testing import add, free_port

from lockgate.checkpoint import resolve_filesystem
from lockgate.clock import SystemClock
from lockgate.errors import AnalysisError, OptionError
from lockgate.options import Options
from lockgate.sources.base import READ_ALL_AVAILABLE, ReadLimit, SourceContext
from lockgate.sources.redis import REDIS_SCHEMA, RedisCommandError, RedisSourceProvider


def make_source(spark, redis_server, root: Path, **options):
    fs, path = resolve_filesystem(str(root))
    context = SourceContext(
        spark=spark,
        options=Options({**redis_server.options, **options}),
        schema=REDIS_SCHEMA,
        metadata_path=fs.join(path, "sources", "0"),
        fs=fs,
        clock=SystemClock(),
    )
    return RedisSourceProvider().createSource(context)


def rows(df) -> list[tuple[str, str, dict, int]]:
    out = df.select("key", "id", "fields", F.unix_millis("timestamp").alias("ms")).collect()
    return sorted((x["key"], x["id"], dict(x["fields"]), x["ms"]) for x in out)


def expected(stream: str, ids: list[str]) -> list[tuple[str, str, dict, int]]:
    return [(stream, i, {"n": f"{stream}/{i}"}, int(i.split("-")[0])) for i in ids]


def test_batches_read_exactly_the_id_range(spark, redis_server, r, names, tmp_path):
    a, b = names("a"), names("b")
    a_ids = ["1000-0", "1000-1", "2000-0", "3000-0", "4000-5"]
    b_ids = ["1500-0", "2500-0", "3500-0"]
    add(r, a, a_ids)
    add(r, b, b_ids)
    source = make_source(spark, redis_server, tmp_path, streams=f"{a},{b}", pageSize="2")
    start = source.initialOffset()
    assert start == {a: "0-0", b: "0-0"}
    end = source.latestOffset(start, READ_ALL_AVAILABLE)
    assert end == {a: "4000-5", b: "3500-0"}
    everything = source.getBatch(start, end)
    assert rows(everything) == expected(a, a_ids) + expected(b, b_ids)
    # (start, end]: start excluded, end included, per stream.
    middle = source.getBatch({a: "1000-0", b: "1500-0"}, {a: "3000-0", b: "2500-0"})
    assert rows(middle) == expected(a, ["1000-1", "2000-0", "3000-0"]) + expected(b, ["2500-0"])
    # Replayable: new entries do not change an old range.
    add(r, a, ["5000-0"])
    assert rows(source.getBatch({a: "1000-0", b: "1500-0"}, {a: "3000-0", b: "2500-0"})) == (
        rows(middle)
    )
    # One partition per stream with entries, read by tasks (mapInArrow), not the driver:
    # the plan holds the ID ranges, not the entries.
    assert middle.rdd.getNumPartitions() == 2
    plan = middle._jdf.queryExecution().executedPlan().toString()
    assert "MapInArrow" in plan and "Range (0, 2, step=1, splits=2)" in plan, plan
    assert "LocalTableScan" not in plan, plan
    only_a = source.getBatch({a: "3000-0", b: "3500-0"}, {a: "5000-0", b: "3500-0"})
    assert only_a.rdd.getNumPartitions() == 1
    assert rows(only_a) == expected(a, ["4000-5", "5000-0"])
    source.stop()


def test_no_batch_until_there_is_data(spark, redis_server, r, names, tmp_path):
    a = names("a")  # does not exist yet
    source = make_source(spark, redis_server, tmp_path, streams=a)
    start = source.initialOffset()
    assert source.latestOffset(start, READ_ALL_AVAILABLE) is None
    add(r, a, ["7-0"])
    assert source.latestOffset(start, READ_ALL_AVAILABLE) == {a: "7-0"}
    # After a batch, "no new data" is the start offset itself.
    assert source.latestOffset({a: "7-0"}, READ_ALL_AVAILABLE) == {a: "7-0"}
    source.stop()


def test_max_entries_per_trigger_is_shared_fairly(spark, redis_server, r, names, tmp_path):
    a, b, c = names("a"), names("b"), names("c")
    add(r, a, [f"{i}-0" for i in range(1, 11)])  # 10 entries
    add(r, b, ["1-0", "2-0"])  # 2 entries; c has none
    source = make_source(
        spark, redis_server, tmp_path, streams=f"{a},{b},{c}", maxEntriesPerTrigger="6"
    )
    limit = source.getDefaultReadLimit()
    assert limit == ReadLimit(max_rows=6)
    start = source.initialOffset()
    # b uses 2 of its share of 3; what it leaves goes to a.
    first = source.latestOffset(start, limit)
    assert first == {a: "4-0", b: "2-0", c: "0-0"}
    second = source.latestOffset(first, limit)
    assert second == {a: "10-0", b: "2-0", c: "0-0"}
    assert source.latestOffset(second, limit) == second
    assert rows(source.getBatch(first, second)) == sorted(
        expected(a, [f"{i}-0" for i in range(5, 11)])
    )
    # An uneven split never exceeds the limit.
    add(r, b, [f"{i}-0" for i in range(3, 13)])
    add(r, c, [f"{i}-0" for i in range(1, 11)])
    third = source.latestOffset(second, ReadLimit(max_rows=5))
    taken = {"b": int(third[b].split("-")[0]) - 2, "c": int(third[c].split("-")[0])}
    assert third[a] == "10-0" and sorted(taken.values()) == [2, 3]
    source.stop()


def test_starting_offsets_latest_is_resolved_once(spark, redis_server, r, names, tmp_path):
    a, b = names("a"), names("b")
    add(r, a, ["1-0", "2-0"])
    source = make_source(
        spark, redis_server, tmp_path, streams=f"{a},{b}", startingOffsets="latest"
    )
    assert source.initialOffset() == {a: "2-0", b: "0-0"}
    add(r, a, ["3-0"])
    # A restart before the first batch starts from the same IDs (sources/0/0).
    again = make_source(spark, redis_server, tmp_path, streams=f"{a},{b}", startingOffsets="latest")
    assert again.initialOffset() == {a: "2-0", b: "0-0"}
    assert json.loads((tmp_path / "sources" / "0" / "0").read_text().split("\n", 1)[1]) == {
        a: "2-0",
        b: "0-0",
    }
    end = again.latestOffset(again.initialOffset(), READ_ALL_AVAILABLE)
    assert rows(again.getBatch(again.initialOffset(), end)) == expected(a, ["3-0"])


def test_starting_offsets_per_stream(spark, redis_server, r, names, tmp_path):
    a, b = names("a"), names("b")
    add(r, a, ["1-0", "2-0", "3-0"])
    add(r, b, ["1-0", "2-0"])
    starting = json.dumps({a: "1-0", b: "earliest"})
    source = make_source(
        spark, redis_server, tmp_path, streams=f"{a},{b}", startingOffsets=starting
    )
    start = source.initialOffset()
    assert start == {a: "1-0", b: "0-0"}
    end = source.latestOffset(start, READ_ALL_AVAILABLE)
    assert rows(source.getBatch(start, end)) == expected(a, ["2-0", "3-0"]) + expected(
        b, ["1-0", "2-0"]
    )


def test_a_key_that_is_not_a_stream(spark, redis_server, r, names, tmp_path):
    a = names("a")
    r.set(a, "x")
    source = make_source(spark, redis_server, tmp_path, streams=a)
    with pytest.raises(RedisCommandError, match=f"Key '{a}' at Redis 127.0.0.1:.* is not a stream"):
        source.latestOffset(source.initialOffset(), READ_ALL_AVAILABLE)


def test_options_are_checked_at_definition_time(ls, redis_server):
    reader = ls.readStream.format("redis").options(**redis_server.options)
    with pytest.raises(OptionError, match="'streams' is required") as info:
        reader.load()
    assert info.value.option == "streams"
    with pytest.raises(OptionError, match="maxEntriesPerTrigger"):
        reader.option("streams", "a").option("maxEntriesPerTrigger", "-1").load()
    with pytest.raises(OptionError, match="port"):
        ls.readStream.format("redis").option("streams", "a").option("port", "99999").load()
    with pytest.raises(AnalysisError, match="user-specified schema"):
        ls.readStream.format("redis").schema("a INT").option("streams", "a").load()
    df = ls.readStream.format("redis").option("streams", "a").load()
    assert df.schema == REDIS_SCHEMA


def test_query_reads_every_entry_once(ls, spark, redis_server, r, names, tmp_path):
    a, b = names("a"), names("b")
    add(r, a, [f"{i}-0" for i in range(1, 6)])
    add(r, b, [f"{i}-0" for i in range(1, 4)])
    df = (
        ls.readStream.format("redis")
        .options(**redis_server.options)
        .option("streams", f"{a},{b}")
        .option("maxEntriesPerTrigger", 3)
        .load()
        .select("key", "id", F.col("fields")["n"].alias("n"))
    )
    table = names("redis_source_query").replace("-", "_")
    q = (
        df.writeStream.format("memory")
        .queryName(table)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    q.processAllAvailable()
    add(r, b, ["4-0", "5-0"])
    q.processAllAvailable()
    q.stop()
    got = sorted(tuple(x) for x in spark.sql(f"select key, id, n from {table}").collect())
    want = sorted(
        [(a, f"{i}-0", f"{a}/{i}-0") for i in range(1, 6)]
        + [(b, f"{i}-0", f"{b}/{i}-0") for i in range(1, 6)]
    )
    assert got == want
    batches = [p for p in q.recentProgress if p.numInputRows > 0]
    assert [p.numInputRows for p in batches] == [3, 3, 2, 2]
    offsets = tmp_path / "ck" / "offsets"
    last = max(int(n.name) for n in offsets.iterdir() if n.name.isdigit())
    assert json.loads((offsets / str(last)).read_text().split("\n")[2]) == {a: "5-0", b: "5-0"}


def test_available_now_reads_what_was_there_at_start(ls, spark, redis_server, r, names, tmp_path):
    a = names("a")
    add(r, a, [f"{i}-0" for i in range(1, 8)])
    table = names("redis_available_now").replace("-", "_")
    q = (
        ls.readStream.format("redis")
        .options(**redis_server.options)
        .option("streams", a)
        .option("maxEntriesPerTrigger", 3)
        .load()
        .writeStream.format("memory")
        .queryName(table)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(120)
    assert [p.numInputRows for p in q.recentProgress if p.numInputRows] == [3, 3, 1]
    assert spark.sql(f"select count(*) from {table}").first()[0] == 7


def test_unreachable_server_fails_the_query_naming_it(ls, names, tmp_path):
    port = free_port()
    q = (
        ls.readStream.format("redis")
        .option("host", "127.0.0.1")
        .option("port", port)
        .option("streams", names("a"))
        .option("retries", 1)
        .option("retryBackoff", "10ms")
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    with pytest.raises(Exception, match=f"Cannot reach Redis at 127.0.0.1:{port}") as info:
        q.awaitTermination(60)
    assert "redis-server is running" in str(info.value)

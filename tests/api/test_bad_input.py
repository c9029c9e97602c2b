"""Bad input: every mistake gets a clear error, and nothing committed is lost.

Malformed data, checkpoints that are corrupt or belong to another query, unknown
formats, bad option values, output modes and triggers, invalid or unsupported
operations, and query name/id clashes. Errors found while defining or starting a
query are raised there; errors found by the query thread (corrupt checkpoint files are
read when it starts) end the query with a ``lockgate.StreamingQueryException`` whose
message names the problem and the file.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import AnalysisException
from pyspark.sql import functions as F

import lockgate
from lockgate import (
    CheckpointError,
    NotSupportedYetError,
    OptionError,
    StreamingQueryException,
)

JSON_SCHEMA = "id LONG, name STRING"
TIMEOUT_S = 120


# -- helpers ------------------------------------------------------------------------------


def _snapshot(root: Path) -> dict[str, bytes]:
    """Every regular file under ``root`` (relative path -> bytes), but the run lock and
    its owner record, which every run writes (docs/checkpoint.md, 'One run per
    checkpoint')."""
    out = {}
    if root.exists():
        for path in sorted(root.rglob("*")):
            if path.is_file() and not path.name.startswith(".lockgate-run"):
                out[str(path.relative_to(root))] = path.read_bytes()
    return out


def _log_ids(directory: Path) -> list[int]:
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def _write_json(path: Path, lines: list[str]) -> None:
    tmp = path.with_name("." + path.name + ".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.rename(path)


def _rate(ls: Any, rows: int = 3) -> Any:
    return ls.readStream.format("rate-micro-batch").option("rowsPerBatch", rows).load()


def _run_once(df: Any, checkpoint: Path) -> Any:
    """Run one availableNow batch of ``df`` into noop with ``checkpoint``; return the query."""
    return (
        df.writeStream.format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )


def _await_failure(q: Any) -> StreamingQueryException:
    with pytest.raises(StreamingQueryException) as info:
        q.awaitTermination(TIMEOUT_S)
    exc = info.value
    assert isinstance(exc, lockgate.StreamingQueryException)
    assert q.exception() is exc
    assert not q.isActive
    return exc


@pytest.fixture
def rate_checkpoint(ls: Any, tmp_path: Path) -> Path:
    """A checkpoint with two committed batches (0 and 1) of a rate-micro-batch query."""
    checkpoint = tmp_path / "checkpoint"
    for _ in range(2):
        q = _run_once(_rate(ls), checkpoint)
        assert q.awaitTermination(TIMEOUT_S)
        assert q.exception() is None
    assert _log_ids(checkpoint / "offsets") == [0, 1]
    assert _log_ids(checkpoint / "commits") == [0, 1]
    return checkpoint


# -- malformed data -----------------------------------------------------------------------


def _failfast_query(ls: Any, tmp_path: Path) -> tuple[Any, Path, Path, Path]:
    src = tmp_path / "in"
    src.mkdir()
    out = tmp_path / "out"
    checkpoint = tmp_path / "checkpoint"
    _write_json(src / "a.json", ['{"id": 1, "name": "a"}', '{"id": 2, "name": "b"}'])
    q = (
        ls.readStream.format("json")
        .schema(JSON_SCHEMA)
        .option("mode", "FAILFAST")
        .option("maxFilesPerTrigger", 1)
        .load(str(src))
        .writeStream.format("parquet")
        .option("checkpointLocation", str(checkpoint))
        .start(str(out))
    )
    q.processAllAvailable()
    assert _log_ids(checkpoint / "commits") == [0]
    _write_json(src / "b.json", ['{"id": 3, "name": "c"}', '{"id": 4, "name":'])
    return q, src, out, checkpoint


def test_malformed_json_with_failfast_fails_the_query_and_keeps_committed_batches(
    ls: Any, spark: Any, tmp_path: Path
) -> None:
    q, _, out, checkpoint = _failfast_query(ls, tmp_path)
    exc = _await_failure(q)
    assert exc.cause is not None
    # The failed batch 1 was logged, never committed; batch 0 stays in sink and commits.
    assert _log_ids(checkpoint / "offsets") == [0, 1]
    assert _log_ids(checkpoint / "commits") == [0]
    assert _log_ids(out / "_spark_metadata") == [0]
    rows = spark.read.parquet(str(out)).collect()
    assert sorted((r["id"], r["name"]) for r in rows) == [(1, "a"), (2, "b")]
    assert q not in ls.streams.active


def test_malformed_json_with_failfast_error_message_names_the_problem(
    ls: Any, tmp_path: Path
) -> None:
    q, _, _, _ = _failfast_query(ls, tmp_path)
    exc = _await_failure(q)
    message = str(exc)
    assert message.startswith("[STREAM_FAILED]")
    assert "b.json" in message, message
    assert "MALFORMED_RECORD" in message or "FAILED_READ_FILE" in message, message


# -- checkpoints of another query, corrupt checkpoints ---------------------------------------


def test_checkpoint_of_a_query_with_a_different_number_of_sources(
    ls: Any, rate_checkpoint: Path
) -> None:
    before = _snapshot(rate_checkpoint)
    two_sources = _rate(ls).union(_rate(ls))
    q = _run_once(two_sources, rate_checkpoint)
    exc = _await_failure(q)
    message = str(exc)
    assert (
        "There are [1] sources in the checkpoint offsets and now there are [2] sources "
        "requested by the query. Cannot continue." in message
    ), message
    assert str(rate_checkpoint) in message
    assert isinstance(exc.cause, CheckpointError)
    assert _snapshot(rate_checkpoint) == before


CORRUPTIONS = {
    # name: (file, new content, words the message must contain)
    "offsets-empty": ("offsets/1", b"", ["empty"]),
    "offsets-garbage": ("offsets/1", b"\x00garbage\nmore garbage", ["malformed"]),
    "offsets-version-only": ("offsets/1", b"v1\n", ["truncated"]),
    "offsets-bad-json": ("offsets/1", b'v1\n{"batchWatermarkMs":0,\n{"offset":3}', ["malformed"]),
    "offsets-v99": (
        "offsets/1",
        b'v99\n{"batchWatermarkMs":0,"batchTimestampMs":1,"conf":{}}\n{"offset":3}',
        ["v99", "UnsupportedLogVersion"],
    ),
    "older-offsets-garbage": ("offsets/0", b"garbage", ["malformed"]),
    "commits-empty": ("commits/1", b"", ["empty"]),
    "commits-v99": (
        "commits/1",
        b'v99\n{"nextBatchWatermarkMs":0}',
        ["v99", "UnsupportedLogVersion"],
    ),
    "commits-bad-json": ("commits/1", b"v1\n{nope", ["malformed"]),
}


@pytest.mark.parametrize("checksum", ["with-checksum", "without-checksum"])
@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_corrupt_checkpoint_file_fails_the_query_naming_the_file(
    ls: Any, rate_checkpoint: Path, corruption: str, checksum: str
) -> None:
    """A file that no longer matches its ``.crc`` fails its check before it is parsed; one
    without a ``.crc`` (a checkpoint older than lockgate's checksums) fails its parse. Both
    name the file, and neither writes or repairs anything."""
    relative, content, words = CORRUPTIONS[corruption]
    target = rate_checkpoint / relative
    crc = target.with_name(target.name + ".crc")
    assert crc.exists()
    target.write_bytes(content)
    if checksum == "with-checksum":
        words = ["Checksum verification failed", "new checkpoint location"]
    else:
        crc.unlink()
    before = _snapshot(rate_checkpoint)
    q = _run_once(_rate(ls), rate_checkpoint)
    exc = _await_failure(q)
    message = str(exc)
    assert str(target) in message, message
    for word in words:
        assert word in message, message
    assert isinstance(exc.cause, CheckpointError)
    assert exc.cause.path == str(target)
    # Nothing was written or repaired: no new batch, the corrupt file left as it was.
    assert _snapshot(rate_checkpoint) == before


def test_corrupt_metadata_file_is_refused_at_start(ls: Any, rate_checkpoint: Path) -> None:
    metadata = rate_checkpoint / "metadata"
    metadata.write_text("not json")
    before = _snapshot(rate_checkpoint)
    with pytest.raises(CheckpointError, match="metadata") as info:
        _run_once(_rate(ls), rate_checkpoint)
    assert str(metadata) in str(info.value)
    assert _snapshot(rate_checkpoint) == before


def test_checkpoint_location_that_is_a_regular_file(ls: Any, tmp_path: Path) -> None:
    location = tmp_path / "not-a-directory"
    location.write_text("precious")
    with pytest.raises(CheckpointError) as info:
        _run_once(_rate(ls), location)
    message = str(info.value)
    assert str(location) in message
    assert "not a directory" in message
    assert location.read_text() == "precious"
    assert ls.streams.active == []


def test_file_sink_without_checkpoint_location(ls: Any, spark: Any, tmp_path: Path) -> None:
    saved = spark.conf.get("spark.sql.streaming.checkpointLocation", None)
    if saved is not None:
        spark.conf.unset("spark.sql.streaming.checkpointLocation")
    try:
        out = tmp_path / "out"
        with pytest.raises(AnalysisException) as info:
            _rate(ls).writeStream.format("parquet").start(str(out))
    finally:
        if saved is not None:
            spark.conf.set("spark.sql.streaming.checkpointLocation", saved)
    assert "checkpointLocation must be specified" in str(info.value)
    assert not out.exists()
    assert ls.streams.active == []


# -- unknown formats and bad options --------------------------------------------------------


def test_unknown_source_format(ls: Any) -> None:
    with pytest.raises(OptionError) as info:
        ls.readStream.format("no-such-source").load()
    assert "no-such-source" in str(info.value)


def test_unknown_sink_format(ls: Any, tmp_path: Path) -> None:
    checkpoint = tmp_path / "checkpoint"
    with pytest.raises(OptionError) as info:
        (
            _rate(ls)
            .writeStream.format("no-such-sink")
            .option("checkpointLocation", str(checkpoint))
            .start()
        )
    assert "no-such-sink" in str(info.value)
    assert not checkpoint.exists()


@pytest.mark.parametrize(
    ("fmt", "option", "value"),
    [
        ("rate-micro-batch", "rowsPerBatch", "-1"),
        ("rate-micro-batch", "rowsPerBatch", "abc"),
        ("rate-micro-batch", "rowsPerBatch", "0"),
        ("rate", "rowsPerSecond", "fast"),
        ("rate", "rowsPerSecond", "-5"),
        ("json", "maxFilesPerTrigger", "x"),
        ("json", "maxFilesPerTrigger", "0"),
        ("json", "maxBytesPerTrigger", "lots"),
    ],
)
def test_bad_source_option_value(
    ls: Any, tmp_path: Path, fmt: str, option: str, value: str
) -> None:
    reader = ls.readStream.format(fmt).option(option, value)
    if fmt == "json":
        reader = reader.schema(JSON_SCHEMA).option("path", str(tmp_path))
    with pytest.raises(OptionError) as info:
        reader.load()
    message = str(info.value)
    assert option in message
    assert value in message
    assert info.value.option == option


def test_bad_console_sink_option_value(
    ls: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with pytest.raises(OptionError) as info:
        _rate(ls).writeStream.format("console").option("numRows", "x").start()
    message = str(info.value)
    assert "numRows" in message and "'x'" in message
    assert info.value.option == "numRows"
    assert ls.streams.active == []


def test_failed_start_leaves_no_temporary_checkpoint(
    ls: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    temp_root = tmp_path / "tmp"
    temp_root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp_root))
    with pytest.raises(OptionError):
        _rate(ls).writeStream.format("console").option("numRows", "x").start()
    assert list(temp_root.iterdir()) == []


# -- output modes ---------------------------------------------------------------------------


def test_unknown_output_mode(ls: Any, tmp_path: Path) -> None:
    expected = "Unknown output mode bogus. Accepted output modes are 'append', 'complete', 'update'"
    with pytest.raises(ValueError, match=expected) as info:
        _rate(ls).writeStream.outputMode("bogus")
    assert isinstance(info.value, OptionError)
    with pytest.raises(ValueError, match=expected):
        _rate(ls).writeStream.format("noop").start(outputMode="bogus")
    assert ls.streams.active == []


def test_complete_mode_on_a_stateless_query(ls: Any, tmp_path: Path) -> None:
    checkpoint = tmp_path / "checkpoint"
    with pytest.raises(AnalysisException) as info:
        (
            _rate(ls)
            .writeStream.format("noop")
            .outputMode("complete")
            .option("checkpointLocation", str(checkpoint))
            .start()
        )
    assert (
        "[STREAMING_OUTPUT_MODE.UNSUPPORTED_OPERATION] Invalid streaming output mode: complete. "
        "This output mode is not supported for no streaming aggregations on streaming "
        "DataFrames/DataSets." in str(info.value)
    )
    assert not checkpoint.exists()


def test_update_mode_on_the_file_sink(ls: Any, tmp_path: Path) -> None:
    checkpoint = tmp_path / "checkpoint"
    with pytest.raises(AnalysisException) as info:
        (
            _rate(ls)
            .writeStream.format("parquet")
            .outputMode("update")
            .option("checkpointLocation", str(checkpoint))
            .start(str(tmp_path / "out"))
        )
    assert "data source parquet does not support update output mode" in str(info.value).lower()
    assert not checkpoint.exists()


# -- triggers -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"processingTime": "1 second", "once": True},
        {"once": True, "availableNow": True},
        {},
        {"once": False},
        {"availableNow": False},
        {"processingTime": ""},
        {"processingTime": "   "},
        {"processingTime": "soon"},
        {"processingTime": "10"},
        {"processingTime": "-1 second"},
        {"processingTime": "1 month"},
        {"continuous": "5 m"},
    ],
)
def test_trigger_misuse(spark: Any, ls: Any, kwargs: dict[str, Any]) -> None:
    """PySpark's and Spark's own errors (ONLY_ALLOW_SINGLE_TRIGGER, VALUE_NOT_ALLOWED,
    VALUE_NOT_NON_EMPTY_STR, INVALID_INTERVAL_FORMAT.*, "should not be negative", ...)."""
    from pyspark.errors import PySparkException

    def error(writer: Any) -> tuple[type, str]:
        with pytest.raises(PySparkException) as info:
            writer.trigger(**kwargs)
        return type(info.value).__mro__[2], str(info.value).split("SQLSTATE")[0]

    assert error(_rate(ls).writeStream) == error(
        spark.readStream.format("rate").load().writeStream
    )


# -- invalid and unsupported operations -------------------------------------------------------


@pytest.mark.parametrize(
    "define",
    [
        lambda df: df.select("nope"),
        lambda df: df.select(F.col("nope") + 1),
        lambda df: df.where("nope > 1"),
        lambda df: df.filter(F.col("nope") > 1),
        lambda df: df.withColumn("x", F.col("nope")),
        lambda df: df.selectExpr("value + nope"),
    ],
    ids=["select", "select-col", "where-sql", "filter-col", "withColumn", "selectExpr"],
)
def test_bad_column_fails_at_definition_time(ls: Any, define: Any) -> None:
    df = _rate(ls)
    with pytest.raises(AnalysisException) as info:
        define(df)
    exc = info.value
    # Spark's own analyzer error, not a lockgate wrapper.
    assert not isinstance(exc, lockgate.LockgateError)
    assert exc.getCondition().startswith("UNRESOLVED_COLUMN"), exc.getCondition()
    assert "nope" in str(exc)


@pytest.mark.parametrize(
    ("define", "operation"),
    [
        # a grouping set aggregating its own grouping column (Spark reads the column's
        # values, lockgate's expansion the nulled key)
        (lambda df: df.rollup("value").agg(F.count("value")), "rollup"),
        (lambda df: df.cube("value", "timestamp").agg(F.max("value")), "cube"),
        (lambda df: df.rollup("value").agg(F.grouping_id()), "grouping_id"),
        # a key of the sets that is not among the columns, aggregated
        (
            lambda df: df.groupingSets([["timestamp"], ["value"]]).agg(F.max("value")),
            "groupingSets aggregating its own grouping column (value)",
        ),
        (
            lambda df: df.groupingSets([["value"]], "value", "value").agg(F.count("*")),
            "groupingSets by the same key twice",
        ),
        # the pivot column is a grouping key: Spark's first aggregation groups by both
        (
            lambda df: df.groupBy("value").pivot("value", [1, 2]).agg(F.sum("value")),
            "pivot whose keys, pivot column and aggregates share names",
        ),
    ],
    ids=[
        "rollup",
        "cube",
        "grouping_id",
        "groupingSets-hidden-key",
        "groupingSets-twice",
        "pivot",
    ],
)
def test_stateful_operation_is_not_supported_yet(ls: Any, define: Any, operation: str) -> None:
    """Stateful operators lockgate's engine does not have yet fail when defined."""
    with pytest.raises(NotSupportedYetError) as info:
        define(_rate(ls))
    assert operation in str(info.value)
    assert "not supported yet" in str(info.value)


def test_pivot_without_values_fails_as_in_spark(spark: Any, ls: Any) -> None:
    """Spark cannot find a stream's pivot values; both refuse when pivot() is called."""
    with pytest.raises(AnalysisException) as native:
        spark.readStream.format("rate").load().groupBy("value").pivot("value")
    with pytest.raises(AnalysisException) as mine:
        _rate(ls).groupBy("value").pivot("value")
    assert str(native.value).split("\n")[0] in str(mine.value)


def test_stream_stream_join_without_equality_key_is_not_supported_yet(ls: Any) -> None:
    with pytest.raises(NotSupportedYetError) as info:
        _rate(ls).alias("l").join(_rate(ls).alias("r"), F.expr("l.value < r.value"))
    assert "not supported yet" in str(info.value)


@pytest.mark.parametrize(
    "action",
    [
        lambda df: df.count(),
        lambda df: df.collect(),
        lambda df: df.show(),
        lambda df: df.toPandas(),
        lambda df: df.take(1),
        lambda df: df.write,
    ],
    ids=["count", "collect", "show", "toPandas", "take", "write"],
)
def test_action_on_a_streaming_dataframe(ls: Any, action: Any) -> None:
    with pytest.raises(AnalysisException) as info:
        action(_rate(ls).select("value"))
    assert "Queries with streaming sources must be executed with writeStream.start();" in str(
        info.value
    )


# -- clashes with active queries ------------------------------------------------------------


def test_second_query_with_the_same_name_while_the_first_is_active(
    ls: Any, tmp_path: Path
) -> None:
    stream = lockgate.MemoryStream(ls, "value INT")
    seen: list[int] = []

    def collect(df: Any, batch_id: int) -> None:
        seen.extend(r["value"] for r in df.collect())

    first = (
        stream.toDF()
        .writeStream.queryName("same_name")
        .foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / "first"))
        .start()
    )
    second_checkpoint = tmp_path / "second"
    with pytest.raises(AnalysisException) as info:
        (
            stream.toDF()
            .writeStream.queryName("same_name")
            .format("noop")
            .option("checkpointLocation", str(second_checkpoint))
            .start()
        )
    assert (
        "Cannot start query with name same_name as a query with that name is already active "
        "in this SparkSession" in str(info.value)
    )
    assert [q.id for q in ls.streams.active] == [first.id]
    # The first query is untouched and keeps working.
    stream.addData([1, 2])
    first.processAllAvailable()
    assert sorted(seen) == [1, 2]
    assert first.isActive and first.exception() is None
    first.stop()
    # The name is free again once the first query stopped.
    again = (
        stream.toDF()
        .writeStream.queryName("same_name")
        .format("noop")
        .option("checkpointLocation", str(second_checkpoint))
        .start()
    )
    again.stop()


def test_duplicate_memory_query_name_keeps_the_active_querys_table(
    ls: Any, spark: Any
) -> None:
    stream = lockgate.MemoryStream(ls, "value INT")
    first = stream.toDF().writeStream.format("memory").queryName("dup_memory").start()
    stream.addData([1, 2, 3])
    first.processAllAvailable()
    assert spark.sql("select count(*) from dup_memory").first()[0] == 3
    with pytest.raises(AnalysisException, match="already active"):
        stream.toDF().writeStream.format("memory").queryName("dup_memory").start()
    assert spark.sql("select count(*) from dup_memory").first()[0] == 3


@pytest.fixture
def no_stop_on_restart(spark: Any) -> Any:
    spark.conf.set("spark.sql.streaming.stopActiveRunOnRestart", "false")
    yield
    spark.conf.unset("spark.sql.streaming.stopActiveRunOnRestart")


def test_restart_from_the_checkpoint_of_an_active_query_replaces_it_by_default(
    ls: Any, tmp_path: Path
) -> None:
    checkpoint = tmp_path / "checkpoint"
    stream = lockgate.MemoryStream(ls, "value INT")
    seen: list[int] = []

    def collect(df: Any, batch_id: int) -> None:
        seen.extend(r["value"] for r in df.collect())

    first = stream.toDF().writeStream.foreachBatch(collect).option("checkpointLocation", str(checkpoint)).start()
    stream.addData([1])
    first.processAllAvailable()
    second = stream.toDF().writeStream.foreachBatch(collect).option("checkpointLocation", str(checkpoint)).start()
    assert not first.isActive and first.exception() is None
    assert second.id == first.id and second.runId != first.runId
    stream.addData([2])
    second.processAllAvailable()
    assert sorted(seen) == [1, 2]
    assert [q.id for q in ls.streams.active] == [second.id]
    second.stop()


def test_restart_from_the_checkpoint_of_an_active_query(
    ls: Any, tmp_path: Path, no_stop_on_restart: Any
) -> None:
    checkpoint = tmp_path / "checkpoint"
    stream = lockgate.MemoryStream(ls, "value INT")
    seen: list[int] = []

    def collect(df: Any, batch_id: int) -> None:
        seen.extend(r["value"] for r in df.collect())

    first = (
        stream.toDF()
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
        .start()
    )
    stream.addData([1])
    first.processAllAvailable()
    with pytest.raises(AnalysisException) as info:
        (
            stream.toDF()
            .writeStream.foreachBatch(collect)
            .option("checkpointLocation", str(checkpoint))
            .start()
        )
    message = str(info.value)
    assert (
        f"Cannot start query with id {first.id} as another query with same id is already "
        "active" in message
    )
    assert "restart a query from checkpoint that is already active" in message
    assert [q.id for q in ls.streams.active] == [first.id]
    # The active query is untouched: it keeps running and committing.
    stream.addData([2, 3])
    first.processAllAvailable()
    assert sorted(seen) == [1, 2, 3]
    assert first.isActive and first.exception() is None
    assert _log_ids(checkpoint / "commits") == [0, 1]
    metadata = json.loads((checkpoint / "metadata").read_text())
    assert metadata["id"] == first.id
    first.stop()
    assert os.path.isdir(checkpoint)

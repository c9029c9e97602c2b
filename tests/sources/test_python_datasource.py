"""Python data sources (``spark.dataSource.register``): readers and writers, differential
against native Spark.

The sources read a counter whose current end is kept in a file, so both engines see the
same data; the readers log the driver calls Spark makes (``commit``) to files, and the
sink writes one JSON file per partition and batch and logs its commits.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import uuid
from pathlib import Path

import pytest
from pyspark import cloudpickle
from pyspark.sql import functions as F
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    InputPartition,
    SimpleDataSourceStreamReader,
    WriterCommitMessage,
)

# The classes travel to the Python workers by value (the test module is not importable there).
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _end(options) -> int:
    return int(Path(options["counter"]).read_text())


def _log(options, record) -> None:
    log = options.get("log")
    if log:
        with open(log, "a") as f:
            f.write(json.dumps(record) + "\n")


class RangePartition(InputPartition):
    def __init__(self, start: int, end: int) -> None:
        self.start, self.end = start, end


class CounterReader(DataSourceStreamReader):
    def __init__(self, options) -> None:
        self.options = options

    def initialOffset(self):
        return {"offset": 0}

    def latestOffset(self, start, limit):
        return {"offset": _end(self.options)}

    def partitions(self, start, end):
        lo, hi = start["offset"], end["offset"]
        mid = (lo + hi) // 2
        return [RangePartition(lo, mid), RangePartition(mid, hi)]

    def read(self, partition):
        for i in range(partition.start, partition.end):
            yield (i, f"k{i % 3}")

    def commit(self, end):
        _log(self.options, {"commit": end})


class CounterSource(DataSource):
    @classmethod
    def name(cls):
        return "lg_counter"

    def schema(self):
        return "id INT, k STRING"

    def streamReader(self, schema):
        return CounterReader(self.options)


class SimpleCounterReader(SimpleDataSourceStreamReader):
    def __init__(self, options) -> None:
        self.options = options

    def initialOffset(self):
        return {"n": 0}

    def read(self, start):
        end = _end(self.options)
        return iter([(i, i * 10) for i in range(start["n"], end)]), {"n": end}

    def readBetweenOffsets(self, start, end):
        _log(self.options, {"readBetweenOffsets": [start, end]})
        return iter([(i, i * 10) for i in range(start["n"], end["n"])])

    def commit(self, end):
        _log(self.options, {"commit": end})


class SimpleCounterSource(DataSource):
    @classmethod
    def name(cls):
        return "lg_simple_counter"

    def schema(self):
        return "id INT, v LONG"

    def simpleStreamReader(self, schema):
        return SimpleCounterReader(self.options)


class FilesWriter(DataSourceStreamWriter):
    def __init__(self, options, overwrite) -> None:
        self.options, self.overwrite = options, overwrite

    def write(self, iterator):
        from pyspark import TaskContext

        rows = [r.asDict() for r in iterator]
        path = os.path.join(self.options["path"], f"part-{TaskContext.get().partitionId()}-{uuid.uuid4().hex}.json")
        with open(path, "w") as f:
            json.dump(rows, f, default=str)
        message = WriterCommitMessage()  # importable on every worker, for Spark's plain pickle
        message.path, message.rows = path, len(rows)
        return message

    def commit(self, messages, batchId):
        record = {"batch": batchId, "rows": sum(m.rows for m in messages), "overwrite": self.overwrite}
        with open(os.path.join(self.options["path"], f"_commit-{batchId}"), "w") as f:
            json.dump(record, f)
        for m in messages:
            os.rename(m.path, m.path.replace("part-", f"b{batchId}-part-"))

    def abort(self, messages, batchId):
        with open(os.path.join(self.options["path"], f"_abort-{batchId}"), "w") as f:
            json.dump({"batch": batchId}, f)


class FilesSink(DataSource):
    @classmethod
    def name(cls):
        return "lg_files"

    def streamWriter(self, schema, overwrite):
        return FilesWriter(self.options, overwrite)


@pytest.fixture(scope="module", autouse=True)
def registered(spark):
    for cls in (CounterSource, SimpleCounterSource, FilesSink):
        spark.dataSource.register(cls)


@contextlib.contextmanager
def _oracle():
    """Native Spark starts a Python process on the driver for a Python data source (its
    stream runner, each sink commit) and gives it a hard-coded 10 s to connect back: on
    an overloaded machine the oracle cannot run, which says nothing of lockgate."""
    from pyspark.errors import StreamingQueryException

    try:
        yield
    except StreamingQueryException as exc:
        if "Python worker failed to connect back" in str(exc):
            pytest.skip("native Spark's Python worker did not start within its 10 s timeout")
        raise


def _sorted(rows) -> list[tuple]:
    return sorted(tuple(r) for r in rows)


def _set_end(counter: Path, n: int) -> None:
    temp = counter.with_name(f".{counter.name}.{uuid.uuid4().hex}")
    temp.write_text(str(n))
    os.replace(temp, counter)  # the running queries never read a half-written file


def _sink_state(path: Path) -> tuple[list, list]:
    """(committed rows per batch, commit records) written by the FilesSink."""
    rows: dict[int, list] = {}
    commits = []
    for f in sorted(os.listdir(path)):
        if f.startswith("_commit-"):
            commits.append(json.loads((path / f).read_text()))
        elif f.startswith("b"):
            batch = int(f[1 : f.index("-")])
            rows.setdefault(batch, []).extend(tuple(sorted(r.items())) for r in json.loads((path / f).read_text()))
    return sorted((b, sorted(r)) for b, r in rows.items()), sorted(commits, key=lambda c: c["batch"])


def _last_offsets_line(checkpoint: Path, batch: int) -> str:
    return (checkpoint / "offsets" / str(batch)).read_text().splitlines()[-1]


def test_partitioned_reader_matches_native(spark, ls, tmp_path):
    counter = tmp_path / "counter"
    _set_end(counter, 7)
    results = {}
    for engine, reader in (("lockgate", ls.readStream), ("native", spark.readStream)):
        with _oracle() if engine == "native" else contextlib.nullcontext():
            log = tmp_path / f"{engine}.log"
            ck = tmp_path / f"ck-{engine}"
            name = f"pyds_{engine}_{uuid.uuid4().hex[:6]}"
            df = reader.format("lg_counter").option("counter", str(counter)).option("log", str(log)).load()
            counts = df.groupBy("k").agg(F.count("*").alias("n"), F.sum("id").alias("s"))
            q = counts.writeStream.format("memory").queryName(name).outputMode("complete").option(
                "checkpointLocation", str(ck)
            ).start()
            try:
                _set_end(counter, 7)
                q.processAllAvailable()
                first = _sorted(spark.table(name).collect())
                _set_end(counter, 20)
                q.processAllAvailable()
                second = _sorted(spark.table(name).collect())
                description = q.lastProgress["sources"][0]["description"]
            finally:
                q.stop()
            commits = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
            results[engine] = (first, second, _last_offsets_line(ck, 1), commits, description)
            _set_end(counter, 7)
    native, lockgate_ = results["native"], results["lockgate"]
    assert native[0] == lockgate_[0] == [("k0", 3, 9), ("k1", 2, 5), ("k2", 2, 7)]
    assert native[1] == lockgate_[1]
    assert lockgate_[2] == native[2] == '{"offset": 20}'  # the offset as json.dumps writes it
    assert lockgate_[3] == native[3] and {"commit": {"offset": 7}} in lockgate_[3]
    assert lockgate_[4].split("@")[0] == native[4].split("@")[0]


def test_simple_reader_and_restart_replay(spark, ls, tmp_path):
    """Rows read on the driver; a batch re-run after a restart (its commit removed) is read
    with readBetweenOffsets, in both engines."""
    counter = tmp_path / "counter"
    results = {}
    for engine, reader in (("lockgate", ls.readStream), ("native", spark.readStream)):
        with _oracle() if engine == "native" else contextlib.nullcontext():
            _set_end(counter, 4)
            log = tmp_path / f"{engine}.log"
            ck = tmp_path / f"ck-{engine}"
            out = tmp_path / f"out-{engine}"
            out.mkdir()
            batches: list = []

            def start(reader=reader, log=log, batches=batches, ck=ck):
                df = reader.format("lg_simple_counter").option("counter", str(counter)).option("log", str(log)).load()
                return (
                    df.where("id % 2 = 0")
                    .writeStream.foreachBatch(lambda b, i: batches.append((i, _sorted(b.collect()))))
                    .option("checkpointLocation", str(ck))
                    .start()
                )

            q = start()
            try:
                q.processAllAvailable()
                _set_end(counter, 9)
                q.processAllAvailable()
            finally:
                q.stop()
            for leftover in ("1", ".1.crc"):  # Spark writes a checksum file beside it
                if (ck / "commits" / leftover).exists():
                    os.remove(ck / "commits" / leftover)
            _set_end(counter, 12)
            q = start()
            try:
                q.processAllAvailable()
            finally:
                q.stop()
            calls = [json.loads(line) for line in log.read_text().splitlines()]
            results[engine] = (batches, calls, _last_offsets_line(ck, 2))
    native, lockgate_ = results["native"], results["lockgate"]
    assert native[0] == lockgate_[0]
    assert lockgate_[0][-2:] == [(1, [(4, 40), (6, 60), (8, 80)]), (2, [(10, 100)])]
    assert {"readBetweenOffsets": [{"n": 4}, {"n": 9}]} in lockgate_[1]
    assert native[1] == lockgate_[1]
    assert native[2] == lockgate_[2] == '{"n": 12}'


@pytest.mark.parametrize("mode", ["append", "complete"])
def test_stream_writer_sink_matches_native(spark, ls, tmp_path, mode):
    counter = tmp_path / "counter"
    results = {}
    for engine, reader in (("lockgate", ls.readStream), ("native", spark.readStream)):
        with _oracle() if engine == "native" else contextlib.nullcontext():
            out = tmp_path / f"out-{engine}"
            out.mkdir()
            ck = tmp_path / f"ck-{engine}"
            # the first rows are there before start(), so that no engine's first trigger
            # races the test's first write (a batch 0 with or without rows, by timing)
            _set_end(counter, 5)
            df = reader.format("lg_counter").option("counter", str(counter)).load()
            if mode == "complete":
                df = df.groupBy("k").count()
            q = (
                df.writeStream.format("lg_files").outputMode(mode).option("path", str(out))
                .option("checkpointLocation", str(ck)).start()
            )
            try:
                for end in (5, 11):
                    _set_end(counter, end)
                    q.processAllAvailable()
            finally:
                q.stop()
            _set_end(counter, 14)  # a restart carries on from the checkpoint
            q = (
                df.writeStream.format("lg_files").outputMode(mode).option("path", str(out))
                .option("checkpointLocation", str(ck)).start()
            )
            try:
                q.processAllAvailable()
                description = q.lastProgress["sink"]["description"]
            finally:
                q.stop()
            results[engine] = (_sink_state(out), description)
    native, lockgate_ = results["native"], results["lockgate"]
    assert native[0] == lockgate_[0]
    _, commits = lockgate_[0]
    assert [c["batch"] for c in commits][-1] >= 2
    assert all(c["overwrite"] == (mode == "complete") for c in commits)
    assert native[1].split("@")[0] == lockgate_[1].split("@")[0]


def test_schema_from_the_user_and_unknown_format(spark, ls, tmp_path):
    counter = tmp_path / "counter"
    _set_end(counter, 3)
    schema = "id INT, k STRING"
    df = ls.readStream.format("lg_counter").schema(schema).option("counter", str(counter)).load()
    assert df.schema == spark.readStream.format("lg_counter").schema(schema).option("counter", "x").load().schema
    with pytest.raises(Exception, match="Failed to find data source: lg_nope"):
        ls.readStream.format("lg_nope").load()

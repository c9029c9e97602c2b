"""``sources[].latestOffset`` in progress, against native Spark: what the source reports
as its latest offset (Spark's ``reportLatestOffset``), null for the sources Spark reads
with admission control that report none (files, ``rate-micro-batch``), the batch's end
for those it reads without (a memory stream). Kafka's, the topic's latest offsets past a
capped batch, is checked in tests/kafka/test_kafka_source.py."""

from __future__ import annotations

import json

from differential import process_all, wait_until, write_text
from pyspark.sql.datasource import DataSourceStreamReader
from pyspark.sql.streaming.datasource import ReadMaxRows


def _latest_offsets(query) -> list:
    return [p.sources[0].latestOffset for p in query.recentProgress if p.numInputRows > 0]


def _run(df, tmp_path, name):
    q = df.writeStream.format("noop").option("checkpointLocation", str(tmp_path / name)).start()
    return q


def test_file_and_rate_micro_batch_sources_report_none(spark, ls, tmp_path):
    for i in range(3):
        write_text(tmp_path / "in", [f"line {i}"])
    for engine, session in (("native", spark), ("lockgate", ls)):
        files = session.readStream.option("maxFilesPerTrigger", 1).text(str(tmp_path / "in"))
        rate = session.readStream.format("rate-micro-batch").option("rowsPerBatch", 5).load()
        queries = [_run(files, tmp_path, f"{engine}-files"), _run(rate, tmp_path, f"{engine}-rate")]
        try:
            process_all(queries[:1])  # the rate stream never runs dry: two batches of it
            rate_query = queries[1]
            wait_until(lambda q=rate_query: len(_latest_offsets(q)) >= 2, message=f"{engine} rate batches")
            for q in queries:
                # PySpark shows a null offset as the JSON text "null"
                assert _latest_offsets(q) and set(_latest_offsets(q)) == {"null"}, (engine, q.lastProgress)
        finally:
            for q in queries:
                q.stop()


def test_a_memory_stream_reports_the_batch_end(ls):
    from lockgate.testing import MemoryStream

    stream = MemoryStream(ls, "value INT")
    q = stream.toDF().writeStream.format("noop").start()
    try:
        for batch in ([1, 2], [3]):
            stream.addData(batch)
            q.processAllAvailable()
        progress = [p for p in q.recentProgress if p.numInputRows > 0]
        assert [p.sources[0].latestOffset for p in progress] == [p.sources[0].endOffset for p in progress]
        assert [json.loads(p.sources[0].endOffset) for p in progress] == [0, 1]
    finally:
        q.stop()


def test_a_python_data_source_reports_its_readers_latest(spark, ls, tmp_path):
    from pyspark.sql.datasource import DataSource

    # defined here, so that the workers get the classes by value (a test module is not
    # importable there)
    class _Limited(DataSourceStreamReader):
        """Ten rows in all, read at most four per batch; its latest is all ten."""

        def initialOffset(self):
            return {"i": 0}

        def latestOffset(self, start, limit):
            end = 10 if not isinstance(limit, ReadMaxRows) else min(10, start["i"] + limit.max_rows)
            return {"i": end}

        def getDefaultReadLimit(self):
            return ReadMaxRows(4)

        def reportLatestOffset(self):
            return {"i": 10}

        def partitions(self, start, end):
            from pyspark.sql.datasource import InputPartition

            return [InputPartition((start["i"], end["i"]))]

        def read(self, partition):
            low, high = partition.value
            for i in range(low, high):
                yield (i,)

    class LimitedSource(DataSource):
        @classmethod
        def name(cls):
            return "lockgate_limited_latest"

        def schema(self):
            return "i int"

        def streamReader(self, schema):
            return _Limited()

    spark.dataSource.register(LimitedSource)
    reports = {}
    for engine, session in (("native", spark), ("lockgate", ls)):
        q = _run(session.readStream.format("lockgate_limited_latest").load(), tmp_path, engine)
        try:
            q.processAllAvailable()
            reports[engine] = [json.loads(x) for x in _latest_offsets(q)]
            ends = [json.loads(p.sources[0].endOffset) for p in q.recentProgress if p.numInputRows > 0]
            assert ends == [{"i": 4}, {"i": 8}, {"i": 10}], (engine, ends)
        finally:
            q.stop()
    assert reports["lockgate"] == reports["native"] == [{"i": 10}] * 3

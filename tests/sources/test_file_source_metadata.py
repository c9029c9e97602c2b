"""Spark's hidden ``_metadata`` column of the file source, differential against native."""

from __future__ import annotations

from differential import Differential, write_json
from pyspark.sql import functions as F


def test_hidden_metadata_column_as_spark(spark, ls, tmp_path):
    """Spark's hidden ``_metadata`` column of file sources (``file_path``, ``file_name``,
    ``file_size``, ``file_modification_time``...): selected, filtered on and grouped by,
    through batches with files and an empty one."""
    inp = tmp_path / "in"
    inp.mkdir()

    def build(reader):
        df = reader.schema("id LONG, name STRING").json(str(inp))
        return (
            df.select("id", "_metadata", F.col("_metadata.file_name").alias("f"))
            .where(F.col("_metadata.file_size") > 0)
            .select("id", "f", "_metadata.file_path", "_metadata.file_size", "_metadata.file_modification_time")
        )

    def grouped(reader):
        df = reader.schema("id LONG, name STRING").json(str(inp))
        return df.groupBy(F.col("_metadata.file_name").alias("f")).agg(F.count("*").alias("n"))

    d = Differential(spark, ls, tmp_path / "q", build, sink="foreachBatch")
    g = Differential(spark, ls, tmp_path / "g", lambda r: _Update(grouped(r)), sink="foreachBatch")
    try:
        for rows in ([{"id": 1, "name": "a"}, {"id": 2, "name": "b"}], [{"id": 3, "name": "c"}]):
            write_json(inp, rows)
            assert d.run()
            g.run()
        assert len({r.split(",")[1] for r in d.run()}) == 2  # two files, by name
    finally:
        d.stop()
        g.stop()


class _Update:
    def __init__(self, df):
        self.df = df

    @property
    def writeStream(self):
        return self.df.writeStream.outputMode("update")

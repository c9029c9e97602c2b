"""SQL over streaming views (``createOrReplaceTempView`` + ``ls.sql``), differential
against native Spark's ``spark.sql`` over a streaming temp view."""

from __future__ import annotations

import uuid

import pytest
from differential import Differential, write_json
from pyspark.errors import AnalysisException, ParseException

from lockgate.api.reader import DataStreamReader as LockgateReader
from lockgate.errors import AnalysisError

SCHEMA = "id LONG, name STRING, score DOUBLE, ts TIMESTAMP"


def rows(start: int, n: int, second: int = 0) -> list[dict]:
    return [
        {"id": i, "name": f"n{i % 3}", "score": i * 1.5, "ts": f"2024-01-01T00:00:{second + i % 5:02d}Z"}
        for i in range(start, start + n)
    ]


class _Mode:
    """A query with its output mode, for the Differential harness."""

    def __init__(self, df, mode: str) -> None:
        self.df, self.mode = df, mode

    @property
    def writeStream(self):
        return self.df.writeStream.outputMode(self.mode)


def sql_query(ls, inp, query: str, *, mode: str = "append", views=None, watermark: str | None = None):
    """``query_fn`` registering the stream as view ``ev`` on either engine and running ``query``."""
    suffix = uuid.uuid4().hex[:8]

    def make(reader):
        lockgate_side = isinstance(reader, LockgateReader)
        df = reader.schema(SCHEMA).json(str(inp))
        if watermark:
            df = df.withWatermark("ts", watermark)
        view = f"ev_{suffix}_{'lg' if lockgate_side else 'native'}"
        df.createOrReplaceTempView(view)
        for name, build in (views or {}).items():
            build(df).createOrReplaceTempView(f"{name}_{suffix}_{'lg' if lockgate_side else 'native'}")
        text = query.replace("{ev}", view)
        for name in views or {}:
            text = text.replace("{" + name + "}", f"{name}_{suffix}_{'lg' if lockgate_side else 'native'}")
        engine = ls if lockgate_side else ls.spark
        return _Mode(engine.sql(text), mode)

    return make


@pytest.fixture
def inp(tmp_path):
    path = tmp_path / "in"
    path.mkdir()
    return path


@pytest.mark.parametrize(
    "query",
    [
        "SELECT id, upper(name) AS n, score * 2 AS s FROM {ev} WHERE id % 2 = 0",
        "SELECT * FROM {ev} e WHERE e.score > 3",
        # one view in both branches of a union, each with its own filter
        "SELECT id, name FROM {ev} WHERE id < 3 UNION ALL SELECT id, name FROM {ev} WHERE id > 6",
        (
            "WITH a AS (SELECT id, name FROM {ev} WHERE id > 1), b AS (SELECT * FROM a WHERE id < 7) "
            "SELECT id * 10 AS x, name FROM b"
        ),
    ],
)
def test_stateless_sql(spark, ls, tmp_path, inp, query):
    d = Differential(spark, ls, tmp_path / "q", sql_query(ls, inp, query), sink="foreachBatch")
    try:
        write_json(inp, rows(0, 5))
        d.run()
        write_json(inp, rows(5, 4))
        assert d.run()
    finally:
        d.stop()


def test_windowed_aggregation_append_with_restart(spark, ls, tmp_path, inp):
    query = (
        "SELECT window(ts, '2 seconds') AS w, name, count(*) AS c, avg(score) AS a "
        "FROM {ev} WHERE id >= 0 GROUP BY window(ts, '2 seconds'), name"
    )
    d = Differential(spark, ls, tmp_path / "q", sql_query(ls, inp, query, watermark="1 second"), sink="foreachBatch")
    try:
        write_json(inp, rows(0, 5))
        d.run()
        d.restart()
        write_json(inp, rows(5, 5, second=20))
        d.run()
        write_json(inp, rows(10, 2, second=40))
        assert d.run()
    finally:
        d.stop()


@pytest.mark.parametrize(
    ("query", "mode"),
    [
        ("SELECT upper(name) AS u, max(id) AS m FROM {ev} GROUP BY name", "update"),
        ("SELECT name, count(*), sum(score) FROM {ev} GROUP BY name", "complete"),
        ("SELECT name, count(*) AS c FROM {ev} GROUP BY 1 HAVING c > 2", "complete"),
        ("SELECT name, count(*) FROM {ev} GROUP BY 1 HAVING count(*) > 2", "update"),
        ("SELECT name AS nm, max(id) AS m FROM {ev} GROUP BY nm HAVING m > 5 AND nm <> 'n2'", "complete"),
        ("SELECT name, max(id) AS m FROM {ev} GROUP BY name HAVING min(id) > 0", "update"),
        ("WITH t AS (SELECT * FROM {ev}) SELECT name, max(score) AS m FROM t GROUP BY name", "complete"),
        # SELECT DISTINCT is an aggregation in Spark (DataFrame.distinct() deduplicates)
        ("SELECT DISTINCT name, id % 2 AS p FROM {ev}", "update"),
    ],
)
def test_aggregations(spark, ls, tmp_path, inp, query, mode):
    d = Differential(spark, ls, tmp_path / "q", sql_query(ls, inp, query, mode=mode), sink="foreachBatch")
    try:
        write_json(inp, rows(0, 4))
        d.run()
        write_json(inp, rows(4, 4))
        assert d.run()
    finally:
        d.stop()


def test_joins_and_views_of_views(spark, ls, tmp_path, inp):
    dim = f"dim_{uuid.uuid4().hex[:8]}"
    spark.createDataFrame([("n0", "zero"), ("n1", "one")], "name STRING, label STRING").createOrReplaceTempView(dim)
    static = f"SELECT e.id, d.label FROM {{ev}} e JOIN {dim} d ON e.name = d.name WHERE e.id > 0"
    d = Differential(spark, ls, tmp_path / "q1", sql_query(ls, inp, static), sink="foreachBatch")
    # a view of an aggregation, read by a second query
    counts = sql_query(
        ls,
        inp,
        "SELECT name, c * 10 AS c10 FROM {counts} WHERE c > 1",
        mode="complete",
        views={"counts": lambda df: df.groupBy("name").count().withColumnRenamed("count", "c")},
    )
    d2 = Differential(spark, ls, tmp_path / "q2", counts, sink="foreachBatch")
    try:
        write_json(inp, rows(0, 5))
        d.run()
        d2.run()
        write_json(inp, rows(5, 3))
        assert d.run()
        assert d2.run()
    finally:
        d.stop()
        d2.stop()


def test_errors_as_spark(spark, ls, inp):
    name = f"ev_{uuid.uuid4().hex[:8]}"
    lg = ls.readStream.schema(SCHEMA).json(str(inp))
    lg.createTempView(name)
    with pytest.raises(AnalysisError, match="TEMP_TABLE_OR_VIEW_ALREADY_EXISTS"):
        lg.createTempView(name)
    # spark.sql does not see lockgate's streaming views (a query over one would not stream)
    with pytest.raises(AnalysisException, match="TABLE_OR_VIEW_NOT_FOUND"):
        spark.sql(f"SELECT * FROM {name}")


@pytest.mark.parametrize(
    ("query", "mode", "message"),
    [
        ("SELECT id FROM {ev} INTERSECT SELECT id FROM {ev} WHERE id > 3", "append",
         "Intersect of streaming DataFrames/Datasets is not supported"),
        ("SELECT id FROM {ev} EXCEPT SELECT id FROM {ev} WHERE id > 3", "append",
         "Except on a streaming DataFrame/Dataset on the right is not supported"),
        ("SELECT DISTINCT name FROM {ev}", "append",
         "STREAMING_OUTPUT_MODE.UNSUPPORTED_OPERATION"),
    ],
)
def test_refusals_as_spark(spark, ls, tmp_path, inp, query, mode, message):
    """What Spark refuses, lockgate refuses with Spark's words (at definition or start)."""
    make = sql_query(ls, inp, query, mode=mode)
    for reader, label in ((spark.readStream, "native"), (ls.readStream, "lockgate")):
        with pytest.raises(AnalysisException, match=message):
            q = make(reader).writeStream.format("noop").option(
                "checkpointLocation", str(tmp_path / label)
            ).start()
            q.stop()


@pytest.mark.parametrize("args", [None, {"x": 1}])
def test_parse_errors_as_spark(spark, ls, args):
    """A query Spark cannot parse fails with Spark's ParseException, with parameters too."""
    with pytest.raises(ParseException) as native:
        spark.sql("SELEC 1", args)
    with pytest.raises(ParseException) as ours:
        ls.sql("SELEC 1", args)
    assert str(ours.value) == str(native.value)

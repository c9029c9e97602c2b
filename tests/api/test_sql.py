"""SQL over streaming views (``createOrReplaceTempView`` + ``ls.sql``), differential
against native Spark's ``spark.sql`` over a streaming temp view."""

from __future__ import annotations

import uuid

import pytest
from differential import Differential, InMode, write_json
from pyspark.errors import AnalysisException, ParseException

from lockgate.api.reader import DataStreamReader as LockgateReader
from lockgate.errors import AnalysisError

SCHEMA = "id LONG, name STRING, score DOUBLE, ts TIMESTAMP"


def rows(start: int, n: int, second: int = 0) -> list[dict]:
    return [
        {"id": i, "name": f"n{i % 3}", "score": i * 1.5, "ts": f"2024-01-01T00:00:{second + i % 5:02d}Z"}
        for i in range(start, start + n)
    ]


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
        return InMode(engine.sql(text), mode)

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
        # a view's and a WITH query's own names qualify their columns (and stars)
        "WITH t AS (SELECT {ev}.* FROM {ev} WHERE {ev}.id > 0) SELECT t.id, upper(t.name) AS u FROM t",
        # LIMIT of a constant expression, which Spark evaluates
        "SELECT {ev}.id, {ev}.name FROM {ev} LIMIT 1 + 2",
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
        # GROUP BY ALL: the select list's items without an aggregate
        ("SELECT name, id % 2 AS p, count(*) AS c FROM {ev} GROUP BY ALL", "update"),
        ("SELECT count(*) AS c, max(score) AS m FROM {ev} GROUP BY ALL", "complete"),
        # FILTER clauses, per aggregate (count, sum, avg, max_by, collect_list, percentile)
        (
            (
                "SELECT name, count(*) FILTER (WHERE score > 3) AS c, sum(score) FILTER (WHERE id % 2 = 0) AS s, "
                "avg(id) FILTER (WHERE id > 2) AS a, max_by(id, score) FILTER (WHERE id < 6) AS mb, "
                "collect_list(id) FILTER (WHERE id % 3 = 1) AS l, percentile(score, 0.5) FILTER (WHERE id > 1) AS p "
                "FROM {ev} GROUP BY name"
            ),
            "update",
        ),
        ("SELECT name, first(id) IGNORE NULLS AS f, last(score, true) FILTER (WHERE id > 1) AS l FROM {ev} GROUP BY name", "complete"),
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


@pytest.mark.parametrize(
    "query",
    [
        # an aggregate function the select list does not name, and a tie-breaker
        "SELECT name, count(*) FROM {ev} GROUP BY name ORDER BY count(*) DESC, name",
        # the grouping column qualified by the view's name
        "SELECT {ev}.name, count(*) AS c FROM {ev} GROUP BY {ev}.name ORDER BY {ev}.name DESC",
        # a select-list alias, and an aggregate of a column not selected
        "SELECT name, sum(score) AS s FROM {ev} GROUP BY name ORDER BY max(id) % 4, s DESC",
        # HAVING over an aggregate, ORDER BY an alias with nulls ordered explicitly
        "SELECT name, min(score) AS m FROM {ev} GROUP BY name HAVING count(*) > 1 ORDER BY m DESC NULLS FIRST",
        # ORDER BY a grouping expression the select list computes differently
        "SELECT upper(name) AS u, count(*) AS c FROM {ev} GROUP BY name ORDER BY name",
    ],
)
def test_order_by_over_an_aggregation_as_spark(spark, ls, tmp_path, inp, query):
    """ORDER BY after GROUP BY (complete mode): what the ORDER BY reads that the output
    does not hold is computed by the aggregation and dropped after the sort, as Spark's
    analyser does; the rows come in Spark's order, batch by batch."""
    d = Differential(spark, ls, tmp_path / "q", sql_query(ls, inp, query, mode="complete"), sink="foreachBatch")
    try:
        write_json(inp, rows(0, 5))
        d.run()
        write_json(inp, rows(5, 6))
        d.run()
        ordered = [[(b, [tuple(r) for r in batch]) for b, batch in side.batches] for side in (d.native, d.lockgate)]
        assert ordered[1] == ordered[0]
        assert len(ordered[0]) == 2 and all(batch for _, batch in ordered[0])
        assert all(len(r) == len(ordered[0][0][1][0]) for _, batch in ordered[1] for r in batch)
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


def test_static_subqueries_and_qualifiers(spark, ls, tmp_path, inp):
    """A subtree over static tables only (aggregation, DISTINCT, ORDER BY/LIMIT, set
    operations, reading a static WITH query) is Spark's own DataFrame; a global temp
    view's name qualifies its columns; SELECT DISTINCT of columns sharing a name."""
    suffix = uuid.uuid4().hex[:8]
    dim = f"dim_{suffix}"
    spark.createDataFrame(
        [("n0", "zero"), ("n1", "one"), ("n1", "uno")], "name STRING, label STRING"
    ).createOrReplaceTempView(dim)
    queries = [
        (
            (
                "SELECT {gv}.id, global_temp.{gv}.name, x.c FROM global_temp.{gv} "
                f"JOIN (SELECT name, count(*) AS c FROM {dim} GROUP BY name) x ON global_temp.{{gv}}.name = x.name"
            ),
            "append",
        ),
        (
            (
                f"WITH d AS (SELECT * FROM {dim}), d2 AS (SELECT * FROM d WHERE label <> 'zero') "
                "SELECT e.id, y.label FROM {ev} e "
                "JOIN (SELECT DISTINCT name, label FROM d2 ORDER BY label LIMIT 1) y ON e.name = y.name "
                "LEFT SEMI JOIN (SELECT name FROM d UNION SELECT 'n2' EXCEPT SELECT 'n0') z ON e.name = z.name"
            ),
            "append",
        ),
        (f"SELECT DISTINCT e.name, d.name FROM {{ev}} e JOIN {dim} d ON e.name = d.name", "update"),
    ]

    def query_fn(query: str, mode: str):
        def make(reader):
            side = "lg" if isinstance(reader, LockgateReader) else "native"
            df = reader.schema(SCHEMA).json(str(inp))
            view, gv = f"ev_{suffix}_{side}", f"gv_{suffix}_{side}"
            df.createOrReplaceTempView(view)
            df.createOrReplaceGlobalTempView(gv)
            engine = ls if side == "lg" else spark
            return InMode(engine.sql(query.replace("{ev}", view).replace("{gv}", gv)), mode)

        return make

    runs = [
        Differential(spark, ls, tmp_path / f"q{i}", query_fn(q, mode), sink="foreachBatch")
        for i, (q, mode) in enumerate(queries)
    ]
    try:
        write_json(inp, rows(0, 4))
        for d in runs:
            d.run()
        write_json(inp, rows(4, 3))
        for d in runs:
            assert d.run()
    finally:
        for d in runs:
            d.stop()


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
        # LIMIT takes a constant of integer type, checked by Spark's analyser
        ("SELECT * FROM {ev} LIMIT 1.5D", "append",
         (r'INVALID_LIMIT_LIKE_EXPRESSION.DATA_TYPE\] The limit like expression "1.5" is invalid. '
         r'The limit expression must be integer type, but got "DOUBLE"')),
        ("SELECT * FROM {ev} LIMIT '2'", "append",
         r'INVALID_LIMIT_LIKE_EXPRESSION.DATA_TYPE\] .* but got "STRING"'),
        ("SELECT * FROM {ev} LIMIT 2L", "append",
         r'INVALID_LIMIT_LIKE_EXPRESSION.DATA_TYPE\] .* but got "BIGINT"'),
        ("SELECT * FROM {ev} LIMIT id", "append",
         r'INVALID_LIMIT_LIKE_EXPRESSION.IS_UNFOLDABLE\] The limit like expression "id" is invalid'),
        ("SELECT * FROM {ev} LIMIT 1 - 2", "append",
         r"INVALID_LIMIT_LIKE_EXPRESSION.IS_NEGATIVE\] .* but got -1"),
        ("SELECT * FROM {ev} LIMIT 2 OFFSET 1", "append",
         "Offset is not supported on streaming DataFrames/Datasets"),
        ("SELECT * FROM {ev} TABLESAMPLE (50 PERCENT)", "append",
         "Sampling is not supported on streaming DataFrames/Datasets"),
        ("SELECT 1L AS id UNION ALL SELECT id FROM {ev}", "append",
         "Union between streaming and batch DataFrames/Datasets is not supported"),
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


@pytest.mark.parametrize(
    ("grouping", "words"),
    [
        ("ROLLUP(name)", "GROUP BY ROLLUP"),
        ("CUBE(name, id % 2)", "GROUP BY CUBE"),
        ("GROUPING SETS ((name), ())", "GROUP BY GROUPING SETS"),
    ],
)
def test_grouping_sets_in_sql_are_refused_clearly(spark, ls, inp, grouping, words):
    """Native Spark runs them; lockgate's SQL failed with Spark's internal "Cannot call the
    method dataType$ of BaseGroupingSets". Now a NotSupportedYetError names them and the
    DataFrame API's rollup()/cube() that lockgate runs."""
    from lockgate.errors import NotSupportedYetError

    view = f"ev_{uuid.uuid4().hex[:8]}"
    ls.readStream.schema(SCHEMA).json(str(inp)).createOrReplaceTempView(view)
    with pytest.raises(NotSupportedYetError, match=f"{words} in SQL over a streaming view .*rollup"):
        ls.sql(f"SELECT name, count(*) AS c FROM {view} GROUP BY {grouping}")

"""The Python tree of Spark's parsed plan that ``ls.sql`` applies (``lockgate/plan/sql_plan.py``)."""

from __future__ import annotations

import dataclasses

import pytest
from pyspark.errors import AnalysisException

from lockgate.plan import sql_plan as p


def test_a_query_becomes_a_tree_of_its_operators(spark):
    tree = p.parse(
        spark,
        "WITH a AS (SELECT * FROM v) SELECT name AS n, count(*) FROM a t WHERE t.id > 1 "
        "GROUP BY 1 HAVING count(*) > 2 ORDER BY n LIMIT 5",
    )
    assert isinstance(tree, p.UnresolvedWith)
    [(name, cte)] = tree.ctes
    assert name == "a" and isinstance(cte, p.SubqueryAlias) and cte.alias == "a"
    assert isinstance(cte.child, p.Project) and isinstance(cte.child.child, p.UnresolvedRelation)
    assert cte.child.child.parts == ("v",)
    limit = tree.child
    assert isinstance(limit, p.Limit)  # Spark's GlobalLimit over a LocalLimit
    assert isinstance(limit.limit, p.Literal) and (limit.limit.value, limit.limit.type_name) == (5, "integer")
    sort = limit.child
    assert isinstance(sort, p.Sort) and sort.is_global and sort.order[0].references == ("n",)
    having = sort.child
    assert isinstance(having, p.UnresolvedHaving) and isinstance(having.child, p.Aggregate)
    aggregate = having.child
    [group] = aggregate.grouping
    assert isinstance(group, p.Ordinal) and group.position == 1
    alias, count = aggregate.aggregates
    assert isinstance(alias, p.Alias) and alias.name == "n"
    assert isinstance(alias.child, p.Attribute) and alias.child.name_parts == ("name",)
    assert type(count) is p.Expression
    where = aggregate.child
    assert isinstance(where, p.Filter) and where.condition.references == ("id",)
    assert isinstance(where.child, p.SubqueryAlias) and where.child.alias == "t"
    assert where.child.child.parts == ("a",)
    assert tree.nested == (limit, cte)
    with pytest.raises(dataclasses.FrozenInstanceError):
        tree.child = limit  # type: ignore[misc]


def test_joins_unions_and_what_ls_sql_does_not_apply(spark):
    tree = p.parse(spark, "SELECT * FROM v JOIN w USING (k) NATURAL LEFT JOIN x")
    natural = tree.child
    assert isinstance(natural, p.Join) and (natural.join_type, natural.natural, natural.using) == (
        "LeftOuter", True, None,
    )
    using = natural.left
    assert isinstance(using, p.Join) and (using.join_type, using.using, using.condition) == ("Inner", ("k",), None)
    on = p.parse(spark, "SELECT * FROM v a JOIN w b ON a.k = b.k").child
    assert on.condition.references == ("k", "k")

    union = p.parse(spark, "SELECT 1 UNION ALL SELECT 2 EXCEPT ALL SELECT 3")
    assert isinstance(union, p.Except) and union.is_all and isinstance(union.left, p.Union)

    generate = p.parse(spark, "SELECT * FROM v LATERAL VIEW explode(a) t AS x WHERE x IN (SELECT y FROM w)")
    assert isinstance(generate.child, p.Filter)
    [subquery] = generate.child.subqueries
    assert isinstance(subquery, p.Project) and subquery.child.parts == ("w",)
    unsupported = generate.child.child
    assert isinstance(unsupported, p.Unsupported) and unsupported.name == "Generate"
    assert unsupported.children[0].parts == ("v",)
    assert p.parse(spark, "SELEC 1") is None


def test_a_subtree_that_reads_no_stream_is_spark_s_dataframe(spark):
    tree = p.parse(spark, "SELECT id, row_number() OVER (ORDER BY id DESC) AS r FROM range(3)")
    assert [tuple(r) for r in p.static_frame(spark, tree).collect()] == [(2, 1), (1, 2), (0, 3)]
    with pytest.raises(AnalysisException, match="TABLE_OR_VIEW_NOT_FOUND"):
        p.static_frame(spark, p.parse(spark, "SELECT * FROM no_such_table_here"))


def test_static_subtrees_read_static_with_queries_and_limits_are_spark_s(spark):
    tree = p.parse(spark, "WITH a AS (SELECT 1 AS x), b AS (SELECT x + 1 AS y FROM a) SELECT y FROM b LIMIT 1 + 1")
    assert [name for name, _ in tree.ctes] == ["a", "b"]
    body = tree.child.child  # under the LIMIT
    with pytest.raises(AnalysisException, match="TABLE_OR_VIEW_NOT_FOUND"):
        p.static_frame(spark, body)  # b is not in scope
    assert p.static_frame(spark, body, tree.ctes).collect()[0][0] == 2
    assert p.limit_value(spark, tree.child, spark.range(0)) == 2
    for text, error in [("1.5", "DATA_TYPE"), ("id", "IS_UNFOLDABLE"), ("-1", "IS_NEGATIVE")]:
        limit = p.parse(spark, f"SELECT * FROM v LIMIT {text}")
        with pytest.raises(AnalysisException, match=f"INVALID_LIMIT_LIKE_EXPRESSION.{error}"):
            p.limit_value(spark, limit, spark.range(0))


def test_a_view_is_read_under_its_qualified_name(spark):
    df = p.qualified(spark.range(2), ("global_temp", "gv"))
    assert [r[0] for r in df.select("global_temp.gv.id", "gv.id").collect()] == [0, 1]
    assert df.select("gv.*").columns == ["id"]

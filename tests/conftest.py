"""One SparkSession for the whole test run, with few shuffle partitions."""

from __future__ import annotations

import os
import sys

import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

POLLING_DELAY = os.environ.get("LOCKGATE_TEST_POLLING_DELAY", "100ms")

# Modules left out of `make test` with the tests marked slow: differential matrices over
# more functions, expressions, join shapes and folds than the representative cases the
# other modules keep, and smoke runs of the benchmarks beyond one each. `make test-all`
# runs them. With them `make test` took over 100 min on a 2-core machine, past CI's 90
# (the list: the heaviest modules by the per-module times of such a run).
EXTENDED = frozenset(
    {
        "tests/benchmarks/test_kafka_latency.py",
        "tests/benchmarks/test_nexmark.py",
        "tests/observability/test_cli.py",
        "tests/plan/join/test_join_empty_side.py",
        "tests/plan/join/test_join_event_time_lineage.py",
        "tests/plan/join/test_join_float_keys.py",
        "tests/plan/join/test_join_folded_filters.py",
        "tests/plan/join/test_join_inferred_empty_side.py",
        "tests/plan/join/test_join_nested_columns.py",
        "tests/plan/join/test_join_of_stateful.py",
        "tests/plan/join/test_join_unread_columns.py",
        "tests/plan/join/test_join_windows.py",
        "tests/plan/test_aggregate_columns.py",
        "tests/plan/test_aggregate_exact_values.py",
        "tests/plan/test_aggregate_expressions.py",
        "tests/plan/test_aggregate_map_keys.py",
        "tests/plan/test_aggregate_more_functions.py",
        "tests/plan/test_approx_count_distinct.py",
        "tests/plan/test_dedup_pre_aggregation.py",
        "tests/plan/test_duplicate_struct_fields.py",
        "tests/plan/test_event_time_lineage.py",
        "tests/plan/test_explicit_state_chains.py",
        "tests/plan/test_multiple_stateful.py",
        "tests/plan/test_session_batch_merge.py",
        "tests/plan/test_state_tasks.py",
        "tests/plan/test_transform_with_state_encoding.py",
        "tests/state/test_read_state_tws_change_feed.py",
    }
)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid.split("::", 1)[0] in EXTENDED:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def spark():
    from pyspark.sql import SparkSession

    import lockgate

    builder = SparkSession.builder
    # Spark's Kafka connector for the oracle, when tools/fetch_kafka.sh has fetched it
    # (other tests do not depend on it),
    from bench.kafka_broker import connector_jars

    # and lockgate's own jar (the exactly-once Kafka sink's JVM writer) when it was built
    jars = [j for j in (connector_jars() or "").split(",") if j] + lockgate.jars()
    if jars:
        builder = builder.config("spark.jars", ",".join(jars))
    session = (
        builder.master("local[2]")
        .appName("lockgate-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.ui.enabled", "false")
        .config(map=lockgate.spark_conf())
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
        # An idle query (native or lockgate) lists its sources again after this delay;
        # Spark's 10ms default makes the dozens of idle queries of a differential test
        # spend most of the machine's CPU listing directories. processAllAvailable
        # waits at most this long more per step.
        .config("spark.sql.streaming.pollingDelay", POLLING_DELAY)
        .getOrCreate()
    )
    # LOCKGATE_TEST_STATE_TASKS=1 runs the suite with one task serving every state
    # partition (spark.lockgate.stateTasks), the path a machine with fewer cores than
    # shuffle partitions takes.
    tasks = os.environ.get("LOCKGATE_TEST_STATE_TASKS")
    if tasks:
        session.conf.set("spark.lockgate.stateTasks", tasks)
    # LOCKGATE_TEST_PLAN_REUSE=false plans every batch node by node instead of reusing
    # the analysed plan of the first batch of its shape (spark.lockgate.planReuse).
    reuse = os.environ.get("LOCKGATE_TEST_PLAN_REUSE")
    if reuse:
        session.conf.set("spark.lockgate.planReuse", reuse)
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def ls(spark):
    import lockgate

    return lockgate.session(spark)


@pytest.fixture(autouse=True)
def _stop_queries(request):
    """Stop every lockgate and native query a test left running."""
    yield
    if "spark" not in request.fixturenames and "ls" not in request.fixturenames:
        return
    spark = request.getfixturevalue("spark")
    for q in spark.streams.active:
        q.stop()
    if "ls" in request.fixturenames:
        session = request.getfixturevalue("ls")
        for q in session.streams.active:
            q.stop()
        session.streams.resetTerminated()


@pytest.fixture
def bench(spark, ls, tmp_path):
    """A :class:`differential.Bench`: native/lockgate query pairs fed by the same steps of
    input files, stopped at the end of the test."""
    from differential import Bench

    b = Bench(spark, ls, tmp_path)
    yield b
    b.stop()


@pytest.fixture
def no_json_filter_pushdown(spark):
    """``spark.sql.json.filterPushdown.enabled`` off for the test. Spark pushes a stream
    join's inferred ``isnotnull(key)`` into its JSON parser, which then skips rows with
    null keys before ``numInputRows`` counts them; lockgate filters them in the join (a
    known difference, docs/stream-joins.md). Without the pushdown both count them."""
    pushdown = "spark.sql.json.filterPushdown.enabled"
    before = spark.conf.get(pushdown)
    spark.conf.set(pushdown, "false")
    yield
    spark.conf.set(pushdown, before)

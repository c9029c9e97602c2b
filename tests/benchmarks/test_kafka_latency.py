"""``python -m bench.kafka_latency`` runs: every query on every engine gives latency figures.

A smoke run (2 s of input at 50 records/s per query and engine, the first half second
dropped) on its own broker, with the test session (which has Spark's Kafka connector on
``spark.jars`` when ``tools/fetch_kafka.sh`` has fetched it). Without java, the broker's
jars, confluent-kafka or the connector the test is skipped, and fails under ``CI=true``,
as the tests in tests/kafka. No figure is compared with a time: only that each is there,
positive, p99 >= p50, and that the rows sourced in the measured window came out.
"""

from __future__ import annotations

import json
import os

import pytest

from bench.kafka_broker import CONNECTOR_CLASSPATH, broker_problem
from bench.kafka_latency import main, runs

SECONDS, WARMUP, RATE = 2, 0.5, 50


def _require(spark) -> None:
    problem = broker_problem()
    if problem is None and "spark-sql-kafka" not in (
        spark.sparkContext.getConf().get("spark.jars", "") or ""
    ):
        problem = f"the native Spark session has no Kafka connector ({CONNECTOR_CLASSPATH} is missing: run tools/fetch_kafka.sh)"
    if problem is None:
        return
    if os.environ.get("CI", "").strip().lower() in ("true", "1", "yes"):
        pytest.fail(f"CI=true and the Kafka latency benchmark cannot run: {problem}", pytrace=False)
    pytest.skip(f"Kafka latency benchmark skipped: {problem} (with CI=true this fails)")


def test_every_engine_and_query_gives_latency_figures(spark, tmp_path):
    _require(spark)
    lines: list[str] = []
    results = main(
        [
            "--seconds",
            str(SECONDS),
            "--warmup",
            str(WARMUP),
            "--rate",
            str(RATE),
            "--results-dir",
            str(tmp_path),
        ],
        spark=spark,
        log=lines.append,
    )
    expected = list(
        runs(["stateless", "dedup", "window"], ["native", "lockgate", "lockgate-continuous"])
    )
    assert len(expected) == 7
    got = {
        (q, e): res for q, by_engine in results["queries"].items() for e, res in by_engine.items()
    }
    assert sorted(got) == sorted(expected)
    measured = RATE * (SECONDS - WARMUP)
    for key, res in got.items():
        assert "error" not in res, (key, res)
        assert res["drained"], key
        assert res["p50_ms"] > 0 and res["p99_ms"] > 0, (key, res)
        assert res["p99_ms"] >= res["p50_ms"], (key, res)
        # every input record of the measured window has an output record (a window row
        # per record: 100 records over 1,000 keys), dedup one per pair; pacing in 5 ms
        # steps moves the window's edges by a record or two
        per_record = 0.5 if key[0] == "dedup" else 1.0
        assert res["records"] >= per_record * measured - 3, (key, res)
    # the ratio column and the results file
    table = "\n".join(lines)
    assert "| stateless | lockgate-continuous |" in table
    with open(results["json_path"]) as f:
        written = json.load(f)
    assert (
        written["queries"]["window"]["lockgate"]["p50_ms"] == got[("window", "lockgate")]["p50_ms"]
    )

"""Nexmark (bench/nexmark_queries.py): the generator gives both engines the same rows, and
every query gives the same rows on lockgate as on native Spark, batch by batch.

The correctness guard of ``python -m bench.nexmark``: three tiny batches per query, both
engines' queries running side by side. Each batch spans 20 s of event time, so 10 s
windows and sessions close within the run and the stateful queries emit rows.
"""

from __future__ import annotations

import math
import threading
import time
from datetime import timedelta

import pytest
from pyspark.sql import Row

from bench.nexmark_queries import QUERIES, Config, auctions, bids, persons

# 400 events per batch, each batch 20 s of event time; 10 auctions in flight (Nexmark: 100)
# so that auctions end within a batch and q4's chained windows close within the run.
CFG = Config(rows_per_batch=400, span_ms=20_000, q2_modulus=7, num_partitions=2, in_flight_auctions=10)
BATCHES = 3
TIMEOUT_S = 180


def _norm(value):
    if isinstance(value, Row):
        return tuple(_norm(v) for v in value)
    if isinstance(value, (list, tuple)):
        return tuple(_norm(v) for v in value)
    if isinstance(value, float):
        return round(value, 6) if not math.isnan(value) else "nan"
    return value


class _Collect:
    """foreachBatch: every batch's rows, sorted, by batch id."""

    def __init__(self) -> None:
        self.batches: dict[int, list[tuple]] = {}
        self.lock = threading.Lock()

    def __call__(self, df, batch_id: int) -> None:
        rows = sorted((_norm(r) for r in df.collect()), key=repr)
        with self.lock:
            self.batches[batch_id] = rows


def _run(readers_by_engine, names, build):
    """Start every (query, engine) pair, wait for ``BATCHES`` batches of each, stop them."""
    sinks, queries = {}, {}
    try:
        for name in names:
            for engine, readers in readers_by_engine.items():
                sink = _Collect()
                df = build(name, readers)
                mode = QUERIES[name].output_mode if name in QUERIES else "append"
                queries[name, engine] = df.writeStream.outputMode(mode).foreachBatch(sink).start()
                sinks[name, engine] = sink
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            for key, q in queries.items():
                if not q.isActive:
                    raise AssertionError(f"{key} stopped: {q.exception()}")
            if all(len(s.batches) >= BATCHES for s in sinks.values()):
                break
            time.sleep(0.1)
        else:
            raise AssertionError({k: len(s.batches) for k, s in sinks.items()})
    finally:
        for q in queries.values():
            q.stop()
    return {k: {b: s.batches[b] for b in range(BATCHES)} for k, s in sinks.items()}


@pytest.fixture(scope="module")
def readers(spark, ls):
    return {"native": lambda: spark.readStream, "lockgate": lambda: ls.readStream}


class _StaticRate:
    """A stand-in for ``readStream`` giving what ``rate-micro-batch`` gives for the first
    ``BATCHES`` batches, as a static DataFrame: the generator's rules checked in one job."""

    def __init__(self, spark) -> None:
        self.spark = spark

    def format(self, _source):
        return self

    def option(self, _key, _value):
        return self

    def load(self):
        from pyspark.sql import functions as F

        return self.spark.range(BATCHES * CFG.rows_per_batch).select(
            F.timestamp_millis(F.floor(F.col("id") / CFG.rows_per_batch) * 1000).alias("timestamp"),
            F.col("id").alias("value"))


def test_generator_follows_nexmark_rules(spark):
    def rows(table):
        return [_norm(r) for r in table(lambda: _StaticRate(spark), CFG).orderBy("date_time").collect()]

    got = {"bids": rows(bids), "auctions": rows(auctions), "persons": rows(persons)}
    # 1 person, 3 auctions, 46 bids of every 50 events
    assert {k: len(v) for k, v in got.items()} == {"bids": 368 * BATCHES, "auctions": 24 * BATCHES,
                                                   "persons": 8 * BATCHES}
    # ids are consecutive from 1000
    assert [r[0] for r in got["persons"]] == list(range(1000, 1000 + 8 * BATCHES))
    assert [r[0] for r in got["auctions"]] == list(range(1000, 1000 + 24 * BATCHES))
    first = got["bids"][0][5]
    for auction, bidder, price, _channel, _url, date_time, _extra in got["bids"]:
        b = int((date_time - first).total_seconds() // (CFG.span_ms / 1000))  # the event's batch
        # bids go to existing auctions or the next few, from existing persons or the next few
        assert 1000 <= auction <= 1000 + 24 * (b + 1) + 10
        assert 1000 <= bidder <= 1000 + 8 * (b + 1) + 10
        assert 1 <= price <= 100_000_000
    assert max(r[5] for r in got["bids"]) - first < timedelta(milliseconds=BATCHES * CFG.span_ms)
    # auctions: date_time < expires <= date_time + the longest lifetime; categories 10-14
    for row in got["auctions"]:
        assert row[5] < row[6] <= row[5] + timedelta(milliseconds=CFG.max_auction_ms)
        assert 10 <= row[8] <= 14
    assert {r[5] for r in got["persons"]} <= {"AZ", "CA", "ID", "OR", "WA", "WY"}
    # hot auctions and bidders: half the bids go to the latest even auction, 3 in 4 come
    # from the latest hot bidder
    assert 0.3 < sum(1 for r in got["bids"] if r[0] % 2 == 0) / len(got["bids"]) < 0.95


def test_sources_same_rows_on_both_engines(readers):
    """Bids are compared by q0 (every column); here auctions and persons."""
    tables = {"auctions": auctions, "persons": persons}
    got = _run(readers, list(tables), lambda name, r: tables[name](r, CFG))
    for name in tables:
        assert got[name, "lockgate"] == got[name, "native"], name
        assert [len(got[name, "native"][b]) for b in range(BATCHES)] == [
            {"auctions": 24, "persons": 8}[name]] * BATCHES


@pytest.mark.parametrize("name", list(QUERIES))
def test_query_same_rows_on_both_engines(readers, name):
    got = _run(readers, [name], lambda name, r: QUERIES[name].build(r, CFG))
    assert got[name, "lockgate"] == got[name, "native"]
    # the query produced rows within the run, so the comparison says something
    assert any(got[name, "native"].values())

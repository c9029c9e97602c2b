"""The Python workers and state hosts drop the cached state of queries that stopped, as
Spark unloads a stopped query's state stores: every state task hears which queries of the
driver run (``state_udf.encode_params``) and the process running it keeps only their
partitions (``store.retain_cached``)."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import pyarrow as pa
from differential import SCHEMA, ev, write_json

from lockgate.plan import state_udf
from lockgate.state import store as store_module


def _cached_queries_of_workers(spark: Any) -> dict[int, set[str]]:
    """pid -> query ids a Python worker or a state host (``lockgate.state.host``) holds
    state of, from a job over the workers."""

    def probe(batches: Any) -> Any:
        from lockgate.state.host import host_stats
        from lockgate.state.store import cached_queries

        for _ in batches:
            pass
        pids, ids = [os.getpid()], [json.dumps(sorted(cached_queries()))]
        for stats in host_stats().values():
            pids.append(stats["pid"])
            ids.append(json.dumps(stats["cached_queries"]))
        yield pa.RecordBatch.from_pydict({"pid": pids, "ids": ids})

    seen: dict[int, set[str]] = {}
    for _ in range(2):
        rows = spark.range(0, 4, 1, 4).mapInArrow(probe, "pid long, ids string").collect()
        for row in rows:
            seen[row.pid] = set(json.loads(row.ids))
    return seen


def _counting(ls: Any, inp: Any, checkpoint: Any) -> Any:
    counts = ls.readStream.schema(SCHEMA).json(str(inp)).groupBy("k").count()
    return counts.writeStream.format("noop").outputMode("update").option("checkpointLocation", str(checkpoint)).start()


def test_a_stopped_querys_state_leaves_the_workers(spark, ls, tmp_path):
    inp = tmp_path / "in"
    inp.mkdir()
    write_json(inp, [ev(i, f"k{i % 5}", 1.0) for i in range(20)])
    first = _counting(ls, inp, tmp_path / "first")
    first.processAllAvailable()
    assert any(first.id in ids for ids in _cached_queries_of_workers(spark).values())
    first.stop()

    second = _counting(ls, inp, tmp_path / "second")
    second.processAllAvailable()
    write_json(inp, [ev(i, f"k{i % 7}", 1.0) for i in range(20)])
    second.processAllAvailable()
    workers = _cached_queries_of_workers(spark)
    second.stop()
    assert any(second.id in ids for ids in workers.values()), workers
    holding_first = [pid for pid, ids in workers.items() if first.id in ids]
    assert not holding_first, f"workers {holding_first} still hold the stopped query's state: {workers}"


def test_running_queries_travel_with_the_batch_values():
    state_udf.query_running("a", True)
    state_udf.query_running("b", True)
    state_udf.query_running("b", True)  # a restart overlapping the run it stops
    state_udf.query_running("b", False)
    try:
        encoded = json.loads(state_udf.encode_params({3: {"version": 2}}))
        assert encoded["3"] == {"version": 2}
        assert {"a", "b"} <= set(encoded["runningQueries"])
    finally:
        state_udf.query_running("a", False)
        state_udf.query_running("b", False)
    assert not {"a", "b"} & set(json.loads(state_udf.encode_params({}))["runningQueries"])


def test_retain_cached_keeps_running_queries_and_anonymous_partitions():
    conf = store_module.StateStoreConf(
        root="/nowhere", operator_id=0, num_partitions=1,
        key_schema=pa.schema([("k", pa.string())]), value_schema=pa.schema([("v", pa.int64())]),
    )
    store_module.clear_cache()
    try:
        for query in ("running", "stopped", ""):
            store_module._cache_put(dataclasses.replace(conf, checkpoint_id=query), 0, 1, {("x",): [1]})
        store_module.retain_cached({"running"})
        assert store_module.cached_queries() == {"running", ""}
    finally:
        store_module.clear_cache()

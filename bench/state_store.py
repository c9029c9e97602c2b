"""Micro-benchmark of lockgate's state store, outside Spark.

Measures, for one partition: a batch that updates C keys in a state of S keys
(merge + delta commit), a snapshot write, and a cold load (snapshot + 9 deltas) as a
task on a worker without the cached version would do.

    .venv/bin/python -m bench.state_store
"""

from __future__ import annotations

import shutil
import tempfile
import time

import pyarrow as pa

from lockgate.state.store import StateStore, StateStoreConf, clear_cache

KEY = pa.schema([pa.field("k", pa.int64())])
VALUE = pa.schema([pa.field("count", pa.int64()), pa.field("sum", pa.float64())])


def _conf(root: str, interval: int) -> StateStoreConf:
    return StateStoreConf(root=root, operator_id=0, num_partitions=1, key_schema=KEY,
                          value_schema=VALUE, snapshot_interval=interval, cache_partitions=4)


def run(state_keys: int, changed: int, batches: int = 10) -> dict[str, float]:
    root = tempfile.mkdtemp(prefix="lockgate-state-bench-")
    try:
        conf = _conf(root, interval=10_000)
        store = StateStore(conf, 0, 0)
        for k in range(state_keys):
            store.put((k,), [1, 1.0])
        store.commit()
        # steady state: C changed keys per batch, served from the worker cache
        times = []
        for b in range(batches):
            t0 = time.perf_counter()
            store = StateStore(conf, 0, b + 1)
            base = (b * changed * 7919) % max(state_keys, 1)
            for i in range(changed):
                key = ((base + i) % state_keys,)
                old = store.get(key)
                store.put(key, [old[0] + 1, old[1] + 1.0] if old else [1, 1.0])
            store.commit()
            times.append((time.perf_counter() - t0) * 1000)
        times.sort()
        version = batches + 1
        # snapshot of the whole partition
        t0 = time.perf_counter()
        snap_conf = _conf(root, interval=version + 1)
        store = StateStore(snap_conf, 0, version)
        store.put((0,), [1, 1.0])
        store.commit()
        snapshot_ms = (time.perf_counter() - t0) * 1000
        # cold load: snapshot + deltas
        clear_cache()
        t0 = time.perf_counter()
        StateStore(conf, 0, version + 1)
        cold_ms = (time.perf_counter() - t0) * 1000
        return {"batch_median_ms": times[len(times) // 2], "snapshot_ms": snapshot_ms, "cold_load_ms": cold_ms}
    finally:
        shutil.rmtree(root, ignore_errors=True)
        clear_cache()


def main() -> None:
    print(f"{'keys in state':>14} {'changed/batch':>14} {'batch (cached) ms':>18} {'snapshot ms':>12} {'cold load ms':>13}")
    for state_keys, changed in [(10_000, 10_000), (250_000, 2_500), (1_000_000, 2_500), (1_000_000, 25_000)]:
        r = run(state_keys, changed)
        print(f"{state_keys:>14,} {changed:>14,} {r['batch_median_ms']:>18.1f} {r['snapshot_ms']:>12.1f} {r['cold_load_ms']:>13.1f}")


if __name__ == "__main__":
    main()

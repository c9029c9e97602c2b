"""The explicit-state steps alone, outside Spark: ``python -m bench.explicit_state_task``.

Does the state step's cost follow the keys a batch touches or the keys in state? For each
size, one state partition is filled with that many keys (written to the store directly and
committed as version 1, so the fill costs no user-function calls), then ``--batches``
batches of ``--touched`` keys each (every key once, all already in state) go through the
state step of ``bench/explicit_state.py``'s workloads with the batch's values given
directly, as a task gets them:

* ``tws``: ``run_tws_task`` with ``RunningCount`` (a ValueState per key);
* ``session``: ``run_flat_map_task`` with ``sessionize`` (event-time timeout; the filled
  keys' timeouts lie beyond the run, so no key is due and the batch's own keys are all it
  should cost).

Per batch: CPU time of this process (``time.process_time``: less sensitive than wall time
to other load on a shared machine) and wall time; the median over the batches that write
no snapshot (every 10th version writes one: that costs the whole partition by design, and
is reported apart).

    .venv/bin/python -m bench.explicit_state_task --sizes 10000,100000,500000 --touched 1000
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Any

import pyarrow as pa
from pyspark import cloudpickle
from pyspark.sql.types import LongType, StructField, StructType, TimestampType

from bench.common import Acc, loadavg
from bench.explicit_state import (
    SESSION_OUTPUT,
    SESSION_STATE,
    TWS_OUTPUT,
    RunningCount,
    make_sessionize,
)

TZ = "UTC"


def _struct(ddl: str) -> StructType:
    """``"a long, b long"`` as a StructType, without Spark (only the types used here)."""
    types = {"long": LongType(), "timestamp": TimestampType()}
    fields = [part.split() for part in ddl.split(",")]
    return StructType([StructField(name, types[kind], True) for name, kind in fields])


def _conf(root: str, key: pa.Schema, value: pa.Schema, name: str | None = None, micros: bool = False) -> Any:
    from lockgate.state.store import StateStoreConf

    return StateStoreConf(root=root, operator_id=0, num_partitions=1, key_schema=key, value_schema=value,
                          store_name=name, checkpoint_id=f"bench-{root}", timestamps_as_micros=micros)


def _fill(conf: Any, size: int, value: Any) -> None:
    from lockgate.state.store import StateStore

    store = StateStore(conf, 0, 0)
    for k in range(size):
        store.put((k,), value(k))
    store.commit()


def _timed(run: Any) -> tuple[float, float, int]:
    c0, t0 = time.process_time(), time.perf_counter()
    rows = sum(b.num_rows for b in run())
    return (time.process_time() - c0) * 1000, (time.perf_counter() - t0) * 1000, rows


def tws(size: int, touched: int, batches: int) -> list[dict[str, Any]]:
    from lockgate.plan.transform_with_state import (
        _TIMER_VALUE,
        TIMERS,
        StateVariable,
        TwsTask,
        run_tws_task,
    )
    from lockgate.state.arrow_types import schema_to_arrow

    root = tempfile.mkdtemp(prefix="lockgate-es-task-")
    variable = StateVariable("acc", "value", _struct("count long, total long"))
    key = schema_to_arrow(_struct("k long"), TZ)
    stores = {"acc": _conf(root, key, schema_to_arrow(variable.value_type(), TZ), "acc"),
              TIMERS: _conf(root, key, schema_to_arrow(_TIMER_VALUE, TZ), TIMERS)}
    _fill(stores["acc"], size, lambda k: [1, k])
    _fill(stores[TIMERS], 0, lambda k: None)
    input_schema = _struct("k long, v long")
    out = []
    for b in range(batches):
        keys = pa.array([(size + b * touched + i) % size for i in range(touched)], type=pa.int64())
        batch = pa.RecordBatch.from_arrays([keys, keys, keys, pa.array([0] * touched, type=pa.int32())],
                                           names=["k", "v", "__lockgate_tws_key_0", "__lockgate_pid"])
        task = TwsTask(stores=stores, variables=(variable,), processor_bytes=cloudpickle.dumps(RunningCount()),
                       pandas=True, time_mode="none", key_columns=("__lockgate_tws_key_0",),
                       input_columns=("k", "v"), input_schema=input_schema, event_time_column=None,
                       output_event_time=None, initial_columns=(), out_schema=schema_to_arrow(_struct(TWS_OUTPUT), TZ),
                       output_struct=_struct(TWS_OUTPUT), timezone=TZ, accumulator=Acc(), operator_id=0,
                       version=b + 2, batch_timestamp_ms=0)
        cpu, wall, rows = _timed(lambda task=task, batch=batch: run_tws_task(task, 0, iter([batch])))
        out.append({"version": b + 2, "cpu_ms": cpu, "wall_ms": wall, "rows_out": rows,
                    "state_rows": task.accumulator.v.get("0.numRowsTotal")})
    return out


def session(size: int, touched: int, batches: int) -> list[dict[str, Any]]:
    from lockgate.plan.flat_map_groups import EVENT_TIME_TIMEOUT, FlatMapTask, run_flat_map_task
    from lockgate.state.arrow_types import schema_to_arrow

    root = tempfile.mkdtemp(prefix="lockgate-es-task-")
    state_type = _struct(SESSION_STATE)
    value = StructType([StructField("groupState", state_type, True), StructField("timeoutTimestamp", LongType(), True)])
    conf = _conf(root, schema_to_arrow(_struct("k long"), TZ), schema_to_arrow(value, TZ), micros=True)
    far = 10**12  # the filled keys' timeouts: beyond the run
    _fill(conf, size, lambda k: [{"start_ms": 0, "end_ms": 0, "events": 1}, far])
    in_type = StructType([StructField("k", LongType()), StructField("v", LongType()), StructField("ts", TimestampType())])
    in_schema = schema_to_arrow(in_type, TZ).append(pa.field("__lockgate_pid", pa.int32()))
    out = []
    for b in range(batches):
        keys = pa.array([(size + b * touched + i) % size for i in range(touched)], type=pa.int64())
        ts = pa.array([(b + 1) * 1_000_000] * touched, type=pa.timestamp("us", tz=TZ))
        batch = pa.RecordBatch.from_arrays([keys, keys, ts, pa.array([0] * touched, type=pa.int32())],
                                           schema=in_schema)
        task = FlatMapTask(store=conf, version=b + 2, func=make_sessionize(far), key_columns=("k",),
                           value_columns=("k", "v", "ts"), key_schema=_struct("k long"), state_schema=state_type,
                           output_schema=_struct(SESSION_OUTPUT), timeout=EVENT_TIME_TIMEOUT,
                           watermark_present=True, event_time_column="ts", timezone=TZ, safecheck=False,
                           assign_cols_by_name=True, max_records=10_000, accumulator=Acc(), operator_id=0,
                           watermark_ms=b * 1000, late_watermark_ms=max(0, b - 1) * 1000, batch_timestamp_ms=0)
        cpu, wall, rows = _timed(lambda task=task, batch=batch: run_flat_map_task(task, 0, iter([batch])))
        out.append({"version": b + 2, "cpu_ms": cpu, "wall_ms": wall, "rows_out": rows,
                    "state_rows": task.accumulator.v.get("0.numRowsTotal")})
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench.explicit_state_task", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10000,100000,500000", help="keys in state")
    parser.add_argument("--touched", type=int, default=1_000, help="keys per batch")
    parser.add_argument("--batches", type=int, default=12, help="batches per size (versions 2..)")
    parser.add_argument("--workloads", default="tws,session")
    args = parser.parse_args(argv)
    runs = {"tws": tws, "session": session}
    results: dict[str, Any] = {}
    print(f"load {loadavg()}")
    for name in [n.strip() for n in args.workloads.split(",") if n.strip()]:
        for size in [int(s) for s in args.sizes.split(",") if s.strip()]:
            batches = runs[name](size, args.touched, args.batches)
            plain = [b for b in batches if b["version"] % 10]
            snap = [b for b in batches if not b["version"] % 10]
            entry = {
                "cpu_median_ms": statistics.median(b["cpu_ms"] for b in plain),
                "wall_median_ms": statistics.median(b["wall_ms"] for b in plain),
                "snapshot_batch_cpu_ms": [round(b["cpu_ms"]) for b in snap],
                "state_rows": batches[-1]["state_rows"],
                "load": loadavg(),
            }
            results[f"{name}/{size}"] = entry
            print(f"{name:8s} {size:>9,} keys in state, {args.touched:,} touched: CPU median "
                  f"{entry['cpu_median_ms']:.0f} ms, wall median {entry['wall_median_ms']:.0f} ms, snapshot "
                  f"batch CPU {entry['snapshot_batch_cpu_ms']} ms (state rows {entry['state_rows']:,}; "
                  f"load {entry['load']})", flush=True)
    return results


if __name__ == "__main__":
    main()

"""The dropDuplicates state step alone, outside Spark: ``python -m bench.dedup_task``.

One partition of workload 4 (2,500 rows per batch, 1,250 keys per batch timestamp, a
10-second watermark, so ~12,500 keys in state) through ``run_dedup_task`` for 30
batches, with the batch's values given directly; prints a few batches' times and state
metrics and the mean per-batch time of batches 12-29 (docs/benchmarks.md).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable

import pyarrow as pa
from pyspark.sql.types import BooleanType, LongType, StructField, StructType, TimestampType

from bench.common import Acc
from lockgate.plan.dedup import DedupTask, run_dedup_task
from lockgate.state.arrow_types import schema_to_arrow
from lockgate.state.store import StateStoreConf

TZ = "UTC"
ROW_SCHEMA = StructType(
    [
        StructField("timestamp", TimestampType()),
        StructField("value", LongType()),
        StructField("k", LongType()),
    ]
)


def main(batches: int = 30, log: Callable[[str], None] = print) -> list[int]:
    """Run ``batches`` batches; returns each batch's output row count."""
    out_schema = schema_to_arrow(ROW_SCHEMA, TZ)
    key_schema = schema_to_arrow(StructType([ROW_SCHEMA["k"], ROW_SCHEMA["timestamp"]]), TZ)
    value_schema = schema_to_arrow(StructType([StructField("seen", BooleanType(), True)]), TZ)
    conf = StateStoreConf(
        root=tempfile.mkdtemp(),
        operator_id=0,
        num_partitions=1,
        key_schema=key_schema,
        value_schema=value_schema,
        checkpoint_id="x",
    )
    rows = 2500
    in_schema = out_schema.append(pa.field("__lockgate_pid", pa.int32()))
    total = 0.0
    emitted = []
    for b in range(batches):
        ts = pa.array([b * 1_000_000 * 1000] * rows, type=pa.timestamp("us", tz="UTC"))
        vals = pa.array(range(b * rows * 4, b * rows * 4 + rows), type=pa.int64())
        k = pa.array([v % 1250 for v in range(rows)], type=pa.int64())
        batch = pa.RecordBatch.from_arrays(
            [ts, vals, k, pa.array([0] * rows, type=pa.int32())], schema=in_schema
        )
        acc = Acc()
        task = DedupTask(
            store=conf,
            version=b + 1,
            key_columns=("k", "timestamp"),
            watermark_ms=max(0, (b - 10) * 1000 * 1000),
            late_watermark_ms=max(0, (b - 11) * 1000000),
            event_time_key=1,
            within_watermark=False,
            event_time_column="timestamp",
            delay_ms=0,
            out_schema=out_schema,
            accumulator=acc,
            operator_id=0,
        )
        t0 = time.perf_counter()
        out = list(run_dedup_task(task, 0, iter([batch])))
        dtms = (time.perf_counter() - t0) * 1000
        emitted.append(sum(o.num_rows for o in out))
        if b >= 12:
            total += dtms
        if b in (5, 12, 20, 29):
            metrics = {
                name: v
                for name, v in acc.v.items()
                if "Time" in name or "Total" in name or "Removed" in name
            }
            log(f"{b} {dtms:.1f} ms {emitted[-1]} {metrics}")
    if batches > 12:
        log(f"mean of batches 12..{batches - 1}: {total / (batches - 12):.1f} ms")
    return emitted


if __name__ == "__main__":
    main()

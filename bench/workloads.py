"""The benchmark workloads: one query definition per workload, for either engine.

Every builder takes ``readers``, a function returning a fresh ``readStream``
(``spark.readStream`` for native Spark Structured Streaming or
``lockgate.session(spark).readStream``), and returns the streaming DataFrame; the code is the same for both engines, as it is for users moving a query
over. ``bench.run`` drives them (interleaved rounds, timings, memory).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import functions as F
from pyspark.sql.types import (
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)


@dataclass(frozen=True)
class Sizes:
    """Rows per batch and other sizes; ``FULL`` for the real run, ``SMOKE`` for the test."""

    rows_1a: int = 10_000
    rows_1b: int = 1_000_000
    rows_2: int = 10_000
    window_keys_2: int = 100
    keys_3: int = 1_000_000
    rows_3: int = 10_000
    fill_rows_3: int = 250_000
    rows_4: int = 10_000
    dedup_keys_4: int = 5_000
    rows_5: int = 10_000
    rows_per_file_6: int = 5_000
    files_per_trigger_6: int = 2
    recovery_after_7: int = 50
    rows_8: int = 100_000
    keys_8: int = 50_000
    rows_9: int = 100_000
    rows_10: int = 100_000
    keys_10: int = 10
    rows_shapes: int = 100_000
    """Rows per batch of every shape of ``bench/shapes.py``."""


FULL = Sizes()
SMOKE = Sizes(
    rows_1a=1_000,
    rows_1b=20_000,
    rows_2=1_000,
    window_keys_2=10,
    keys_3=20_000,
    rows_3=1_000,
    fill_rows_3=20_000,
    rows_4=1_000,
    dedup_keys_4=500,
    rows_5=1_000,
    rows_per_file_6=500,
    files_per_trigger_6=2,
    recovery_after_7=4,
    rows_8=1_000,
    keys_8=500,
    rows_9=1_000,
    rows_10=1_000,
    keys_10=10,
    rows_shapes=1_000,
)


@dataclass
class Context:
    """What a builder needs besides the reader."""

    sizes: Sizes
    rows_per_batch: int
    input_dir: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Workload:
    key: str
    title: str
    description: str
    build: Callable[[Any, Context], Any]
    rows_per_batch: Callable[[Sizes], int]
    output_mode: str = "append"
    sink: str = "noop"
    kind: str = "standard"
    """``standard``/``join``/``files`` (interleaved A/B rounds), ``state-scaling`` (3) or
    ``recovery`` (7)."""
    inputs: int = 1
    """Streaming sources: a batch's ``numInputRows`` is ``inputs * rows_per_batch``."""


def rate(readers: Any, rows_per_batch: int) -> Any:
    return readers().format("rate-micro-batch").option("rowsPerBatch", rows_per_batch).load()


# -- 1: stateless ------------------------------------------------------------------------
def stateless(readers: Any, ctx: Context) -> Any:
    df = rate(readers, ctx.rows_per_batch)
    return df.where((F.col("value") % 10) < 8).select(
        F.col("timestamp"),
        (F.col("value") * 2).alias("v2"),
        (F.col("value") % 100).alias("bucket"),
        F.concat(F.lit("id-"), F.col("value").cast("string")).alias("label"),
    )


# -- 2: tumbling window count, watermark, append ----------------------------------------
def window_count(readers: Any, ctx: Context) -> Any:
    # rate-micro-batch stamps every row of batch b with startTimestamp + b * 1000 ms, so a
    # 10-second window spans 10 batches and holds window_keys_2 keys.
    df = rate(readers, ctx.rows_per_batch)
    return (
        df.withWatermark("timestamp", "10 seconds")
        .groupBy(F.window("timestamp", "10 seconds"), (F.col("value") % ctx.sizes.window_keys_2).alias("k"))
        .count()
    )


# -- 3 / 7: high-cardinality groupBy count, update mode ------------------------------------
def keyed_count(readers: Any, ctx: Context) -> Any:
    df = rate(readers, ctx.rows_per_batch)
    return df.groupBy((F.col("value") % ctx.sizes.keys_3).alias("k")).count()


# -- 8: several aggregates per key --------------------------------------------------------------
def keyed_aggregates(readers: Any, ctx: Context) -> Any:
    # Each key twice per batch (keys_8 = rows / 2), every key of the state updated
    # every batch: the state step's merge of min, max, avg and count buffers.
    df = rate(readers, ctx.rows_per_batch)
    return df.groupBy((F.col("value") % ctx.sizes.keys_8).alias("k")).agg(
        F.min("value").alias("lo"), F.max("value").alias("hi"), F.avg("value").alias("mean"), F.count("*").alias("n")
    )


# -- 4: dropDuplicates with watermark ---------------------------------------------------------
def dedup(readers: Any, ctx: Context) -> Any:
    # Each key appears rows_4 / dedup_keys_4 times per batch (all with the batch's
    # timestamp); state keeps (k, timestamp) until the watermark (10 s = 10 batches)
    # passes it.
    df = rate(readers, ctx.rows_per_batch)
    return (
        df.withWatermark("timestamp", "10 seconds")
        .withColumn("k", F.col("value") % ctx.sizes.dedup_keys_4)
        .dropDuplicates(["k", "timestamp"])
    )


# -- 9: dropDuplicates of new keys -------------------------------------------------------------
def dedup_new_keys(readers: Any, ctx: Context) -> Any:
    # Spark's own example of a deduplication: a guid per event with its event time
    # (dropDuplicates(["guid", "eventTime"])). Every key is new; each leaves the state
    # when the watermark (2 s = 2 batches) passes its batch's timestamp.
    df = rate(readers, ctx.rows_per_batch)
    return df.withWatermark("timestamp", "2 seconds").dropDuplicates(["value", "timestamp"])


# -- 5: stream-stream inner join with watermarks ------------------------------------------------
def stream_join(readers: Any, ctx: Context) -> Any:
    # Two rate-micro-batch streams with the same values and timestamps; each left row
    # matches its right row within the +-5 s time bound.
    left = (
        rate(readers, ctx.rows_per_batch)
        .select(F.col("value").alias("lk"), F.col("timestamp").alias("lt"))
        .withWatermark("lt", "10 seconds")
    )
    right = (
        rate(readers, ctx.rows_per_batch)
        .select(F.col("value").alias("rk"), F.col("timestamp").alias("rt"))
        .withWatermark("rt", "10 seconds")
    )
    # Written with >= / <= (as the figures in docs/benchmarks.md were measured); both
    # engines treat BETWEEN the same way.
    cond = (
        (F.col("lk") == F.col("rk"))
        & (F.col("lt") >= F.col("rt") - F.expr("INTERVAL 5 SECONDS"))
        & (F.col("lt") <= F.col("rt") + F.expr("INTERVAL 5 SECONDS"))
    )
    return left.join(right, cond, "inner")


# -- 6: JSON files -> parquet -----------------------------------------------------------------
FILE_SCHEMA = StructType(
    [
        StructField("id", LongType()),
        StructField("ts", TimestampType()),
        StructField("k", IntegerType()),
        StructField("name", StringType()),
        StructField("amount", DoubleType()),
    ]
)


def write_json_files(directory: str, files: int, rows_per_file: int) -> None:
    """``files`` JSON-lines files of ``rows_per_file`` rows each, named in order."""
    os.makedirs(directory, exist_ok=True)
    row_id = 0
    for f in range(files):
        lines = []
        for _ in range(rows_per_file):
            lines.append(
                json.dumps(
                    {
                        "id": row_id,
                        "ts": f"2024-01-01T00:{(row_id // 60) % 60:02d}:{row_id % 60:02d}.000Z",
                        "k": row_id % 997,
                        "name": f"name-{row_id % 1013}",
                        "amount": (row_id % 1000) / 10.0,
                    }
                )
            )
            row_id += 1
        path = os.path.join(directory, f"part-{f:05d}.json")
        tmp = os.path.join(directory, f".part-{f:05d}.json.tmp")
        with open(tmp, "w") as out:
            out.write("\n".join(lines) + "\n")
        os.rename(tmp, path)
        # distinct, increasing modification times keep the files in order
        os.utime(path, (1_700_000_000 + f, 1_700_000_000 + f))


def json_files(readers: Any, ctx: Context) -> Any:
    assert ctx.input_dir is not None
    df = (
        readers()
        .schema(FILE_SCHEMA)
        .option("maxFilesPerTrigger", ctx.sizes.files_per_trigger_6)
        .json(ctx.input_dir)
    )
    return df.where(F.col("amount") > 10.0).select(
        "id", "ts", "k", F.upper(F.col("name")).alias("name"), (F.col("amount") * 1.1).alias("amount")
    )


# -- 10: distinct values per window ---------------------------------------------------------
def distinct_per_window(readers: Any, ctx: Context) -> Any:
    # Every value is new, and every batch falls in the same 1-hour window (one second of
    # event time per batch), so each group's distinct values grow batch after batch:
    # Spark's state is its HyperLogLog++ registers, fixed in size.
    df = rate(readers, ctx.rows_per_batch)
    return df.groupBy(F.window("timestamp", "1 hour"), (F.col("value") % ctx.sizes.keys_10).alias("k")).agg(
        F.approx_count_distinct("value").alias("distinct")
    )


WORKLOADS: dict[str, Workload] = {
    w.key: w
    for w in [
        Workload(
            "1a",
            "stateless filter+projection, small batches",
            "rate-micro-batch -> where(value % 10 < 8) -> select 4 columns -> noop",
            stateless,
            lambda s: s.rows_1a,
        ),
        Workload(
            "1b",
            "stateless filter+projection, large batches",
            "as 1a with 1M rows per batch",
            stateless,
            lambda s: s.rows_1b,
        ),
        Workload(
            "2",
            "tumbling-window count, watermark, append",
            "withWatermark(10 s).groupBy(window(timestamp, 10 s), value % 100).count(), append",
            window_count,
            lambda s: s.rows_2,
        ),
        Workload(
            "3",
            "groupBy count, high-cardinality key, update",
            "groupBy(value % 1_000_000).count(), update mode; small state vs 1M keys in state",
            keyed_count,
            lambda s: s.rows_3,
            output_mode="update",
            kind="state-scaling",
        ),
        Workload(
            "4",
            "dropDuplicates with watermark",
            "withWatermark(10 s).dropDuplicates([value % 5000, timestamp]), append",
            dedup,
            lambda s: s.rows_4,
        ),
        Workload(
            "5",
            "stream-stream inner join with watermarks",
            "two rate-micro-batch streams joined on key and a +-5 s time bound, watermarks 10 s",
            stream_join,
            lambda s: s.rows_5,
            kind="join",
            inputs=2,
        ),
        Workload(
            "6",
            "JSON file source -> parquet file sink",
            "readStream.json(dir, maxFilesPerTrigger=2) -> filter/project -> parquet sink",
            json_files,
            lambda s: s.rows_per_file_6 * s.files_per_trigger_6,
            sink="parquet",
            kind="files",
        ),
        Workload(
            "7",
            "recovery time of workload 3",
            "restart workload 3 from its checkpoint after N batches; start() -> first new batch done",
            keyed_count,
            lambda s: s.rows_3,
            output_mode="update",
            kind="recovery",
        ),
        Workload(
            "8",
            "several aggregates per key, update",
            "groupBy(value % 50_000).agg(min, max, avg, count), update mode; every key updated every batch",
            keyed_aggregates,
            lambda s: s.rows_8,
            output_mode="update",
        ),
        Workload(
            "9",
            "dropDuplicates of new keys with eviction",
            "withWatermark(2 s).dropDuplicates([value, timestamp]), append; every key new, evicted 2 batches later",
            dedup_new_keys,
            lambda s: s.rows_9,
        ),
        Workload(
            "10",
            "approx_count_distinct per window, update",
            "groupBy(window(timestamp, 1 h), value % 10).agg(approx_count_distinct(value)), update mode; "
            "every value new, one window for the whole run",
            distinct_per_window,
            lambda s: s.rows_10,
            output_mode="update",
        ),
    ]
}


def select(spec: str | None) -> list[str]:
    """``"1,3"`` -> ``["1a", "1b", "3"]``; ``None`` -> every workload."""
    if not spec:
        return list(WORKLOADS)
    chosen: list[str] = []
    for part in spec.split(","):
        part = part.strip().lower()
        if not part:
            continue
        matches = [k for k in WORKLOADS if k == part or (k.rstrip("ab") == part and k != part)]
        if not matches:
            raise ValueError(f"unknown workload {part!r}; known: {', '.join(WORKLOADS)}")
        for k in matches:
            if k not in chosen:
                chosen.append(k)
    return [k for k in WORKLOADS if k in chosen]

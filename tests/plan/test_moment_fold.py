"""The state step's fold of a batch's values into CentralMomentAgg's buffers
(``aggregate_folds.fold_moments``) against Spark's own evaluation of the same update
expressions (``moment_partials``), bit for bit, on values that stress the doubles."""

from __future__ import annotations

import math
import random
import struct

import pyarrow as pa
import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, LongType, StructField, StructType

from lockgate.plan.aggregate import MomentFold, fold_batch
from lockgate.plan.aggregate_folds import moment_partials, moment_values

GROUPS = {
    0: [1.0, 2.0, 3.0, 4.0, 1e-300, -2.5],
    1: [0.1] * 7,  # equal values: m2 stays exactly 0.0
    2: [1e308, -1e308, 1e308, 3.0],  # overflow to inf and nan
    3: [-0.0, 0.0, -0.0],
    4: [float("nan"), 1.0],
    5: [None, None],  # every value null: the zero buffers
    6: [7.0, None, 1 / 3, 2 / 3, 1e16, 1.0, -1e16],
    7: [float("inf"), 2.0],
    8: [i / 7 + (i % 3) * 1e-3 for i in range(1, 40)],  # where a regrouped sum rounds apart
    9: [math.sqrt(i) * 1.37 - (i % 5) ** 3 / 11 for i in range(1, 80)],
}


def _bits(x: float) -> bytes:
    """The double's bits; every NaN as one (Spark treats them as one value, and which NaN
    operand an operation keeps is the hardware's and the operand order's)."""
    return b"NaN" if math.isnan(x) else struct.pack(">d", x)


def _many_groups() -> dict[int, list[float | None]]:
    """Enough groups that the fold steps them together (numpy), of uneven lengths, and one
    long group that it finishes alone (Python), with the doubles' special values mixed in."""
    rnd = random.Random(24)
    specials = [0.0, -0.0, 1e-300, 1e308, -1e308, float("inf"), float("nan"), None]
    groups: dict[int, list[float | None]] = {}
    for k in range(300):
        groups[k] = [
            rnd.choice(specials) if rnd.random() < 0.02 else rnd.uniform(-1e6, 1e6) * 10 ** rnd.randint(-8, 8)
            for _ in range(rnd.choice([1, 2, 5, 9, 17, 33, 64]))
        ]
    groups[300] = [rnd.gauss(1e9, 3.0) for _ in range(700)]
    groups[301] = [None, None]  # every value null: an empty list, the zero buffers
    return groups


@pytest.mark.parametrize("order", [2, 3, 4])
@pytest.mark.parametrize("groups", [GROUPS, _many_groups()], ids=["specials", "many-groups"])
def test_fold_in_the_task_is_sparks_fold_bit_for_bit(spark, order, groups):
    rows = [(k, v) for k, values in groups.items() for v in values]
    schema = StructType([StructField("k", LongType()), StructField("v", DoubleType())])
    df = spark.createDataFrame(rows, schema).coalesce(1)
    fields = [f"b{i}" for i in range(order + 1)]
    partials = moment_partials(F.col("v"), order)
    sparks = {
        r["k"]: tuple(r[f] for f in fields)
        for r in df.groupBy("k").agg(*[p.alias(f) for p, f in zip(partials, fields)]).collect()
    }
    lists = df.groupBy("k").agg(moment_values(F.col("v")).alias("values")).toArrow()
    batch = fold_batch(lists.to_batches()[0], (MomentFold("values", tuple(fields)),))
    assert batch.schema.names == ["k", *fields]
    assert all(batch.schema.field(f).type == pa.float64() for f in fields)
    ours = {r["k"]: tuple(r[f] for f in fields) for r in batch.to_pylist()}
    assert set(ours) == set(groups)
    for k in groups:
        assert [_bits(x) for x in ours[k]] == [_bits(x) for x in sparks[k]], (k, ours[k], sparks[k])
    if groups is GROUPS:
        assert ours[1][2] == 0.0 and ours[5] == (0.0,) * (order + 1)
        assert math.isnan(ours[4][1]) and math.isnan(ours[2][2])

"""approx_count_distinct's state: Spark's HyperLogLog++ registers, not the values seen.

Spark keeps ``2^p`` registers per group (``p`` from the relative standard deviation).
A value sets register ``idx`` (the first ``p`` bits of its 64-bit hash) to at least
``pw`` (one more than the leading zeros of the hash's other bits), and two buffers merge
by taking each register's maximum: so the registers, and the estimate Spark computes
from them, depend only on the set of values seen, whatever the batches and their
order. lockgate computes each value's ``(idx, pw)`` in Spark with Spark's own hash
(``xxhash64``, seed 42; it hashes ``-0.0`` as ``0.0`` and every NaN alike, as
``HyperLogLogPlusPlusHelper.update`` normalises floats before hashing) as one int, the
*code* ``idx * 64 + pw`` (``pw`` is at most 61), and a batch's partial is the set of
its group's codes (``collect_set``: a plain aggregation, no lambda per element). The
state keeps per group the largest code of each register set, sorted (an ``array<int>``
of at most ``2^p`` codes, however many values a group sees): :func:`registers` reduces
a batch's codes to that when a key first comes, :func:`merge_registers` merges two.
The estimate is Spark's, computed after the state step (:func:`estimates`, an Arrow
UDF over the groups the batch emits). The bias-correction tables are read from Spark's
JVM (``HyperLogLogPlusPlusHelper``), not copied.

The estimate follows Spark's ``query`` operation by operation: the sum of
``2^-register`` in register order, the raw estimate, linear counting below Spark's
thresholds, the k-nearest-neighbour bias correction with Java's binary search over the
raw-estimate table, and Java's ``Math.round``. ``math.log`` and Java's ``Math.log`` can
differ in the last bit for some inputs; the linear-counting estimate is rounded to a
whole number, so that would show only for an estimate within 1e-13 of a half.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, SparkSession

K = 6
"""Spark's number of raw-estimate neighbours averaged for the bias correction."""
MAX_BITS = 24
"""The largest ``p`` lockgate keeps registers for (a relative standard deviation of
0.0003 or more); smaller ones keep the values, as before (``decompose``)."""


def precision(relative_sd: float) -> int:
    """Spark's ``p`` for a relative standard deviation (``HyperLogLogPlusPlusHelper``)."""
    return math.ceil(2.0 * math.log(1.106 / relative_sd) / math.log(2.0))


def registers_partial(arg: Column, bits: int) -> Column:
    """The aggregate expression of one batch's codes of a group (``array<int>``, in no
    order, possibly several per register); empty for a group of nulls only."""
    from pyspark.sql import functions as F

    hashed = F.xxhash64(arg)
    index = F.shiftrightunsigned(hashed, 64 - bits)
    rest = F.shiftleft(hashed, bits).bitwiseOR(F.lit(1 << (bits - 1)))
    # Java's numberOfLeadingZeros(rest) + 1: rest is never 0, and bin() of a long has
    # no leading zeros (64 digits for a negative one)
    leading = F.lit(65) - F.length(F.bin(rest))
    return F.collect_set(F.when(arg.isNotNull(), (index * 64 + leading).cast("int")))


def registers(codes: Any) -> tuple[int, ...]:
    """A group's registers from any codes: the largest code of each register, sorted
    (the state's form)."""
    import numpy as np

    if not codes:
        return ()
    unique = np.unique(np.asarray(codes, dtype=np.int64))  # sorted
    last = np.ones(len(unique), dtype=bool)  # the last code of each register's run
    last[:-1] = (unique[1:] >> 6) != (unique[:-1] >> 6)
    return tuple(unique[last].tolist())


def merge_registers(state: Any, batch: Any) -> tuple[int, ...]:
    """Two groups' registers (codes) merged: each register's maximum."""
    if not batch:
        return tuple(state or ())
    return registers([*(state or ()), *batch])


def _java_binary_search(values: list[float], key: float) -> int:
    """``java.util.Arrays.binarySearch`` over ``values`` (Spark's tables are not
    strictly sorted everywhere, so the probe sequence itself must be Java's)."""
    low, high = 0, len(values) - 1
    while low <= high:
        mid = (low + high) >> 1
        if values[mid] < key:
            low = mid + 1
        elif values[mid] > key:
            high = mid - 1
        else:
            return mid
    return -(low + 1)


def _java_round(x: float) -> int:
    """Java's ``Math.round`` of a non-negative double: half up."""
    whole = math.floor(x)
    return int(whole) + (1 if x - whole >= 0.5 else 0)


def _bias(raw: float, estimates: list[float], biases: list[float]) -> float:
    found = _java_binary_search(estimates, raw)
    nearest = -(found + 1) if found < 0 else found
    count = len(estimates)
    low = max(nearest - K + 1, 0)
    high = min(low + K, count)

    def distance(i: int) -> float:
        diff = raw - estimates[i]
        return diff * diff

    while high < count and distance(high) < distance(low):
        low += 1
        high += 1
    total = 0.0
    for i in range(low, high):
        total += biases[i]
    return total / (high - low)


def _alpha_m2(bits: int) -> float:
    m = 1 << bits
    if bits == 4:
        return 0.673 * m * m
    if bits == 5:
        return 0.697 * m * m
    if bits == 6:
        return 0.709 * m * m
    return (0.7213 / (1.0 + 1.079 / m)) * m * m


def _query(z_inverse: float, zeros: float, bits: int, tables: Tables) -> int:
    """Spark's estimate from the sum of ``2^-register`` and the registers at zero."""
    m = 1 << bits
    raw = _alpha_m2(bits) / z_inverse

    def corrected() -> float:
        if bits < 19 and raw < 5.0 * m:
            return raw - _bias(raw, tables.estimates, tables.biases)
        return raw

    if zeros > 0:
        linear = m * math.log(m / zeros)
        small = (bits < 19 and linear <= tables.threshold) or raw <= 2.5 * m
        return _java_round(linear if small else corrected())
    return _java_round(corrected())


def estimates(codes: pa.Array, bits: int, tables: Tables) -> pa.Array:
    """Spark's ``HyperLogLogPlusPlusHelper.query`` of each group's registers (a list
    array of codes; a null list as no registers set): the registers of a few thousand
    groups at a time as rows of a numpy matrix, whose row-wise cumulative sum of
    ``2^-register`` adds in register order as Spark's loop does."""
    import numpy as np
    import pyarrow as pa

    if isinstance(codes, pa.ChunkedArray):
        codes = codes.combine_chunks()
    m = 1 << bits
    offsets = codes.offsets.to_numpy()  # into the whole child array, even of a slice
    values = codes.values.to_numpy(zero_copy_only=False).astype(np.int64)
    out = np.empty(len(codes), dtype=np.int64)
    step = max(1, (1 << 20) // m)
    for low in range(0, len(codes), step):
        high = min(low + step, len(codes))
        lengths = np.diff(offsets[low : high + 1])
        rows = np.repeat(np.arange(high - low), lengths)
        taken = values[int(offsets[low]) : int(offsets[high])]
        matrix = np.zeros((high - low, m), dtype=np.int64)
        np.maximum.at(matrix, (rows, taken >> 6), taken & 63)
        sums = np.cumsum(np.ldexp(1.0, -matrix), axis=1)[:, -1]
        zeros = m - np.count_nonzero(matrix, axis=1)
        for i in range(high - low):
            out[low + i] = _query(float(sums[i]), float(zeros[i]), bits, tables)
    return pa.array(out, type=pa.int64())


class Tables:
    """Spark's constants for one ``p``: the linear-counting threshold, the raw
    estimates and their biases (empty from ``p`` = 19, where Spark uses none)."""

    def __init__(self, threshold: float, estimates: list[float], biases: list[float]) -> None:
        self.threshold = threshold
        self.estimates = estimates
        self.biases = biases


_TABLES: dict[int, Tables] = {}


def tables(spark: SparkSession, bits: int) -> Tables:
    """Spark's tables for ``p`` = ``bits``, read from its JVM once per process."""
    found = _TABLES.get(bits)
    if found is None:
        jvm = spark.sparkContext._jvm
        helper = jvm.org.apache.spark.sql.catalyst.util.HyperLogLogPlusPlusHelper
        arrays = jvm.java.util.Arrays

        def doubles(array: Any) -> list[float]:
            text = str(arrays.toString(array)).strip("[]")
            return [float(x) for x in text.split(",")] if text else []

        if bits < 19:
            threshold = doubles(helper.THRESHOLDS())[bits - 4]
            found = Tables(
                threshold,
                doubles(helper.RAW_ESTIMATE_DATA()[bits - 4]),
                doubles(helper.BIAS_DATA()[bits - 4]),
            )
        else:
            found = Tables(0.0, [], [])
        _TABLES[bits] = found
    return found


_UDFS: dict[tuple[int, int], Any] = {}


def estimate_column(spark: SparkSession, registers: Column, bits: int) -> Column:
    """Spark's approx_count_distinct of each row's registers (codes): an Arrow UDF, made once
    per ``p`` and JVM (a UDF made per batch would be pickled and registered every
    batch)."""
    key = (id(spark.sparkContext._jvm), bits)
    udf = _UDFS.get(key)
    if udf is None:
        from pyspark.sql.functions import arrow_udf
        from pyspark.util import PythonEvalType

        constants = tables(spark, bits)

        def estimate(column):  # type: ignore[no-untyped-def]
            return estimates(column, bits, constants)

        udf = _UDFS[key] = arrow_udf(  # type: ignore[call-overload]
            estimate, returnType="long", functionType=PythonEvalType.SQL_SCALAR_ARROW_UDF
        )
    return udf(registers)  # type: ignore[no-any-return]

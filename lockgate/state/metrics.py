"""Task-side state metrics, summed on the driver through a Spark accumulator."""

from __future__ import annotations

from pyspark.accumulators import AccumulatorParam


class DictSumParam(AccumulatorParam):
    """Accumulates ``{name: number}`` dicts by summing per name."""

    def zero(self, value: dict[str, int]) -> dict[str, int]:
        return {}

    def addInPlace(self, value1: dict[str, int], value2: dict[str, int]) -> dict[str, int]:
        for key, number in value2.items():
            value1[key] = value1.get(key, 0) + number
        return value1

"""The Kafka source's offsets: the next offset to read per topic-partition.

Written to the offsets log as Spark's ``KafkaSourceOffset`` JSON,
``{"topic":{"0":42,"1":7}}``: partition ``p`` of ``topic`` has been read up to, not
including, offset 42 (as ``KafkaConsumer.position()``). A batch reads ``[start, end)``
per partition. Also here: Spark's proration of ``maxOffsetsPerTrigger`` over partitions
(``KafkaMicroBatchStream.rateLimit``) and its split of ranges into tasks
(``KafkaOffsetRangeCalculator``, option ``minPartitions``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

TopicPartition = tuple[str, int]
PartitionOffsets = dict[TopicPartition, int]

EARLIEST = -2
LATEST = -1
LONG_MAX = 2**63 - 1


def to_json(offsets: PartitionOffsets) -> dict[str, dict[str, int]]:
    """``{(t, p): o}`` -> ``{"t": {"p": o}}``, topics and partitions in order."""
    out: dict[str, dict[str, int]] = {}
    for topic, partition in sorted(offsets):
        out.setdefault(topic, {})[str(partition)] = int(offsets[(topic, partition)])
    return out


def from_json(value: Any) -> PartitionOffsets:
    """The inverse of :func:`to_json`; raises ValueError on anything else."""
    if not isinstance(value, dict):
        raise TypeError(f"expected a JSON object of topics, got {value!r}")
    out: PartitionOffsets = {}
    for topic, parts in value.items():
        if not isinstance(parts, dict):
            raise TypeError(f"expected a JSON object of partitions for topic {topic!r}")
        for partition, offset in parts.items():
            if isinstance(offset, bool) or not isinstance(offset, int):
                raise TypeError(f"offset {offset!r} of {topic}-{partition} is not an integer")
            out[(str(topic), int(partition))] = offset
    return out


def describe(partitions: Any) -> str:
    """Topic-partitions as Spark prints a set of them: ``Set(t-0, t-1)``."""
    return "Set(" + ", ".join(f"{t}-{p}" for t, p in sorted(partitions)) + ")"


def rate_limit(
    limit: int, start: PartitionOffsets, until: PartitionOffsets, new_start: PartitionOffsets
) -> PartitionOffsets:
    """End offsets reading at most ``limit`` records, prorated over the partitions by
    their backlog (Spark's ``rateLimit``: floored shares, a share below one rounded up
    so no partition starves). ``new_start`` holds the earliest offsets of partitions
    that are in ``until`` but not in ``start``."""
    sizes: dict[TopicPartition, int] = {}
    for tp, end in until.items():
        begin = start.get(tp, new_start.get(tp))
        if begin is not None and end - begin > 0:
            sizes[tp] = end - begin
    total = float(sum(sizes.values()))
    if total < 1:
        return dict(until)
    out: PartitionOffsets = {}
    for tp, end in until.items():
        if tp not in sizes:
            out[tp] = end
            continue
        begin = start.get(tp, new_start.get(tp, 0))
        prorate = limit * (sizes[tp] / total)
        share = math.ceil(prorate) if prorate < 1 else math.floor(prorate)
        off = LONG_MAX if share > LONG_MAX - begin else begin + share
        out[tp] = min(end, off)
    return out


@dataclass(frozen=True)
class OffsetRange:
    """``[from_offset, until_offset)`` of one topic-partition: one read task."""

    topic: str
    partition: int
    from_offset: int
    until_offset: int

    @property
    def size(self) -> int:
        return self.until_offset - self.from_offset


def split_ranges(
    ranges: list[OffsetRange], min_partitions: int | None, max_records: int | None = None
) -> list[OffsetRange]:
    """Spark's ``KafkaOffsetRangeCalculator.getRanges``: empty ranges dropped; with
    ``maxRecordsPerPartition``, a range split into ``ceil(size / max)`` equal tasks;
    then, with ``minPartitions`` above the number of ranges, large ranges split into
    about ``size / total * minPartitions`` tasks each (rounded, at least one)."""
    ranges = [r for r in ranges if r.size > 0]
    if max_records is not None:
        ranges = [
            piece
            for r in ranges
            for piece in _divided(r, math.ceil(r.size / max_records))
            if piece.size > 0
        ]
    if min_partitions is None or len(ranges) >= min_partitions:
        return ranges

    def parts_of(size: int, total: int, parts: int) -> int:
        # Scala's math.round rounds halves up.
        return max(math.floor(size / total * parts + 0.5), 1)

    total = sum(r.size for r in ranges)
    unsplit = [r for r in ranges if parts_of(r.size, total, min_partitions) == 1]
    # By topic-partition, as Spark: every piece of a partition counted as small is kept.
    unsplit_keys = {(r.topic, r.partition) for r in unsplit}
    split_total = total - sum(r.size for r in unsplit)
    split_min = max(min_partitions - len(unsplit), 1)
    out: list[OffsetRange] = []
    for r in ranges:
        parts = (
            1
            if (r.topic, r.partition) in unsplit_keys
            else parts_of(r.size, split_total, split_min)
        )
        out.extend(_divided(r, parts))
    return [r for r in out if r.size > 0]


def _divided(r: OffsetRange, parts: int) -> list[OffsetRange]:
    """``r`` in ``parts`` consecutive pieces; the last ones take the remainder."""
    out = []
    remaining = r.size
    begin = r.from_offset
    for part in range(parts):
        this = remaining // (parts - part)
        remaining -= this
        end = min(begin + this, r.until_offset)
        out.append(OffsetRange(r.topic, r.partition, begin, end))
        begin = end
    return out


def dumps(offsets: PartitionOffsets) -> str:
    return json.dumps(to_json(offsets), separators=(",", ":"))

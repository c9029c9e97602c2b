"""What the continuous halves of the built-in sinks share, and the noop sink's.

Writers run in the long-running tasks, one per partition and epoch; what a sink
collects on the driver (console's shown rows, memory's rows) travels in the commit
message of each partition, bounded for console by ``numRows``. Each sink's continuous
half lives in its module (``ConsoleContinuousSink`` in :mod:`lockgate.sinks.console`,
``MemoryContinuousSink`` in :mod:`lockgate.sinks.memory`, ``ForeachContinuousSink`` in
:mod:`lockgate.sinks.foreach`) and builds on the writers here.
"""

from __future__ import annotations

from typing import Any

from lockgate.row_codec import decode_rows, encode_rows
from lockgate.sinks.base import ContinuousDataWriter, ContinuousSink


def rows_of(messages: list[tuple[dict[str, Any], bytes | None]]) -> list[tuple[Any, ...]]:
    rows: list[tuple[Any, ...]] = []
    for _meta, payload in messages:
        if payload:
            rows.extend(decode_rows(payload))
    return rows


def output_rows(messages: list[tuple[dict[str, Any], bytes | None]]) -> int:
    return sum(int(meta.get("rows", 0)) for meta, _ in messages)


class CountingWriter(ContinuousDataWriter):
    def __init__(self, keep: int | None) -> None:
        self.keep = keep
        self.rows = 0
        self.kept: list[tuple[Any, ...]] = []

    def write(self, row: tuple[Any, ...]) -> None:
        self.rows += 1
        if self.keep is None or len(self.kept) < self.keep:
            self.kept.append(row)

    def commit(self) -> tuple[dict[str, Any], bytes | None]:
        payload = encode_rows(self.kept) if self.keep != 0 else None
        return {"rows": self.rows}, payload


class CollectingFactory:
    """Writers that send (up to ``keep``) rows to the driver with their commit message."""

    def __init__(self, keep: int | None) -> None:
        self.keep = keep

    def __call__(self, partition: int, epoch: int) -> ContinuousDataWriter:
        return CountingWriter(self.keep)


class NoopContinuousSink(ContinuousSink):
    def createWriterFactory(self) -> Any:
        return CollectingFactory(0)

    def description(self) -> str:
        return "NoopTable"

"""The commit log (Spark's CommitLog): ``commits/<N>`` marks batch N as fully written."""

from __future__ import annotations

import json
from dataclasses import dataclass

from lockgate.checkpoint.log import MetadataLog
from lockgate.errors import CheckpointError


@dataclass(frozen=True)
class CommitMetadata:
    nextBatchWatermarkMs: int = 0


class CommitLog(MetadataLog[CommitMetadata]):
    def serialize(self, entry: CommitMetadata) -> str:
        return json.dumps({"nextBatchWatermarkMs": entry.nextBatchWatermarkMs}, separators=(",", ":"))

    def deserialize(self, body: str, path: str) -> CommitMetadata:
        line = body.split("\n", 1)[0].strip()
        if not line:
            raise CheckpointError(
                f"Commit log file {path} is truncated: it has no metadata line. The "
                "checkpoint is corrupt.",
                path=path,
            )
        try:
            data = json.loads(line)
            return CommitMetadata(int(data.get("nextBatchWatermarkMs", 0)))
        except (ValueError, TypeError, AttributeError) as exc:
            raise CheckpointError(
                f"Commit log file {path} is malformed: {line!r} ({exc}).", path=path
            ) from exc

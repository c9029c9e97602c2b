"""The offsets write-ahead log (Spark's OffsetSeqLog): ``offsets/<N>``.

Format::

    v1
    {"batchWatermarkMs":0,"batchTimestampMs":1700000000000,"conf":{...}}
    <offset JSON of source 0, or "-" when it has none>
    <offset JSON of source 1>
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from lockgate.checkpoint.log import MetadataLog
from lockgate.errors import CheckpointError

VOID_OFFSET = "-"


@dataclass(frozen=True)
class OffsetSeqMetadata:
    """Batch watermark, batch timestamp and the conf pinned for the query's lifetime."""

    batchWatermarkMs: int = 0
    batchTimestampMs: int = 0
    conf: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(
            {
                "batchWatermarkMs": self.batchWatermarkMs,
                "batchTimestampMs": self.batchTimestampMs,
                "conf": self.conf,
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str, path: str = "<offsets>") -> OffsetSeqMetadata:
        try:
            data = json.loads(text)
            return cls(
                batchWatermarkMs=int(data.get("batchWatermarkMs", 0)),
                batchTimestampMs=int(data.get("batchTimestampMs", 0)),
                conf={str(k): str(v) for k, v in (data.get("conf") or {}).items()},
            )
        except (ValueError, TypeError, AttributeError) as exc:
            raise CheckpointError(
                f"Offsets log file {path} has malformed metadata {text!r}: {exc}", path=path
            ) from exc


@dataclass(frozen=True)
class OffsetSeq:
    """The end offsets of one batch, one per source in plan order (JSON strings)."""

    offsets: tuple[str | None, ...]
    metadata: OffsetSeqMetadata


class OffsetSeqLog(MetadataLog[OffsetSeq]):
    def serialize(self, entry: OffsetSeq) -> str:
        lines = [entry.metadata.to_json()]
        lines += [VOID_OFFSET if o is None else o for o in entry.offsets]
        return "\n".join(lines)

    def deserialize(self, body: str, path: str) -> OffsetSeq:
        lines = body.split("\n")
        if not lines or not lines[0].strip():
            raise CheckpointError(
                f"Offsets log file {path} is truncated: it has no metadata line. The "
                "checkpoint is corrupt.",
                path=path,
            )
        metadata = OffsetSeqMetadata.from_json(lines[0], path)
        offsets: list[str | None] = []
        for line in lines[1:]:
            if line == "":
                continue
            offsets.append(None if line == VOID_OFFSET else line)
        return OffsetSeq(tuple(offsets), metadata)

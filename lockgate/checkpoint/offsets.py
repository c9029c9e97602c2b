"""The offsets write-ahead log (Spark's OffsetSeqLog): ``offsets/<N>``.

Format::

    v1
    {"batchWatermarkMs":0,"batchTimestampMs":1700000000000,"conf":{...}}
    <offset JSON of source 0, or "-" when it has none>
    <offset JSON of source 1>

With source evolution (``spark.sql.streaming.queryEvolution.enableSourceEvolution``),
Spark 4.3's v2 format keys each offset by the source's name (``readStream.name``)::

    v2
    {"batchWatermarkMs":0,"batchTimestampMs":1700000000000,"conf":{...},"sourceMetadataInfo":{}}
    <name of a source>:<its offset JSON, or "-">
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from lockgate.checkpoint.log import CORRUPT_LOG_FIX, MetadataLog
from lockgate.errors import CheckpointError

VOID_OFFSET = "-"


@dataclass(frozen=True)
class OffsetSeqMetadata:
    """Batch watermark, batch timestamp and the conf pinned for the query's lifetime."""

    batchWatermarkMs: int = 0
    batchTimestampMs: int = 0
    conf: dict[str, str] = field(default_factory=dict)

    def to_json(self, v2: bool = False) -> str:
        data: dict[str, object] = {
            "batchWatermarkMs": self.batchWatermarkMs,
            "batchTimestampMs": self.batchTimestampMs,
            "conf": self.conf,
        }
        if v2:
            data["sourceMetadataInfo"] = {}
        return json.dumps(data, separators=(",", ":"))

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
    names: tuple[str, ...] | None = None
    """The sources' names (v2, source evolution), one per offset; None: by position (v1)."""

    def in_order(self, names: tuple[str, ...] | None) -> list[str | None]:
        """The offsets of the sources ``names`` (None: by position), in that order; a
        source this batch has no offset for gets None."""
        if self.names is None or names is None:
            return list(self.offsets)
        by_name = dict(zip(self.names, self.offsets))
        return [by_name.get(name) for name in names]


class OffsetSeqLog(MetadataLog[OffsetSeq]):
    VERSION = 2

    def version_of(self, entry: OffsetSeq) -> int:
        """v2 for offsets keyed by source name (source evolution), else Spark's v1."""
        return 1 if entry.names is None else 2

    def serialize(self, entry: OffsetSeq) -> str:
        if entry.names is not None:
            lines = [entry.metadata.to_json(v2=True)]
            lines += [
                f"{name}:{VOID_OFFSET if o is None else o}" for name, o in zip(entry.names, entry.offsets)
            ]
            return "\n".join(lines)
        lines = [entry.metadata.to_json()]
        lines += [VOID_OFFSET if o is None else o for o in entry.offsets]
        return "\n".join(lines)

    def repartitioned(self, batch_id: int) -> tuple[int, int] | None:
        """(from, to) when batch ``batch_id`` changes the state's partition count
        (``spark.sql.shuffle.partitions``, pinned since the first batch) from the batch
        before it: only an offline repartition plans such a batch. Else None."""
        planned, before = self.get(batch_id), self.get(batch_id - 1)
        if planned is None or before is None:
            return None
        key = "spark.sql.shuffle.partitions"
        old, new = before.metadata.conf.get(key), planned.metadata.conf.get(key)
        return None if old is None or new is None or old == new else (int(old), int(new))

    def deserialize_version(self, version: int, body: str, path: str) -> OffsetSeq:
        entry = self.deserialize(body, path)
        if version < 2:
            for index, offset in enumerate(entry.offsets):
                if offset is not None:
                    self._check_offset(offset, str(index), path)
            return entry
        names: list[str] = []
        offsets: list[str | None] = []
        for line in entry.offsets:
            name, sep, offset = ("-" if line is None else line).partition(":")
            if not sep:
                raise CheckpointError(
                    f"Offsets log file {path} (v2) has a line without a source name: {line!r}.",
                    path=path,
                )
            names.append(name)
            offsets.append(None if offset == VOID_OFFSET else offset)
            if offset != VOID_OFFSET:
                self._check_offset(offset, repr(name), path)
        return OffsetSeq(tuple(offsets), entry.metadata, tuple(names))

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

    def _check_offset(self, offset: str, source: str, path: str) -> None:
        """Refuse an offset cut off inside its JSON: a file truncated in its last line
        would otherwise be read as a shorter offset, which the source misreads or fails
        on without naming the file. Offsets are JSON (Spark's ``Offset.json``); one that
        does not open as a JSON object, array or string is left to its source."""
        if not offset.startswith(("{", "[", '"')):
            return
        try:
            json.loads(offset)
        except ValueError as exc:
            raise CheckpointError(
                f"Offsets log file {path} is corrupt: the offset of source {source} is not "
                f"valid JSON ({exc}): {offset[:200]!r}. The file was truncated or damaged. "
                f"{CORRUPT_LOG_FIX}",
                path=path,
            ) from exc
